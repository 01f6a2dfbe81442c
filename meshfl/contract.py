"""The REST contract between agents, operators and the coordinator (API v1).

These ``TypedDict`` shapes are the single source of the JSON bodies: the coordinator
validates requests and documents its OpenAPI schema from them (pydantic accepts
``TypedDict``), and the agent's client builds and reads them. Units are in the field
names (``_s`` seconds, ``_bytes`` bytes).

Endpoints (all under :data:`API_PREFIX`; *device* = ``Authorization: Bearer
<device_token>``, *admin* = ``Authorization: Bearer <admin_token>``):

=======  ==========================================  =======  ======================
method   path                                        auth     body → response
=======  ==========================================  =======  ======================
POST     /devices/enrol                              token    EnrolRequest → EnrolResponse
GET      /devices                                    admin    → list[DevicePublic] (filters)
GET      /devices/{device_id}                        admin    → DevicePublic
GET      /devices/profiles                           admin    → list[DevicePublic] (alias)
PATCH    /devices/{device_id}                        admin    DevicePatch → DevicePublic
POST     /devices/{device_id}/drain                  admin    → DevicePublic
POST     /devices/{device_id}/undrain                admin    → DevicePublic
POST     /devices/{device_id}/revoke                 admin    → DevicePublic
DELETE   /devices/{device_id}                        admin    → 204
PUT      /devices/{device_id}/profile                device   CapabilityProfile → DevicePublic
GET      /devices/{device_id}/profiles               admin    → list[ProfileSample]
GET      /devices/{device_id}/assignment             device   → Assignment (204: none)
POST     /jobs                                       admin    JobSpec → JobPublic
GET      /jobs                                       admin    → list[JobPublic]
GET      /jobs/{job_id}                              admin    → JobPublic
POST     /jobs/{job_id}/start                        admin    → JobPublic
POST     /jobs/{job_id}/pause                        admin    → JobPublic (409 unless running)
POST     /jobs/{job_id}/resume                       admin    → JobPublic (409 unless paused)
POST     /jobs/{job_id}/stop                         admin    → JobPublic
GET      /jobs/{job_id}/rounds                       admin    → list[RoundSummary] (?since=R)
GET      /jobs/{job_id}/reports                      admin    → list[DeviceRoundReport]
GET      /jobs/{job_id}/devices                      admin    → list[JobDeviceMetrics]
GET      /jobs/{job_id}/devices/{device_id}/metrics  admin    → list[DeviceRoundMetrics]
GET      /jobs/{job_id}/topology                     admin    → TopologyPublic
GET      /jobs/{job_id}/ledger                       admin    → JobLedger
POST     /jobs/{job_id}/metrics                      device   RoundMetrics → 204
POST     /jobs/{job_id}/metrics/batch                device   list[RoundMetrics] → 204
POST     /jobs/{job_id}/done                         device   DeviceDone → 204
POST     /jobs/{job_id}/decline                      device   DeviceDecline → 204
PUT      /jobs/{job_id}/devices/{device_id}/model    device   ONNX bytes → ModelArtifact
GET      /jobs/{job_id}/artifacts                    admin    → JobArtifacts
GET      /jobs/{job_id}/artifacts/consensus.onnx     either   → ONNX bytes (ETag: sha256)
GET      /jobs/{job_id}/artifacts/{device_id}.onnx   admin    → ONNX bytes
GET      /topology                                   admin    → FleetTopology
PUT      /topology                                   admin    TopologySetting → FleetTopology
=======  ==========================================  =======  ======================

``GET /healthz`` (liveness) and ``GET /readyz`` (readiness: 503 problem details while the
database is unreachable or not at the Alembic head) need no auth; ``GET /metrics``
(Prometheus text) needs an operator token of any role unless the coordinator's
``metrics_public`` setting is on. All three are at the root, not under the prefix.
``.../devices/{device_id}/metrics`` is paged by ``limit`` (1..1000, default 100) and
``offset``, in round order, with ``X-Total-Count``.

Operator auth (issue 6): *admin* above means an operator credential — the settings'
admin token or an API token (``/tokens``) with a role: ``GET`` routes accept every role
(``read-only``, ``operator``, ``admin``), the other operator routes ``operator`` or
``admin``, and ``/tokens`` only ``admin``. An expired or revoked API token is 401.

=======  ==========================================  =======  ======================
POST     /tokens                                     admin    ApiTokenCreate → ApiTokenCreated
GET      /tokens                                     admin    → list[ApiTokenPublic]
DELETE   /tokens/{token_id}                          admin    → 204 (revoked)
POST     /enrolment-tokens                           operator EnrolmentTokenCreate → ...Created
GET      /enrolment-tokens                           operator → list[EnrolmentTokenPublic]
DELETE   /enrolment-tokens/{token_id}                operator → 204 (revoked)
=======  ==========================================  =======  ======================

Errors are RFC 9457 problem details (``application/problem+json``): ``{"type", "title",
"status", "detail", "instance"}``, ``detail`` one line naming the problem and the fix.
Request bodies reject unknown fields (422), except a ``CapabilityProfile``, whose
unknown measurements are dropped (newer agents may report more).

Model artifacts (a job with ``publish_model``): each participant PUTs its final
``model.onnx`` (``application/octet-stream``, header ``X-Content-SHA256`` = its hex
SHA-256, at most the coordinator's ``max_model_bytes``); the consensus model is the
parameter mean of the uploaded models. ``consensus.onnx`` accepts the admin token or the
token of any device of the fleet, and ``latest`` for ``{job_id}`` (the most recently
finished job with a consensus model); it answers ``ETag: "<sha256>"`` and
``X-Meshfl-Job-Id``, and 304 to a matching ``If-None-Match``.

``GET /devices/{device_id}/assignment`` may add an idle device to the latest running
``elastic`` job (a join: a new topology version); ``PUT .../profile`` may remove a
participant whose battery fell below its job's ``min_battery_percent`` (a leave). Every
topology version is also pushed, retained, on ``meshfl/v1/{fleet}/control`` as JSON
``{"job", "version", "from_round", "kind", "devices", "edges", "status"}``: the graph's
edges as position pairs, not W (each agent computes its row of W from them under the
job's ``mixing`` rule).

``GET /devices`` (and its older alias ``/devices/profiles``) is the fleet view: every
device with its latest profile, in enrolment order, optionally only those with every
``tag`` given, in a ``state``, ``online``/``offline`` (``status``), or whose profile
reports ``min_cores``/``max_cores``, ``min_memory_bytes``/``max_memory_bytes``,
``min_train_samples_per_s`` or ``min_uplink_bytes_per_s`` (a device that did not report
the field does not match), paged by ``limit`` (1..1000, default 100) and ``offset``; the
``X-Total-Count`` header counts every match. ``drain``, ``revoke`` and ``DELETE`` take a
device out of its running jobs (a new topology version; docs/fleet.md, "Devices").
``GET /devices/{device_id}/profiles`` is one device's profile history, newest first, paged
the same way; ``since`` (unix seconds) keeps samples received at or after it. Every
``PUT .../profile`` (and a profile sent at enrolment) appends a sample; the coordinator
keeps the latest 1000 per device.
"""

