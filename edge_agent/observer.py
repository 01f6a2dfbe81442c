"""The narrow interface through which the agent reports what it does to a metrics exporter.

The daemon and the job runner call an :class:`AgentObserver`; they never import
prometheus-client. :class:`NullObserver` (the default) does nothing;
:class:`edge_agent.telemetry.AgentTelemetry` exports to Prometheus (``meshfl agent run
--metrics-port``). What is reported:

- once connected: the device id and a function reading the transport's reconnect count;
- at each job's start: a function reading how many received messages wait in the
  engine's mailbox (``queue_depth``), read at scrape time;
- after each round: a :class:`RoundSample` — the round's wall time and payload bytes
  (the figures of the round report the coordinator gets) and the job engine's counters
  so far (:func:`engine_counts`), plus ε spent on a DP job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "DROP_REASONS",
    "REJECT_REASONS",
    "AgentObserver",
    "NullObserver",
    "RoundSample",
    "engine_counts",
]

DROP_REASONS = {
    "duplicate": "duplicates",
    "stale": "stale",
    "foreign": "foreign",
    "awaiting_keyframe": "awaiting_keyframe",
    "gap": "gaps",
    "late": "late_ignored",
}
"""``reason`` label → the engine stats' counter of well-formed messages dropped that way.

``duplicate``: a ``(sender, sequence)`` already applied; ``stale``: a D-PSGD model older
than the one held, or a CHOCO difference that a keyframe applied since already holds;
``foreign``: another job's, or a former neighbour's; ``awaiting_keyframe`` / ``gap``: a CHOCO
difference whose replica is unknown, or that overtook a predecessor (held for it, counted
once per gap; a keyframe is requested); ``late``: a secure round's masked input from a peer
already declared dropped.
"""

REJECT_REASONS = {
    "malformed": "rejected",
    "unsigned": "unsigned",
    "signature": "bad_signature",
    "replayed": "replayed",
}
"""``reason`` label → the engine stats' counter of messages refused as invalid.

``malformed``: bad checksum, bounds or encoding, or a sender that does not match its
topic; ``unsigned`` / ``signature`` / ``replayed``: a signed job's refusals
(:mod:`edge_agent.signing`).
"""


@dataclass(frozen=True)
class RoundSample:
    """What one finished round of one job adds to the agent's metrics.

    ``seconds`` is the round's wall time (training, exchange, consensus step; seconds);
    ``bytes_sent`` / ``bytes_received`` the payload bytes of this round (bytes, as in the
    round report); ``applied``, ``dropped`` and ``rejected`` the job engine's counts *so
    far* (cumulative; :func:`engine_counts`); ``epsilon`` the ε this job has spent on
    this device (``None``: not a DP job).
    """

    job: str
    round: int
    seconds: float
    bytes_sent: int
    bytes_received: int
    applied: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    rejected: Mapping[str, int] = field(default_factory=dict)
    epsilon: float | None = None


def engine_counts(stats: object) -> tuple[int, dict[str, int], dict[str, int]]:
    """``(applied, dropped by reason, rejected by reason)`` read from an engine's ``stats``.

    Works on the gossip engine's ``EngineStats`` and the secure engine's ``SecureStats``:
    a counter one of them lacks reads 0 (the secure engine applies no single delta, so
    its ``applied`` is its ``committed`` contributions).
    """

    def count(name: str) -> int:
        return int(getattr(stats, name, 0))

    applied = count("applied") if hasattr(stats, "applied") else count("committed")
    dropped = {reason: count(name) for reason, name in DROP_REASONS.items()}
    rejected = {reason: count(name) for reason, name in REJECT_REASONS.items()}
    return applied, dropped, rejected


class AgentObserver(Protocol):
    """Receives the agent's events (see the module docstring); must never raise."""

    def connected(
        self,
        device: str,
        reconnects: Callable[[], int],
        callback_errors: Callable[[], int] | None = None,
    ) -> None:
        """The agent enrolled as ``device`` and connected.

        ``reconnects()`` and ``callback_errors()`` read the transport's reconnect count and
        its contained callback exceptions; ``callback_errors`` None: not known.
        """

    def job_started(self, job: str, queue_depth: Callable[[], int]) -> None:
        """A job's engine started; ``queue_depth()`` reads the messages waiting in it."""

    def round_finished(self, sample: RoundSample) -> None:
        """One round of a job finished and was reported."""

    def job_finished(self, job: str) -> None:
        """The job's engine stopped (its mailbox is no longer read)."""


class NullObserver:
    """An :class:`AgentObserver` that ignores everything (metrics off, the default)."""

    def connected(
        self,
        device: str,
        reconnects: Callable[[], int],
        callback_errors: Callable[[], int] | None = None,
    ) -> None:
        """Ignore the connection."""

    def job_started(self, job: str, queue_depth: Callable[[], int]) -> None:
        """Ignore the job's start."""

    def round_finished(self, sample: RoundSample) -> None:
        """Ignore the round."""

    def job_finished(self, job: str) -> None:
        """Ignore the job's end."""
