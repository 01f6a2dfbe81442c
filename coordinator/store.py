"""The coordinator's data access: devices, profiles, jobs, participation, round metrics.

Every function takes the request's ``Session`` and the clock's ``now`` (unix seconds),
commits what it writes, and raises :mod:`coordinator.errors` / meshfl errors, never
HTTP exceptions. Job lifecycle rules live in :mod:`coordinator.lifecycle`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from sqlalchemy import Select, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, undefer

from coordinator.db import Device, DeviceProfile, Job, JobDevice, RoundMetric
from coordinator.errors import Forbidden, NotFound
from meshfl.contract import CapabilityProfile, JobSpec, RoundMetrics

__all__ = [
    "ACTIVE_STATUSES",
    "PROFILE_HISTORY_LIMIT",
    "create_job",
    "device_by_token",
    "device_names",
    "device_round_metrics",
    "enrol_device",
    "get_device",
    "get_devices",
    "get_job",
    "hash_token",
    "last_report_at",
    "last_round",
    "latest_reports",
    "list_devices",
    "list_jobs",
    "participant_ids",
    "participants",
    "participation",
    "profile_history",
    "record_metrics",
    "round_metrics",
    "running_jobs",
    "touch",
    "update_profile",
]

PROFILE_HISTORY_LIMIT = 1000
"""Profile samples kept per device; older ones are deleted when a new one is stored."""


def hash_token(token: str) -> str:
    """SHA-256 hex digest of a bearer token; only the digest is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def enrol_device(
    session: Session,
    *,
    name: str,
    fleet: str,
    profile: CapabilityProfile,
    now: float,
    identity_key: str | None = None,
    tags: list[str] | None = None,
    commit: bool = True,
) -> tuple[Device, str]:
    """Create a new device identity; returns it and its bearer token (shown once).

    Re-enrolling under an existing name creates another identity: names are labels.
    ``identity_key`` is the device's Ed25519 public key (base64, checked by the caller);
    ``tags`` its first tags (those of the enrolment token; ``None``: none).
    ``commit=False`` only flushes: the caller commits once the enrolment's other steps
    (the token's use, the broker login) have succeeded, or rolls it all back.
    """
    token = secrets.token_urlsafe(32)
    device = Device(
        id=f"dev-{secrets.token_hex(6)}",
        name=name,
        fleet=fleet,
        token_hash=hash_token(token),
        profile=dict(profile),
        enrolled_at=now,
        last_seen=now,
        identity_key=identity_key,
        tags=list(tags or []),
        labels={},
        state="active",
    )
    session.add(device)
    session.flush()
    if profile:  # measured at join: the first sample of its history
        _add_profile_sample(session, device, profile, now)
    if commit:
        session.commit()
    return device, token


def device_by_token(session: Session, token: str) -> Device | None:
    """Find the device whose token this is, or ``None``."""
    return session.scalars(select(Device).where(Device.token_hash == hash_token(token))).first()


def get_device(session: Session, device_id: str) -> Device:
    """Return the device ``device_id``; raises :class:`NotFound` (also once deleted)."""
    device = session.get(Device, device_id)
    if device is None or device.state == "deleted":
        raise NotFound(f"device {device_id!r} is not enrolled; list devices with GET /devices")
    return device


def get_devices(session: Session, device_ids: list[str]) -> list[Device]:
    """The devices ``device_ids`` that exist, in the order given."""
    found = {d.id: d for d in session.scalars(select(Device).where(Device.id.in_(device_ids)))}
    return [found[i] for i in device_ids if i in found]


def identity_keys(session: Session, device_ids: list[str]) -> dict[str, str | None]:
    """The identity key of each of ``device_ids`` that exists (``None``: enrolled without).

    Two columns, not whole devices: read at every assignment poll of every participant.
    """
    query = select(Device.id, Device.identity_key).where(Device.id.in_(device_ids))
    found: dict[str, str | None] = {i: key for i, key in session.execute(query)}
    return {i: found[i] for i in device_ids if i in found}


def list_devices(session: Session) -> list[Device]:
    """All devices, in enrolment order."""
    return list(session.scalars(select(Device).order_by(Device.enrolled_at, Device.id)))


ACTIVE_STATUSES = ("running", "paused")
"""Statuses of a started job that has not ended: its devices are busy with it."""


