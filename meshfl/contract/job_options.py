"""A job's options, defined once: name, type, default, help and the check of each.

:data:`JOB_OPTIONS` is the one table. Everything else is derived from it:

- the command-line options of ``meshfl job start`` and ``meshfl local``
  (:func:`meshfl.app.cli.options.with_job_options` turns each entry into a Typer option);
- the fields and defaults of the launcher's :class:`~meshfl.app.local.config.LocalConfig`;
- the :class:`~meshfl.contract.jobs.JobSpec` fields a command sends
  (:func:`job_spec_fields`) and the one-line refusal of an out-of-range value
  (:func:`check_job_options`);
- the value the coordinator and the agent read for a field a spec leaves out
  (:func:`spec_value`).

A new job option is one :class:`JobOption` here, a ``JobSpec`` field of the same name
(``meshfl/contract/jobs.py``) and a ``LocalConfig`` field (``meshfl/app/local/config.py``);
both commands then offer it and send it. ``default`` is what a bare REST job gets: the
value an absent ``NotRequired`` field means, or, for a field every ``JobSpec`` carries,
the value the commands fill in. Both commands depart from it only where
:data:`LAUNCHER_OVERRIDES` says.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from meshfl.errors import ConfigError

__all__ = [
    "DEFAULT_MODEL",
    "JOB_DEFAULTS",
    "JOB_OPTIONS",
    "LAUNCHER_DEFAULTS",
    "LAUNCHER_OVERRIDES",
    "JobOption",
    "check_job_options",
    "job_spec_fields",
    "spec_value",
]


@dataclass(frozen=True, slots=True)
class JobOption:
    """One option of a job: a ``JobSpec`` field and, unless ``command_line`` is off, a flag.

    ``kind`` is the value's type (``str``, ``int``, ``float`` or ``bool``; a ``None``
    default also allows ``None``). ``required``: every ``JobSpec`` carries the field (it
    is always sent); otherwise it is sent only when it differs from ``default``.
    ``param`` is the command-line parameter (``--param-with-dashes``; ``""``: the field's
    name). ``check`` returns whether a value is valid, ``rule`` says what it demands: a
    value that fails is refused as ``--param must be RULE (got VALUE)``.
    """

    field: str
    kind: type
    default: Any
    help: str
    required: bool = False
    param: str = ""
    metavar: str | None = None
    check: Callable[[Any], bool] | None = None
    rule: str = ""
    command_line: bool = True

    @property
    def name(self) -> str:
        """The command-line parameter's Python name (``deadline`` for ``round_deadline_s``)."""
        return self.param or self.field

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--deadline``."""
        return "--" + self.name.replace("_", "-")


def _at_least_1(value: int) -> bool:
    return value >= 1


def _not_negative(value: float) -> bool:
    return value >= 0


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def _share(value: float) -> bool:
    """In (0, 1]."""
    return math.isfinite(value) and 0 < value <= 1


def _seed(value: int | None) -> bool:
    return value is None or 0 <= value < 2**32


JOB_OPTIONS: tuple[JobOption, ...] = (
    JobOption("topology", str, None,
              "ring, torus, exponential, one-peer-exponential, random-regular, erdos-renyi,"
              " small-world, star, complete, or a path to a JSON edge list {n, edges}."),
    JobOption("algorithm", str, "choco", "choco (CHOCO-SGD, compressed) or dpsgd.",
              required=True, check=lambda v: v in ("choco", "dpsgd"), rule="choco or dpsgd"),
    JobOption("codec", str, "sign",
              "Codec spec, e.g. topk:0.1, sign, int8+zstd (docs/codecs.md).", required=True),
    JobOption("consensus_step", float, 1.0, "CHOCO-SGD consensus step size γ in (0, 1].",
              required=True, check=_share, rule="in (0, 1]"),
    JobOption("keyframe_growth", float, 0.0,
              "Keyframe when the compression error is this many times normal (0: off).",
              check=lambda v: math.isfinite(v) and (v == 0 or v > 1), rule="0 (off) or > 1"),
    JobOption("dense_below", int, 0, "Send tensors with fewer elements uncompressed (0: none).",
              check=_not_negative, rule=">= 0"),
    JobOption("byte_budget", int, 0,
              "Payload bytes per message; sets top-k/random-k density (0: off).",
              check=_not_negative, rule=">= 0"),
    JobOption("rounds", int, 30, "Gossip rounds.",
              required=True, check=_at_least_1, rule="at least 1"),
    JobOption("learning_rate", float, 0.1, "SGD learning rate.",
              required=True, check=_positive, rule="a positive number"),
    JobOption("local_momentum", float, 0.0,
              "Momentum β in [0, 1) of the local SGD, kept across rounds (--momentum-kind).",
              check=lambda v: math.isfinite(v) and 0 <= v < 1, rule="in [0, 1)"),
    JobOption("momentum_kind", str, "heavy-ball",
              "heavy-ball or quasi-global (QG-DSGDm): how --local-momentum applies.",
              check=lambda v: v in ("heavy-ball", "quasi-global"),
              rule="heavy-ball or quasi-global"),
    JobOption("batch_size", int, 32, "Minibatch size.",
              required=True, check=_at_least_1, rule="at least 1"),
    JobOption("local_epochs", int, 1, "Local epochs per round.",
              required=True, check=_at_least_1, rule="at least 1"),
    JobOption("round_deadline_s", float, 30.0, "Round deadline in seconds.",
              required=True, param="deadline", check=_positive, rule="a positive number"),
    JobOption("max_payload_bytes", int, 131072, "Largest MQTT payload, bytes (128 KiB).",
              required=True, command_line=False),
    JobOption("sketch_dim", int, 256, "Count-sketch size of the consensus distance (0: off).",
              required=True, command_line=False),
    # Topology, round and planning options (issue 4).
    JobOption("topology_degree", int, 4, "random-regular degree, small-world lattice degree k.",
              param="degree"),
    JobOption("topology_probability", float, 0.3,
              "erdos-renyi edge / small-world rewiring probability.", param="probability"),
    JobOption("topology_seed", int, None, "Seed of the random topologies (default: --seed).",
              check=_seed, rule="in [0, 2^32)"),
    JobOption("mixing", str, "metropolis-hastings",
              "Mixing weights: metropolis-hastings or max-degree."),
    JobOption("mode", str, "sync",
              "sync (rounds wait for the quorum) or async (bounded staleness)."),
    JobOption("staleness", int, 2, "async: oldest usable neighbour lag τ, in rounds.",
              check=_not_negative, rule=">= 0 rounds"),
    JobOption("quorum", float, 1.0, "sync: proceed once this share of the neighbours answered.",
              check=_share, rule="in (0, 1]"),
    JobOption("plan", bool, False, "Capability-aware planning of work and codecs."),
    JobOption("uplink_budget_s", float, 0.05,
              "Planner: seconds of uplink per message (sets byte budgets).",
              param="uplink_budget", check=_positive, rule="> 0 seconds"),
    JobOption("min_battery_percent", float, 0.0,
              "Devices below this battery % (not charging) sit out; 0: off.", param="min_battery",
              check=lambda v: math.isfinite(v) and 0 <= v <= 100, rule="in [0, 100]"),
    JobOption("elastic", bool, False, "Admit idle devices that appear mid-job."),
    # Privacy and robustness (issue 5; docs/privacy.md).
    JobOption("secure_aggregation", int, 0,
              "Secure aggregation in every neighbourhood with threshold T (0: off).",
              metavar="T"),
    JobOption("secure_range", float, 1.0, "Fixed-point range ±R of a masked coordinate."),
    JobOption("dp_noise_multiplier", float, 0.0, "DP noise multiplier σ (0: no DP)."),
    JobOption("dp_clip", float, 0.0, "DP clipping norm C of each delta."),
    JobOption("dp_mode", str, "local",
              "local (each device adds all its noise) or distributed (needs SecAgg)."),
    JobOption("dp_unit", str, "device",
              "Unit of privacy: device (σ, C on each released delta) or record (DP-SGD:"
              " per-example clipping to C, noise σ·C per Poisson-sampled batch).",
              check=lambda v: v in ("device", "record"), rule="device or record"),
    JobOption("dp_delta", float, 1e-5, "δ of the (ε, δ) guarantee."),
    JobOption("dp_epsilon_budget", float, 0.0, "ε budget per device over all its jobs (0: none)."),
    JobOption("robust", str, None,
              "Robust mixing: median, trimmed:0.1 or clipped-gossip (default: off)."),
)  # fmt: skip
"""Every option of a job, in ``--help`` order."""

JOB_DEFAULTS: Mapping[str, Any] = MappingProxyType({o.field: o.default for o in JOB_OPTIONS})
"""Field → a bare REST job's value (``topology`` ``None``: the fleet's default setting)."""

LAUNCHER_OVERRIDES: Mapping[str, Any] = MappingProxyType(
    {"topology": "complete", "keyframe_growth": 1.5, "local_momentum": 0.9}
)
"""Where ``meshfl local`` departs from a bare REST job: the W1 setting, CHOCO-SGD with
the sign codec on the complete graph, γ 1, local heavy-ball momentum 0.9 and
error-triggered keyframes (README, "Why these defaults"; BENCHMARKS.md).
``meshfl job start`` takes the same defaults, so one command line is one job on both."""

LAUNCHER_DEFAULTS: Mapping[str, Any] = MappingProxyType({**JOB_DEFAULTS, **LAUNCHER_OVERRIDES})
"""Field → the default of ``meshfl local``, ``meshfl job start`` and ``LocalConfig``."""


DEFAULT_MODEL = "mlp"
"""``--model`` when none is given: W1's MLP (the ``JobSpec``'s ``model`` is built from
``--model``, ``--hidden``, ``--image-shape`` and ``--model-kwargs``; docs/models.md)."""


def job_spec_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``JobSpec`` fields of ``values`` (field → value, one per :data:`JOB_OPTIONS`).

    A required field is always there; another only when it differs from its default
    (its absence means the default) and is not ``None``.
    """
    return {
        o.field: values[o.field]
        for o in JOB_OPTIONS
        if o.required or (values[o.field] != o.default and values[o.field] is not None)
    }


def check_job_options(values: Mapping[str, Any]) -> None:
    """Refuse an out-of-range option of ``values`` (field → value) in one line.

    Raises
    ------
    meshfl.errors.ConfigError
        ``--param must be RULE (got VALUE)`` for the first value that fails its check.

    """
    for o in JOB_OPTIONS:
        value = values[o.field]
        if o.check is not None and not o.check(value):
            raise ConfigError(f"{o.flag} must be {o.rule} (got {value!r})")


def spec_value(spec: Mapping[str, Any], field: str) -> Any:
    """``spec[field]``, or the job option's default when the spec leaves it out."""
    return spec.get(field, JOB_DEFAULTS[field])
