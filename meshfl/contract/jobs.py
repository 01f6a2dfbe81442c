"""Jobs: a job's options (:class:`JobSpec`), its state, and a device's assignment (``/jobs``)."""

from __future__ import annotations

from typing import Literal

from typing_extensions import NotRequired, TypedDict

from meshfl.contract._schema import strict, strict_request
from meshfl.contract.models import ModelSpec
from meshfl.contract.topology import CustomGraph, DevicePlan, Neighbour

__all__ = [
    "JOB_MODES",
    "JOB_TOPOLOGIES",
    "Assignment",
    "DeviceSelector",
    "JobDevicePublic",
    "JobPublic",
    "JobSpec",
    "JobStatus",
]

JOB_TOPOLOGIES = (
    "ring",
    "torus",
    "exponential",
    "one-peer-exponential",
    "random-regular",
    "erdos-renyi",
    "small-world",
    "star",
    "complete",
    "custom",
)
"""Topology names a job accepts. ``custom`` takes its graph from ``JobSpec.custom_graph``
(the CLI reads it from a JSON edge-list file); ``one-peer-exponential`` is time-varying:
round r uses :func:`meshfl.topology.one_peer_exponential` ``(n, r)``."""


JOB_MODES = ("sync", "async")
"""``sync``: every round waits for the neighbours (up to the quorum and the deadline);
``async``: AD-PSGD-style, a device mixes what its neighbours last sent, waiting only for
a neighbour whose latest message is more than ``staleness`` rounds old."""


JobStatus = Literal["created", "running", "paused", "completed", "failed", "stopped"]
"""``paused``: devices finish the rounds before the job's ``pause_round`` and wait there
until it is resumed (``running`` again) or stopped (docs/fleet.md, "Jobs")."""


@strict_request
class JobSpec(TypedDict):
    """Everything a device needs to run its part of a job.

    ``codec`` is a codec spec string (``identity``, ``topk:0.1``); ``topology`` is
    one of :data:`JOB_TOPOLOGIES`; ``consensus_step`` is CHOCO-SGD's
    γ (ignored by D-PSGD); ``devices`` is how many live, idle devices the job needs (0: all
    of them at start); ``test_data`` is a path each device resolves locally
    (``None``: the device evaluates on the ``x_test``/``y_test`` arrays of its own file);
    ``sketch_dim`` is the size of the count sketch used to estimate consensus distance
    (0 disables it); ``keyframe_growth`` makes a CHOCO-SGD message a lossless
    keyframe when the device's relative compression error exceeds this many times its
    normal level (the median of its first 10 messages; 0 or absent: never);
    ``dense_below`` sends tensors with fewer elements uncompressed (biases, norms; 0 or
    absent: none); ``byte_budget`` (bytes per message, 0 or absent: none) sets a top-k or
    random-k codec's density to the largest that fits; ``local_momentum`` is the
    trainer's momentum β in [0, 1), its buffer kept across rounds (0 or absent: plain
    SGD), applied as ``momentum_kind`` says: ``heavy-ball`` (the default) or
    ``quasi-global`` (:mod:`edge_agent.local_step`).

    A spec without ``topology`` takes the fleet's default topology setting
    (``GET /topology``): its kind and those of its parameters (``topology_degree``,
    ``topology_probability``, ``topology_seed``, ``mixing``, ``custom_graph``) the spec
    does not set; the stored job always carries ``topology``. ``select`` keeps the start
    (and elastic joins) to active devices matching a :class:`DeviceSelector`.
    """

    name: str
    model: ModelSpec
    algorithm: Literal["choco", "dpsgd"]
    codec: str
    topology: NotRequired[str]  # one of JOB_TOPOLOGIES [the fleet default, see below]
    rounds: int
    learning_rate: float
    batch_size: int
    local_epochs: int
    consensus_step: float
    round_deadline_s: float
    max_payload_bytes: int
    seed: int
    devices: int
    test_data: str | None
    sketch_dim: int
    keyframe_growth: NotRequired[float]
    dense_below: NotRequired[int]
    byte_budget: NotRequired[int]
    local_momentum: NotRequired[float]  # heavy ball β of the local SGD, in [0, 1) [0: off]
    # How local_momentum applies (issue 22): heavy ball on local gradients, or quasi-global
    # momentum (Lin et al., ICML 2021) following the mixed model's change [heavy-ball].
    momentum_kind: NotRequired[Literal["heavy-ball", "quasi-global"]]
    # Topology parameters (issue 4); absent: the defaults in brackets.
    topology_degree: NotRequired[int]  # random-regular degree, small-world k [4]
    topology_probability: NotRequired[float]  # erdos-renyi p, small-world rewiring [0.3]
    topology_seed: NotRequired[int]  # seed of the random builders [spec.seed]
    mixing: NotRequired[Literal["metropolis-hastings", "max-degree"]]  # [metropolis-hastings]
    custom_graph: NotRequired[CustomGraph]  # required when topology == "custom"
    # Rounds (issue 4).
    mode: NotRequired[Literal["sync", "async"]]  # [sync]
    staleness: NotRequired[int]  # async: τ, the oldest usable neighbour round lag [2]
    quorum: NotRequired[float]  # proceed once ceil(quorum·d) neighbours answered [1.0]
    # Planning and churn (issue 4).
    plan: NotRequired[bool]  # capability-aware planning [False]
    uplink_budget_s: NotRequired[float]  # planner: seconds of uplink per message [0.05]
    min_battery_percent: NotRequired[float]  # below it (not charging): sit out [0: off]
    elastic: NotRequired[bool]  # admit idle devices that appear mid-job [False]
    # Model artifacts (issue 8).
    publish_model: NotRequired[bool]  # devices upload their final model.onnx at the end [False]
    # Privacy and robustness (issue 5); see meshfl.aggregation.privacy and docs/privacy.md.
    secure_aggregation: NotRequired[int]  # threshold t of per-neighbourhood SecAgg [0: off]
    secure_range: NotRequired[float]  # fixed-point range ±R of a masked coordinate [1.0]
    dp_noise_multiplier: NotRequired[float]  # σ; 0 or absent: no differential privacy
    dp_clip: NotRequired[float]  # C, the L2 clipping norm of a released delta
    dp_mode: NotRequired[Literal["local", "distributed"]]  # where the noise is added [local]
    dp_delta: NotRequired[float]  # δ of the (ε, δ) guarantee [1e-5]
    dp_epsilon_budget: NotRequired[float]  # ε_max per device, over all its jobs [0: none]
    # The unit of privacy (issue 22): "device" (σ, C on each released delta) or "record"
    # (DP-SGD in the trainer: per-sample clipping to C, noise σC per minibatch) [device].
    dp_unit: NotRequired[Literal["device", "record"]]
    robust: NotRequired[str]  # "median", "trimmed:β", "clipped-gossip" [plain mixing]
    # Signed deltas (issue 6): every envelope Ed25519-signed by its sender, verified by
    # receivers against Assignment.peer_keys; needs every participant enrolled with an
    # identity_key [True]. See docs/security.md.
    signed_deltas: NotRequired[bool]
    # Fleet management (issue 6): start only on active devices matching this [all devices].
    select: NotRequired[DeviceSelector]


