"""``/jobs``: create, start, pause, resume and stop jobs; rounds and per-device metrics.

Devices post their round metrics, done and decline reports here.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Query, Response, status
from sqlalchemy.orm import Session

from coordinator import budget, fleet_topology, ledger, lifecycle, reports, store, validation
from coordinator.control import Control
from coordinator.db import Job
from coordinator.deps import (
    ControlDep,
    DeviceDep,
    NowDep,
    OperateDep,
    ReadDep,
    SessionDep,
    SettingsDep,
)
from coordinator.settings import CoordinatorSettings
from meshfl.contract import (
    DeviceDecline,
    DeviceDone,
    DeviceRoundMetrics,
    DeviceRoundReport,
    JobDeviceMetrics,
    JobLedger,
    JobPublic,
    JobSpec,
    RoundMetrics,
    RoundSummary,
    TopologyPublic,
)

__all__ = ["router"]

router = APIRouter(prefix="/jobs", tags=["jobs"])


def _public(session: Session, job: Job) -> JobPublic:
    rows = store.participants(session, job)
    ids = [r.device_id for r in rows]
    names = store.device_names(session, ids)
    epsilon = budget.job_epsilons(session, job, ids)
    return reports.job_public(job, rows, names, store.round_metrics(session, job), epsilon)


def _read(
    session: Session, job_id: str, now: float, settings: CoordinatorSettings, control: Control
) -> Job:
    job = store.get_job(session, job_id)
    return lifecycle.refresh_status(session, job, now, settings, control)


@router.post("", response_model=JobPublic, status_code=status.HTTP_201_CREATED)
def create_job(body: JobSpec, _: OperateDep, session: SessionDep, now: NowDep) -> JobPublic:
    """Validate a job spec and store the job (status ``created``).

    A spec without ``topology`` takes the fleet's default topology (``GET /topology``):
    its kind and the parameters the spec does not set, stored with the job.
    """
    body = fleet_topology.fill_spec(body, fleet_topology.get_setting(session)[0])
    validation.validate_spec(body)
    spec = validation.fill_model_hash(body)  # stored with the job; agents check it
    return _public(session, store.create_job(session, spec, now))


@router.get("", response_model=list[JobPublic])
def list_jobs(
    _: ReadDep, session: SessionDep, settings: SettingsDep, control: ControlDep, now: NowDep
) -> list[JobPublic]:
    """Every job, oldest first."""
    jobs = store.list_jobs(session)
    for job in jobs:
        lifecycle.refresh_status(session, job, now, settings, control)
    return [_public(session, job) for job in jobs]


@router.get("/{job_id}", response_model=JobPublic)
def get_job(
    job_id: str,
    _: ReadDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
) -> JobPublic:
    """One job with each participant's progress."""
    return _public(session, _read(session, job_id, now, settings, control))


@router.post("/{job_id}/start", response_model=JobPublic)
def start_job(
    job_id: str,
    _: OperateDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
) -> JobPublic:
    """Pick the participants, plan the topology, mixing matrix and work, and run the job."""
    job = store.get_job(session, job_id)
    return _public(session, lifecycle.start_job(session, job, now, settings, control))


@router.post("/{job_id}/pause", response_model=JobPublic)
def pause_job(
    job_id: str,
    _: OperateDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
) -> JobPublic:
    """Hold a running job: devices finish the rounds before ``pause_round`` and wait.

    409 unless the job is running.
    """
    job = _read(session, job_id, now, settings, control)
    return _public(session, lifecycle.pause_job(session, job, control))


@router.post("/{job_id}/resume", response_model=JobPublic)
def resume_job(
    job_id: str,
    _: OperateDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
) -> JobPublic:
    """Let a paused job's devices go on from the round they wait before (409 unless paused)."""
    job = _read(session, job_id, now, settings, control)
    return _public(session, lifecycle.resume_job(session, job, now, control))


@router.post("/{job_id}/stop", response_model=JobPublic)
def stop_job(
    job_id: str,
    _: OperateDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
) -> JobPublic:
    """Stop a created, running or paused job (409 once it has ended)."""
    job = _read(session, job_id, now, settings, control)
    return _public(session, lifecycle.stop_job(session, job, now, control))


Since = Annotated[
    int, Query(ge=1, le=2**31, description="only rounds from this one on (default 1: all)")
]


@router.get("/{job_id}/rounds", response_model=list[RoundSummary])
def get_rounds(
    job_id: str, _: ReadDep, session: SessionDep, since: Since = 1
) -> list[RoundSummary]:
    """One summary per round any device reported, from round ``since`` on.

    A summary depends only on its round's reports, so a client that follows a job asks
    for the rounds after those it has seen complete instead of reloading the whole job.
    """
    job = store.get_job(session, job_id)
    rows = store.participants(session, job)
    metrics = store.round_metrics(session, job, since_round=since, sketches=True)
    return reports.round_summaries(job, rows, metrics)


@router.get("/{job_id}/devices", response_model=list[JobDeviceMetrics])
def get_devices(job_id: str, _: ReadDep, session: SessionDep) -> list[JobDeviceMetrics]:
    """Each participant's totals: rounds, latest accuracy, bytes, ε spent (by index)."""
    job = store.get_job(session, job_id)
    rows = store.participants(session, job)
    ids = [r.device_id for r in rows]
    epsilon = budget.job_epsilons(session, job, ids)
    return reports.job_device_metrics(
        rows, store.device_names(session, ids), store.round_metrics(session, job), epsilon
    )


Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many items (1..1000)")]
Offset = Annotated[int, Query(ge=0, le=2**31, description="skip this many items first")]


