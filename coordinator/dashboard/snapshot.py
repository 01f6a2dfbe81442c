"""The dashboard's snapshot: the fleet and one job, as one JSON document.

Built from the store with the functions the REST API uses (:mod:`coordinator.reports`,
:mod:`coordinator.fleet`, :mod:`coordinator.budget`, :mod:`coordinator.ledger`), so the
page shows what ``GET /api/v1/devices``, ``/jobs/{id}/rounds``, ``/jobs/{id}/devices``,
``/jobs/{id}/topology`` and ``/jobs/{id}/ledger`` answer; nothing is derived twice. The
layout is the dashboard contract's (docs/dashboard.md)::

    {"generated_at", "fleet", "devices": [...], "devices_total", "jobs": [...], "job"}

Building one reads every round report of the selected job (``round_summaries`` needs
them), so :class:`SnapshotCache` shares one build per job and second between viewers.
The snapshot only reads: it does not apply the job completion rules that ``GET
/api/v1/jobs`` applies (the next API read or report does).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from coordinator import budget, fleet, ledger, reports, store
from coordinator.db import Device, Job
from coordinator.presence import Presence
from coordinator.settings import CoordinatorSettings
from meshfl.contract import JobDeviceMetrics

__all__ = [
    "MAX_DEVICES",
    "MAX_JOBS",
    "SnapshotCache",
    "build_snapshot",
    "default_job",
    "fingerprint",
]

MAX_DEVICES = 1000
"""Most devices listed in a snapshot (``devices_total`` counts them all)."""
MAX_JOBS = 20
"""Most jobs listed in a snapshot's ``jobs``, newest first."""
ACTIVE = ("running", "paused")


def default_job(jobs: Sequence[Job]) -> Job | None:
    """The job a dashboard shows when none is asked for.

    The most recently started running or paused job; else the most recently created
    job; ``None`` when there is no job.
    """
    active = [j for j in jobs if j.status in ACTIVE]
    if active:
        return max(active, key=lambda j: (j.started_at or j.created_at, j.id))
    return max(jobs, key=lambda j: (j.created_at, j.id), default=None)


def _job_entry(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "name": str(job.spec.get("name", "")),
        "status": job.status,
        "rounds": int(job.spec["rounds"]),
        "created_at": job.created_at,
    }


def _privacy(spec: dict[str, Any]) -> dict[str, Any]:
    """What protects the job's data, for the job view's facts line.

    The DP unit (``device``, ``record``, or None: no DP), σ and C, and the
    secure-aggregation threshold t (0: off).
    """
    sigma = spec.get("dp_noise_multiplier") or 0.0
    return {
        "dp_unit": spec.get("dp_unit", "device") if sigma else None,
        "noise_multiplier": sigma,
        "clipping_norm": spec.get("dp_clip") if sigma else None,
        "secure_aggregation": int(spec.get("secure_aggregation") or 0),
    }


def _topology(job: Job) -> dict[str, Any] | None:
    if not job.topology:  # not started yet
        return None
    topo = reports.topology_public(job)
    w = topo["mixing_matrix"]
    return {
        "kind": topo["kind"],
        "version": topo["version"],
        "devices": topo["devices"],
        "edges": [[i, j] for i, j in topo["edges"]],
        "weights": [float(w[i][j]) for i, j in topo["edges"]],
        "spectral_gap": topo["spectral_gap"],
    }


def _job_view(session: Session, job: Job) -> tuple[dict[str, Any], dict[str, JobDeviceMetrics]]:
    """The snapshot's ``job`` object and each participant's totals, by device id."""
    rows = store.participants(session, job)
    ids = [r.device_id for r in rows]
    metrics = store.round_metrics(session, job, sketches=True)  # for the consensus curve
    epsilon = budget.job_epsilons(session, job, ids)
    names = store.device_names(session, ids)
    per_device = reports.job_device_metrics(rows, names, metrics, epsilon)
    delivery = ledger.job_ledger(job.id, rows, metrics, names)["rounds"]
    curves = [
        {
            "round": s["round"],
            "mean_accuracy": s["mean_accuracy"],
            "min_accuracy": s["min_accuracy"],
            "consensus_distance": s["consensus_distance"],
            "bytes_sent": s["bytes_sent"],
            "bytes_received": s["bytes_received"],
            "elapsed_s": s["elapsed_s"],
        }
        for s in reports.round_summaries(job, rows, metrics)
    ]
    view = {
        **_job_entry(job),
        "algorithm": job.spec.get("algorithm"),
        "codec": job.spec.get("codec"),
        "privacy": _privacy(job.spec),
        "rounds_done": curves[-1]["round"] if curves else 0,
        "curves": curves,
        "topology": _topology(job),
        "accuracy_by_device": {m["device_id"]: m["latest_accuracy"] for m in per_device},
        "ledger": delivery or None,  # per-round totals of GET /jobs/{id}/ledger
    }
    return view, {m["device_id"]: m for m in per_device}