def busy_device_ids(session: Session) -> set[str]:
    """Devices taking part in a running or paused job that they have not finished."""
    query = (
        select(JobDevice.device_id)
        .join(Job, Job.id == JobDevice.job_id)
        .where(Job.status.in_(ACTIVE_STATUSES), JobDevice.done.is_(False))
    )
    return set(session.scalars(query))


def device_names(session: Session, device_ids: list[str]) -> dict[str, str]:
    """Map each of ``device_ids`` that exists to its name."""
    query = select(Device.id, Device.name).where(Device.id.in_(device_ids))
    return {device_id: name for device_id, name in session.execute(query)}


def touch(session: Session, device: Device, now: float) -> None:
    """Record that ``device`` was heard from at ``now``."""
    device.last_seen = now
    session.commit()


def update_profile(
    session: Session, device: Device, profile: CapabilityProfile, now: float
) -> Device:
    """Replace the device's capability profile and append it to the device's history.

    The history keeps the latest :data:`PROFILE_HISTORY_LIMIT` samples of the device.
    """
    device.profile = dict(profile)
    device.last_seen = now
    _add_profile_sample(session, device, profile, now)
    session.commit()
    return device


def _newest_first(device_id: str) -> Select[int]:
    return (
        select(DeviceProfile.id)
        .where(DeviceProfile.device_id == device_id)
        .order_by(DeviceProfile.received_at.desc(), DeviceProfile.id.desc())
    )


def _add_profile_sample(
    session: Session, device: Device, profile: CapabilityProfile, now: float
) -> None:
    session.add(DeviceProfile(device_id=device.id, profile=dict(profile), received_at=now))
    session.flush()
    beyond = _newest_first(device.id).offset(PROFILE_HISTORY_LIMIT)
    stale = list(session.scalars(beyond))
    if stale:
        session.execute(delete(DeviceProfile).where(DeviceProfile.id.in_(stale)))


def profile_history(
    session: Session, device: Device, *, limit: int, offset: int = 0, since: float | None = None
) -> list[DeviceProfile]:
    """The device's stored profiles, newest first; ``since``: received at or after it."""
    query = select(DeviceProfile).where(DeviceProfile.device_id == device.id)
    if since is not None:
        query = query.where(DeviceProfile.received_at >= since)
    query = query.order_by(DeviceProfile.received_at.desc(), DeviceProfile.id.desc())
    return list(session.scalars(query.offset(offset).limit(limit)))


def create_job(session: Session, spec: JobSpec, now: float) -> Job:
    """Store a new job in status ``created`` (the spec must be validated already)."""
    job = Job(id=f"job-{secrets.token_hex(6)}", spec=dict(spec), status="created", created_at=now)
    session.add(job)
    session.commit()
    return job


def get_job(session: Session, job_id: str) -> Job:
    """Return the job ``job_id``; raises :class:`NotFound`."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(
            f"job {job_id!r} does not exist; list jobs with GET /api/v1/jobs or `meshfl job list`"
        )
    return job


def list_jobs(session: Session) -> list[Job]:
    """All jobs, oldest first."""
    return list(session.scalars(select(Job).order_by(Job.created_at, Job.id)))


def running_jobs(session: Session) -> list[Job]:
    """Running jobs, latest started first."""
    query = select(Job).where(Job.status == "running").order_by(Job.started_at.desc(), Job.id)
    return list(session.scalars(query))


def participants(session: Session, job: Job, *, fresh: bool = False) -> list[JobDevice]:
    """List the job's participants by index (empty before the job starts).

    ``fresh``: re-read rows already loaded in this session (after another request changed
    them).
    """
    query = select(JobDevice).where(JobDevice.job_id == job.id).order_by(JobDevice.index)
    if fresh:
        query = query.execution_options(populate_existing=True)
    return list(session.scalars(query))


def participant_ids(session: Session, job: Job) -> set[str]:
    """The device ids of the job's participants, past ones included (a column, no rows)."""
    return set(session.scalars(select(JobDevice.device_id).where(JobDevice.job_id == job.id)))


def participant_states(session: Session, job: Job) -> list[tuple[bool, int | None, float]]:
    """``(done, left_round, last_activity)`` of each of the job's participants.

    The columns :func:`coordinator.lifecycle.refresh_status` decides on, without loading
    the rows (each request would otherwise build one object per participant).
    """
    query = select(JobDevice.done, JobDevice.left_round, JobDevice.last_activity)
    rows = session.execute(query.where(JobDevice.job_id == job.id))
    return [(bool(done), left, float(seen)) for done, left, seen in rows]


