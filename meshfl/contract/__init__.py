"""The REST contract between agents, operators and the coordinator (API v1).

One module per resource (:mod:`~meshfl.contract.devices`, :mod:`~meshfl.contract.jobs`,
:mod:`~meshfl.contract.topology`, :mod:`~meshfl.contract.reports`,
:mod:`~meshfl.contract.ledger`, :mod:`~meshfl.contract.artifacts`,
:mod:`~meshfl.contract.secagg`, :mod:`~meshfl.contract.privacy`,
:mod:`~meshfl.contract.tokens`, :mod:`~meshfl.contract.models`) and a job's options, defined
once (:mod:`~meshfl.contract.job_options`); every public name is
re-exported here, so ``from meshfl.contract import JobSpec`` is the way to import it.
How the shapes validate under pydantic: :mod:`meshfl.contract._schema`.

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

from meshfl.contract.artifacts import JobArtifacts, ModelArtifact
from meshfl.contract.devices import (
    CapabilityProfile,
    DevicePatch,
    DevicePublic,
    DeviceState,
    EnrolRequest,
    EnrolResponse,
    ProfileSample,
    enrol_proof_message,
)
from meshfl.contract.job_options import (
    DEFAULT_MODEL,
    JOB_DEFAULTS,
    JOB_OPTIONS,
    LAUNCHER_DEFAULTS,
    LAUNCHER_OVERRIDES,
    JobOption,
    check_job_options,
    job_spec_fields,
    spec_value,
)
from meshfl.contract.jobs import (
    JOB_MODES,
    JOB_TOPOLOGIES,
    Assignment,
    DeviceSelector,
    JobDevicePublic,
    JobPublic,
    JobSpec,
    JobStatus,
)
from meshfl.contract.ledger import (
    JobLedger,
    LedgerCounts,
    LedgerDerived,
    LedgerPair,
    LedgerRoundTotals,
    LedgerRow,
    LedgerTotals,
    PeerLedger,
    RoundLedger,
)
from meshfl.contract.models import MAX_CLASSES, ModelSpec
from meshfl.contract.privacy import PrivacySpend, PrivacyStatus
from meshfl.contract.reports import (
    DeviceDecline,
    DeviceDone,
    DeviceRoundMetrics,
    DeviceRoundReport,
    JobDeviceMetrics,
    RoundMetrics,
    RoundSummary,
)
from meshfl.contract.secagg import Declaration, KeyBundle, SecAggDirectory, SignedDeclaration
from meshfl.contract.tokens import (
    ApiRole,
    ApiTokenCreate,
    ApiTokenCreated,
    ApiTokenPublic,
    EnrolmentTokenCreate,
    EnrolmentTokenCreated,
    EnrolmentTokenPublic,
    FleetEnrolmentPublic,
    FleetEnrolmentRotate,
    FleetEnrolmentRotated,
)
from meshfl.contract.topology import (
    CustomGraph,
    DevicePlan,
    FleetTopology,
    Neighbour,
    TopologyEdge,
    TopologyEvent,
    TopologyEventKind,
    TopologyNode,
    TopologyPublic,
    TopologySetting,
)

__all__ = [
    "API_PREFIX",
    "DEFAULT_MODEL",
    "JOB_DEFAULTS",
    "JOB_MODES",
    "JOB_OPTIONS",
    "JOB_TOPOLOGIES",
    "LAUNCHER_DEFAULTS",
    "LAUNCHER_OVERRIDES",
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
    "JobOption",
    "JobPublic",
    "JobSpec",
    "JobStatus",
    "KeyBundle",
    "LedgerCounts",
    "LedgerDerived",
    "LedgerPair",
    "LedgerRoundTotals",
    "LedgerRow",
    "LedgerTotals",
    "ModelArtifact",
    "ModelSpec",
    "Neighbour",
    "PeerLedger",
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
    "check_job_options",
    "enrol_proof_message",
    "job_spec_fields",
    "spec_value",
]

API_PREFIX = "/api/v1"
"""The path every REST endpoint but ``/healthz``, ``/readyz`` and ``/metrics`` is under."""
