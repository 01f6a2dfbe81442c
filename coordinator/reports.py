"""Shape stored rows into the REST contract's bodies (``meshfl.contract``).

Pure functions of ORM rows: no session, no clock. Round summaries aggregate the round
reports of the devices that sent one; the consensus distance (mean ‖x_i − x̄‖², here on
the devices' count sketches) comes from :func:`meshfl.aggregation.consensus_distance`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from coordinator import planning
from coordinator.db import Device, DeviceProfile, Job, JobDevice, RoundMetric
from coordinator.presence import Presence, online_status
from meshfl.aggregation import consensus_distance
from meshfl.contract import (
    Assignment,
    CapabilityProfile,
    DevicePlan,
    DevicePublic,
    DeviceRoundMetrics,
    DeviceRoundReport,
    DeviceState,
    JobDeviceMetrics,
    JobDevicePublic,
    JobPublic,
    JobSpec,
    JobStatus,
    Neighbour,
    ProfileSample,
    RoundSummary,
    TopologyEvent,
    TopologyPublic,
)

__all__ = [
    "assignment",
    "device_plan",
    "device_public",
    "device_reports",
    "device_round_metrics",
    "job_device_metrics",
    "job_public",
    "profile_sample",
    "round_summaries",
    "sketch_distance",
    "topology_public",
]


def device_public(
    device: Device, now: float, live_within_s: float, presence: Presence | None = None
) -> DevicePublic:
    """Show a device as operators see it (no token, no digest).

    ``online`` and ``online_source`` follow :func:`coordinator.presence.online_status`:
    the device's latest MQTT status in ``presence`` when it is at least as recent as
    ``last_seen``, else heard from within ``live_within_s`` seconds before ``now``
    (unix s). ``presence`` ``None``: the heartbeat rule only.
    """
    online = online_status(
        presence, device.id, device.last_seen, now=now, live_within_s=live_within_s
    )
    return DevicePublic(
        device_id=device.id,
        name=device.name,
        fleet=device.fleet,
        profile=cast(CapabilityProfile, device.profile),
        enrolled_at=device.enrolled_at,
        last_seen=device.last_seen,
        tags=list(device.tags or []),
        labels=dict(device.labels or {}),
        state=cast(DeviceState, device.state),
        online=online.online,
        revoked_at=device.revoked_at,
        online_source=online.source,
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

    ``metrics`` must be loaded with their sketches (``store.round_metrics(...,
    sketches=True)``): the consensus distance is computed from them.

    ``elapsed_s`` is the latest arrival of that round's reports minus ``started_at``
    (seconds, coordinator clock); ``missing_devices`` lists the participants, by index,
    that took part in the round (``joined_round <= round < left_round``) but sent no
    report for it.
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
                consensus_distance=sketch_distance([m.sketch or [] for m in reports]),
                bytes_sent=sum(int(m.metrics["bytes_sent"]) for m in reports),
                bytes_received=sum(int(m.metrics["bytes_received"]) for m in reports),
                elapsed_s=max(m.received_at for m in reports) - started,
                devices_reporting=len(reporters),
                missing_devices=[
                    r.device_id for r in rows if _took_part(r, rnd) and r.device_id not in reporters
                ],
            )
        )
    return out


def _took_part(row: JobDevice, rnd: int) -> bool:
    return row.joined_round <= rnd and (row.left_round is None or rnd < row.left_round)


def _degrees(job: Job) -> dict[str, int]:
    """Each current device's degree in the job's graph, by id (empty before the start)."""
    topo: dict[str, Any] = job.topology or {}
    ids = topo.get("devices", [])
    degree: dict[str, int] = defaultdict(int)
    for i, j in topo.get("edges", []):
        degree[ids[int(i)]] += 1
        degree[ids[int(j)]] += 1
    return degree


def device_plan(job: Job, device_id: str) -> DevicePlan:
    """The device's plan in the job's current topology (all the work, no budget: default)."""
    plan = (job.topology or {}).get("plan", {}).get(device_id)
    if plan is None:
        return DevicePlan(work_fraction=1.0, byte_budget=0)
    out = DevicePlan(
        work_fraction=float(plan["work_fraction"]), byte_budget=int(plan["byte_budget"])
    )
    if plan.get("no_wait"):
        out["no_wait"] = [str(d) for d in plan["no_wait"]]
    return out


def _job_device(
    row: JobDevice,
    name: str,
    reported: set[int],
    last_round: int,
    mine: list[RoundMetric],
    degree: int,
    plan: DevicePlan,
) -> JobDevicePublic:
    final: dict[str, Any] = row.final or {}
    if row.done and "bytes_sent" in final:
        sent, received = int(final["bytes_sent"]), int(final["bytes_received"])
    else:  # not done: the sum of its round reports so far
        sent = sum(int(m.metrics["bytes_sent"]) for m in mine)
        received = sum(int(m.metrics["bytes_received"]) for m in mine)
    public = JobDevicePublic(
        device_id=row.device_id,
        name=name,
        index=row.index,
        rounds_reported=len(reported),
        missing_rounds=[
            r for r in range(1, last_round + 1) if _took_part(row, r) and r not in reported
        ],
        final_accuracy=float(final["final_accuracy"]) if "final_accuracy" in final else None,
        bytes_sent=sent,
        bytes_received=received,
        done=row.done,
        error=final.get("error"),
        isolated_rounds=sorted(
            m.round for m in mine if degree and len(m.metrics["missing"]) >= degree
        ),
        joined_round=row.joined_round,
        left_round=row.left_round,
        plan=plan,
    )
    for key in ("onnx_path", "onnx_max_abs_diff"):
        if key in final:
            public[key] = final[key]
    return public


def job_public(
    job: Job,
    rows: Sequence[JobDevice],
    names: dict[str, str],
    metrics: Sequence[RoundMetric],
    epsilon: Mapping[str, float | None] | None = None,
) -> JobPublic:
    """Show a job with each participant's progress; ``names`` maps device id to name.

    ``epsilon`` maps device id to the ε this job spent on it (``None``: not a DP job),
    shown as ``epsilon_spent``; omitted: the field is left out.

    ``missing_rounds`` of a device are the rounds ``1..R`` it took part in
    (``joined_round <= r < left_round``) but did not report, where R is the last round
    any device reported; ``isolated_rounds`` the rounds it reported but heard from none
    of its neighbours in the current topology (it trained alone); ``unmixed_rounds`` the
    rounds in which a neighbour mixed without its delta (late, lost); ``plan`` its
    :class:`~meshfl.contract.DevicePlan`.
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
            degree.get(r.device_id, 0),
            device_plan(job, r.device_id),
        )
        for r in rows
    ]
    unmixed: dict[str, set[int]] = defaultdict(set)  # sender → rounds a neighbour went without
    for m in metrics:
        for sender in m.metrics.get("missing", ()):
            unmixed[str(sender)].add(m.round)
    for device in devices:
        device["unmixed_rounds"] = sorted(unmixed.get(device["device_id"], ()))
    if epsilon is not None:
        unit = _privacy_unit(job)
        for device in devices:
            device["epsilon_spent"] = epsilon.get(device["device_id"])
            device["privacy_unit"] = unit
    return JobPublic(
        job_id=job.id,
        status=cast(JobStatus, job.status),
        spec=cast(JobSpec, job.spec),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        devices=devices,
        pause_round=job.pause_round,
    )