def last_round(session: Session, job: Job) -> int:
    """The highest round any device reported for ``job`` (0: none yet)."""
    query = select(func.max(RoundMetric.round)).where(RoundMetric.job_id == job.id)
    return int(session.scalars(query).one() or 0)


def last_report_at(session: Session, job: Job) -> dict[str, float]:
    """When each device last sent a round report for ``job`` (unix seconds), by device id."""
    query = (
        select(RoundMetric.device_id, func.max(RoundMetric.received_at))
        .where(RoundMetric.job_id == job.id)
        .group_by(RoundMetric.device_id)
    )
    return {device_id: float(at) for device_id, at in session.execute(query)}


def latest_reports(
    session: Session, job: Job, device_id: str, *, since_round: int, limit: int
) -> list[RoundMetric]:
    """The device's latest ``limit`` reports for ``job`` from ``since_round`` on, newest first."""
    query = (
        select(RoundMetric)
        .where(
            RoundMetric.job_id == job.id,
            RoundMetric.device_id == device_id,
            RoundMetric.round >= since_round,
        )
        .order_by(RoundMetric.round.desc())
        .limit(limit)
    )
    return list(session.scalars(query))


def participation(session: Session, job: Job, device: Device) -> JobDevice:
    """``device``'s participation in ``job``; raises :class:`Forbidden` if it has none."""
    row = session.get(JobDevice, (job.id, device.id))
    if row is None:
        raise Forbidden(
            f"device {device.id!r} does not take part in job {job.id!r}; "
            "ask GET /devices/{device_id}/assignment for this device's job"
        )
    return row


def round_metrics(
    session: Session, job: Job, *, since_round: int = 1, sketches: bool = False
) -> list[RoundMetric]:
    """Every stored round report of ``job`` from ``since_round`` on, by round then arrival.

    ``sketches``: load each report's ``sketch`` too (round summaries need them); without,
    reading ``RoundMetric.sketch`` raises.
    """
    query = (
        select(RoundMetric)
        .where(RoundMetric.job_id == job.id, RoundMetric.round >= since_round)
        .order_by(RoundMetric.round, RoundMetric.id)
    )
    if sketches:
        query = query.options(undefer(RoundMetric.sketch))
    return list(session.scalars(query))


def record_metrics(
    session: Session,
    row: JobDevice,
    device: Device,
    reports: Sequence[RoundMetrics],
    now: float,
) -> int:
    """Store round reports of one participant in one transaction; repeats are ignored.

    A report whose (job, device, round) is stored already, or repeated within
    ``reports``, is skipped (the first report wins). Returns how many were stored. If a
    concurrent request stored one of the same rounds first, the transaction is retried
    once without it.
    """
    row.last_activity = now
    device.last_seen = now
    for _attempt in range(2):
        stored = set(
            session.scalars(
                select(RoundMetric.round).where(
                    RoundMetric.job_id == row.job_id,
                    RoundMetric.device_id == row.device_id,
                    RoundMetric.round.in_({m["round"] for m in reports}),
                )
            )
        )
        fresh: dict[int, RoundMetrics] = {}
        for metrics in reports:
            if metrics["round"] not in stored:
                fresh.setdefault(metrics["round"], metrics)
        session.add_all(
            RoundMetric(
                job_id=row.job_id,
                device_id=row.device_id,
                round=round_,
                metrics={k: v for k, v in metrics.items() if k != "sketch"},
                sketch=list(metrics.get("sketch", [])),
                received_at=now,
            )
            for round_, metrics in fresh.items()
        )
        try:
            session.commit()
        except IntegrityError:  # a concurrent duplicate won the race: look again
            session.rollback()
            row.last_activity = now
            device.last_seen = now
            continue
        return len(fresh)
    session.commit()  # the activity alone
    return 0


def device_round_metrics(
    session: Session, job: Job, device_id: str, *, limit: int, offset: int = 0
) -> tuple[list[RoundMetric], int]:
    """One device's round reports for ``job`` by round, a page of them and their total."""
    where = (RoundMetric.job_id == job.id, RoundMetric.device_id == device_id)
    total = session.scalars(select(func.count()).select_from(RoundMetric).where(*where)).one()
    query = select(RoundMetric).where(*where).order_by(RoundMetric.round)
    return list(session.scalars(query.offset(offset).limit(limit))), int(total)
