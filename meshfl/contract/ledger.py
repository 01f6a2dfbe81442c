"""The delivery ledger: per round, per sender and per job (``/jobs/{job_id}/ledger``)."""

from __future__ import annotations

from typing_extensions import NotRequired, TypedDict

from meshfl.contract._schema import strict, strict_request

__all__ = [
    "JobLedger",
    "LedgerCounts",
    "LedgerDerived",
    "LedgerPair",
    "LedgerRoundTotals",
    "LedgerRow",
    "LedgerTotals",
    "PeerLedger",
    "RoundLedger",
]


@strict_request
class RoundLedger(TypedDict):
    """One device's delivery ledger for one round (docs/reliability.md defines each count).

    Counts of gossip envelopes since the device's previous report, except
    ``duplicates`` (repeated chunks and repeated envelopes dropped) and ``unrepaired``
    (a gauge: messages awaiting repair at the end of the round).
    """

    sent: int  # envelopes this device published
    delivered: int  # envelopes of this job that reached it and decoded
    applied: int  # envelopes applied to a replica (exactly once by (sender, sequence))
    duplicates: int
    rejected_malformed: int  # delta-topic payloads that did not decode (CRC, truncated)
    rejected_signature: int
    rejected_unsigned: int
    rejected_replayed: int
    rejected_stale: int  # a D-PSGD model older than the one held
    rejected_other: int  # misrouted, from a former peer, or not fitting the model
    # refused before being held: a round past the window, over the sender's quota, a full
    # receive queue (edge_agent.mailbox); absent from older agents
    rejected_quota: NotRequired[int]
    missing: int  # sequence numbers skipped: a later one of the same sender came first
    awaiting_keyframe: int  # arrived, but the sender's replica needs a keyframe first
    # missing or awaiting messages applied after all (late); absent from older agents: 0
    delivered_late: NotRequired[int]
    recovered_by_keyframe: int  # missing or awaiting messages repaired by a full state
    lost: int  # missing or awaiting messages given up on (last round, or peer dropped)
    unrepaired: int
    applied_twice: int  # (sender, sequence) pairs applied again: 0 unless a bug
    # envelopes this device re-sent on neighbours' repair requests; absent from older agents
    retransmitted: NotRequired[int]
    # Issue 25 (absent from older agents): this device's last sequence number, and what
    # became of each tracked sender's sequence numbers here so far (cumulative).
    sequence: NotRequired[int]
    peers: NotRequired[dict[str, PeerLedger]]


@strict
class PeerLedger(TypedDict):
    """What became of one sender's sequence numbers at one receiver, so far.

    ``heard`` counts the numbers up to ``high`` (the highest that arrived) from where the
    receiver started counting; each is exactly one of ``applied``, ``recovered`` (by a
    keyframe), ``lost``, ``unrepaired`` or ``discarded`` (arrived, never applied nor
    repaired). docs/reliability.md.
    """

    high: int
    heard: int
    # 1: still the receiver's peer; 0: a former one (its later numbers were not for it)
    tracked: NotRequired[int]
    applied: int
    recovered: int
    lost: int
    unrepaired: int
    discarded: int


@strict
class LedgerCounts(TypedDict):
    """The delivery-ledger counts every ledger view carries (docs/reliability.md).

    The fields of :class:`RoundLedger` (``delivered_late`` always present) plus
    ``rejected``, the six ``rejected_*`` counts summed.
    """

    sent: int
    delivered: int
    applied: int
    duplicates: int
    rejected: int
    rejected_malformed: int
    rejected_signature: int
    rejected_unsigned: int
    rejected_replayed: int
    rejected_stale: int
    rejected_other: int
    rejected_quota: int
    missing: int
    awaiting_keyframe: int
    delivered_late: int
    recovered_by_keyframe: int
    lost: int
    unrepaired: int
    applied_twice: int
    retransmitted: int


@strict
class LedgerRoundTotals(LedgerCounts):
    """A round's delivery ledger summed over the devices that reported one.

    ``unrepaired`` is summed too; ``devices_reporting`` counts the reports.
    """

    round: int
    devices_reporting: int


@strict
class LedgerRow(LedgerCounts):
    """One device's delivery ledger for one round, as it reported it (plus ``rejected``)."""

    device_id: str
    name: str
    round: int


@strict
class LedgerTotals(LedgerCounts):
    """A job's delivery ledger over the whole run (docs/reliability.md).

    Sums of every reported round, except: ``unrepaired`` sums each device's latest
    report; ``unrecovered_losses`` = ``lost`` + ``unrepaired``. ``applied_twice`` is
    measured by each device (an independent ``(sender, sequence)`` set; 0 unless a
    bug); ``corrupted_applied`` is 0 by construction: an envelope exists only after its
    CRC-32 (and, in a signed job, its Ed25519 signature) checked out, and what failed
    is counted in ``rejected_malformed`` / ``rejected_signature``.
    """

    devices_reporting: int
    rounds_reported: int
    unrecovered_losses: int
    corrupted_applied: int


@strict
class JobLedger(TypedDict):
    """``GET /jobs/{id}/ledger``: per device and round, per-round totals, run totals.

    Only round reports that carry a ledger count (agents before issue 7 send none).
    """

    job_id: str
    rows: list[LedgerRow]  # by round, then device index
    rounds: list[LedgerRoundTotals]  # by round
    totals: LedgerTotals
    # Issue 25: per (sender, receiver), from the devices' latest reports (absent: no
    # device reported per-sender counts).
    derived: NotRequired[LedgerDerived]


@strict
class LedgerPair(TypedDict):
    """What became of one sender's messages at one neighbour (docs/reliability.md).

    ``addressed`` = ``applied + recovered + lost + unrepaired + discarded + unaccounted``
    exactly; ``unaccounted``: numbers the sender used after the last one the receiver
    heard of (dropped by a broker, or sent after the receiver stopped).
    """

    sender: str
    receiver: str
    addressed: int
    applied: int
    recovered: int
    lost: int
    unrepaired: int
    discarded: int
    unaccounted: int


@strict
class LedgerDerived(TypedDict):
    """Every (sender, receiver) pair's :class:`LedgerPair` and their sums."""

    pairs: list[LedgerPair]
    sent: int  # the senders' sequence numbers used, summed (reported ``sent``)
    addressed: int
    applied: int
    recovered: int
    lost: int
    unrepaired: int
    discarded: int
    unaccounted: int
