"""The delivery ledger of one device in one job: what happened to every gossip message.

The gossip engine (:mod:`edge_agent.inbox`, :mod:`edge_agent.engine`) tells a
:class:`DeliveryLedger` what it sends, what reaches it and what it does with each
envelope; :meth:`DeliveryLedger.take_round` returns the counts since the previous call
as a :class:`~meshfl.contract.RoundLedger`, which the agent reports with the round's
metrics. docs/reliability.md ("The delivery ledger") defines every field.

**Repairs.** A neighbour's messages carry consecutive sequence numbers (one per
published envelope). A message needs repair when it is *missing* — a later sequence
number of the same sender arrived first — or when it arrived but could not be applied
because the replica of its sender was unknown or broken (a CHOCO difference dropped
while awaiting a keyframe). A full-state message applied later (a KEYFRAME, or a D-PSGD
model) with a higher sequence number repairs every such message before it: they count
as *recovered by keyframe*. A missing message that arrives after all and is applied — and
a CHOCO difference that waited for it and is applied after it — counts as *delivered
late*. A message still unrepaired when this device reports its last round of the job, or
when its sender stops being tracked (a new topology version), counts as *lost*;
``unrepaired`` reports those pending at the end of each round. So, over a device's run,
``missing + awaiting_keyframe = delivered_late + recovered_by_keyframe + lost`` plus the
last ``unrepaired``.

Sequence numbers are expected from 1 for the neighbours this device tracks when it
starts; for a peer added later, and for every peer of a joiner, from the first one that
arrives (the earlier ones were not addressed to this device).

**Per sender, exactly.** For each tracked sender the ledger also keeps how many of its
sequence numbers it has *heard of* (every number up to the highest that arrived, from
where counting started) and what became of each, once: ``applied`` (unique),
``recovered`` (by a keyframe), ``lost``, still ``unrepaired``, or — arrived, but never
applied nor repaired — ``discarded`` (stale, refused, held for a round never run), so
that ``heard = applied + recovered + lost + unrepaired + discarded`` for every sender.
The round report carries these per sender (``peers``) with this device's own last
sequence number (``sequence``); the coordinator derives from them, for every
(sender, receiver), the numbers the sender used that the receiver never heard of
(*unaccounted*: :mod:`coordinator.ledger`).

**Through a crash.** :meth:`DeliveryLedger.state` is saved in the job's checkpoint with
the round's report, before the report is posted; :meth:`DeliveryLedger.restore` puts it
back in a resumed agent, so counts survive the agent's own restart: what happened after
the checkpoint is undone by the crash (the replicas are reset by keyframes, which recover
every message after the checkpoint) and counted again after it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from typing import cast

from meshfl.contract import RoundLedger

__all__ = ["DeliveryLedger", "LedgerCounts", "PeerCounts", "from_ranges", "to_ranges"]


@dataclass
class LedgerCounts:
    """Counters of the ledger (envelopes, except ``duplicates``: see the module docs)."""

    sent: int = 0
    delivered: int = 0
    applied: int = 0
    duplicates: int = 0
    rejected_malformed: int = 0
    rejected_signature: int = 0
    rejected_unsigned: int = 0
    rejected_replayed: int = 0
    rejected_stale: int = 0
    rejected_other: int = 0
    rejected_quota: int = 0
    missing: int = 0
    awaiting_keyframe: int = 0
    delivered_late: int = 0
    recovered_by_keyframe: int = 0
    lost: int = 0
    applied_twice: int = 0
    retransmitted: int = 0


MAX_GAP = 1_000_000
"""Most sequence numbers one jump can make missing (keeps every count far below 2**53, the
coordinator's plausibility bound, whatever a sender claims)."""


def _ranges_of(ranges: object) -> list[tuple[int, int]]:
    """``[lo, hi]`` pairs checked (ValueError if ``ranges`` is not a list of them)."""
    if not isinstance(ranges, list):
        raise ValueError("ranges must be a list")
    out = []
    for item in ranges:
        if not (isinstance(item, list) and len(item) == 2 and all(_is_int(v) for v in item)):
            raise ValueError(f"bad range {item!r}")
        if not 0 <= item[0] <= item[1]:
            raise ValueError(f"bad range {item!r}")
        out.append((item[0], item[1]))
    return out


class _Gaps:
    """Sequence numbers awaiting repair, as sorted disjoint ``[lo, hi]`` ranges.

    Ranges, not a set: a neighbour (or anyone who can publish on its topic, in an
    unsigned job) may jump its sequence number by 2**64, and the gap must still cost
    O(1) memory. The number of ranges is at most the number of messages received.
    """

    def __init__(self) -> None:
        self._ranges: list[list[int]] = []

    def __len__(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self._ranges)

    def __contains__(self, sequence: int) -> bool:
        return any(lo <= sequence <= hi for lo, hi in self._ranges)

    def add_range(self, lo: int, hi: int) -> None:
        """Add ``lo..hi`` (inclusive), above every range held (a new gap at the top)."""
        if self._ranges and self._ranges[-1][1] >= lo - 1:
            self._ranges[-1][1] = max(self._ranges[-1][1], hi)
        else:
            self._ranges.append([lo, hi])

    def add(self, sequence: int) -> bool:
        """Add one sequence number; False if it was held already."""
        if sequence in self:
            return False
        self._ranges.append([sequence, sequence])
        self._ranges.sort()
        merged: list[list[int]] = []
        for lo, hi in self._ranges:
            if merged and merged[-1][1] >= lo - 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self._ranges = merged
        return True

    def discard(self, sequence: int) -> bool:
        """Remove one sequence number; False if it was not held."""
        for i, (lo, hi) in enumerate(self._ranges):
            if lo <= sequence <= hi:
                parts = [[lo, sequence - 1]] if lo < sequence else []
                parts += [[sequence + 1, hi]] if sequence < hi else []
                self._ranges[i : i + 1] = parts
                return True
        return False

    def remove_below(self, sequence: int) -> int:
        """Remove every number below ``sequence``; how many were removed."""
        removed, kept = 0, []
        for lo, hi in self._ranges:
            if hi < sequence:
                removed += hi - lo + 1
            elif lo < sequence:
                removed += sequence - lo
                kept.append([sequence, hi])
            else:
                kept.append([lo, hi])
        self._ranges = kept
        return removed


@dataclass
class PeerCounts:
    """What became of one sender's sequence numbers at this receiver (cumulative)."""

    heard: int = 0
    applied: int = 0
    recovered: int = 0
    lost: int = 0


_ENGINE_FIELDS = ("applied", "rejected_stale", "duplicates", "rejected_unsigned",
                  "rejected_signature", "rejected_replayed")  # fmt: skip
"""Counts the engine keeps (restarted at 0 by a new process): the ledger adds a base."""


def to_ranges(numbers: Collection[int]) -> list[list[int]]:
    """Sorted disjoint ``[lo, hi]`` ranges covering ``numbers``."""
    out: list[list[int]] = []
    for n in sorted(numbers):
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return out


def from_ranges(ranges: object) -> set[int]:
    """The numbers of ``[lo, hi]`` ranges (ValueError if they are not such ranges)."""
    out: set[int] = set()
    for lo, hi in _ranges_of(ranges):
        if hi - lo > MAX_GAP:
            raise ValueError(f"range {[lo, hi]} is too long")
        out.update(range(lo, hi + 1))
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class DeliveryLedger:
    """Counts one device's deliveries, repairs and losses (see the module docstring).

    Parameters
    ----------
    peers
        The device ids tracked from the start: their sequence numbers are expected
        from 1.

    """

    def __init__(self, peers: Collection[str]) -> None:
        self.counts = LedgerCounts()
        self._reported = LedgerCounts()
        self._floor: dict[str, int | None] = dict.fromkeys(peers, 0)
        self._high: dict[str, int] = {}
        self._seen: set[str] = set()  # senders with at least one message since tracked
        self._unrepaired: dict[str, _Gaps] = {}
        self._applied: dict[str, set[int]] = {}
        self._peer: dict[str, PeerCounts] = {}
        self._last_high: dict[str, int] = {}  # highest heard of, kept after untrack
        self._base = dict.fromkeys(_ENGINE_FIELDS, 0)  # engine counts of earlier processes

    def _of(self, peer: str) -> PeerCounts:
        return self._peer.setdefault(peer, PeerCounts())

    @property
    def unrepaired(self) -> int:
        """Messages that need repair and have not had it yet (a gauge, not a counter)."""
        return sum(len(s) for s in self._unrepaired.values())

    def track(self, peers: Collection[str]) -> None:
        """Track ``peers`` added later: their sequence numbers count from the first seen."""
        for peer in peers:
            self._floor.setdefault(peer, None)

    def untrack(self, peers: Collection[str]) -> None:
        """Stop tracking ``peers``: their unrepaired messages count as lost."""
        for peer in peers:
            gone = len(self._unrepaired.pop(peer, ()))
            self.counts.lost += gone
            self._of(peer).lost += gone
            self._floor.pop(peer, None)  # tracked again later: from its first message
            self._high.pop(peer, None)
            self._seen.discard(peer)

    def from_first_seen(self, peers: Collection[str]) -> None:
        """Count ``peers``' sequence numbers from the first that arrives (a joiner)."""
        for peer in peers:
            if peer not in self._seen:
                self._floor[peer] = None

    def arrived(self, sender: str, sequence: int) -> None:
        """A new ``(sender, sequence)`` of a tracked peer arrived: note the ones it skipped."""
        self._seen.add(sender)
        floor = self._floor.get(sender)
        if floor is None:  # a peer added later (or never tracked): from this message on
            floor = self._floor[sender] = sequence - 1
        high = max(self._high.get(sender, floor), floor)
        if sequence > high:
            self._of(sender).heard += min(sequence - high, MAX_GAP + 1)
        gaps = self._unrepaired.setdefault(sender, _Gaps())
        if sequence > high + 1:  # every number in between is missing (none arrived above high)
            # A jump past MAX_GAP is no run of real messages (a forged sequence number in
            # an unsigned job): only the MAX_GAP numbers before it count.
            lo = max(high + 1, sequence - MAX_GAP)
            self.counts.missing += sequence - lo
            gaps.add_range(lo, sequence - 1)
        self._high[sender] = max(high, sequence)
        self._last_high[sender] = max(self._last_high.get(sender, 0), sequence)

    def unusable(self, sender: str, sequence: int) -> None:
        """``(sender, sequence)`` arrived but awaits its sender's keyframe to be of use."""
        if self._unrepaired.setdefault(sender, _Gaps()).add(sequence):
            self.counts.awaiting_keyframe += 1  # a late arrival of a missing one counts once

    def applied(self, sender: str, sequence: int, *, full_state: bool) -> None:
        """``(sender, sequence)`` was applied; a full state repairs the messages before it.

        A message that was awaiting repair itself (missing, or held for a missing one)
        leaves the repairs as *delivered late*.
        """
        done = self._applied.setdefault(sender, set())
        if sequence in done:
            self.counts.applied_twice += 1
        elif sequence > (self._floor.get(sender) or 0):
            self._of(sender).applied += 1
        done.add(sequence)
        pending = self._unrepaired.get(sender)
        if pending is None:
            return
        if pending.discard(sequence):
            self.counts.delivered_late += 1
        if full_state:
            recovered = pending.remove_below(sequence)
            self.counts.recovered_by_keyframe += recovered
            self._of(sender).recovered += recovered

    def peer_counts(self) -> dict[str, dict[str, int]]:
        """What became of each sender's sequence numbers here so far (cumulative).

        Per sender: ``high`` (the highest heard of), ``tracked`` (1: still a peer; 0:
        a former one, whose later numbers were not for this device), ``heard``,
        ``applied``, ``recovered``, ``lost``, ``unrepaired`` and ``discarded``.
        """
        out: dict[str, dict[str, int]] = {}
        for peer in sorted(set(self._peer) | set(self._high)):
            p = self._of(peer)
            pending = len(self._unrepaired.get(peer, ()))
            out[peer] = {
                "high": self._last_high.get(peer, 0),
                "tracked": int(peer in self._floor),
                "heard": p.heard,
                "applied": p.applied,
                "recovered": p.recovered,
                "lost": p.lost,
                "unrepaired": pending,
                "discarded": p.heard - p.applied - p.recovered - p.lost - pending,
            }
        return out

    def state(self) -> dict[str, object]:
        """Everything the ledger knows, as JSON (saved in the job's checkpoint)."""
        return {
            "counts": {f.name: int(getattr(self._reported, f.name)) for f in fields(LedgerCounts)},
            "floor": dict(self._floor),
            "high": dict(self._high),
            "seen": sorted(self._seen),
            "unrepaired": {p: [list(r) for r in g._ranges] for p, g in self._unrepaired.items()},
            "applied": {p: to_ranges(s) for p, s in self._applied.items()},
            "peers": {p: [c.heard, c.applied, c.recovered, c.lost] for p, c in self._peer.items()},
            "last_high": dict(self._last_high),
        }

    def restore(self, state: Mapping[str, object]) -> None:
        """Put back :meth:`state` of an earlier process of this agent (after a crash).

        The counts reported so far continue (the engine's restarted counters are added
        to them); senders heard of before keep their sequence numbers, so that the
        messages sent since the checkpoint show as missing and are recovered by the
        keyframes a resumed device asks for. Raises ValueError if ``state`` is not one.
        """
        counts = state.get("counts")
        if not isinstance(counts, dict) or not all(
            _is_int(counts.get(f.name, 0)) for f in fields(LedgerCounts)
        ):
            raise ValueError("bad ledger counts")
        restored = LedgerCounts(
            **{f.name: int(counts.get(f.name, 0)) for f in fields(LedgerCounts)}
        )
        floor, high, seen = state.get("floor"), state.get("high"), state.get("seen")
        gaps, applied, peers = state.get("unrepaired"), state.get("applied"), state.get("peers")
        if not (isinstance(floor, dict) and isinstance(high, dict) and isinstance(seen, list)):
            raise ValueError("bad ledger state")
        if not (isinstance(gaps, dict) and isinstance(applied, dict) and isinstance(peers, dict)):
            raise ValueError("bad ledger state")
        if not all(v is None or _is_int(v) for v in floor.values()):
            raise ValueError("bad ledger floors")
        if not all(_is_int(v) for v in high.values()):
            raise ValueError("bad ledger highs")
        per: dict[str, PeerCounts] = {}
        for peer, values in peers.items():
            if not (isinstance(values, list) and len(values) == 4 and all(map(_is_int, values))):
                raise ValueError("bad ledger peer counts")
            per[str(peer)] = PeerCounts(*values)
        pending: dict[str, _Gaps] = {}
        for peer, ranges in gaps.items():
            g = _Gaps()
            for lo, hi in sorted(_ranges_of(ranges)):
                g.add_range(lo, hi)
            pending[str(peer)] = g
        done = {str(p): from_ranges(r) for p, r in applied.items()}
        self.counts = restored
        self._reported = LedgerCounts(**vars(restored))
        for name in _ENGINE_FIELDS:
            self._base[name] = getattr(restored, name)
        for peer, value in floor.items():
            if str(peer) in self._floor or value is not None:
                self._floor[str(peer)] = value
        self._high = {str(p): int(v) for p, v in high.items()}
        self._seen = {str(p) for p in seen} & set(self._high)
        self._unrepaired = pending
        self._applied = done
        self._peer = per
        last_high = state.get("last_high") or {}
        if isinstance(last_high, dict):
            self._last_high = {str(p): int(v) for p, v in last_high.items() if _is_int(v)}
        for peer, value in self._high.items():
            self._last_high[peer] = max(self._last_high.get(peer, 0), value)

    def forgotten(self, sender: str, sequences: Collection[int]) -> None:
        """``sender``'s ``sequences`` arrived but were held unapplied by a process now gone.

        A message held for a later round dies with the process (:func:`edge_agent.resume.
        restore_delivery`): it now awaits repair, like one that arrived unusable.
        """
        for sequence in sequences:
            self.unusable(sender, sequence)

    def take_round(self, engine: Mapping[str, int], *, final: bool = False) -> RoundLedger:
        """The counts since the previous call, as the round's report carries them.

        Parameters
        ----------
        engine
            The engine's own counters so far (:class:`~edge_agent.inbox.EngineStats`
            fields ``applied``, ``stale``, ``unsigned``, ``bad_signature``,
            ``replayed``, plus ``duplicates``: repeated chunks and envelopes).
        final
            This device's last round of the job: every unrepaired message becomes lost.

        """
        c, base = self.counts, self._base
        c.applied = base["applied"] + engine["applied"]
        c.rejected_stale = base["rejected_stale"] + engine["stale"]
        c.duplicates = base["duplicates"] + engine["duplicates"]
        c.rejected_unsigned = base["rejected_unsigned"] + engine["unsigned"]
        c.rejected_signature = base["rejected_signature"] + engine["bad_signature"]
        c.rejected_replayed = base["rejected_replayed"] + engine["replayed"]
        if final:
            for peer, pending in self._unrepaired.items():
                c.lost += len(pending)
                self._of(peer).lost += len(pending)
            self._unrepaired.clear()
        now = {f.name: int(getattr(c, f.name)) for f in fields(LedgerCounts)}
        before = {f.name: int(getattr(self._reported, f.name)) for f in fields(LedgerCounts)}
        self._reported = LedgerCounts(**now)
        delta = {k: now[k] - before[k] for k in now}
        delta["unrepaired"] = self.unrepaired
        out = cast(dict[str, object], delta)
        out["sequence"] = int(engine.get("sequence", 0))
        out["peers"] = self.peer_counts()
        return cast(RoundLedger, out)
