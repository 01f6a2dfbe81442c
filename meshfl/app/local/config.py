"""The options of ``meshfl local``: :class:`LocalConfig`, its defaults and privacy fields.

Its own module so that the launcher's parts (fleet, chaos, monitor, report, ...) read
the config without importing :mod:`meshfl.app.local.run`, which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULTS", "PRIVACY_FIELDS", "LocalConfig"]


@dataclass(frozen=True)
class LocalConfig:
    """Options of ``meshfl local`` (defaults: W1, CHOCO-SGD sign, complete, momentum 0.9).

    The defaults are CHOCO-SGD with the sign codec on the complete graph, γ 1, local
    heavy-ball momentum 0.9 (README, "why these defaults"; BENCHMARKS.md).

    Most fields are the ``JobSpec``'s (``topology`` may also be a path to a JSON edge
    list, sent as ``custom_graph``; ``topology_seed`` None means ``seed``;
    ``min_battery_percent`` 0 turns the battery rule off; ``elastic`` is implied by
    ``join_at``). The per-device fields (:mod:`meshfl.app.local.fleet`) name devices
    ``"device-3"`` (or ``"3"``): ``slow`` ``(device, factor ≥ 1)`` pairs, ``links``
    ``(device, "RATE[:LATENCY]")`` pairs, ``join_at`` the rounds after which one more
    agent starts, ``kill`` ``(device, round)`` pairs; ``chaos`` a fault-injection SPEC
    for every agent's link (:mod:`meshfl.app.local.lab.chaos`; empty: none). The model
    (``docs/models.md``): ``model`` a zoo name or ``package.module:callable``,
    ``hidden`` None for the model's default (W1: mlp [64]), ``image_shape``
    ``(C, H, W)`` for 2-D models (None: square), ``model_kwargs`` a user model's keyword
    arguments. ``secure`` runs the fleet on its
    own Mosquitto with TLS, per-device logins and an ACL (not with ``broker`` or
    ``links``; :mod:`meshfl.app.local.secure_broker`). ``dashboard`` prints a read-only login
    link to the coordinator's web dashboard and keeps the servers up
    ``dashboard_linger_s`` seconds after the report is written (``math.inf``: until
    Ctrl-C; ``None``, not given: no wait; any value needs ``dashboard``);
    ``open_browser`` also opens the link (:mod:`meshfl.app.local.dashboard`). ``log_format``
    (``text`` or ``json``) is the children's ``--log-format`` (their logs under ``logs/``).
    ``brokers`` > 1 runs that many Mosquitto brokers bridged to the coordinator's, agents
    alternating over them (:mod:`meshfl.app.local.bridged`; 1: one broker). ``in_process`` K
    > 0 runs the agents as threads of K processes (:mod:`meshfl.app.local.inprocess`; 0: one
    process per agent). ``model_seed`` seeds the model and the shuffles (the JobSpec's
    ``seed``) apart from the partition's ``seed`` (None: ``seed``).
    """

    agents: int = 8
    rounds: int = 30
    dataset: str = "digits"
    alpha: float = 0.5
    topology: str = "complete"
    algorithm: str = "choco"
    codec: str = "sign"
    consensus_step: float = 1.0
    keyframe_growth: float = 1.5
    dense_below: int = 0
    byte_budget: int = 0
    learning_rate: float = 0.1
    local_momentum: float = 0.9
    batch_size: int = 32
    local_epochs: int = 1
    round_deadline_s: float = 30.0
    max_payload_bytes: int = 131072
    broker: str | None = None
    seed: int = 0
    model_seed: int | None = None  # the JobSpec's seed (model, shuffles); None: seed
    out: Path = Path("meshfl-run")
    label_column: str = "label"
    sketch_dim: int = 256
    topology_degree: int = 4
    topology_probability: float = 0.3
    topology_seed: int | None = None
    mixing: str = "metropolis-hastings"
    mode: str = "sync"
    staleness: int = 2
    quorum: float = 1.0
    plan: bool = False
    uplink_budget_s: float = 0.05
    min_battery_percent: float = 0.0
    elastic: bool = False
    slow: tuple[tuple[str, float], ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    join_at: tuple[int, ...] = ()
    kill: tuple[tuple[str, int], ...] = ()
    chaos: str = ""
    model: str = "mlp"
    hidden: tuple[int, ...] | None = None
    image_shape: tuple[int, ...] | None = None
    model_kwargs: dict[str, Any] | None = None
    # Privacy and robustness (issue 5): the JobSpec fields of the same names.
    secure_aggregation: int = 0
    secure_range: float = 1.0
    dp_noise_multiplier: float = 0.0
    dp_clip: float = 0.0
    dp_mode: str = "local"
    dp_delta: float = 1e-5
    dp_epsilon_budget: float = 0.0
    robust: str | None = None
    # Security (issue 6): TLS + per-device broker logins + ACL on Mosquitto.
    secure: bool = False
    # The web dashboard (docs/dashboard.md): a read-only login link, servers kept up after.
    dashboard: bool = False
    dashboard_linger_s: float | None = None
    open_browser: bool = False
    log_format: str = "text"
    # Scale past one broker (issue 10): N Mosquitto brokers joined by bridges.
    brokers: int = 1
    # Scale on one machine (issue 10): agents as threads of K processes (0: a process each).
    in_process: int = 0


DEFAULTS = LocalConfig()

PRIVACY_FIELDS = (
    "secure_aggregation", "secure_range", "dp_noise_multiplier", "dp_clip", "dp_mode",
    "dp_delta", "dp_epsilon_budget", "robust",
)  # fmt: skip
"""The privacy options: LocalConfig fields with the JobSpec fields' names (issue 5)."""
