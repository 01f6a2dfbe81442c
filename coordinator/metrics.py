"""Prometheus metrics of one coordinator app (``GET /metrics``, text exposition format).

Each app owns a :class:`CoordinatorMetrics` with its own ``CollectorRegistry`` (never
prometheus-client's global one), so several apps in one process — tests, or a coordinator
embedded in ``meshfl local`` — do not clash. It exports

- ``meshfl_http_requests_total{method, route, status}``: requests answered, by route
  *template* (``/api/v1/jobs/{job_id}``; ``unmatched`` for a path no route has, so a
  scanner cannot blow up the label set) and status code;
- ``meshfl_http_request_duration_seconds{method, route}``: a histogram of the time to
  answer (seconds, wall clock);
- ``meshfl_devices{state, online}``: enrolled devices by state (``active``,
  ``draining``, ``revoked``) and whether online (:mod:`coordinator.presence`: the Last
  Will status, else heard from within ``live_within_s``);
- ``meshfl_jobs{status}``: jobs by status;
- the per-job counters of :mod:`coordinator.job_metrics` (``meshfl_job_*{job}``);
- ``meshfl_store_up``: 1 when the gauges above could be read from the database, else 0.

The fleet gauges are read from the database at scrape time. To export more (learning
metrics, privacy budgets), write a :data:`Source` — a function ``(session, now,
settings) -> iterable of metric families`` — and pass it to
:meth:`CoordinatorMetrics.add_source`; or register any prometheus-client collector on
``metrics.registry``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from coordinator.db import Device, Job
from coordinator.job_metrics import job_counters
from coordinator.presence import Presence, online_status
from coordinator.settings import CoordinatorSettings
from meshfl.contract import DeviceState, JobStatus

__all__ = [
    "CoordinatorMetrics",
    "RequestMetrics",
    "Source",
    "device_gauges",
    "job_gauges",
    "route_template",
]

log = logging.getLogger("coordinator.metrics")

Source = Callable[[Session, float, CoordinatorSettings], Iterable[Metric]]
"""Reads metric families from the store at scrape time: ``(session, now, settings)``."""

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Histogram buckets of request durations (seconds): the heartbeat goal is p99 < 0.1 s."""

UNMATCHED = "unmatched"
"""The ``route`` label of a request no route matched (404s of unknown paths, 413s)."""


def device_gauges(
    session: Session,
    now: float,
    settings: CoordinatorSettings,
    presence: Presence | None = None,
) -> list[Metric]:
    """``meshfl_devices{state, online}``; every known state appears, with 0 if none.

    Deleted devices (tombstones) are not counted. ``online`` is the devices' ``online``
    (:func:`coordinator.presence.online_status` with ``presence``) on
    ``devices.last_seen`` as stored: at most one heartbeat flush (1 s) behind
    (:mod:`coordinator.liveness`).
    """
    query = select(Device.id, Device.state, Device.last_seen).where(Device.state != "deleted")
    counts = {(state, flag): 0 for state in get_args(DeviceState) for flag in (True, False)}
    for device_id, state, seen in session.execute(query):
        shown = online_status(
            presence, device_id, seen, now=now, live_within_s=settings.live_within_s
        )
        key = (str(state), shown.online)
        counts[key] = counts.get(key, 0) + 1
    family = GaugeMetricFamily(
        "meshfl_devices",
        "Enrolled devices by state and whether they are online (Last Will or heartbeats).",
        labels=["state", "online"],
    )
    for (state, flag), n in sorted(counts.items()):
        family.add_metric([state, "true" if flag else "false"], n)
    return [family]


def job_gauges(session: Session, now: float, settings: CoordinatorSettings) -> list[Metric]:
    """``meshfl_jobs{status}``; every status appears, with 0 if no job has it."""
    del now, settings  # a Source's signature; jobs need neither
    query = select(Job.status, func.count()).group_by(Job.status)
    counts = dict.fromkeys(get_args(JobStatus), 0)
    counts.update({str(s): int(n) for s, n in session.execute(query)})
    family = GaugeMetricFamily("meshfl_jobs", "Jobs by status.", labels=["status"])
    for status, n in sorted(counts.items()):
        family.add_metric([status], n)
    return [family]


