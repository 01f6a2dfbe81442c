"""Job lifecycle: start (plan the topology), churn, completion rules, stop, assignments.

Status moves ``created → running → completed | failed | stopped`` (``created → stopped``
too); a job ends ``failed`` instead of ``completed`` when no participant finished it (every
one declined or left). ``running ⇄ paused`` (:func:`pause_job`, :func:`resume_job`): a
paused job's devices finish the rounds before its ``pause_round`` and wait; it can be
stopped, and it completes if every participant is done, but no departure or staleness
rule applies while it is paused (waiting devices keep polling their assignment, which
counts as activity).
A running job *completes* when every participant is done (finished, declined or left),
or when at least one finished and every other participant has been silent (no metrics,
no done, no assignment poll) for more than ``stale_after_s`` seconds: those are declared
lost and show their ``missing_rounds``. Departures (:func:`coordinator.churn.departures`)
and these rules are evaluated whenever a job is read or a device reports
(:func:`refresh_status`), so no background task is needed. Every new topology version
and every end of a job is announced on the control topic (:mod:`coordinator.control`).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from coordinator import budget, churn, planning, secagg, store
from coordinator.control import Control
from coordinator.db import Device, Job, JobDevice
from coordinator.errors import Conflict
from coordinator.settings import CoordinatorSettings
from coordinator.validation import MAX_SECURE_KEYS
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.contract import DeviceDone, JobSpec, TopologyEvent, spec_value
from meshfl.errors import ConfigError, TopologyError

__all__ = [
    "admit",
    "current_assignment",
    "leave_jobs",
    "leave_on_battery",
    "mark_declined",
    "mark_done",
    "pause_job",
    "peer_keys",
    "refresh_status",
    "resume_job",
    "start_job",
    "stop_job",
]


def start_job(
    session: Session,
    job: Job,
    now: float,
    settings: CoordinatorSettings,
    control: Control | None = None,
) -> Job:
    """Pick the participants, plan the graph, the mixing matrix W and the work; run the job.

    Candidates are the live devices (heard from within ``settings.live_within_s``
    seconds: an idle agent polls for work twice a second) in state ``active`` (never
    draining or revoked ones), matching the spec's ``select``
    (:func:`coordinator.planning.selects`), not busy in another running or paused job and
    not inference-only (profile ``role`` ``"inference"``), by enrolment time.
    With ``spec.min_battery_percent`` > 0 those below it and not
    charging sit out (recorded in the topology's ``sit_out`` and the start event). The
    first ``spec.devices`` of the rest take part (``0``: all of them; a custom graph's
    ``n``); ordered by name (then id), device ``k`` gets index and position ``k``, so the
    same names give the same graph whatever order the devices enrolled in. A
    secure-aggregation job orders them by a salted hash of their ids instead
    (:func:`coordinator.secagg.placement`): names are chosen by devices, and a device
    that picks its place could pick its neighbours. The graph, W,
    plans and version 1 are stored as :mod:`coordinator.planning` describes.

    Privacy (issue 5): a secure-aggregation threshold larger than some device's degree
    in the built graph, or a DP job whose releases would push a selected device past its
    ``dp_epsilon_budget`` (:func:`coordinator.budget.check_start`), is refused.

    Raises
    ------
    Conflict
        The job was already started, fewer eligible devices are live than it needs, the
        topology cannot be built for that many devices, or a privacy check above fails.

    """
    if job.status != "created":
        raise Conflict(f"job {job.id!r} is already {job.status}; create a new job to run again")
    spec: JobSpec = job.spec  # type: ignore[assignment]
    wanted = int(spec["devices"]) or (spec["custom_graph"]["n"] if "custom_graph" in spec else 0)
    busy = store.busy_device_ids(session)
    selector = spec.get("select", {})
    live = [
        d
        for d in store.list_devices(session)
        if now - d.last_seen <= settings.live_within_s
        and d.id not in busy
        and d.state == "active"  # draining and revoked devices take no new work
        and d.profile.get("role") != "inference"  # serve-only agents never train
        and planning.selects(selector, d)
    ]
    sit_out = planning.battery_reasons(live, float(spec_value(spec, "min_battery_percent")))
    eligible = [d for d in live if d.id not in sit_out]
    if not eligible or len(eligible) < wanted:
        low = f" ({len(sit_out)} more sit out, low on battery)" if sit_out else ""
        which = (
            f"live, idle, active device(s) match its selector ({planning.selector_text(selector)})"
            if selector
            else "live, idle, active device(s) are enrolled"
        )
        fix = (
            "select fewer or broader devices"
            if selector
            else "start more agents or create the job for fewer devices"
        )
        raise Conflict(
            f"job {job.id!r} needs {wanted or 'at least 1'} device(s) but {len(eligible)}"
            f" {which}{low}; {fix}"
        )
    chosen = sorted(eligible[:wanted] if wanted else eligible, key=lambda d: (d.name, d.id))
    salt = None
    if PrivacyOptions.from_spec(spec).secure:  # no device may steer its own place (issue 23)
        salt, chosen = secagg.placement(chosen)
    keyless = [d.id for d in chosen if d.identity_key is None]
    if keyless and spec.get("signed_deltas", True):
        raise Conflict(
            f"device {keyless[0]} enrolled without an identity key; re-enrol it with this"
            " agent version, or create the job with signed_deltas false"
        )
    kind = spec["topology"]
    try:
        graph = planning.graph_for(spec, planning.base_graph(spec, len(chosen)), chosen)
        if not graph.is_connected():
            raise TopologyError("the graph is disconnected")
        _, gap = planning.mixing(graph, spec)
    except (ConfigError, TopologyError) as exc:
        raise Conflict(
            f"cannot build topology {kind!r} for {len(chosen)} devices ({exc}); "
            "change spec.devices or spec.topology"
        ) from exc
    options = PrivacyOptions.from_spec(spec)
    degrees = {d.id: graph.degree(k) for k, d in enumerate(chosen)}
    try:
        options.check_degrees(degrees, spec["codec"])
        if options.secure and degrees:
            keys = int(spec["rounds"]) * max(degrees.values())
            if keys > MAX_SECURE_KEYS:
                raise ConfigError(
                    f"a key bundle would carry {keys} masking keys (rounds × degree), more"
                    f" than {MAX_SECURE_KEYS}; use fewer rounds per job or a sparser topology"
                )
    except ConfigError as exc:
        raise Conflict(f"job {job.id!r} cannot start: {exc}") from exc
    budget.check_start(session, job, options, degrees)
    reason = f"started on {len(chosen)} devices" + "".join(
        f"; {device_id} sat out: {why}" for device_id, why in sit_out.items()
    )
    job.topology = {
        "kind": kind,
        "params": planning.topology_params(spec),
        "devices": [d.id for d in chosen],
        "edges": planning.edge_list(graph),
        "gap": gap,
        "version": 1,
        "from_round": 1,
        "events": [
            TopologyEvent(
                version=1, from_round=1, kind="start", device_id=None, reason=reason, at=now
            )
        ],
        "plan": planning.with_no_wait(spec, planning.device_plans(spec, chosen), graph, chosen),
        "sit_out": sit_out,
    }
    if salt is not None:
        job.topology["placement_salt"] = salt
    if options.secure:  # the secure-aggregation neighbourhoods never change (docs/privacy.md)
        job.topology["secure_neighbourhoods"] = secagg.neighbourhoods(job)
    for index, device in enumerate(chosen):
        session.add(
            JobDevice(
                job_id=job.id,
                device_id=device.id,
                index=index,
                done=False,
                final=None,
                last_activity=now,
                joined_round=1,
            )
        )
    job.status, job.started_at = "running", now
    session.commit()
    if control is not None:
        control.announce(job)
    return job


def _end(session: Session, job: Job, status: str, at: float, control: Control | None) -> None:
    if status == "completed" and not any(_finished(r) for r in store.participants(session, job)):
        status = "failed"  # every participant declined or left: nothing was trained
    job.status, job.finished_at = status, at
    session.commit()
    if control is not None:
        control.announce(job)


def _finished(row: JobDevice) -> bool:
    """The participant reported done with a model (not a decline), and did not leave."""
    return row.done and row.left_round is None and "error" not in (row.final or {})


def stop_job(session: Session, job: Job, now: float, control: Control | None = None) -> Job:
    """Stop a created, running or paused job; raises :class:`Conflict` once it has ended."""
    if job.status not in ("created", *store.ACTIVE_STATUSES):
        raise Conflict(f"job {job.id!r} is already {job.status}; nothing to stop")
    job.pause_round = None
    _end(session, job, "stopped", now, control)
    return job


def pause_job(session: Session, job: Job, control: Control | None = None) -> Job:
    """Hold a running job at a round boundary until :func:`resume_job`.

    The boundary ``pause_round`` is the highest reported round + 2
    (:func:`coordinator.churn.next_from_round`, as a topology change): every device, even
    one a round ahead of the coordinator's view, finishes the rounds before it and waits,
    so neighbours stop at the same round. Devices learn it from their assignment (polled
    every 0.5 s) and the control topic.

    Raises
    ------
    Conflict
        The job is not running (created, already paused, or ended).

    """
    if job.status != "running":
        hint = (
            "resume it with POST .../resume"
            if job.status == "paused"
            else "start it first"
            if job.status == "created"
            else "it has ended"
        )
        raise Conflict(f"job {job.id!r} is {job.status}, not running; {hint}")
    job.status, job.pause_round = "paused", churn.next_from_round(session, job)
    session.commit()
    if control is not None:
        control.announce(job)
    return job


def resume_job(session: Session, job: Job, now: float, control: Control | None = None) -> Job:
    """Let a paused job's devices go on from the round they wait before.

    Their activity clocks restart now: a device that died while the job was paused leaves
    by the usual silence and evidence rules once the others report again.

    Raises
    ------
    Conflict
        The job is not paused.

    """
    if job.status != "paused":
        raise Conflict(
            f"job {job.id!r} is {job.status}, not paused; only a paused job can be resumed"
        )
    for row in store.participants(session, job):
        if not row.done:
            row.last_activity = max(row.last_activity, now)
    job.status, job.pause_round = "running", None
    session.commit()
    if control is not None:
        control.announce(job)
    return job


def refresh_status(
    session: Session,
    job: Job,
    now: float,
    settings: CoordinatorSettings,
    control: Control | None = None,
) -> Job:
    """Apply the departure and completion rules to a running job and persist the result.

    A paused job only completes when every participant is done (it finished its last
    round before the pause took hold); nobody departs or is declared lost while paused.
    """
    if job.status == "paused":
        rows = store.participant_states(session, job)
        if rows and all(done for done, _, _ in rows):
            _end(session, job, "completed", now, control)
        return job
    if job.status != "running":
        return job
    due = control is None or control.departures_due(job.id, now, settings.departure_check_s)
    leaving = churn.departures(session, job, now, settings) if due else {}
    if leaving:
        churn.replan(session, job, now, remove=leaving, control=control)
        if job.status != "running":
            return job
    rows = store.participant_states(session, job)
    if rows and all(done for done, _, _ in rows):
        _end(session, job, "completed", now, control)
        return job
    finished = [done and left is None for done, left, _ in rows]
    pending = [seen for done, _, seen in rows if not done]
    if any(finished) and all(now - seen > settings.stale_after_s for seen in pending):
        _end(session, job, "completed", now, control)
    return job


def mark_done(
    session: Session,
    job: Job,
    row: JobDevice,
    device: Device,
    body: DeviceDone,
    now: float,
    control: Control | None = None,
) -> None:
    """Record that a participant finished or declined (the first report wins).

    A participant that was taken out keeps its departure as its result; that it posted
    done since is noted (:data:`coordinator.churn.LEFT_ACKNOWLEDGED`): its agent stopped,
    so it is not taken back (:func:`coordinator.churn.may_rejoin`).
    """
    if not row.done:
        row.done, row.final = True, dict(body)
    elif row.left_round is not None and not (row.final or {}).get(churn.LEFT_ACKNOWLEDGED):
        row.final = {**(row.final or {}), churn.LEFT_ACKNOWLEDGED: True}
    row.last_activity = now
    device.last_seen = now
    session.commit()
    if job.status in store.ACTIVE_STATUSES and all(
        r.done for r in store.participants(session, job)
    ):
        _end(session, job, "completed", now, control)


def mark_declined(
    session: Session,
    job: Job,
    row: JobDevice,
    device: Device,
    reason: str,
    now: float,
    control: Control | None = None,
) -> None:
    """Record that a participant cannot take part; it counts as done, with its reason."""
    if not row.done:
        row.done, row.final = True, {"error": reason[:500]}
    mark_done(session, job, row, device, row.final, now, control)  # type: ignore[arg-type]


def current_assignment(
    session: Session,
    device: Device,
    now: float,
    settings: CoordinatorSettings,
    control: Control | None = None,
) -> tuple[Job, JobDevice] | None:
    """Find the job ``device`` should work on now, with its participation (``None``: none).

    The latest-started job it takes part in that is running or paused, or that has ended
    (completed/stopped) while this device has not reported done — so it learns to
    stop. A device that reported done on an ended job gets nothing for it. Asking counts
    as activity of a participant that is not done (it is alive), paused jobs included.

    A participant taken out of a running job while it was silent (its agent was killed or
    the device rebooted) that asks again is taken back when
    :func:`coordinator.churn.may_rejoin` allows it: a new topology version adds it from
    the next round boundary, and its assignment's ``start_round`` is that round.
    """
    query = (
        select(Job, JobDevice)
        .join(JobDevice, JobDevice.job_id == Job.id)
        .where(JobDevice.device_id == device.id)
        .order_by(Job.started_at.desc(), Job.id)
    )
    found = list(session.execute(query))
    for job, row in found:
        if job.status in store.ACTIVE_STATUSES and not row.done:
            row.last_activity = now
    session.commit()
    for job, row in found:
        refresh_status(session, job, now, settings, control)
        if churn.may_rejoin(session, job, row, device):
            churn.replan(session, job, now, rejoin=[device], control=control)
        if job.status in store.ACTIVE_STATUSES or not row.done:
            return job, row
    return None


def admit(
    session: Session, device: Device, now: float, control: Control | None = None
) -> tuple[Job, JobDevice] | None:
    """Let an idle ``device`` join the latest elastic job that can take it (``None``: none).

    See :func:`coordinator.churn.elastic_job`; the device starts at the new version's
    ``from_round``. A device that is not ``active`` (draining, revoked) is never admitted,
    nor one without an identity key to a ``signed_deltas`` job.
    """
    if device.state != "active":
        return None
    job = churn.elastic_job(session, device)
    if job is None:
        return None
    if device.identity_key is None and job.spec.get("signed_deltas", True):
        return None  # its deltas could not be verified (docs/security.md, "Signed deltas")
    added = churn.replan(session, job, now, add=[device], control=control)
    return (job, added[0]) if added else None


def peer_keys(session: Session, job: Job) -> dict[str, str | None]:
    """The identity keys of the devices of ``job``'s current topology version, by id.

    ``None`` for a device enrolled without one. Read at every assignment request, so a
    device admitted to an elastic job is known to its neighbours from their next poll.
    """
    return store.identity_keys(session, list((job.topology or {}).get("devices", [])))


def leave_on_battery(
    session: Session, device: Device, now: float, control: Control | None = None
) -> None:
    """Take ``device`` out of the running jobs whose battery threshold it is now below."""
    for job in store.running_jobs(session):
        row = session.get(JobDevice, (job.id, device.id))
        reason = None if row is None else churn.battery_departure(job, row, device)
        if reason is not None:
            _leave(session, job, device, reason, now, control)


def leave_jobs(
    session: Session, device: Device, reason: str, now: float, control: Control | None = None
) -> list[str]:
    """Take ``device`` out of every running or paused job it still works on; their ids.

    The battery path's departure (:func:`coordinator.churn.replan`): a new topology
    version without the device from the next round boundary (``from_round``), so the
    device finishes the round it is in. Used when an operator drains or revokes it.
    """
    left = []
    query = select(Job).join(JobDevice, JobDevice.job_id == Job.id)
    query = query.where(JobDevice.device_id == device.id, Job.status.in_(store.ACTIVE_STATUSES))
    for job in list(session.scalars(query.order_by(Job.started_at.desc(), Job.id))):
        row = session.get(JobDevice, (job.id, device.id))
        if row is not None and row.left_round is None and not row.done:
            _leave(session, job, device, reason, now, control)
            left.append(job.id)
    return left


def _leave(
    session: Session, job: Job, device: Device, reason: str, now: float, control: Control | None
) -> None:
    churn.replan(session, job, now, remove={device.id: reason}, control=control)
    rows = store.participants(session, job)
    if job.status in store.ACTIVE_STATUSES and all(r.done for r in rows):
        _end(session, job, "completed", now, control)
