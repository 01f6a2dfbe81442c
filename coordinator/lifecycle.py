"""Job lifecycle: start (plan the topology), completion rules, stop, assignments.

Status moves ``created → running → completed | stopped`` (``created → stopped`` too).
A running job *completes* when every participant reported done, or when at least one
did and every other participant has been silent (no metrics, no done) for more than
``stale_after_s`` seconds: those are declared lost and show their ``missing_rounds``.
The rule is evaluated whenever a job is read (:func:`refresh_status`), so no background
task is needed.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from coordinator import store
from coordinator.db import Device, Job, JobDevice
from coordinator.errors import Conflict
from meshfl.contract import DeviceDone
from meshfl.errors import ConfigError, TopologyError
from meshfl.topology import build_graph, metropolis_hastings, spectral_gap

__all__ = ["current_assignment", "mark_done", "refresh_status", "start_job", "stop_job"]


def start_job(session: Session, job: Job, now: float, stale_after_s: float = 120.0) -> Job:
    """Pick the participants, build the graph and mixing matrix W, and run the job.

    Participants are the first ``spec.devices`` live devices (heard from within
    ``stale_after_s`` seconds: an idle agent polls for work twice a second) that are not
    busy in another running job, by enrolment time
    (``0``: all of them); ordered by name (then id), device ``k`` gets index ``k`` in W,
    so the same names give the same graph whatever order the devices enrolled in. W is the
    Metropolis–Hastings matrix of ``build_graph(spec.topology, n)``; the topology
    stored is ``{kind, devices, edges, W, gap}`` with gap ``1 − |λ₂(W)|``.

    Raises
    ------
    Conflict
        The job was already started, fewer devices are enrolled than it needs, or the
        topology cannot be built for that many devices.

    """
    if job.status != "created":
        raise Conflict(f"job {job.id!r} is already {job.status}; create a new job to run again")
    wanted = int(job.spec["devices"])
    busy = store.busy_device_ids(session)
    enrolled = [
        d
        for d in store.list_devices(session)
        if now - d.last_seen <= stale_after_s and d.id not in busy
    ]
    if not enrolled or len(enrolled) < wanted:
        raise Conflict(
            f"job {job.id!r} needs {wanted or 'at least 1'} device(s) but "
            f"{len(enrolled)} live, idle device(s) are enrolled; start more agents or"
            " create a job with fewer devices"
        )
    chosen = sorted(enrolled[:wanted] if wanted else enrolled, key=lambda d: (d.name, d.id))
    kind = job.spec["topology"]
    try:
        graph = build_graph(kind, len(chosen))
        w = metropolis_hastings(graph)
        gap = float(spectral_gap(w))
    except (ConfigError, TopologyError) as exc:
        raise Conflict(
            f"cannot build topology {kind!r} for {len(chosen)} devices ({exc}); "
            "change spec.devices or spec.topology"
        ) from exc
    job.topology = {
        "kind": kind,
        "devices": [d.id for d in chosen],
        "edges": sorted([int(i), int(j)] for i, j in graph.edges),
        "W": [[float(x) for x in row] for row in w],
        "gap": gap,
    }
    for index, device in enumerate(chosen):
        session.add(
            JobDevice(
                job_id=job.id,
                device_id=device.id,
                index=index,
                done=False,
                final=None,
                last_activity=now,
            )
        )
    job.status, job.started_at = "running", now
    session.commit()
    return job


def stop_job(session: Session, job: Job, now: float) -> Job:
    """Stop a created or running job; raises :class:`Conflict` once it has ended."""
    if job.status not in ("created", "running"):
        raise Conflict(f"job {job.id!r} is already {job.status}; nothing to stop")
    job.status, job.finished_at = "stopped", now
    session.commit()
    return job


def refresh_status(session: Session, job: Job, now: float, stale_after_s: float) -> Job:
    """Apply the completion rules to a running job and persist the result."""
    if job.status != "running":
        return job
    rows = store.participants(session, job)
    done = [r for r in rows if r.done]
    if not done:
        return job
    pending = [r for r in rows if not r.done]
    if all(now - r.last_activity > stale_after_s for r in pending):
        job.status = "completed"
        job.finished_at = max(r.last_activity for r in done) if not pending else now
        session.commit()
    return job


def mark_done(
    session: Session, job: Job, row: JobDevice, device: Device, body: DeviceDone, now: float
) -> None:
    """Record that a participant finished or declined (the first report wins)."""
    if not row.done:
        row.done, row.final = True, dict(body)
    row.last_activity = now
    device.last_seen = now
    session.commit()
    if job.status == "running" and all(r.done for r in store.participants(session, job)):
        job.status, job.finished_at = "completed", now
        session.commit()


def mark_declined(
    session: Session, job: Job, row: JobDevice, device: Device, reason: str, now: float
) -> None:
    """Record that a participant cannot take part; it counts as done, with its reason."""
    if not row.done:
        row.done, row.final = True, {"error": reason[:500]}
    mark_done(session, job, row, device, row.final, now)  # type: ignore[arg-type]


def current_assignment(
    session: Session, device: Device, now: float, stale_after_s: float
) -> tuple[Job, JobDevice] | None:
    """Find the job ``device`` should work on now, with its participation (``None``: none).

    The latest-started job it takes part in that is running, or that has ended
    (completed/stopped) while this device has not reported done — so it learns to
    stop. A device that reported done on an ended job gets nothing for it.
    """
    query = (
        select(Job, JobDevice)
        .join(JobDevice, JobDevice.job_id == Job.id)
        .where(JobDevice.device_id == device.id)
        .order_by(Job.started_at.desc(), Job.id)
    )
    for job, row in session.execute(query):
        refresh_status(session, job, now, stale_after_s)
        if job.status == "running" or not row.done:
            return job, row
    return None