from __future__ import annotations

from typing import Any, Literal

from typing_extensions import NotRequired, TypedDict

__all__ = [
    "API_PREFIX",
    "JOB_MODES",
    "JOB_TOPOLOGIES",
    "MAX_CLASSES",
    "ApiRole",
    "ApiTokenCreate",
    "ApiTokenCreated",
    "ApiTokenPublic",
    "Assignment",
    "CapabilityProfile",
    "CustomGraph",
    "Declaration",
    "DeviceDecline",
    "DeviceDone",
    "DevicePatch",
    "DevicePlan",
    "DevicePublic",
    "DeviceRoundMetrics",
    "DeviceRoundReport",
    "DeviceSelector",
    "DeviceState",
    "EnrolRequest",
    "EnrolResponse",
    "EnrolmentTokenCreate",
    "EnrolmentTokenCreated",
    "EnrolmentTokenPublic",
    "FleetEnrolmentPublic",
    "FleetEnrolmentRotate",
    "FleetEnrolmentRotated",
    "FleetTopology",
    "JobArtifacts",
    "JobDeviceMetrics",
    "JobDevicePublic",
    "JobLedger",
    "JobPublic",
    "JobSpec",
    "JobStatus",
    "KeyBundle",
    "LedgerCounts",
    "LedgerRoundTotals",
    "LedgerRow",
    "LedgerTotals",
    "ModelArtifact",
    "ModelSpec",
    "Neighbour",
    "PrivacySpend",
    "PrivacyStatus",
    "ProfileSample",
    "RoundLedger",
    "RoundMetrics",
    "RoundSummary",
    "SecAggDirectory",
    "SignedDeclaration",
    "TopologyEdge",
    "TopologyEvent",
    "TopologyEventKind",
    "TopologyNode",
    "TopologyPublic",
    "TopologySetting",
    "enrol_proof_message",
]

API_PREFIX = "/api/v1"

MAX_CLASSES = 100_000
"""Most classes a model (``ModelSpec.num_classes``) may have; data labels must lie in
``[0, MAX_CLASSES)``."""

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