@router.get(
    "/{job_id}/devices/{device_id}/metrics",
    response_model=list[DeviceRoundMetrics],
    responses={200: {"headers": {"X-Total-Count": {"description": "reports in all pages"}}}},
)
def get_device_metrics(
    job_id: str,
    device_id: str,
    _: ReadDep,
    session: SessionDep,
    response: Response,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[DeviceRoundMetrics]:
    """One participant's round reports in round order, paged (``X-Total-Count``: all).

    404 when the device does not take part in the job.
    """
    job = store.get_job(session, job_id)
    if device_id not in {r.device_id for r in store.participants(session, job)}:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"device {device_id!r} does not take part in job {job_id!r}; list its devices"
            f" with GET /api/v1/jobs/{job_id}/devices",
        )
    rows, total = store.device_round_metrics(session, job, device_id, limit=limit, offset=offset)
    response.headers["X-Total-Count"] = str(total)
    return [reports.device_round_metrics(m) for m in rows]


@router.get("/{job_id}/reports", response_model=list[DeviceRoundReport])
def get_reports(job_id: str, _: ReadDep, session: SessionDep) -> list[DeviceRoundReport]:
    """Every stored per-device round report, in arrival order (for time-based views)."""
    job = store.get_job(session, job_id)
    return reports.device_reports(job, store.round_metrics(session, job))


@router.get("/{job_id}/ledger", response_model=JobLedger)
def get_ledger(job_id: str, _: ReadDep, session: SessionDep) -> JobLedger:
    """The job's delivery ledger: per device and round, per-round totals, run totals.

    Built from the ledgers the devices report with their round metrics (agents before
    issue 7 report none: their rounds are left out). docs/reliability.md defines each
    count; ``totals.unrecovered_losses`` is what the run lost for good.
    """
    job = store.get_job(session, job_id)
    rows = store.participants(session, job)
    names = store.device_names(session, [r.device_id for r in rows])
    return ledger.job_ledger(job.id, rows, store.round_metrics(session, job), names)


@router.get("/{job_id}/topology", response_model=TopologyPublic)
def get_topology(job_id: str, _: ReadDep, session: SessionDep) -> TopologyPublic:
    """Return the job's graph and mixing matrix W (409 before the job starts)."""
    job = store.get_job(session, job_id)
    if job.topology is None:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"job {job_id!r} has no topology yet; start it with POST /api/v1/jobs/{job_id}/start",
        )
    return reports.topology_public(job)


@router.post("/{job_id}/metrics", status_code=status.HTTP_204_NO_CONTENT)
def post_metrics(
    job_id: str,
    body: RoundMetrics,
    device: DeviceDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
) -> Response:
    """Record a participant's round report; re-posting a round is a no-op.

    A report for a round at or after the device's ``left_round`` is ignored (it left).
    """
    return post_metrics_batch(job_id, [body], device, session, settings, control, now)


MAX_BATCH = 64
"""Round reports one ``POST .../metrics/batch`` may carry."""


@router.post("/{job_id}/metrics/batch", status_code=status.HTTP_204_NO_CONTENT)
def post_metrics_batch(
    job_id: str,
    body: Annotated[list[RoundMetrics], Body(min_length=1, max_length=MAX_BATCH)],
    device: DeviceDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
) -> Response:
    """Record up to 64 round reports of one participant, in order, as one request.

    Each report is checked and stored as by ``POST .../metrics`` (a re-posted round is a
    no-op, a round at or after ``left_round`` is ignored); one bad report refuses the
    whole batch (422) before any is stored. The job's status is refreshed once. An agent
    whose rounds outpace its reports sends what queued up in one batch, so a fast job
    costs the coordinator one request per batch instead of one per round.
    """
    job = store.get_job(session, job_id)
    row = store.participation(session, job, device)
    rounds = int(job.spec["rounds"])
    for report in body:
        if not 1 <= report["round"] <= rounds:
            raise HTTPException(
                422,
                f"round {report['round']} is out of range; job {job_id!r} has rounds 1..{rounds}",
            )
        validation.validate_metrics(report, job.spec)  # type: ignore[arg-type]
    if any(report["missing"] for report in body):  # most reports miss nobody: no query
        participants = store.participant_ids(session, job)
        for report in body:
            validation.validate_missing(report["missing"], device.id, participants)
    kept = [r for r in body if row.left_round is None or r["round"] < row.left_round]
    if kept:
        store.record_metrics(session, row, device, kept, now)
    lifecycle.refresh_status(session, job, now, settings, control)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{job_id}/done", status_code=status.HTTP_204_NO_CONTENT)
def post_done(
    job_id: str,
    body: DeviceDone,
    device: DeviceDep,
    session: SessionDep,
    control: ControlDep,
    now: NowDep,
) -> Response:
    """Record that a participant finished; the job completes when all have."""
    validation.validate_done(body)
    job = store.get_job(session, job_id)
    row = store.participation(session, job, device)
    lifecycle.mark_done(session, job, row, device, body, now, control)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{job_id}/decline", status_code=status.HTTP_204_NO_CONTENT)
def post_decline(
    job_id: str,
    body: DeviceDecline,
    device: DeviceDep,
    session: SessionDep,
    control: ControlDep,
    now: NowDep,
) -> Response:
    """Record that a participant cannot take part (e.g. its data does not fit the model)."""
    job = store.get_job(session, job_id)
    row = store.participation(session, job, device)
    lifecycle.mark_declined(session, job, row, device, body["reason"], now, control)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
