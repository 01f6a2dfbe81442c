"""The hand-over between a transport's network thread and an engine's own thread.

The network thread only puts ``(topic, payload)`` pairs on a queue
(:meth:`Mailbox._on_message`); the engine handles them on its thread, one at a time,
while it waits (:meth:`Mailbox._wait_one`) or between rounds (:meth:`Mailbox.drain`).
Both the gossip engine's :class:`~edge_agent.inbox.Inbox` and the
:class:`~edge_agent.secure_engine.SecureEngine` are mailboxes.

**Nothing a peer sends can end the engine.** Any exception out of a handler — a
:class:`~meshfl.errors.MeshflError` the handler did not catch, or a bug it exposed — is
a rejected, counted message (:meth:`Mailbox._on_handler_error`), never an exception out
of the wait; a retained hostile status is rejected at every restart, not fatal at each.

**The queue is bounded** (:data:`MAX_QUEUED_MESSAGES` messages, :data:`MAX_QUEUED_BYTES`
bytes of payload): a message that arrives when it is full is dropped and counted in
``refused_full`` (folded into the engine's counters on its thread), so a flooding peer
costs memory up to the bound, not without end.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

__all__ = ["MAX_QUEUED_BYTES", "MAX_QUEUED_MESSAGES", "MAX_ROUNDS_AHEAD", "Mailbox"]

MAX_QUEUED_MESSAGES = 65_536
"""Most received messages waiting to be handled."""
MAX_QUEUED_BYTES = 512 * 2**20
"""Most payload bytes waiting to be handled."""
MAX_ROUNDS_AHEAD = 256
"""Rounds a peer's message may run ahead of this device's round and still be held for it;
further ahead (a round near 2**32, say) it is refused and counted, never held."""


class _Rejections(Protocol):
    rejected: int
    rejected_reasons: list[str]


class Mailbox:
    """A bounded queue of received messages and the loop that handles them.

    Subclasses implement :meth:`_handle` (which should not raise for bad input: count
    and log it with :meth:`_reject`; whatever escapes it is counted by
    :meth:`_on_handler_error`) and provide ``stats`` with ``rejected`` (int) and
    ``rejected_reasons`` (list of str).

    Parameters
    ----------
    clock
        Monotonic clock (seconds).
    max_messages, max_bytes
        Bounds of the queue (defaults :data:`MAX_QUEUED_MESSAGES`,
        :data:`MAX_QUEUED_BYTES`).

    """

    logger: logging.Logger = logging.getLogger("meshfl.agent.engine")

    def __init__(
        self,
        clock: Callable[[], float],
        max_messages: int = MAX_QUEUED_MESSAGES,
        max_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self.clock = clock
        self._inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self._queue_lock = threading.Lock()
        self._queue_bounds = (max_messages, max_bytes)
        self._queued = [0, 0]  # messages, bytes (under _queue_lock)
        self._refused_full = 0  # dropped on a full queue, not yet folded (under _queue_lock)

    def _handle(self, topic: str, payload: bytes) -> None:
        raise NotImplementedError

    def queue_depth(self) -> int:
        """Received messages waiting to be handled (approximate: other threads add)."""
        return self._inbox.qsize()

    def _on_message(self, topic: str, payload: bytes) -> None:
        # Runs on the transport's network thread: do nothing but hand over (or drop).
        with self._queue_lock:
            count, size = self._queued
            if count >= self._queue_bounds[0] or size + len(payload) > self._queue_bounds[1]:
                self._refused_full += 1
                return
            self._queued = [count + 1, size + len(payload)]
        self._inbox.put((topic, payload))

    def _take(self, timeout: float | None) -> tuple[str, bytes] | None:
        try:
            item = self._inbox.get(timeout=timeout) if timeout else self._inbox.get_nowait()
        except queue.Empty:
            return None
        with self._queue_lock:
            self._queued = [self._queued[0] - 1, self._queued[1] - len(item[1])]
        return item

    def _dispatch(self, topic: str, payload: bytes) -> None:
        """Handle one message; nothing it raises leaves here (see the module docstring)."""
        with self._queue_lock:
            full, self._refused_full = self._refused_full, 0
        if full:
            self._on_queue_full(full)
        try:
            self._handle(topic, payload)
        except Exception as exc:
            self._on_handler_error(topic, exc)

    def _on_handler_error(self, topic: str, exc: Exception) -> None:
        """Count a message whose handler raised (a subclass adds its ledger count)."""
        self._reject(f"dropped a message on {topic}: {type(exc).__name__}: {str(exc)[:200]}")

    def _on_queue_full(self, dropped: int) -> None:
        """Count ``dropped`` messages refused on a full queue (a subclass adds its ledger)."""
        self._reject(f"dropped {dropped} messages: the receive queue was full", count=dropped)

    def _wait_one(self, deadline: float) -> bool:
        """Handle one incoming message, waiting until ``deadline``; False once it passed."""
        remaining = deadline - self.clock()
        if remaining <= 0:
            return False
        item = self._take(min(remaining, 0.25))
        if item is not None:
            self._dispatch(*item)
        return True

    def _drain_queue(self) -> None:
        """Handle whatever already arrived, without waiting."""
        while (item := self._take(None)) is not None:
            self._dispatch(*item)

    def _reject(self, reason: str, count: int = 1) -> None:
        """Count and log ``count`` dropped messages (the first 20 reasons are kept)."""
        stats: _Rejections = getattr(self, "stats")  # noqa: B009 (each subclass has its own)
        stats.rejected += count
        if len(stats.rejected_reasons) < 20:
            stats.rejected_reasons.append(reason)
        self.logger.warning("%s", reason)