TopologyEventKind = Literal["start", "join", "leave"]

JobStatus = Literal["created", "running", "paused", "completed", "failed", "stopped"]
"""``paused``: devices finish the rounds before the job's ``pause_round`` and wait there
until it is resumed (``running`` again) or stopped (docs/fleet.md, "Jobs")."""


class CapabilityProfile(TypedDict, total=False):
    """What a device measured about itself (all fields optional).

    The coordinator refuses (422) a number that is not finite or is negative, and a
    ``battery_percent`` outside [0, 100]; ``None`` battery/charging: the device has none.
    """

    cores: int
    memory_bytes: int
    accelerator: str | None
    platform: str
    train_samples_per_s: float  # measured on the job's model and batch size
    train_samples: int  # local training samples (one epoch) for the job measured on
    model_hash: str
    uplink_bytes_per_s: float  # measured through the broker
    downlink_bytes_per_s: float  # measured through the broker
    broker_rtt_s: float  # round trip to the broker, measured through the broker
    battery_percent: float | None  # 0..100; None: no battery
    charging: bool | None  # None: no battery
    measured_at: float  # unix seconds, device clock
    role: Literal["train", "inference"]  # "inference": serve-only agent, never in a job


class ProfileSample(TypedDict):
    """One stored capability profile of a device (``GET /devices/{device_id}/profiles``)."""

    profile: CapabilityProfile
    received_at: float  # unix seconds, coordinator clock


class EnrolRequest(TypedDict):
    """Body of ``POST /devices/enrol``: the fleet's enrolment token and a device name."""

    token: str
    name: str
    profile: NotRequired[CapabilityProfile]
    # Secure aggregation (issue 5): the device's Ed25519 identity public key, raw 32 bytes
    # in standard base64; the coordinator checks per-job key bundles against it.
    identity_key: NotRequired[str]
    # Issue 23: the identity key's signature (base64) of enrol_proof_message(token, name,
    # identity_key). Needed to enrol again under a key an active device holds: the old
    # device is then revoked (its token and broker login), not left beside the new one.
    identity_proof: NotRequired[str]


class EnrolResponse(TypedDict):
    """The identity a device receives at enrolment."""

    device_id: str
    device_token: str
    fleet: str
    broker_url: str | None
    # Broker credentials (issue 6), present when the coordinator manages broker accounts:
    # the MQTT username (the device id, also its client id) and a password shown only here.
    broker_username: NotRequired[str]
    broker_password: NotRequired[str]
    # PEM of the CA that signed the broker's TLS certificate, when the coordinator has one.
    broker_ca: NotRequired[str]


DeviceState = Literal["active", "draining", "revoked"]
"""``active``: takes work; ``draining``: finishes the round it is in, then takes no new
work; ``revoked``: its device token and broker login no longer work (issue 6)."""


class DevicePublic(TypedDict):
    """A device as operators see it.

    ``online``: its latest MQTT status (``online``, or ``offline`` from a clean shutdown
    or its Last Will) when that came at or after ``last_seen``, else heard from within
    the coordinator's ``live_within_s`` seconds; ``online_source`` says which decided
    (``"last_will"`` or ``"heartbeat"``). See docs/fleet.md, "Online".
    """

    device_id: str
    name: str
    fleet: str
    profile: CapabilityProfile
    enrolled_at: float  # unix seconds
    last_seen: float  # unix seconds
    # Fleet management (issue 6).
    tags: list[str]
    labels: dict[str, str]
    state: DeviceState
    online: bool
    revoked_at: float | None  # unix seconds; None: not revoked
    online_source: NotRequired[Literal["last_will", "heartbeat"]]


class DevicePatch(TypedDict, total=False):
    """Body of ``PATCH /devices/{device_id}``: what is given replaces the stored value.

    Tags and label keys match ``[A-Za-z0-9_.:-]{1,64}``; at most 32 tags and 32 labels;
    a label value is at most 256 printable characters.
    """

    tags: list[str]
    labels: dict[str, str]