def _device_entry(
    device: Device,
    now: float,
    settings: CoordinatorSettings,
    job_id: str | None,
    mine: JobDeviceMetrics | None,
    presence: Presence | None,
) -> dict[str, Any]:
    public = reports.device_public(device, now, settings.live_within_s, presence)
    # The status message carries the round an agent announced (at start and on some
    # transitions), its reports the last round it finished: the later of the two.
    known: list[int] = []
    if mine is not None:
        if presence is not None and (announced := presence.round_of(device.id, job_id)):
            known.append(announced)
        if mine["latest_round"] is not None:
            known.append(mine["latest_round"])
    rnd = max(known) if known else None
    return {
        "device_id": public["device_id"],
        "name": public["name"],
        "state": public["state"],
        "online": bool(public["online"]),
        "online_source": public.get("online_source", "heartbeat"),
        "tags": public["tags"],
        "profile": public["profile"],
        "last_seen": public["last_seen"],
        "round": rnd,
        "bytes_sent": mine["bytes_sent"] if mine is not None else 0,
        "epsilon_spent": mine["epsilon_spent"] if mine is not None else None,
    }


def build_snapshot(
    session: Session,
    settings: CoordinatorSettings,
    now: float,
    *,
    job_id: str | None = None,
    presence: Presence | None = None,
) -> dict[str, Any]:
    """Build the dashboard snapshot (layout in the module docstring and docs/dashboard.md).

    Parameters
    ----------
    session : Session
        A database session; only read.
    settings : CoordinatorSettings
        Its ``fleet`` and ``live_within_s`` (seconds) are used.
    now : float
        The coordinator's clock, unix seconds (``generated_at``; online status).
    job_id : str or None, optional
        The job to show; ``None`` (default): :func:`default_job`.
    presence : Presence or None, optional
        The devices' MQTT statuses (``app.state.presence``): they decide ``online``
        where recent (:func:`coordinator.presence.online_status`) and give a device's
        ``round`` in the selected job; ``None`` (default), or no status of that job:
        heartbeats decide, and the round is the device's latest round report.

    Returns
    -------
    dict
        JSON-ready. Devices in enrolment order, the selected job's participants first,
        at most :data:`MAX_DEVICES`; a device's ``round``, ``bytes_sent`` and
        ``epsilon_spent`` are for the selected job (``None``/0 outside it).

    Raises
    ------
    coordinator.errors.NotFound
        ``job_id`` names no job.

    """
    jobs = store.list_jobs(session)
    job = store.get_job(session, job_id) if job_id is not None else default_job(jobs)
    view, per_device = _job_view(session, job) if job is not None else (None, {})
    found, total = fleet.list_devices(
        session,
        fleet.DeviceFilter(),
        now=now,
        live_within_s=settings.live_within_s,
        limit=2**31,
        presence=presence,
    )
    found.sort(key=lambda d: d.id not in per_device)  # stable: participants first
    devices = [
        _device_entry(d, now, settings, job.id if job else None, per_device.get(d.id), presence)
        for d in found[:MAX_DEVICES]
    ]
    newest = sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)[:MAX_JOBS]
    return {
        "generated_at": now,
        "fleet": settings.fleet,
        "devices": devices,
        "devices_total": total,
        "jobs": [_job_entry(j) for j in newest],
        "job": view,
    }


def fingerprint(snapshot: dict[str, Any]) -> str:
    """SHA-256 of the snapshot without ``generated_at``: equal when nothing changed."""
    content = {k: v for k, v in snapshot.items() if k != "generated_at"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


class SnapshotCache:
    """Share snapshot builds between viewers: one build per job within ``max_age_s``.

    Parameters
    ----------
    build : callable
        ``build(job_id)`` returns a fresh snapshot (``job_id`` ``None``: the default
        job); it may raise, and the error reaches the caller uncached.
    max_age_s : float, optional
        How long a build is reused (seconds, monotonic clock); default 0.9, under the
        event stream's 1 s check so each check sees a build at most a second old.
    max_entries : int, optional
        Most jobs cached (default 64); the cache empties when it is full.

    """

    def __init__(
        self,
        build: Callable[[str | None], dict[str, Any]],
        *,
        max_age_s: float = 0.9,
        max_entries: int = 64,
    ) -> None:
        self._build = build
        self.max_age_s = max_age_s
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: dict[str | None, tuple[float, dict[str, Any]]] = {}

    def get(self, job_id: str | None) -> dict[str, Any]:
        """The snapshot of ``job_id``: a cached one under ``max_age_s`` old, else built."""
        with self._lock:
            cached = self._entries.get(job_id)
        if cached is not None and time.monotonic() - cached[0] < self.max_age_s:
            return cached[1]
        snapshot = self._build(job_id)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[job_id] = (time.monotonic(), snapshot)
        return snapshot
