"""Per-device privacy budgets: recorded DP releases, ε spent, and the refusals.

Every DP release a device makes is recorded before it happens (``POST
.../privacy/{device_id}/spend``, one row per job, device and round, with the job's σ and
δ), so a restart of the coordinator keeps every spent ε. ε is always computed from the
rows by :func:`coordinator.privacy.epsilon` — the device's releases over *all* its jobs,
at the δ of the job asking — and compared with the device's ε_max: the smallest
``dp_epsilon_budget`` of this job and of every DP job the device took part in (a budget
can be lowered by a later job, never raised):

- at the start, a DP job with a budget is refused (409) when the releases it would make
  (``rounds × releases per round``: the device's degree under secure aggregation, one
  aggregate per neighbour; else 1) would push any selected device past ε_max;
- while it runs, a release that would cross ε_max is refused (409) and not recorded: the
  device must not send it, and stops.

**Units** (issue 22): a job names its unit of privacy (``dp_unit``). A device-level
row is ``releases`` noised deltas; a record-level row is ``releases`` DP-SGD steps at
the Poisson sampling rate the device reports. ε at the device unit composes the
device-level rows, ε at the record unit every row (:func:`coordinator.privacy.epsilon`),
and a budget caps the ε of its own job's unit. At a record-level start the planned
steps of a device come from its latest profile's ``train_samples`` (n_local: rounds ×
local epochs × ⌈n/B⌉ steps at q = B/n); a device that reported none is checked round by
round only.

A round is recorded once (a retried request changes nothing), except that the first
spend of a new run of the agent (``new_run``: started or restarted) counts its releases
again when the round is already recorded: a restarted agent noises its delta afresh, and
the earlier run may already have published one for that round.

**Atomic.** The check and the spend (and, at a start, the check and the claim of the
devices) are one transaction that first locks the device rows (:func:`lock_devices`):
PostgreSQL row locks taken in id order, SQLite's write lock. A concurrent spend or start
for the same device waits, then reads what the first one committed: two job starts
cannot both take one device, nor two spends the device's last budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from coordinator import privacy, store
from coordinator.db import Device, Job, JobDevice, PrivacySpendRecord
from coordinator.errors import Conflict
from coordinator.privacy import Spend
from meshfl.aggregation.privacy import DEFAULT_DP_DELTA, PrivacyOptions
from meshfl.contract import PrivacySpend, PrivacyStatus
from meshfl.errors import ConfigError

__all__ = [
    "check_start",
    "device_status",
    "job_epsilons",
    "lock_devices",
    "record_spend",
    "releases_per_round",
]


MAX_STEPS_PER_ROUND = 1_000_000
"""The most DP-SGD steps one record-level spend may record (a round's local steps)."""


def releases_per_round(options: PrivacyOptions, degree: int) -> int:
    """Releases a device of ``degree`` neighbours makes per round (secure: d, else 1)."""
    return max(1, degree) if options.secure else 1


def _spends(session: Session, device_id: str, *, job_id: str | None = None) -> list[Spend]:
    """The device's recorded rows (one job's, or all), grouped by σ, sampling rate and unit."""
    record = PrivacySpendRecord
    query = (
        select(record.noise_multiplier, func.sum(record.releases), record.sampling_rate,
               record.unit)
        .where(record.device_id == device_id)
        .group_by(record.noise_multiplier, record.sampling_rate, record.unit)
    )  # fmt: skip
    if job_id is not None:
        query = query.where(record.job_id == job_id)
    return [
        Spend(float(sigma), int(count), float(rate), str(unit))
        for sigma, count, rate, unit in session.execute(query)
    ]


def _budget(options: PrivacyOptions) -> float | None:
    return options.epsilon_budget if options.epsilon_budget > 0 else None


def _device_budget(session: Session, device_id: str, options: PrivacyOptions) -> float | None:
    """The device's ε_max at the job's unit: the smallest budget of its jobs of that unit.

    The budgets of this job and of every DP job of the same unit the device was in.
    A budget sticks to the device: a later job may lower it, never raise it, so a job
    with a larger ``dp_epsilon_budget`` cannot spend what an earlier one capped.
    """
    query = select(Job).join(JobDevice, JobDevice.job_id == Job.id)
    jobs = session.scalars(query.where(JobDevice.device_id == device_id))
    others = [PrivacyOptions.from_spec(j.spec) for j in jobs]
    budgets = [_budget(o) for o in others if o.unit == options.unit]
    known = [b for b in (*budgets, _budget(options)) if b is not None]
    return min(known, default=None)


def _planned(
    session: Session, device_id: str, job: Job, options: PrivacyOptions, degree: int
) -> Spend | None:
    """What ``job`` will spend on the device (``None``: unknown until it reports)."""
    rounds = int(job.spec["rounds"])
    if not options.record_dp:
        return Spend(options.noise_multiplier, rounds * releases_per_round(options, degree))
    device = session.get(Device, device_id)
    n = int((device.profile or {}).get("train_samples", 0) or 0) if device else 0
    if n <= 0:
        return None
    batch = int(job.spec["batch_size"])
    steps = rounds * int(job.spec["local_epochs"]) * -(-n // batch)
    return Spend(options.noise_multiplier, steps, min(1.0, batch / n), "record")


def lock_devices(session: Session, device_ids: Iterable[str]) -> None:
    """Lock the devices' rows until the session's transaction ends (commit or rollback).

    PostgreSQL: ``SELECT ... ORDER BY id FOR UPDATE`` (locks taken in one order, so two
    callers cannot deadlock). SQLite: a no-op ``UPDATE`` of the rows, which takes the
    database's write lock (SQLite has no row locks; its driver begins the transaction
    at the first write). Reads after it see every transaction committed before it.
    """
    ids = sorted(set(device_ids))
    if not ids:
        return
    if session.get_bind().dialect.name == "sqlite":
        statement = update(Device).where(Device.id.in_(ids)).values(last_seen=Device.last_seen)
        session.execute(statement.execution_options(synchronize_session=False))
    else:
        session.execute(select(Device.id).where(Device.id.in_(ids)).order_by(Device.id)
                        .with_for_update())  # fmt: skip


def check_start(
    session: Session, job: Job, options: PrivacyOptions, degrees: Mapping[str, int]
) -> None:
    """Claim the selected devices for ``job``; refuse if one was taken or would pass its ε_max.

    ``degrees`` maps each selected device id to its degree in the built graph. The
    devices' rows are locked (:func:`lock_devices`) until the caller commits the start,
    and whether they are busy is read again under the lock: of two jobs starting at
    once on one device, the second sees the first's claim.

    Raises
    ------
    Conflict
        A device was taken by another job meanwhile, or the projected ε of some device
        (its releases so far over all jobs, plus ``rounds × releases_per_round`` at this
        job's σ) exceeds ``dp_epsilon_budget``.

    """
    if options.dp:
        privacy.load_accountant()  # not under the lock: the first import takes seconds
    lock_devices(session, degrees)
    taken = sorted(store.busy_device_ids(session) & set(degrees))
    if taken:
        raise Conflict(
            f"job {job.id!r} cannot start: device {taken[0]!r} was just taken by another job"
            " starting at the same time; start it again"
        )
    if not options.dp:
        return
    unit, delta = options.unit, options.delta
    for device_id in sorted(degrees):
        budget = _device_budget(session, device_id, options)
        planned = _planned(session, device_id, job, options, degrees[device_id])
        if budget is None or planned is None:
            continue
        spent = _spends(session, device_id)
        projected = privacy.epsilon([*spent, planned], delta, unit)
        if projected > budget:
            so_far = privacy.epsilon(spent, delta, unit)
            what = "DP-SGD steps" if options.record_dp else "releases"
            raise Conflict(
                f"job {job.id!r} would spend device {device_id!r} to ε = {projected:.3g} at"
                f" δ = {delta:g} for its {unit}s (ε = {so_far:.3g} spent so far,"
                f" {planned.releases} new {what}) past its ε budget {budget:g} (the smallest"
                f" dp_epsilon_budget of its {unit}-level jobs); use fewer rounds, a larger"
                " dp_noise_multiplier or other devices"
            )


def record_spend(
    session: Session, job: Job, device: Device, body: PrivacySpend, now: float
) -> PrivacyStatus:
    """Record the releases of one round before the device makes them; return its status.

    Idempotent per (job, device, round): the same count again changes nothing — except
    ``new_run``, whose releases of a recorded round are counted again (the module
    docstring). The check and the record are one transaction under the device's lock.

    Raises
    ------
    Conflict
        The job adds no DP noise, the round was recorded with another count, or the
        releases would push the device past the job's budget ("privacy budget
        exhausted": nothing is recorded).
    Forbidden
        The device does not take part in the job.
    meshfl.errors.ConfigError
        A round outside ``1..rounds`` or a count outside ``1..participants − 1``.

    """
    options = PrivacyOptions.from_spec(job.spec)
    if not options.dp:
        raise Conflict(f"job {job.id!r} adds no DP noise (dp_noise_multiplier 0); nothing to spend")
    store.participation(session, job, device)
    rounds = int(job.spec["rounds"])
    if not 1 <= body["round"] <= rounds:
        raise ConfigError(f"round {body['round']} is out of range; job {job.id!r} has 1..{rounds}")
    rate = _check_releases(session, job, options, body)
    key = (job.id, device.id, body["round"])
    privacy.load_accountant()  # not under the lock: the first import takes seconds
    lock_devices(session, [device.id])  # check and spend: one step (module docstring)
    stored = _row(session, *key)
    again = stored is not None and bool(body.get("new_run", False))
    if stored is None or again:
        spent = _spends(session, device.id)
        new = Spend(options.noise_multiplier, body["releases"], rate, options.unit)
        after = privacy.epsilon([*spent, new], options.delta, options.unit)
        budget = _device_budget(session, device.id, options)
        if budget is not None and after > budget:
            session.rollback()  # releases the lock
            raise Conflict(
                f"privacy budget exhausted: round {body['round']} of job {job.id!r} would take"
                f" device {device.id!r} to ε = {after:.3g} > dp_epsilon_budget {budget:g} at"
                f" δ = {options.delta:g} for its {options.unit}s; the device must stop releasing"
            )
        if stored is not None:  # a new run re-releases a recorded round: count it again
            stored.releases += body["releases"]
            stored.at = now
            session.commit()
            return _status(session, device.id, options.delta, budget, options.unit)
        session.add(
            PrivacySpendRecord(
                job_id=job.id,
                device_id=device.id,
                round=body["round"],
                releases=body["releases"],
                noise_multiplier=options.noise_multiplier,
                delta=options.delta,
                at=now,
                unit=options.unit,
                sampling_rate=rate,
            )
        )
        try:
            session.commit()
        except IntegrityError:  # a concurrent spend of the same round won
            session.rollback()
            stored = _row(session, *key)
    else:
        session.commit()  # nothing to write: end the transaction, releasing the lock
    if stored is not None and stored.releases != body["releases"]:
        raise Conflict(
            f"round {body['round']} of job {job.id!r} is already recorded with"
            f" {stored.releases} releases for device {device.id!r}; a round is spent once"
        )
    budget = _device_budget(session, device.id, options)
    return _status(session, device.id, options.delta, budget, options.unit)


def _check_releases(
    session: Session, job: Job, options: PrivacyOptions, body: PrivacySpend
) -> float:
    """Check a spend's count (and, at the record unit, its sampling rate); return q.

    Raises ConfigError with the valid range.
    """
    if options.record_dp:
        rate = body.get("sampling_rate")
        ok = isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate <= 1
        if not ok:
            raise ConfigError(
                f"job {job.id!r} is record-level DP: a spend needs sampling_rate in (0, 1]"
                f" (B / n_local of its DP-SGD steps), got {rate!r}"
            )
        if not 1 <= body["releases"] <= MAX_STEPS_PER_ROUND:
            raise ConfigError(
                f"releases = {body['releases']} is invalid; a record-level spend counts the"
                f" round's DP-SGD steps, 1..{MAX_STEPS_PER_ROUND}"
            )
        return float(rate)  # type: ignore[arg-type]
    if "sampling_rate" in body and body["sampling_rate"] != 1:
        raise ConfigError(
            f"job {job.id!r} is device-level DP: its releases are not sampled (sampling_rate 1)"
        )
    most = max(1, len(store.participants(session, job)) - 1)
    if not 1 <= body["releases"] <= most:
        raise ConfigError(
            f"releases = {body['releases']} is invalid; a device of job {job.id!r} makes 1..{most}"
            " per round (1, or one per neighbour under secure aggregation)"
        )
    return 1.0


def _row(session: Session, job_id: str, device_id: str, rnd: int) -> PrivacySpendRecord | None:
    query = select(PrivacySpendRecord).where(
        PrivacySpendRecord.job_id == job_id,
        PrivacySpendRecord.device_id == device_id,
        PrivacySpendRecord.round == rnd,
    )
    return session.scalars(query.execution_options(populate_existing=True)).first()


def _status(
    session: Session, device_id: str, delta: float, budget: float | None, unit: str = "device"
) -> PrivacyStatus:
    spent = [s for s in _spends(session, device_id) if unit == "record" or s.unit == unit]
    return PrivacyStatus(
        device_id=device_id,
        epsilon_spent=privacy.epsilon(spent, delta, unit),
        delta=delta,
        epsilon_budget=budget,
        releases=sum(s.releases for s in spent),
        unit=unit,
    )


def device_status(
    session: Session, device: Device, delta: float | None = None, unit: str = "device"
) -> PrivacyStatus:
    """ε the device spent over all its jobs, for its data or for each of its records.

    ``unit`` ``device``: device-level releases; ``record``: every release and DP-SGD step.
    ``delta`` ``None``: the smallest ``dp_delta`` of the DP jobs it took part in
    (:data:`~meshfl.aggregation.privacy.DEFAULT_DP_DELTA` when none). The budget shown is
    the smallest positive ``dp_epsilon_budget`` of those jobs of ``unit`` (``None``: not
    capped). ``releases`` counts the rows ε composes (releases and DP-SGD steps).
    """
    query = select(Job).join(JobDevice, JobDevice.job_id == Job.id)
    jobs = session.scalars(query.where(JobDevice.device_id == device.id))
    options = [o for o in (PrivacyOptions.from_spec(j.spec) for j in jobs) if o.dp]
    if delta is None:
        delta = min((o.delta for o in options), default=DEFAULT_DP_DELTA)
    budgets = [b for b in (_budget(o) for o in options if o.unit == unit) if b is not None]
    return _status(session, device.id, delta, min(budgets, default=None), unit)


def job_epsilons(session: Session, job: Job, device_ids: Sequence[str]) -> dict[str, float | None]:
    """ε this job's releases cost each device at the job's δ and unit (``None``: no DP)."""
    options = PrivacyOptions.from_spec(job.spec)
    if not options.dp:
        return dict.fromkeys(device_ids)
    return {
        d: privacy.epsilon(_spends(session, d, job_id=job.id), options.delta, options.unit)
        for d in device_ids
    }