class ModelSpec(TypedDict):
    """Which model to train; agents build it from the model zoo by ``name``.

    ``name`` is a zoo model (``mlp``, ``cnn1d``, ``logreg``, ``lenet``, ``resnet``) or
    ``custom``: the agent imports ``factory`` (``"package.module:callable"``) and calls it
    with ``kwargs`` (JSON values). ``image_shape`` ``[C, H, W]`` is how 2-D models read a
    flat sample. ``hash`` (64 hex) is :func:`meshfl.modelspec.layout_hash` of the built
    model: the coordinator fills it for zoo models, a custom spec must carry it, and an
    agent that builds a different layout declines the job. See ``docs/models.md``.
    """

    name: str  # "mlp"
    input_dim: int
    num_classes: int
    hidden: list[int]
    image_shape: NotRequired[list[int]]
    factory: NotRequired[str]
    kwargs: NotRequired[dict[str, Any]]
    hash: NotRequired[str]


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
    trainer's heavy-ball momentum β in [0, 1), its buffer kept across rounds (0 or
    absent: plain SGD).

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
    robust: NotRequired[str]  # "median", "trimmed:β", "clipped-gossip" [plain mixing]
    # Signed deltas (issue 6): every envelope Ed25519-signed by its sender, verified by
    # receivers against Assignment.peer_keys; needs every participant enrolled with an
    # identity_key [True]. See docs/security.md.
    signed_deltas: NotRequired[bool]
    # Fleet management (issue 6): start only on active devices matching this [all devices].
    select: NotRequired[DeviceSelector]


class CustomGraph(TypedDict):
    """An uploaded graph: ``n`` nodes ``0..n-1`` and undirected ``edges`` ``[i, j]``."""

    n: int
    edges: list[list[int]]  # pairs [i, j] (JSON arrays)


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


class TopologySetting(TypedDict):
    """The fleet's default topology (``PUT /topology``); the names are ``JobSpec``'s.

    Absent parameters take the job defaults (degree 4, probability 0.3, the job's seed —
    0 in the fleet preview —, Metropolis–Hastings). ``custom_graph`` is required with
    ``topology`` ``custom`` and refused otherwise.
    """

    topology: str
    topology_degree: NotRequired[int]
    topology_probability: NotRequired[float]
    topology_seed: NotRequired[int]
    mixing: NotRequired[Literal["metropolis-hastings", "max-degree"]]
    custom_graph: NotRequired[CustomGraph]


class TopologyNode(TypedDict):
    """A device in the fleet graph and its self weight w_ii."""

    device_id: str
    name: str
    self_weight: float


class TopologyEdge(TypedDict):
    """An undirected edge of the fleet graph and its mixing weight w_ij (= w_ji)."""

    source: str  # device id
    target: str  # device id
    weight: float


class FleetTopology(TypedDict):
    """``GET /topology``: the default setting and the graph it gives the fleet now.

    The graph is built over the live (heard from within ``live_within_s``), ``active``
    devices ordered by name then id, as a job starting on all of them would get it;
    ``spectral_gap`` is 1 − |λ₂(W)|. ``error`` says why no graph could be built for that
    many devices (``nodes`` and ``edges`` are then empty and ``spectral_gap`` ``None``), or
    that the graph is disconnected (shown, with its gap 0: a job would not start on it).
    ``updated_at`` is ``None`` while the built-in default (a ring) is in force.
    """

    setting: TopologySetting
    updated_at: float | None  # unix seconds, coordinator clock
    nodes: list[TopologyNode]
    edges: list[TopologyEdge]
    spectral_gap: float | None
    error: str | None


class DevicePlan(TypedDict):
    """What the planner gave one device (all devices get one; defaults without ``plan``).

    ``work_fraction`` in (0, 1] scales the local work of a round (local steps =
    max(1, round(work_fraction · steps of ``local_epochs`` epochs))); ``byte_budget``
    (bytes per message, 0: none) caps a top-k/random-k codec's density for this device;
    ``no_wait`` (absent: none) lists neighbours behind slow links whose latest state the
    device mixes (within ``staleness`` rounds) without waiting for it.
    """

    work_fraction: float
    byte_budget: int
    no_wait: NotRequired[list[str]]  # slow-link neighbours a sync round does not wait for


class TopologyEvent(TypedDict):
    """One change of a running job's topology: a new version from ``from_round`` on."""

    version: int
    from_round: int
    kind: TopologyEventKind
    device_id: str | None  # the device that joined or left (None for "start")
    reason: str  # "started", "joined", "silent for 15 s", "battery 12% < 20%", ...
    at: float  # unix seconds, coordinator clock


class Neighbour(TypedDict):
    """One neighbour of a device and its mixing weight w_ij."""

    device_id: str
    weight: float


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


class RoundMetrics(TypedDict):
    """What a device reports after each round (``POST /jobs/{id}/metrics``; idempotent)."""

    round: int
    accuracy: float
    loss: float
    bytes_sent: int  # payload bytes published this round, chunk headers included
    bytes_received: int  # payload bytes delivered to the device this round
    missing: list[str]  # neighbours whose delta did not arrive before the deadline
    sketch: list[float]  # count sketch of the model, for the consensus-distance estimate
    train_s: float
    round_s: float
    # Signed jobs (issue 6): envelopes refused this round — unsigned, bad signature (or
    # a sender without a key), replayed (sequence or round already used up).
    rejected_unsigned: NotRequired[int]
    rejected_signature: NotRequired[int]
    rejected_replayed: NotRequired[int]
    # Issue 7: the round's delivery ledger (agents before it send none).
    ledger: NotRequired[RoundLedger]


