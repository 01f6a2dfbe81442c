"""Per-job learning counters of the coordinator's ``/metrics``: a metrics ``Source``.

Read from the store at scrape time for the running and paused jobs plus the
:data:`RECENT_FINISHED` most recently finished ones (a finished job's series disappear
once newer jobs push it out), each labelled ``job`` with the job id:

- ``meshfl_job_rounds_completed`` (gauge): rounds with a summary — rounds any device
  reported, exactly the entries of ``GET /jobs/{job_id}/rounds`` and ``meshfl local``'s
  ``report.json`` ``final.rounds_completed``;
- ``meshfl_job_bytes_sent_total`` / ``meshfl_job_bytes_received_total`` (counters,
  bytes): the sums of the devices' round reports, as ``report.json``'s
  ``final.bytes_sent_total`` / ``bytes_received_total``;
- ``meshfl_job_deltas_rejected_total{reason}`` (counter): envelopes the devices refused,
  summed from the round reports of a ``signed_deltas`` job (``reason`` ``unsigned``,
  ``signature``, ``replayed``; 0 for a job whose reports carry none);
- ``meshfl_job_epsilon_spent`` (gauge): the largest ε this job spent on any of its
  devices, at the job's δ — only for a job with differential privacy (as
  ``report.json``'s ``devices[].epsilon_spent``, whose maximum it is).

Sums run in SQL over the JSON round reports (``json_extract`` on SQLite, ``->>`` on
PostgreSQL): a scrape never loads the reports' sketches.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from coordinator import privacy
from coordinator.db import Job, PrivacySpendRecord, RoundMetric
from coordinator.settings import CoordinatorSettings
from meshfl.aggregation.privacy import PrivacyOptions

__all__ = ["RECENT_FINISHED", "REJECTION_REASONS", "job_counters", "watched_jobs"]

RECENT_FINISHED = 20
"""Finished (completed, failed, stopped) jobs exported besides the running and paused ones."""

REJECTION_REASONS = {
    "unsigned": "rejected_unsigned",
    "signature": "rejected_signature",
    "replayed": "rejected_replayed",
}
"""``reason`` label → the round report's counter of that refusal (a signed job's)."""

_LIVE = ("running", "paused")
_FINISHED = ("completed", "failed", "stopped")


def watched_jobs(session: Session, recent: int = RECENT_FINISHED) -> list[Job]:
    """The running and paused jobs, then the ``recent`` latest finished ones (by finish time)."""
    live = session.scalars(select(Job).where(Job.status.in_(_LIVE)).order_by(Job.id))
    finished = session.scalars(
        select(Job)
        .where(Job.status.in_(_FINISHED))
        .order_by(Job.finished_at.desc().nulls_last(), Job.id)
        .limit(recent)
    )
    return [*live, *finished]


def job_counters(session: Session, now: float, settings: CoordinatorSettings) -> list[Metric]:
    """The per-job families of the module docstring, for :func:`watched_jobs`."""
    del now, settings  # a Source's signature; the counters need neither
    jobs = watched_jobs(session)
    totals = _report_sums(session, [j.id for j in jobs])
    rounds = GaugeMetricFamily(
        "meshfl_job_rounds_completed",
        "Rounds with a summary (any device reported them), by job.",
        labels=["job"],
    )
    sent = CounterMetricFamily(
        "meshfl_job_bytes_sent", "Payload bytes the job's devices sent (bytes).", labels=["job"]
    )
    received = CounterMetricFamily(
        "meshfl_job_bytes_received",
        "Payload bytes the job's devices received (bytes).",
        labels=["job"],
    )
    rejected = CounterMetricFamily(
        "meshfl_job_deltas_rejected",
        "Envelopes the job's devices refused (signed deltas), by reason.",
        labels=["job", "reason"],
    )
    epsilon = GaugeMetricFamily(
        "meshfl_job_epsilon_spent",
        "Largest ε the job spent on one of its devices, at the job's δ (DP jobs only).",
        labels=["job"],
    )
    for job in jobs:
        row = totals.get(job.id, {})
        rounds.add_metric([job.id], row.get("rounds", 0))
        sent.add_metric([job.id], row.get("bytes_sent", 0))
        received.add_metric([job.id], row.get("bytes_received", 0))
        for reason, key in REJECTION_REASONS.items():
            rejected.add_metric([job.id, reason], row.get(key, 0))
        spent = _max_epsilon(session, job)
        if spent is not None:
            epsilon.add_metric([job.id], spent)
    return [rounds, sent, received, rejected, epsilon]


def _report_sums(session: Session, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per job: distinct rounds reported and the sums of the reports' byte and refusal counts."""
    if not job_ids:
        return {}
    summed = ("bytes_sent", "bytes_received", *REJECTION_REASONS.values())
    columns: list[Any] = [func.sum(RoundMetric.metrics[key].as_integer()) for key in summed]
    query = (
        select(RoundMetric.job_id, func.count(RoundMetric.round.distinct()), *columns)
        .where(RoundMetric.job_id.in_(job_ids))
        .group_by(RoundMetric.job_id)
    )
    out: dict[str, dict[str, int]] = {}
    for job_id, n_rounds, *sums in session.execute(query):
        row = {key: int(value or 0) for key, value in zip(summed, sums, strict=True)}
        row["rounds"] = int(n_rounds)
        out[str(job_id)] = row
    return out


def _max_epsilon(session: Session, job: Job) -> float | None:
    """The largest per-device ε of a DP job (``None``: no DP), as ``budget.job_epsilons``.

    Devices with the same ``(σ, releases)`` history share one accountant run.
    """
    options = PrivacyOptions.from_spec(job.spec)
    if not options.dp:
        return None
    record = PrivacySpendRecord
    query = (
        select(record.device_id, record.noise_multiplier, func.sum(record.releases),
               record.sampling_rate, record.unit)
        .where(record.job_id == job.id)
        .group_by(record.device_id, record.noise_multiplier, record.sampling_rate, record.unit)
    )  # fmt: skip
    spends: dict[str, list[privacy.Spend]] = defaultdict(list)
    for device_id, sigma, count, rate, unit in session.execute(query):
        spends[str(device_id)].append(privacy.Spend(float(sigma), int(count), float(rate), unit))
    histories = {tuple(sorted(rows)) for rows in spends.values()}
    return max((privacy.epsilon(h, options.delta, options.unit) for h in histories), default=0.0)
