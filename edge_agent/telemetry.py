"""The agent's Prometheus metrics: ``meshfl agent run --metrics-port PORT``.

The only agent module that imports prometheus-client. :class:`AgentTelemetry` is an
:class:`~edge_agent.observer.AgentObserver` with its own ``CollectorRegistry`` (never
the library's global one); :meth:`AgentTelemetry.serve` exposes it over HTTP
(``GET /metrics``, text exposition format) on a daemon thread. It exports

- ``meshfl_agent_rounds_total{device, job}`` (counter): rounds finished and reported;
- ``meshfl_agent_round_seconds{device, job}`` (histogram, seconds): a round's wall time;
- ``meshfl_agent_bytes_sent_total{device, job}`` / ``…_received_total`` (counters,
  bytes): payload bytes of the rounds, as in the round reports;
- ``meshfl_agent_deltas_applied_total{device, job}`` (counter): neighbours' messages
  applied (secure aggregation: own contributions committed);
- ``meshfl_agent_deltas_dropped_total{device, job, reason}`` (counter): well-formed
  messages not applied (:data:`~edge_agent.observer.DROP_REASONS`);
- ``meshfl_agent_deltas_rejected_total{device, job, reason}`` (counter): invalid ones
  (:data:`~edge_agent.observer.REJECT_REASONS`);
- ``meshfl_agent_epsilon_spent{device, job}`` (gauge): ε this DP job spent on the device;
- ``meshfl_agent_reconnects_total{device}`` (counter): broker connections regained;
- ``meshfl_agent_callback_errors_total{device}`` (counter): exceptions raised in MQTT
  callbacks or the message handler, logged and contained (the network loop carried on);
- ``meshfl_agent_queue_depth{device}`` (gauge): received messages waiting in the running
  job's mailbox (0 between jobs), read at scrape time.

Engine counters arrive cumulative (:class:`~edge_agent.observer.RoundSample`) and are
added as the difference from the job's previous sample.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edge_agent.observer import RoundSample
from meshfl.errors import ConfigError

__all__ = ["ROUND_BUCKETS", "AgentTelemetry"]

ROUND_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Histogram buckets of round wall times (seconds): sub-second CPU rounds to slow links."""