class RoundLedger(TypedDict):
    """One device's delivery ledger for one round (docs/reliability.md defines each count).

    Counts of gossip envelopes since the device's previous report, except
    ``duplicates`` (repeated chunks and repeated envelopes dropped) and ``unrepaired``
    (a gauge: messages awaiting repair at the end of the round).
    """

    sent: int  # envelopes this device published
    delivered: int  # envelopes of this job that reached it and decoded
    applied: int  # envelopes applied to a replica (exactly once by (sender, sequence))
    duplicates: int
    rejected_malformed: int  # delta-topic payloads that did not decode (CRC, truncated)
    rejected_signature: int
    rejected_unsigned: int
    rejected_replayed: int
    rejected_stale: int  # a D-PSGD model older than the one held
    rejected_other: int  # misrouted, from a former peer, or not fitting the model
    # refused before being held: a round past the window, over the sender's quota, a full
    # receive queue (edge_agent.mailbox); absent from older agents
    rejected_quota: NotRequired[int]
    missing: int  # sequence numbers skipped: a later one of the same sender came first
    awaiting_keyframe: int  # arrived, but the sender's replica needs a keyframe first
    # missing or awaiting messages applied after all (late); absent from older agents: 0
    delivered_late: NotRequired[int]
    recovered_by_keyframe: int  # missing or awaiting messages repaired by a full state
    lost: int  # missing or awaiting messages given up on (last round, or peer dropped)
    unrepaired: int
    applied_twice: int  # (sender, sequence) pairs applied again: 0 unless a bug
    # envelopes this device re-sent on neighbours' repair requests; absent from older agents
    retransmitted: NotRequired[int]
    # Issue 25 (absent from older agents): this device's last sequence number, and what
    # became of each tracked sender's sequence numbers here so far (cumulative).
    sequence: NotRequired[int]
    peers: NotRequired[dict[str, PeerLedger]]


class PeerLedger(TypedDict):
    """What became of one sender's sequence numbers at one receiver, so far.

    ``heard`` counts the numbers up to ``high`` (the highest that arrived) from where the
    receiver started counting; each is exactly one of ``applied``, ``recovered`` (by a
    keyframe), ``lost``, ``unrepaired`` or ``discarded`` (arrived, never applied nor
    repaired). docs/reliability.md.
    """

    high: int
    heard: int
    # 1: still the receiver's peer; 0: a former one (its later numbers were not for it)
    tracked: NotRequired[int]
    applied: int
    recovered: int
    lost: int
    unrepaired: int
    discarded: int


class DeviceDone(TypedDict):
    """What a device reports when it finished the job."""

    final_accuracy: float
    bytes_sent: int
    bytes_received: int
    model_path: str
    # The final model exported to ONNX next to model_path (None: the export failed) and
    # max |logit(torch) - logit(onnxruntime)| on the device's test inputs (None: not
    # measured). See docs/onnx.md.
    onnx_path: NotRequired[str | None]
    onnx_max_abs_diff: NotRequired[float | None]


class DeviceDecline(TypedDict):
    """Why a device cannot take part in a job (its data does not fit the model, ...)."""

    reason: str


class DeviceRoundMetrics(TypedDict):
    """One device's stored report of one round (``GET /jobs/{id}/devices/{device}/metrics``)."""

    round: int
    accuracy: float
    loss: float
    bytes_sent: int
    bytes_received: int
    missing: list[str]
    train_s: float
    round_s: float
    received_at: float  # unix seconds, coordinator clock
    # Signed jobs (issue 6): the round's refused envelopes, as the device reported them.
    rejected_unsigned: NotRequired[int]
    rejected_signature: NotRequired[int]
    rejected_replayed: NotRequired[int]


class JobDeviceMetrics(TypedDict):
    """One participant's totals in a job (``GET /jobs/{id}/devices``).

    ``latest_round``/``latest_accuracy`` are its highest reported round and that round's
    accuracy (``None``: no report yet); byte totals are its done report's when it finished,
    else the sum of its round reports; ``epsilon_spent`` is ``None`` for a job without DP.
    """

    device_id: str
    name: str
    joined_round: int
    left_round: int | None
    done: bool
    rounds_reported: int
    latest_round: int | None
    latest_accuracy: float | None
    final_accuracy: float | None
    bytes_sent: int
    bytes_received: int
    epsilon_spent: float | None