def topology_public(job: Job) -> TopologyPublic:
    """Show the started job's current graph, W, version and events (``job.topology`` set).

    A topology stored before versions existed reads as version 1 from round 1, no events.
    """
    topo: dict[str, Any] = job.topology or {}
    return TopologyPublic(
        kind=topo["kind"],
        devices=list(topo["devices"]),
        edges=[(int(i), int(j)) for i, j in topo["edges"]],
        mixing_matrix=planning.weights(topo).tolist(),
        spectral_gap=float(topo["gap"]),
        version=int(topo.get("version", 1)),
        from_round=int(topo.get("from_round", 1)),
        events=[cast(TopologyEvent, e) for e in topo.get("events", [])],
    )


def assignment(
    job: Job,
    row: JobDevice,
    fleet: str,
    identity_keys: Mapping[str, str | None] | None = None,
) -> Assignment:
    """The device's row of the current W: self weight, neighbour weights, version, plan.

    ``peer_keys`` holds the Ed25519 identity key (base64) of every device of the current
    version found in ``identity_keys`` (device id → key, ``None``: enrolled without one;
    see :func:`coordinator.lifecycle.peer_keys`): receivers verify signed deltas with it.

    ``position`` is the device's place in the current version's ``devices`` (its row of
    W); ``index`` stays ``row.index`` (stable: agents seed their data shuffles with it).
    A device that left (or is not in the current version) gets ``position`` -1, no
    neighbours and self weight 1.0: agents stop when they see it. A paused job's
    assignment carries ``pause_round``, the first round the device must not start.
    """
    topo: dict[str, Any] = job.topology or {}
    ids, w = list(topo["devices"]), planning.weights(topo)
    position = ids.index(row.device_id) if row.left_round is None and row.device_id in ids else -1
    peers = sorted(
        {j for a, b in topo["edges"] for j in (a, b) if position in (a, b) and j != position}
    )
    out = Assignment(
        job_id=job.id,
        fleet=fleet,
        status=cast(JobStatus, job.status),
        spec=cast(JobSpec, job.spec),
        index=row.index,
        self_weight=float(w[position][position]) if position >= 0 else 1.0,
        neighbours=[Neighbour(device_id=ids[j], weight=float(w[position][j])) for j in peers],
        topology_version=int(topo.get("version", 1)),
        from_round=int(topo.get("from_round", 1)),
        position=position,
        devices=ids,
        start_round=row.joined_round,
        plan=device_plan(job, row.device_id),
        peer_keys={d: key for d in ids if (key := (identity_keys or {}).get(d)) is not None},
    )
    if job.status == "paused" and job.pause_round is not None:
        out["pause_round"] = int(job.pause_round)
    return out