class AgentTelemetry:
    """Prometheus metrics of one agent process (see the module docstring).

    Parameters
    ----------
    device : str
        The ``device`` label until :meth:`connected` names the enrolled device id
        (default ``""``).

    """

    def __init__(self, device: str = "") -> None:
        self.device = device
        self.registry = CollectorRegistry(auto_describe=False)
        per_job = ["device", "job"]
        by_reason = ["device", "job", "reason"]
        r = self.registry
        self.rounds = Counter("meshfl_agent_rounds", "Rounds finished.", per_job, registry=r)
        self.round_seconds = Histogram(
            "meshfl_agent_round_seconds",
            "Wall time of a round: training, exchange and consensus step (seconds).",
            per_job,
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        self.bytes_sent = Counter(
            "meshfl_agent_bytes_sent", "Payload bytes sent in rounds (bytes).", per_job, registry=r
        )
        self.bytes_received = Counter(
            "meshfl_agent_bytes_received",
            "Payload bytes received in rounds (bytes).",
            per_job,
            registry=r,
        )
        self.applied = Counter(
            "meshfl_agent_deltas_applied", "Neighbours' messages applied.", per_job, registry=r
        )
        self.dropped = Counter(
            "meshfl_agent_deltas_dropped",
            "Well-formed messages not applied, by reason.",
            by_reason,
            registry=r,
        )
        self.rejected = Counter(
            "meshfl_agent_deltas_rejected",
            "Invalid messages refused, by reason.",
            by_reason,
            registry=r,
        )
        self.epsilon = Gauge(
            "meshfl_agent_epsilon_spent", "ε the DP job spent on this device.", per_job, registry=r
        )
        self._reconnects: Callable[[], int] | None = None
        self._callback_errors: Callable[[], int] | None = None
        self._queue_depth: Callable[[], int] | None = None
        self._seen: dict[str, RoundSample] = {}  # each job's previous sample
        self._lock = threading.Lock()
        self.registry.register(_LiveCollector(self))
        self._server: WSGIServer | None = None

    # AgentObserver ------------------------------------------------------------------------

    def connected(
        self,
        device: str,
        reconnects: Callable[[], int],
        callback_errors: Callable[[], int] | None = None,
    ) -> None:
        """Label everything with ``device`` from now on; read the counts at scrape time."""
        self.device, self._reconnects = device, reconnects
        self._callback_errors = callback_errors

    def job_started(self, job: str, queue_depth: Callable[[], int]) -> None:
        """Read the job's mailbox depth at scrape time until :meth:`job_finished`."""
        self._queue_depth = queue_depth

    def job_finished(self, job: str) -> None:
        """Stop reading the job's mailbox; its counters stay."""
        self._queue_depth = None

    def round_finished(self, sample: RoundSample) -> None:
        """Count one round: its time, bytes, and what the engine did since the last one."""
        labels = (self.device, sample.job)
        with self._lock:
            before = self._seen.get(sample.job)
            self._seen[sample.job] = sample
        self.rounds.labels(*labels).inc()
        self.round_seconds.labels(*labels).observe(sample.seconds)
        self.bytes_sent.labels(*labels).inc(max(0, sample.bytes_sent))
        self.bytes_received.labels(*labels).inc(max(0, sample.bytes_received))
        self.applied.labels(*labels).inc(_gain(sample.applied, before.applied if before else 0))
        for reason, n in sample.dropped.items():
            was = before.dropped.get(reason, 0) if before else 0
            self.dropped.labels(*labels, reason).inc(_gain(n, was))
        for reason, n in sample.rejected.items():
            was = before.rejected.get(reason, 0) if before else 0
            self.rejected.labels(*labels, reason).inc(_gain(n, was))
        if sample.epsilon is not None:
            self.epsilon.labels(*labels).set(sample.epsilon)

    # HTTP ---------------------------------------------------------------------------------

    def serve(self, host: str = "127.0.0.1", port: int = 9464) -> int:
        """Serve ``GET /metrics`` on ``host:port`` from a daemon thread; returns the port.

        Port 0 takes any free port (the one returned).

        Raises
        ------
        meshfl.errors.ConfigError
            The address cannot be bound (in use, or not this host's).

        """
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}); choose another"
                " --metrics-port (or --metrics-host)"
            ) from None
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop the HTTP server, if serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _gain(now: int, before: int) -> int:
    """What a cumulative count gained since ``before`` (never negative)."""
    return max(0, now - before)


class _LiveCollector(Collector):
    """Reconnects and mailbox depth, read from the agent at each scrape."""

    def __init__(self, telemetry: AgentTelemetry) -> None:
        self.telemetry = telemetry

    def describe(self) -> Iterable[Metric]:
        return []  # read at scrape time only

    def collect(self) -> Iterator[Metric]:
        t = self.telemetry
        reconnects = CounterMetricFamily(
            "meshfl_agent_reconnects",
            "Times the broker connection came back after being lost.",
            labels=["device"],
        )
        reconnects.add_metric([t.device], t._reconnects() if t._reconnects else 0)
        errors = CounterMetricFamily(
            "meshfl_agent_callback_errors",
            "Exceptions in MQTT callbacks or the message handler, logged and contained.",
            labels=["device"],
        )
        errors.add_metric([t.device], t._callback_errors() if t._callback_errors else 0)
        depth = GaugeMetricFamily(
            "meshfl_agent_queue_depth",
            "Received messages waiting in the running job's mailbox.",
            labels=["device"],
        )
        depth.add_metric([t.device], t._queue_depth() if t._queue_depth else 0)
        yield reconnects
        yield errors
        yield depth