class DeviceRoundReport(TypedDict):
    """One device's report of one round, as stored (``GET /jobs/{id}/reports``)."""

    device_id: str
    round: int
    accuracy: float
    bytes_sent: int
    elapsed_s: float  # since the job started, by the coordinator's clock, when received


class RoundSummary(TypedDict):
    """One round aggregated over the devices that reported it."""

    round: int
    mean_accuracy: float
    min_accuracy: float
    consensus_distance: float | None
    bytes_sent: int
    bytes_received: int
    elapsed_s: float  # since the job started, by the coordinator's clock
    devices_reporting: int
    missing_devices: list[str]


class LedgerCounts(TypedDict):
    """The delivery-ledger counts every ledger view carries (docs/reliability.md).

    The fields of :class:`RoundLedger` (``delivered_late`` always present) plus
    ``rejected``, the six ``rejected_*`` counts summed.
    """

    sent: int
    delivered: int
    applied: int
    duplicates: int
    rejected: int
    rejected_malformed: int
    rejected_signature: int
    rejected_unsigned: int
    rejected_replayed: int
    rejected_stale: int
    rejected_other: int
    rejected_quota: int
    missing: int
    awaiting_keyframe: int
    delivered_late: int
    recovered_by_keyframe: int
    lost: int
    unrepaired: int
    applied_twice: int
    retransmitted: int


class LedgerRoundTotals(LedgerCounts):
    """A round's delivery ledger summed over the devices that reported one.

    ``unrepaired`` is summed too; ``devices_reporting`` counts the reports.
    """

    round: int
    devices_reporting: int


class LedgerRow(LedgerCounts):
    """One device's delivery ledger for one round, as it reported it (plus ``rejected``)."""

    device_id: str
    name: str
    round: int


class LedgerTotals(LedgerCounts):
    """A job's delivery ledger over the whole run (docs/reliability.md).

    Sums of every reported round, except: ``unrepaired`` sums each device's latest
    report; ``unrecovered_losses`` = ``lost`` + ``unrepaired``. ``applied_twice`` is
    measured by each device (an independent ``(sender, sequence)`` set; 0 unless a
    bug); ``corrupted_applied`` is 0 by construction: an envelope exists only after its
    CRC-32 (and, in a signed job, its Ed25519 signature) checked out, and what failed
    is counted in ``rejected_malformed`` / ``rejected_signature``.
    """

    devices_reporting: int
    rounds_reported: int
    unrecovered_losses: int
    corrupted_applied: int


class JobLedger(TypedDict):
    """``GET /jobs/{id}/ledger``: per device and round, per-round totals, run totals.

    Only round reports that carry a ledger count (agents before issue 7 send none).
    """

    job_id: str
    rows: list[LedgerRow]  # by round, then device index
    rounds: list[LedgerRoundTotals]  # by round
    totals: LedgerTotals
    # Issue 25: per (sender, receiver), from the devices' latest reports (absent: no
    # device reported per-sender counts).
    derived: NotRequired[LedgerDerived]


class LedgerPair(TypedDict):
    """What became of one sender's messages at one neighbour (docs/reliability.md).

    ``addressed`` = ``applied + recovered + lost + unrepaired + discarded + unaccounted``
    exactly; ``unaccounted``: numbers the sender used after the last one the receiver
    heard of (dropped by a broker, or sent after the receiver stopped).
    """

    sender: str
    receiver: str
    addressed: int
    applied: int
    recovered: int
    lost: int
    unrepaired: int
    discarded: int
    unaccounted: int


class LedgerDerived(TypedDict):
    """Every (sender, receiver) pair's :class:`LedgerPair` and their sums."""

    pairs: list[LedgerPair]
    sent: int  # the senders' sequence numbers used, summed (reported ``sent``)
    addressed: int
    applied: int
    recovered: int
    lost: int
    unrepaired: int
    discarded: int
    unaccounted: int


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


class TopologyPublic(TypedDict):
    """The job's current graph: edges, the mixing matrix W (row-major, by position).

    ``version`` counts changes (1 at start); it is in force from round ``from_round``;
    ``events`` lists every change so far, oldest first. For ``one-peer-exponential`` the
    edges and W are the union graph's (each round uses one of its matchings).
    """

    kind: str
    devices: list[str]
    edges: list[tuple[int, int]]
    mixing_matrix: list[list[float]]
    spectral_gap: float
    version: int
    from_round: int
    events: list[TopologyEvent]


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


