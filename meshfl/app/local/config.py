"""The options of ``meshfl local``: :class:`LocalConfig`, its defaults and privacy fields.

A job's options are the fields of the one table, :data:`meshfl.contract.JOB_OPTIONS`,
with the launcher's defaults (:data:`meshfl.contract.LAUNCHER_DEFAULTS`); the other
fields are the launcher's own.

Its own module so that the launcher's parts (fleet, chaos, monitor, report, ...) read
the config without importing :mod:`meshfl.app.local.run`, which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshfl.contract.job_options import DEFAULT_MODEL, JOB_OPTIONS, LAUNCHER_DEFAULTS

__all__ = ["DEFAULTS", "PRIVACY_FIELDS", "LocalConfig"]


_DEFAULT = LAUNCHER_DEFAULTS  # one default per job option, in meshfl.contract.job_options


@dataclass(frozen=True)
class LocalConfig:
    """Options of ``meshfl local`` (defaults: W1, CHOCO-SGD sign, complete, momentum 0.9).

    The defaults are CHOCO-SGD with the sign codec on the complete graph, γ 1, local
    heavy-ball momentum 0.9 (README, "why these defaults"; BENCHMARKS.md;
    :data:`meshfl.contract.LAUNCHER_OVERRIDES`).

    The job options are the ``JobSpec``'s (``topology`` may also be a path to a JSON edge
    list, sent as ``custom_graph``; ``topology_seed`` None means ``seed``;
    ``min_battery_percent`` 0 turns the battery rule off; ``elastic`` is implied by
    ``join_at``). The per-device fields (:mod:`meshfl.app.local.fleet`) name devices
    ``"device-3"`` (or ``"3"``): ``slow`` ``(device, factor ≥ 1)`` pairs (with
    ``step_time_s`` > 0, every agent's emulated step time in seconds, a slow device's
    steps take factor × that: WORKLOADS.md's W6), ``links``
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
    seed: int = 0
    dataset: str = "digits"
    alpha: float = 0.5
    broker: str | None = None
    model_seed: int | None = None  # the JobSpec's seed (model, shuffles); None: seed
    out: Path = Path("meshfl-run")
    label_column: str = "label"
    slow: tuple[tuple[str, float], ...] = ()
    step_time_s: float = 0.0
    links: tuple[tuple[str, str], ...] = ()
    join_at: tuple[int, ...] = ()
    kill: tuple[tuple[str, int], ...] = ()
    chaos: str = ""
    model: str = DEFAULT_MODEL
    hidden: tuple[int, ...] | None = None
    image_shape: tuple[int, ...] | None = None
    model_kwargs: dict[str, Any] | None = None
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

    # A job's options: the fields of meshfl.contract.JOB_OPTIONS, with their defaults there
    # (meshfl.contract.LAUNCHER_DEFAULTS: the table's, or the launcher's overrides).
    rounds: int = _DEFAULT["rounds"]
    topology: str = _DEFAULT["topology"]
    algorithm: str = _DEFAULT["algorithm"]
    codec: str = _DEFAULT["codec"]
    consensus_step: float = _DEFAULT["consensus_step"]
    keyframe_growth: float = _DEFAULT["keyframe_growth"]
    dense_below: int = _DEFAULT["dense_below"]
    byte_budget: int = _DEFAULT["byte_budget"]
    learning_rate: float = _DEFAULT["learning_rate"]
    local_momentum: float = _DEFAULT["local_momentum"]
    momentum_kind: str = _DEFAULT["momentum_kind"]
    batch_size: int = _DEFAULT["batch_size"]
    local_epochs: int = _DEFAULT["local_epochs"]
    round_deadline_s: float = _DEFAULT["round_deadline_s"]
    max_payload_bytes: int = _DEFAULT["max_payload_bytes"]
    sketch_dim: int = _DEFAULT["sketch_dim"]
    topology_degree: int = _DEFAULT["topology_degree"]
    topology_probability: float = _DEFAULT["topology_probability"]
    topology_seed: int | None = _DEFAULT["topology_seed"]
    mixing: str = _DEFAULT["mixing"]
    mode: str = _DEFAULT["mode"]
    staleness: int = _DEFAULT["staleness"]
    quorum: float = _DEFAULT["quorum"]
    plan: bool = _DEFAULT["plan"]
    uplink_budget_s: float = _DEFAULT["uplink_budget_s"]
    min_battery_percent: float = _DEFAULT["min_battery_percent"]
    elastic: bool = _DEFAULT["elastic"]
    secure_aggregation: int = _DEFAULT["secure_aggregation"]
    secure_range: float = _DEFAULT["secure_range"]
    dp_noise_multiplier: float = _DEFAULT["dp_noise_multiplier"]
    dp_clip: float = _DEFAULT["dp_clip"]
    dp_mode: str = _DEFAULT["dp_mode"]
    dp_unit: str = _DEFAULT["dp_unit"]
    dp_delta: float = _DEFAULT["dp_delta"]
    dp_epsilon_budget: float = _DEFAULT["dp_epsilon_budget"]
    robust: str | None = _DEFAULT["robust"]

    def job_options(self) -> dict[str, Any]:
        """The job options of this run, keyed by ``JobSpec`` field (one per ``JOB_OPTIONS``)."""
        return {o.field: getattr(self, o.field) for o in JOB_OPTIONS}


DEFAULTS = LocalConfig()

PRIVACY_FIELDS = (
    "secure_aggregation", "secure_range", "dp_noise_multiplier", "dp_clip", "dp_mode", "dp_unit",
    "dp_delta", "dp_epsilon_budget", "robust",
)  # fmt: skip
"""The privacy options: LocalConfig fields with the JobSpec fields' names (issue 5)."""