def device_reports(job: Job, metrics: Sequence[RoundMetric]) -> list[DeviceRoundReport]:
    """Each stored round report, by arrival, with its time since the job started."""
    started = job.started_at or 0.0
    ordered = sorted(metrics, key=lambda m: (m.received_at, m.id))
    return [
        DeviceRoundReport(
            device_id=m.device_id,
            round=m.round,
            accuracy=float(m.metrics["accuracy"]),
            bytes_sent=int(m.metrics["bytes_sent"]),
            elapsed_s=m.received_at - started,
        )
        for m in ordered
    ]


def job_device_metrics(
    rows: Sequence[JobDevice],
    names: Mapping[str, str],
    metrics: Sequence[RoundMetric],
    epsilon: Mapping[str, float | None],
) -> list[JobDeviceMetrics]:
    """Each participant's totals, by index: latest round and accuracy, bytes, ε spent.

    Bytes are the done report's totals when the device finished, else the sum of its
    round reports (as in :func:`job_public`); ``metrics`` in round order.
    """
    mine: dict[str, list[RoundMetric]] = defaultdict(list)
    for m in metrics:
        mine[m.device_id].append(m)
    out: list[JobDeviceMetrics] = []
    for row in rows:
        reports = mine[row.device_id]
        latest = max(reports, key=lambda m: m.round, default=None)
        final: dict[str, Any] = row.final or {}
        if row.done and "bytes_sent" in final:
            sent, received = int(final["bytes_sent"]), int(final["bytes_received"])
        else:
            sent = sum(int(m.metrics["bytes_sent"]) for m in reports)
            received = sum(int(m.metrics["bytes_received"]) for m in reports)
        out.append(
            JobDeviceMetrics(
                device_id=row.device_id,
                name=names.get(row.device_id, ""),
                joined_round=row.joined_round,
                left_round=row.left_round,
                done=row.done,
                rounds_reported=len({m.round for m in reports}),
                latest_round=None if latest is None else latest.round,
                latest_accuracy=None if latest is None else float(latest.metrics["accuracy"]),
                final_accuracy=(
                    float(final["final_accuracy"]) if "final_accuracy" in final else None
                ),
                bytes_sent=sent,
                bytes_received=received,
                epsilon_spent=epsilon.get(row.device_id),
            )
        )
    return out


def device_round_metrics(m: RoundMetric) -> DeviceRoundMetrics:
    """One stored round report of a device (its sketch left out: it is for the coordinator)."""
    body = m.metrics
    out = DeviceRoundMetrics(
        round=m.round,
        accuracy=float(body["accuracy"]),
        loss=float(body["loss"]),
        bytes_sent=int(body["bytes_sent"]),
        bytes_received=int(body["bytes_received"]),
        missing=[str(d) for d in body["missing"]],
        train_s=float(body["train_s"]),
        round_s=float(body["round_s"]),
        received_at=m.received_at,
    )
    for key in ("rejected_unsigned", "rejected_signature", "rejected_replayed"):
        if key in body:  # a signed job's counters
            out[key] = int(body[key])
    return out


def _privacy_unit(job: Job) -> str | None:
    """The unit the job's ε is for (``device``/``record``); ``None``: not a DP job."""
    spec = job.spec
    if not spec.get("dp_noise_multiplier"):
        return None
    return str(spec.get("dp_unit", "device"))