@strict_request
class DeviceSelector(TypedDict, total=False):
    """Which devices a job may run on (``JobSpec.select``; every field given must hold).

    ``tags``: the device carries every one of them; the ``min_*`` fields compare with the
    device's latest capability profile (a device that did not report the field does not
    match). Only devices in state ``active`` are ever selected.
    """

    tags: list[str]
    min_cores: int
    min_memory_bytes: int
    min_train_samples_per_s: float
    min_uplink_bytes_per_s: float  # bytes per second


@strict
class Assignment(TypedDict):
    """A device's part in a running job: its neighbours and mixing weights (row i of W).

    The row belongs to topology ``topology_version``, in force from round ``from_round``;
    ``devices`` lists the version's devices by position in W (``position`` is this
    device's), which time-varying kinds need to build each round's graph.
    ``start_round`` is the first round this device runs (> 1: it joined mid-job).
    """

    job_id: str
    fleet: str
    status: JobStatus
    spec: JobSpec
    index: int
    self_weight: float
    neighbours: list[Neighbour]
    topology_version: int
    from_round: int
    position: int
    devices: list[str]
    start_round: int
    plan: DevicePlan
    # Signed deltas (issue 6): device id → Ed25519 identity key (raw 32 bytes, base64) of
    # every device of this topology version that enrolled with one.
    peer_keys: dict[str, str]
    # Paused jobs (issue 6): the first round that must not start while ``status`` is
    # ``paused``; present only then.
    pause_round: NotRequired[int]


@strict
class JobDevicePublic(TypedDict):
    """One device's part in a job, as operators see it."""

    device_id: str
    name: str
    index: int
    rounds_reported: int
    missing_rounds: list[int]
    final_accuracy: float | None
    bytes_sent: int
    bytes_received: int
    done: bool
    error: str | None  # the reason a device declined the job
    isolated_rounds: list[int]  # rounds it reported without hearing from any neighbour
    # Issue 25: rounds in which a neighbour mixed without this device's delta
    unmixed_rounds: NotRequired[list[int]]
    joined_round: int  # first round it ran (1, or later for a device that joined)
    left_round: int | None  # first round it no longer took part in (None: stayed)
    plan: DevicePlan
    onnx_path: NotRequired[str | None]  # from its DeviceDone, when it reported one
    onnx_max_abs_diff: NotRequired[float | None]
    # ε this job spent on the device at the job's δ (issue 5); None: not a DP job.
    epsilon_spent: NotRequired[float | None]
    # The unit that ε is for: "device" or "record" (issue 22); None: not a DP job.
    privacy_unit: NotRequired[str | None]


@strict
class JobPublic(TypedDict):
    """A job as operators see it."""

    job_id: str
    status: JobStatus
    spec: JobSpec
    created_at: float
    started_at: float | None
    finished_at: float | None
    devices: list[JobDevicePublic]
    pause_round: NotRequired[int | None]  # while paused: the first round held back
