"""Reports: what devices post about a job (metrics, done, decline) and how it reads back."""

from __future__ import annotations

from typing_extensions import NotRequired, TypedDict

from meshfl.contract._schema import strict, strict_request
from meshfl.contract.ledger import RoundLedger

__all__ = [
    "DeviceDecline",
    "DeviceDone",
    "DeviceRoundMetrics",
    "DeviceRoundReport",
    "JobDeviceMetrics",
    "RoundMetrics",
    "RoundSummary",
]


@strict_request
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


@strict_request
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


@strict_request
class DeviceDecline(TypedDict):
    """Why a device cannot take part in a job (its data does not fit the model, ...)."""

    reason: str


@strict
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


@strict
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


@strict
class DeviceRoundReport(TypedDict):
    """One device's report of one round, as stored (``GET /jobs/{id}/reports``)."""

    device_id: str
    round: int
    accuracy: float
    bytes_sent: int
    elapsed_s: float  # since the job started, by the coordinator's clock, when received


@strict
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