class CoordinatorMetrics:
    """The metrics of one app: request counters and store gauges read at each scrape.

    :class:`RequestMetrics` fills the request counters (:meth:`observe`).

    Parameters
    ----------
    sessions : sessionmaker
        Opens the session each scrape reads the store with.
    settings : CoordinatorSettings
        ``live_within_s`` decides ``online``.
    clock : callable
        The app's clock (unix seconds), for ``online``.
    presence : Presence, optional
        The devices' MQTT statuses, for ``online`` (``None``, default: heartbeats only).

    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        settings: CoordinatorSettings,
        clock: Callable[[], float],
        presence: Presence | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "meshfl_http_requests",
            "HTTP requests answered, by method, route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "meshfl_http_request_duration_seconds",
            "Time to answer an HTTP request (seconds), by method and route template.",
            ["method", "route"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self._sources: list[Source] = [partial(device_gauges, presence=presence), job_gauges]
        self._sources.append(job_counters)  # per-job learning counters (coordinator.job_metrics)
        self.registry.register(_StoreCollector(self._sources, sessions, settings, clock))

    def add_source(self, source: Source) -> None:
        """Export what ``source`` reads from the store at every scrape."""
        self._sources.append(source)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one answered request and its duration (seconds)."""
        self.requests.labels(method, route, str(status)).inc()
        self.duration.labels(method, route).observe(seconds)

    def render(self) -> bytes:
        """The registry in Prometheus text format (``CONTENT_TYPE_LATEST``)."""
        return generate_latest(self.registry)


class _StoreCollector(Collector):
    """Runs the sources in one session per scrape; a store failure reads as store_up 0."""

    def __init__(
        self,
        sources: list[Source],
        sessions: sessionmaker[Session],
        settings: CoordinatorSettings,
        clock: Callable[[], float],
    ) -> None:
        self.sources, self.sessions, self.settings, self.clock = sources, sessions, settings, clock

    def describe(self) -> Iterable[Metric]:
        return []  # read the store at scrape time only, never at registration

    def collect(self) -> Iterator[Metric]:
        families: list[Metric] = []
        up = 1
        try:
            with self.sessions() as session:
                for source in self.sources:
                    families.extend(source(session, self.clock(), self.settings))
        except SQLAlchemyError as exc:
            log.warning("metrics: cannot read the store: %s", type(exc).__name__)
            families, up = [], 0
        yield from families
        gauge = GaugeMetricFamily(
            "meshfl_store_up", "1 if the fleet gauges could be read from the database."
        )
        gauge.add_metric([], up)
        yield gauge


class RequestMetrics:
    """ASGI middleware counting every HTTP request by route template and status code.

    The template is the matched route's ``path`` (Starlette records the route in the
    request scope); the status is the response's, or 500 when the app raised.
    """

    def __init__(self, app: Any, metrics: CoordinatorMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve one ASGI call, recording an HTTP request's route, status and duration."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def record_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = route_template(scope)
            self.metrics.observe(scope["method"], route, status, time.perf_counter() - started)


_PARAM = re.compile(r"{(\w+)(?::\w+)?}")


def route_template(scope: Any) -> str:
    """The full path template of the route that served ``scope`` (:data:`UNMATCHED`: none).

    Starlette records the matched route in the scope; a route of an included router may
    know only its own part (``/jobs/{job_id}``), so the part of the request path before
    that route's rendered path (``/api/v1``) is put back in front.
    """
    template = getattr(scope.get("route"), "path", None)
    if not isinstance(template, str):
        return UNMATCHED
    params = scope.get("path_params") or {}
    try:
        rendered = _PARAM.sub(lambda m: str(params[m.group(1)]), template)
    except KeyError:
        return template
    path = str(scope.get("path", ""))
    if rendered and path.endswith(rendered):
        return path[: len(path) - len(rendered)] + template
    return template
