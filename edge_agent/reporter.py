"""Talk to the coordinator off the round loop: round reports in order, assignment polls.

The coordinator is the control plane: no round should wait for it. A running job hands
its round reports and re-measured profiles to a :class:`Reporter`, whose thread posts
them in order (the REST client retries transient failures) and reads the device's
assignment every ``poll_s`` seconds, so that the round loop learns of a stop, a pause or
a new topology version without a request of its own (a paused job's round loop waits on
those polls, :meth:`Reporter.wait_for_poll`). Topology versions also arrive on the
control topic; the poll is the fallback.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from edge_agent.rest import CoordinatorClient
from meshfl.contract import Assignment, CapabilityProfile, RoundMetrics
from meshfl.errors import CoordinatorError, MeshflError
from meshfl.logcontext import run_in_context

__all__ = ["Reporter"]

log = logging.getLogger("meshfl.agent.reporter")

_STOP = object()


class Reporter:
    """A background thread owning the device's REST client while a job runs.

    Parameters
    ----------
    client
        The device's :class:`CoordinatorClient`; only this thread uses it until
        :meth:`close` returns.
    device_id, job_id
        Whose reports and assignment.
    poll_s
        Seconds between assignment reads (default 1).
    max_backlog
        Round reports allowed to wait unsent or in flight (default 8, at most 64: the
        coordinator's batch limit). :meth:`post_metrics` blocks while more are waiting:
        a coordinator that cannot keep up slows the rounds rather than falling ever
        further behind them (its view of the job, and the round it plans topology
        changes from, stays within a few rounds of the devices). Reports that wait go out
        together as one batch.
    coalesce_s
        Longest a round report waits for the next ones (default 0.2 s; 0: each goes out
        at once): reports go out when ``max_backlog // 2`` are waiting or the oldest has
        waited this long, so rounds faster than the coordinator's requests cost it one
        request per few rounds, not one per round. :meth:`close` sends what waits.

    A request that fails for good (the client gave up retrying, or the coordinator
    refused it) is kept and raised by the next :meth:`post_metrics`, :meth:`put_profile`
    or :meth:`close` on the caller's thread: the job fails as it would have inline.

    """

    def __init__(
        self,
        client: CoordinatorClient,
        device_id: str,
        job_id: str,
        poll_s: float = 1.0,
        max_backlog: int = 8,
        coalesce_s: float = 0.2,
    ) -> None:
        if not 1 <= max_backlog <= 64:
            raise ValueError(f"max_backlog must be in 1..64, got {max_backlog}")
        self.client, self.device_id, self.job_id = client, device_id, job_id
        self.poll_s = poll_s
        self.coalesce_s = coalesce_s
        self._batch_size = max(1, max_backlog // 2)
        self._waiting_since: float | None = None  # when the oldest unsent report came
        self._slots = threading.BoundedSemaphore(max_backlog)
        self._queue: queue.Queue[object] = queue.Queue()
        self._lock = threading.Lock()
        self._latest: Assignment | None = None
        self._polled = False
        self._polls = 0  # completed polls, for wait_for_poll
        self._poll_done = threading.Condition(self._lock)
        self._error: MeshflError | None = None
        self._unsent: list[RoundMetrics] = []  # queued round reports, oldest first
        self._batches = True  # False once the coordinator refused the batch route
        # In the caller's log context: its lines name the device and job (meshfl.logcontext).
        self._thread = threading.Thread(
            target=run_in_context(self._run), name="meshfl-reporter", daemon=True
        )
        self._thread.start()

    def post_metrics(self, metrics: RoundMetrics) -> None:
        """Queue one round's report (posted in order, idempotent on the coordinator).

        Blocks while ``max_backlog`` reports are waiting or in flight (backpressure).
        Reports that queued up while a request was in flight go out together, as one
        ``POST .../metrics/batch`` (one ``POST .../metrics`` when alone).
        """
        self._raise()
        while not self._slots.acquire(timeout=0.5):
            self._raise()
            if not self._thread.is_alive():
                return
        with self._lock:
            self._unsent.append(metrics)
        self._queue.put(self._post_due)

    def put_profile(self, profile: CapabilityProfile) -> None:
        """Queue a re-measured capability profile."""
        self._raise()
        self._queue.put(lambda: self.client.put_profile(self.device_id, profile))

    def assignment(self) -> tuple[bool, Assignment | None]:
        """Return ``(polled, latest)``: whether a poll completed yet, and what it read."""
        with self._lock:
            return self._polled, self._latest

    def wait_for_poll(self, timeout_s: float) -> bool:
        """Block until the next assignment poll completes; False after ``timeout_s`` seconds.

        Raises a request's failure kept by the reporter thread (then no poll will come).
        """
        with self._poll_done:
            seen = self._polls
            done = self._poll_done.wait_for(lambda: self._polls > seen, timeout_s)
        self._raise()
        return done

    @property
    def backlog(self) -> int:
        """Requests queued and not yet sent."""
        return self._queue.qsize()

    def close(self, timeout_s: float = 120.0) -> None:
        """Send everything queued, stop the thread, and raise a request's failure."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("%d reports still unsent after %.0f s", self.backlog, timeout_s)
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        polled_at = time.monotonic()
        while True:
            due = polled_at + self.poll_s
            if self._waiting_since is not None:
                due = min(due, self._waiting_since + self.coalesce_s)
            try:
                item = self._queue.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                item = self._post_due
            if item is _STOP:
                if self._error is None:
                    self._call(self._post_unsent)  # what still waits
                return
            if self._error is None:
                self._call(item)  # type: ignore[arg-type]
            if time.monotonic() - polled_at >= self.poll_s and self._error is None:
                self._call(self._poll)
                polled_at = time.monotonic()

    def _post_due(self) -> None:
        """Send the waiting reports if enough wait or the oldest waited ``coalesce_s``."""
        with self._lock:
            waiting = len(self._unsent)
        if not waiting:
            return
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        if waiting >= self._batch_size or now - self._waiting_since >= self.coalesce_s:
            self._post_unsent()

    def _post_unsent(self) -> None:
        """Send every queued report, in order: one request, a batch if more than one."""
        with self._lock:
            batch, self._unsent = self._unsent, []
        self._waiting_since = None
        if not batch:
            return  # an earlier call already sent this one
        try:
            if len(batch) == 1 or not self._batches:
                for metrics in batch:
                    self.client.post_metrics(self.job_id, metrics)
            else:
                self._post_batch(batch)
        finally:
            for _ in batch:
                self._slots.release()

    def _post_batch(self, batch: list[RoundMetrics]) -> None:
        try:
            self.client.post_metrics_batch(self.job_id, batch)
        except CoordinatorError as exc:
            if exc.status not in (404, 405):
                raise
            log.info("the coordinator takes no batches of round reports: one at a time")
            self._batches = False
            for metrics in batch:
                self.client.post_metrics(self.job_id, metrics)

    def _poll(self) -> None:
        current = self.client.assignment(self.device_id)
        with self._poll_done:
            self._latest, self._polled = current, True
            self._polls += 1
            self._poll_done.notify_all()

    def _call(self, request: Callable[[], object]) -> None:
        try:
            request()
        except MeshflError as exc:
            log.error("coordinator request failed: %s", exc)
            self._error = exc
