"""Shape stored rows into the REST contract's bodies (``meshfl.contract``).

Pure functions of ORM rows: no session, no clock. Round summaries aggregate the round
reports of the devices that sent one; the consensus distance (mean ‖x_i − x̄‖², here on
the devices' count sketches) comes from :func:`meshfl.aggregation.consensus_distance`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from coordinator.db import Device, DeviceProfile, Job, JobDevice, RoundMetric
from meshfl.aggregation import consensus_distance
from meshfl.contract import (
    Assignment,
    CapabilityProfile,
    DevicePublic,
    JobDevicePublic,
    JobPublic,
    JobSpec,
    JobStatus,
    Neighbour,
    ProfileSample,
    RoundSummary,
    TopologyPublic,
)

__all__ = [
    "assignment",
    "device_public",
    "job_public",
    "profile_sample",
    "round_summaries",
    "sketch_distance",
    "topology_public",
]


def device_public(device: Device) -> DevicePublic:
    """Show a device as operators see it (no token, no digest)."""
    return DevicePublic(
        device_id=device.id,
        name=device.name,
        fleet=device.fleet,
        profile=cast(CapabilityProfile, device.profile),
        enrolled_at=device.enrolled_at,
        last_seen=device.last_seen,
    )


def profile_sample(row: DeviceProfile) -> ProfileSample:
    """One stored profile of a device with the time the coordinator received it."""
    return ProfileSample(profile=cast(CapabilityProfile, row.profile), received_at=row.received_at)


def sketch_distance(sketches: Sequence[Sequence[float]]) -> float | None:
    """Consensus distance of the devices' sketches, or ``None``.

    ``None`` unless at least two non-empty sketches of equal length, all finite, were
    reported (sketches of shape ``(n_devices, sketch_dim)``, float64).
    """
    rows = [s for s in sketches if len(s) > 0]
    if len(rows) < 2 or len({len(s) for s in rows}) != 1:
        return None
    matrix = np.asarray(rows, dtype=np.float64)
    if not np.all(np.isfinite(matrix)):
        return None
    return float(consensus_distance(matrix))


def round_summaries(
    job: Job, rows: Sequence[JobDevice], metrics: Sequence[RoundMetric]
) -> list[RoundSummary]:
    """One summary per round that any device reported, in round order.

    ``elapsed_s`` is the latest arrival of that round's reports minus ``started_at``
    (seconds, coordinator clock); ``missing_devices`` lists the participants, by index,
    that sent no report for the round.
    """
    by_round: dict[int, list[RoundMetric]] = defaultdict(list)
    for m in metrics:
        by_round[m.round].append(m)
    started = job.started_at or job.created_at
    out: list[RoundSummary] = []
    for rnd in sorted(by_round):
        reports = by_round[rnd]
        accuracy = np.array([float(m.metrics["accuracy"]) for m in reports])
        reporters = {m.device_id for m in reports}
        out.append(
            RoundSummary(
                round=rnd,
                mean_accuracy=float(accuracy.mean()),
                min_accuracy=float(accuracy.min()),
                consensus_distance=sketch_distance([m.metrics["sketch"] for m in reports]),
                bytes_sent=sum(int(m.metrics["bytes_sent"]) for m in reports),
                bytes_received=sum(int(m.metrics["bytes_received"]) for m in reports),
                elapsed_s=max(m.received_at for m in reports) - started,
                devices_reporting=len(reporters),
                missing_devices=[r.device_id for r in rows if r.device_id not in reporters],
            )
        )
    return out


def _degrees(job: Job) -> dict[int, int]:
    """Each device index's degree in the job's graph (empty before the job starts)."""
    degree: dict[int, int] = defaultdict(int)
    for i, j in (job.topology or {}).get("edges", []):
        degree[int(i)] += 1
        degree[int(j)] += 1
    return degree


def _job_device(
    row: JobDevice,
    name: str,
    reported: set[int],
    last_round: int,
    mine: list[RoundMetric],
    degree: int,
) -> JobDevicePublic:
    final: dict[str, Any] = row.final or {}
    if row.done and "bytes_sent" in final:
        sent, received = int(final["bytes_sent"]), int(final["bytes_received"])
    else:  # not done: the sum of its round reports so far
        sent = sum(int(m.metrics["bytes_sent"]) for m in mine)
        received = sum(int(m.metrics["bytes_received"]) for m in mine)
    return JobDevicePublic(
        device_id=row.device_id,
        name=name,
        index=row.index,
        rounds_reported=len(reported),
        missing_rounds=[r for r in range(1, last_round + 1) if r not in reported],
        final_accuracy=float(final["final_accuracy"]) if "final_accuracy" in final else None,
        bytes_sent=sent,
        bytes_received=received,
        done=row.done,
        error=final.get("error"),
        isolated_rounds=sorted(
            m.round for m in mine if degree and len(m.metrics["missing"]) >= degree
        ),
    )


def job_public(
    job: Job, rows: Sequence[JobDevice], names: dict[str, str], metrics: Sequence[RoundMetric]
) -> JobPublic:
    """Show a job with each participant's progress; ``names`` maps device id to name.

    ``missing_rounds`` of a device are the rounds ``1..R`` it did not report, where R is
    the last round any device reported; ``isolated_rounds`` the rounds it reported but
    heard from none of its neighbours (it trained alone).
    """
    last_round = max((m.round for m in metrics), default=0)
    degree = _degrees(job)
    mine: dict[str, list[RoundMetric]] = defaultdict(list)
    for m in metrics:
        mine[m.device_id].append(m)
    devices = [
        _job_device(
            r,
            names.get(r.device_id, ""),
            {m.round for m in mine[r.device_id]},
            last_round,
            mine[r.device_id],
            degree.get(r.index, 0),
        )
        for r in rows
    ]
    return JobPublic(
        job_id=job.id,
        status=cast(JobStatus, job.status),
        spec=cast(JobSpec, job.spec),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        devices=devices,
    )


def topology_public(job: Job) -> TopologyPublic:
    """Show the started job's graph and mixing matrix (``job.topology`` must be set)."""
    topo: dict[str, Any] = job.topology or {}
    return TopologyPublic(
        kind=topo["kind"],
        devices=list(topo["devices"]),
        edges=[(int(i), int(j)) for i, j in topo["edges"]],
        mixing_matrix=topo["W"],
        spectral_gap=float(topo["gap"]),
    )


def assignment(job: Job, row: JobDevice, fleet: str) -> Assignment:
    """Row ``row.index`` of W as the device's self weight and neighbour weights."""
    topo: dict[str, Any] = job.topology or {}
    i, ids, w = row.index, topo["devices"], topo["W"]
    peers = sorted({j for a, b in topo["edges"] for j in (a, b) if i in (a, b) and j != i})
    return Assignment(
        job_id=job.id,
        fleet=fleet,
        status=cast(JobStatus, job.status),
        spec=cast(JobSpec, job.spec),
        index=i,
        self_weight=float(w[i][i]),
        neighbours=[Neighbour(device_id=ids[j], weight=float(w[i][j])) for j in peers],
    )