class ModelArtifact(TypedDict):
    """A model file the coordinator keeps for a job: one device's upload or the consensus.

    ``name`` is the device id or ``"consensus"``; ``sha256`` (hex) and ``size_bytes`` are
    ``None`` for a consensus that could not be built, and ``error`` says why; ``devices``
    are the device ids a consensus averages (a device artifact: its own id).
    """

    name: str
    sha256: str | None
    size_bytes: int | None
    created_at: float  # unix seconds, coordinator clock
    devices: list[str]
    error: str | None


class JobArtifacts(TypedDict):
    """``GET /jobs/{job_id}/artifacts``: the uploaded device models and the consensus."""

    job_id: str
    status: JobStatus
    devices: list[ModelArtifact]
    consensus: ModelArtifact | None  # None: no device model uploaded yet


class KeyBundle(TypedDict):
    r"""A device's public keys for one secure-aggregation job (``PUT .../secagg/keys/{device}``).

    ``c_pk`` is the X25519 public key that seals Shamir shares (raw 32 bytes, standard
    base64); ``s_pks`` the per-round X25519 masking public keys of rounds ``1..rounds``,
    concatenated raw 32-byte keys (``rounds × 32`` bytes, base64); ``signature`` the
    device's Ed25519 identity signature over ``b"meshfl-keybundle-v1\0" + job + b"\0" +
    device + b"\0" + c_pk raw + s_pks raw`` (base64). See ``docs/privacy.md``.
    """

    device: str
    job: str
    c_pk: str
    s_pks: str
    signature: str


class SecAggDirectory(TypedDict):
    """The job's authenticated public-key directory (``GET .../secagg/directory``).

    ``coordinator_key`` is the coordinator's Ed25519 public key (raw 32 bytes, base64),
    which signs declarations; ``identity_keys`` maps each current participant that has
    one to its Ed25519 identity key; ``neighbourhoods`` maps each current participant to
    its sorted neighbour ids N(i); ``complete``: every current participant uploaded its
    bundle.
    """

    job_id: str
    threshold: int
    coordinator_key: str
    identity_keys: dict[str, str]
    bundles: dict[str, KeyBundle]
    neighbourhoods: dict[str, list[str]]
    complete: bool


class Declaration(TypedDict):
    """An aggregator's survivors and dropouts of one round (Bonawitz et al. 2017, round 3).

    ``survivors`` ∪ ``dropped`` is the aggregator's neighbourhood N(i), disjoint, both
    sorted; ``aborted`` is ``len(survivors) < threshold`` (nothing is reconstructed).
    """

    job: str
    round: int
    aggregator: str
    survivors: list[str]
    dropped: list[str]
    aborted: bool


class SignedDeclaration(TypedDict):
    """A declaration signed by the coordinator (first write wins).

    ``signature`` is Ed25519 (base64) over ``json.dumps(declaration, sort_keys=True,
    separators=(",", ":")).encode()``, checked with ``SecAggDirectory.coordinator_key``.
    """

    declaration: Declaration
    signature: str


class PrivacySpend(TypedDict):
    """Body of ``POST .../privacy/{device_id}/spend``: the DP releases of one round.

    ``releases`` noised releases clipped to C in round ``round`` (1 with local DP;
    under secure aggregation one per aggregator, i.e. the device's degree). ``new_run``
    (default false): the first spend of a run of the agent on this job (a start or a
    restart); if the round was already recorded, an earlier run may have released a
    differently noised delta for it, so the coordinator counts these releases again.
    """

    round: int
    releases: int
    new_run: NotRequired[bool]


class PrivacyStatus(TypedDict):
    """A device's privacy spend: ε over all its jobs' releases at ``delta`` (RDP accountant).

    ``epsilon_budget``: the ε_max that applies (``None``: not capped); ``releases``: the
    releases accounted so far, over all its jobs.
    """

    device_id: str
    epsilon_spent: float
    delta: float
    epsilon_budget: float | None
    releases: int


ApiRole = Literal["admin", "operator", "read-only"]
"""An API token's role: ``admin`` everything (token management included), ``operator``
reads and changes devices, jobs and topology, ``read-only`` only reads."""


class ApiTokenCreate(TypedDict):
    """Body of ``POST /tokens`` (admin).

    ``ttl_s``: seconds of life (at most ten years), absent or ``None``: never expires;
    ``name``: a label (at most 200 printable characters).
    """

    role: ApiRole
    name: NotRequired[str]
    ttl_s: NotRequired[float | None]


class ApiTokenPublic(TypedDict):
    """An API token as listed (never its secret)."""

    token_id: str
    name: str
    role: ApiRole
    status: Literal["active", "expired", "revoked"]
    created_at: float  # unix seconds, coordinator clock
    expires_at: float | None  # unix seconds; None: never
    revoked_at: float | None  # unix seconds; None: not revoked


