"""The hand-over between a transport's network thread and an engine's own thread.

The network thread only puts ``(topic, payload)`` pairs on a queue
(:meth:`Mailbox._on_message`); the engine handles them on its thread, one at a time,
while it waits (:meth:`Mailbox._wait_one`) or between rounds (:meth:`Mailbox.drain`).
Both the gossip engine's :class:`~edge_agent.inbox.Inbox` and the
:class:`~edge_agent.secure_engine.SecureEngine` are mailboxes.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from typing import Protocol

__all__ = ["Mailbox"]


class _Rejections(Protocol):
    rejected: int
    rejected_reasons: list[str]


class Mailbox:
    """A queue of received messages and the loop that handles them.

    Subclasses implement :meth:`_handle` (which must not raise for bad input: count and
    log it with :meth:`_reject`) and provide ``stats`` with ``rejected`` (int) and
    ``rejected_reasons`` (list of str).
    """

    logger: logging.Logger = logging.getLogger("meshfl.agent.engine")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()

    def _handle(self, topic: str, payload: bytes) -> None:
        raise NotImplementedError

    def queue_depth(self) -> int:
        """Received messages waiting to be handled (approximate: other threads add)."""
        return self._inbox.qsize()

    def _on_message(self, topic: str, payload: bytes) -> None:
        # Runs on the transport's network thread: do nothing but hand over.
        self._inbox.put((topic, payload))

    def _wait_one(self, deadline: float) -> bool:
        """Handle one incoming message, waiting until ``deadline``; False once it passed."""
        remaining = deadline - self.clock()
        if remaining <= 0:
            return False
        try:
            topic, payload = self._inbox.get(timeout=min(remaining, 0.25))
        except queue.Empty:
            return True
        self._handle(topic, payload)
        return True

    def _drain_queue(self) -> None:
        """Handle whatever already arrived, without waiting."""
        while True:
            try:
                topic, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(topic, payload)

    def _reject(self, reason: str) -> None:
        """Count and log a message that was dropped (the first 20 reasons are kept)."""
        stats: _Rejections = getattr(self, "stats")  # noqa: B009 (each subclass has its own)
        stats.rejected += 1
        if len(stats.rejected_reasons) < 20:
            stats.rejected_reasons.append(reason)
        self.logger.warning("%s", reason)
