"""Model artifacts: the devices' final models and the consensus (``/jobs/{job_id}/artifacts``)."""

from __future__ import annotations

from typing_extensions import TypedDict

from meshfl.contract._schema import strict
from meshfl.contract.jobs import JobStatus

__all__ = ["JobArtifacts", "ModelArtifact"]


@strict
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


@strict
class JobArtifacts(TypedDict):
    """``GET /jobs/{job_id}/artifacts``: the uploaded device models and the consensus."""

    job_id: str
    status: JobStatus
    devices: list[ModelArtifact]
    consensus: ModelArtifact | None  # None: no device model uploaded yet
