"""A round through this device's own broker outage: hold the deadline, notice the return.

Nothing can arrive or leave while the transport reconnects (a broker restart): a round
keeps waiting — for at most :data:`MAX_OUTAGE_WAIT_S` past its deadline — and gets a
whole ``deadline_s`` once connected again, for the neighbours' messages that were queued
meanwhile. After a reconnect the engine's retained status is published again: a broker
that went down cleanly published this device's Last Will.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edge_agent.transport.base import Transport

__all__ = ["MAX_OUTAGE_WAIT_S", "OutageWatch"]

log = logging.getLogger("meshfl.agent.engine")

MAX_OUTAGE_WAIT_S = 300.0
"""Longest a round waits past its deadline while this device's broker connection is down."""


class OutageWatch:
    """Watch the transport's connection for one :class:`~edge_agent.engine.GossipEngine`.

    Parameters
    ----------
    transport
        The engine's transport (``connected``, ``reconnects``, ``flush``).
    deadline_s
        The round deadline in seconds.
    announce
        Publishes the engine's retained status (called once per reconnect).
    clock
        Monotonic clock (seconds).

    """

    def __init__(
        self,
        transport: Transport,
        deadline_s: float,
        announce: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        self.transport, self.deadline_s = transport, deadline_s
        self.announce, self.clock = announce, clock
        self.reconnects = 0  # the transport's reconnects when the status was last published
        self.reconnected_at = -1e9  # clock() when a reconnect was last noticed

    def started(self) -> None:
        """The engine announced its status now: reconnects before this one are known."""
        self.reconnects = self.transport.reconnects

    def deadline(self, deadline: float, published: float) -> float:
        """The round's ``deadline``, held while the connection is down (clock seconds).

        ``published``: when this device published its message of the round. Whatever
        the transport's ``flush`` raises (a broker that refused this device for good:
        taken over) goes to the caller.
        """
        now = self.clock()
        if not self.transport.connected:
            self.transport.flush(0.0)  # raises if the broker refused us for good (taken over)
            cap = published + self.deadline_s + MAX_OUTAGE_WAIT_S
            return min(max(deadline, now + self.deadline_s), cap)
        self.notice()
        return deadline

    def notice(self) -> None:
        """Once per reconnect: remember when (:meth:`just_back`), publish the status."""
        if self.transport.reconnects != self.reconnects:
            self.reconnects = self.transport.reconnects
            self.reconnected_at = self.clock()
            log.info("reconnected: announcing this device's status again")
            self.announce()

    def just_back(self, now: float) -> bool:
        """Whether the connection came back less than ``deadline_s`` seconds before ``now``."""
        return now - self.reconnected_at < self.deadline_s
