"""A job's delivery ledger from its stored round reports (``GET /jobs/{id}/ledger``).

Each device reports its round's :class:`~meshfl.contract.RoundLedger` inside its
``RoundMetrics`` (stored as they came, in ``round_metrics.metrics``: no schema of its
own); this module sums them per round and over the run. Pure functions of ORM rows,
like :mod:`coordinator.reports`. docs/reliability.md defines every field.

**Derived per (sender, receiver).** Agents since issue 25 also report their last
sequence number and, per sender they track, what became of its numbers so far
(:class:`~meshfl.contract.PeerLedger`, cumulative, exact through a crash of the
receiver: :mod:`edge_agent.resume`). :func:`derive` takes each receiver's latest report
and the sender's sequence number as of that round: the numbers the sender used after
the last one the receiver heard of are *unaccounted* (a broker dropped them, or the
receiver stopped first), so that for every pair ``addressed = applied + recovered + lost
+ unrepaired + discarded + unaccounted``, and over a fixed topology ``addressed`` is the
senders' ``sent`` times their fan-out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from coordinator.db import JobDevice, RoundMetric
from meshfl.contract import (
    JobLedger,
    LedgerDerived,
    LedgerPair,
    LedgerRoundTotals,
    LedgerRow,
    LedgerTotals,
    RoundLedger,
)

__all__ = ["COUNTS", "OUTCOMES", "REJECTIONS", "derive", "job_ledger"]

OUTCOMES = ("applied", "recovered", "lost", "unrepaired", "discarded", "unaccounted")
"""What became of an addressed message, each exactly one of these (docs/reliability.md)."""

REJECTIONS = (
    "rejected_malformed",
    "rejected_signature",
    "rejected_unsigned",
    "rejected_replayed",
    "rejected_stale",
    "rejected_other",
    "rejected_quota",
)
"""The reasons an envelope is refused; ``rejected`` is their sum."""

COUNTS = (
    "sent",
    "delivered",
    "applied",
    "duplicates",
    *REJECTIONS,
    "missing",
    "awaiting_keyframe",
    "delivered_late",
    "recovered_by_keyframe",
    "lost",
    "unrepaired",
    "applied_twice",
    "retransmitted",
)
"""The counts of a :class:`~meshfl.contract.RoundLedger`, in the order shown."""


def _counts(ledger: Mapping[str, Any]) -> dict[str, int]:
    out = {k: int(ledger.get(k, 0)) for k in COUNTS}
    out["rejected"] = sum(out[k] for k in REJECTIONS)
    return out


def job_ledger(
    job_id: str,
    rows: Sequence[JobDevice],
    metrics: Sequence[RoundMetric],
    names: Mapping[str, str],
) -> JobLedger:
    """The ledger of a job: per device and round, per round, and over the run.

    Parameters
    ----------
    job_id
        The job's id.
    rows
        The job's participants (their ``index`` orders a round's rows).
    metrics
        Every stored round report of the job; those without a ``ledger`` are skipped.
    names
        Device id → name.

    Returns
    -------
    JobLedger
        ``totals.unrepaired`` sums each device's latest reported ``unrepaired``;
        ``unrecovered_losses`` is ``lost`` plus that; ``corrupted_applied`` is 0 by
        construction (see :class:`~meshfl.contract.LedgerTotals`).

    """
    index = {r.device_id: r.index for r in rows}
    reported = sorted(
        (m for m in metrics if isinstance(m.metrics.get("ledger"), dict)),
        key=lambda m: (m.round, index.get(m.device_id, len(index)), m.device_id),
    )
    out_rows: list[LedgerRow] = []
    per_round: dict[int, dict[str, int]] = {}
    totals: dict[str, int] = dict.fromkeys((*COUNTS, "rejected"), 0)
    latest: dict[str, tuple[int, int]] = {}  # device → (round, unrepaired)
    for m in reported:
        counts = _counts(cast(RoundLedger, m.metrics["ledger"]))
        for key, value in counts.items():
            totals[key] += value
        out_rows.append(
            cast(
                LedgerRow,
                {
                    "device_id": m.device_id,
                    "name": names.get(m.device_id, m.device_id),
                    "round": m.round,
                    **counts,
                },
            )
        )
        summed = per_round.setdefault(m.round, {"devices_reporting": 0})
        summed["devices_reporting"] += 1
        for key, value in counts.items():
            summed[key] = summed.get(key, 0) + value
        if m.round >= latest.get(m.device_id, (0, 0))[0]:
            latest[m.device_id] = (m.round, counts["unrepaired"])
    rounds = [cast(LedgerRoundTotals, {"round": r, **per_round[r]}) for r in sorted(per_round)]
    totals["unrepaired"] = sum(u for _, u in latest.values())
    totals["unrecovered_losses"] = totals["lost"] + totals["unrepaired"]
    totals["corrupted_applied"] = 0
    totals["devices_reporting"] = len(latest)
    totals["rounds_reported"] = len(per_round)
    out = JobLedger(job_id=job_id, rows=out_rows, rounds=rounds, totals=cast(LedgerTotals, totals))
    derived = derive(reported, totals["sent"])
    if derived is not None:
        out["derived"] = derived
    return out


def derive(metrics: Sequence[RoundMetric], sent: int) -> LedgerDerived | None:
    """What became of every sender's messages at every receiver (the module docstring).

    Parameters
    ----------
    metrics
        Round reports carrying a ledger; those without ``peers`` (older agents) are
        skipped.
    sent
        The reported ``sent`` summed over the run (shown with the pairs).

    Returns
    -------
    LedgerDerived or None
        None when no report carried per-sender counts.

    """
    latest: dict[str, RoundMetric] = {}  # receiver → its latest report with peers
    sequences: dict[str, list[tuple[int, int]]] = {}  # sender → (round, sequence)
    for m in metrics:
        ledger = m.metrics["ledger"]
        if "sequence" in ledger:
            sequences.setdefault(m.device_id, []).append((m.round, int(ledger["sequence"])))
        newer = m.device_id not in latest or m.round >= latest[m.device_id].round
        if isinstance(ledger.get("peers"), dict) and newer:
            latest[m.device_id] = m
    if not latest:
        return None
    pairs: list[LedgerPair] = []
    for receiver in sorted(latest):
        m = latest[receiver]
        for sender, counts in sorted(m.metrics["ledger"]["peers"].items()):
            used = max((q for r, q in sequences.get(sender, ()) if r <= m.round), default=0)
            part = {k: int(counts.get(k, 0)) for k in OUTCOMES[:-1]}
            tracked = int(counts.get("tracked", 1))  # a former peer's later numbers: not R's
            part["unaccounted"] = max(0, used - int(counts.get("high", 0))) if tracked else 0
            addressed = int(counts.get("heard", 0)) + part["unaccounted"]
            pairs.append(
                cast(
                    LedgerPair,
                    {"sender": sender, "receiver": receiver, "addressed": addressed, **part},
                )
            )
    rows = cast(list[dict[str, int]], pairs)
    summed = {k: sum(int(p[k]) for p in rows) for k in ("addressed", *OUTCOMES)}
    return cast(LedgerDerived, {"pairs": pairs, "sent": sent, **summed})