class ApiTokenCreated(ApiTokenPublic):
    """``POST /tokens``' answer: the record and ``token``, the secret (shown only here)."""

    token: str


class EnrolmentTokenCreate(TypedDict, total=False):
    """Body of ``POST /enrolment-tokens`` (operator); every field is optional.

    ``ttl_s`` seconds it stays valid (default 3600, at most 30 days); ``uses`` how many
    devices it may enrol (default 1: one-time; at most 10,000); ``tags`` given to each
    device it enrols (``[A-Za-z0-9_.:-]{1,64}``, at most 32); ``name`` a label.
    """

    ttl_s: float
    uses: int
    tags: list[str]
    name: str


class EnrolmentTokenPublic(TypedDict):
    """An enrolment token as listed (never its secret)."""

    token_id: str
    name: str
    tags: list[str]
    uses: int  # the quota it was created with
    uses_left: int
    status: Literal["active", "expired", "used up", "revoked"]
    created_at: float  # unix seconds, coordinator clock
    expires_at: float  # unix seconds
    revoked_at: float | None  # unix seconds; None: not revoked


class EnrolmentTokenCreated(EnrolmentTokenPublic):
    """``POST /enrolment-tokens``' answer: the record and ``token``, shown only here."""

    token: str


class FleetEnrolmentRotate(TypedDict, total=False):
    """Body of ``POST /enrolment-tokens/fleet/rotate``; every field optional.

    ``ttl_s`` seconds the new secret stays valid (omitted: never expires); ``uses`` how
    many devices it may enrol (omitted: unlimited).
    """

    ttl_s: float
    uses: int


class FleetEnrolmentPublic(TypedDict):
    """The fleet's shared enrolment token (never its secret), ``GET /enrolment-tokens/fleet``.

    ``status`` ``off``: no fleet token (the coordinator was started without
    ``--enrol-token`` and none was rotated in); ``uses``/``uses_left`` ``None``:
    unlimited; ``expires_at`` ``None``: never. Times are unix seconds.
    """

    status: Literal["active", "disabled", "expired", "used up", "off"]
    uses: int | None
    uses_left: int | None
    created_at: float | None
    expires_at: float | None
    disabled_at: float | None


class FleetEnrolmentRotated(FleetEnrolmentPublic):
    """``POST /enrolment-tokens/fleet/rotate``'s answer: ``token``, shown only here."""

    token: str


def enrol_proof_message(token: str, name: str, identity_key: str) -> bytes:
    """The bytes a device signs with its identity key to prove it holds it at enrolment.

    The context ``meshfl-enrol-v1`` and a NUL, the SHA-256 digest of ``token`` (32 raw
    bytes), ``name``, a NUL and ``identity_key`` (base64 text), UTF-8:
    bound to the enrolment token presented and the name, so a proof seen once does not
    enrol under another token (``EnrolRequest.identity_proof``).
    """
    import hashlib

    digest = hashlib.sha256(token.encode()).digest()
    return b"meshfl-enrol-v1\0" + digest + name.encode() + b"\0" + identity_key.encode()


_REQUEST_BODIES = frozenset(
    {
        "ApiTokenCreate",
        "CustomGraph",
        "Declaration",
        "DeviceDecline",
        "DeviceDone",
        "DevicePatch",
        "DeviceSelector",
        "EnrolRequest",
        "EnrolmentTokenCreate",
        "FleetEnrolmentRotate",
        "JobSpec",
        "KeyBundle",
        "ModelSpec",
        "PrivacySpend",
        "RoundLedger",
        "RoundMetrics",
        "TopologySetting",
    }
)
"""Request bodies (and their parts) that refuse unknown fields: a misspelt option
(``dp_noise_multipler``) is a 422, not silently ignored. ``CapabilityProfile`` is left
out on purpose: unknown measurements are dropped, so a newer agent still enrols."""


def _strict_bodies() -> None:
    """Make every schema above strict for pydantic: ``true`` is not 1, ``"8"`` is not 8.

    pydantic (the coordinator's FastAPI) reads ``__pydantic_config__`` from a TypedDict;
    setting it as a plain dict keeps this module free of pydantic. Integers are still
    accepted where a float is expected. The :data:`_REQUEST_BODIES` also forbid extra
    keys (``extra="forbid"``: 422, and ``additionalProperties: false`` in the OpenAPI).
    """
    import typing_extensions

    for name, value in list(globals().items()):
        if isinstance(value, type) and typing_extensions.is_typeddict(value):
            config: dict[str, object] = {"strict": True}
            if name in _REQUEST_BODIES:
                config["extra"] = "forbid"
            value.__pydantic_config__ = config  # type: ignore[attr-defined]


_strict_bodies()
