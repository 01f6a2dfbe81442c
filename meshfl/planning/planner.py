"""Capability-aware planning: work shares, byte budgets, battery, quorum, link-aware graphs.

Pure, deterministic functions from measured capability profiles to a plan; no I/O. Every
per-device argument is a sequence indexed like the devices, where ``None`` means "not
measured" (or, for a battery, "mains powered"). The rules and their sources are in
``docs/planning.md``:

- :func:`work_fractions`: load balancing by measured throughput (OmniLearn, Tyagi &
  Sharma 2025): a device ``m`` times slower than the median gets ``1/m`` of the local
  work, so a synchronous round is not held by the straggler;
- :func:`byte_budgets`: a byte budget per message from the measured uplink, which sets a
  top-k/random-k density (:meth:`meshfl.codecs.CodecPolicy.from_options`);
- :func:`battery_sit_out`: devices below a battery threshold and not charging sit out;
- :func:`quorum_size`: "proceed after k of d neighbours" in synchronous rounds;
- :func:`link_aware_graph`: slow links carry fewer edges (a simplification of Sun,
  Nguyen & He 2025, topology/weight co-design for bandwidth-limited edge networks);
  it lives in :mod:`meshfl.planning.links` with :func:`slow_nodes` and :func:`no_wait`;
- :func:`plan_devices`: the composition used by the coordinator.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from meshfl.errors import ConfigError
from meshfl.planning.checks import _check_measurements, _check_positive, _is_number
from meshfl.planning.links import link_aware_graph, no_wait, slow_nodes

__all__ = [
    "Plan",
    "battery_sit_out",
    "byte_budgets",
    "link_aware_graph",
    "no_wait",
    "plan_devices",
    "quorum_size",
    "slow_nodes",
    "work_fractions",
]


def work_fractions(
    samples_per_s: Sequence[float | None],
    *,
    floor: float = 0.05,
    work_samples: Sequence[float | None] | None = None,
    round_floor_s: float = 0.0,
) -> list[float]:
    """Return each device's share of the local work of a round.

    Load balancing in the style of OmniLearn (Tyagi & Sharma, 2025): the reference speed
    is the median of the measured throughputs and device ``i`` does
    ``clip(s_i / median, floor, 1)`` of the nominal local work (local steps or batch).
    A device 4× slower than the median does 0.25 of the work and finishes with the
    others; devices at or above the median do all of it (work is never scaled up).

    With ``work_samples`` (samples one round trains on each device) the rule works on
    compute time instead: ``t_i = work_samples_i / s_i``, the target is
    ``T = max(round_floor_s, median t)`` and device ``i`` does ``clip(T / t_i, floor, 1)``.
    Local work that fits in ``round_floor_s`` — the part of a round communication takes
    anyway — is never cut: shortening it would cost accuracy and save no time.

    Parameters
    ----------
    samples_per_s : sequence of float or None
        Measured training throughput per device, samples per second on the job's model.
        ``None`` or 0 means not measured: that device gets 1.0.
    floor : float, default 0.05
        Smallest fraction given, in (0, 1].
    work_samples : sequence of float or None, optional
        Samples a full round trains on, per device (local epochs × local samples);
        ``None`` entries fall back to the throughput rule's reference.
    round_floor_s : float, default 0
        Seconds of a round not spent training (>= 0).

    Returns
    -------
    list of float
        One fraction in ``[floor, 1]`` per device, in input order; all 1.0 when nothing
        is measured.

    Raises
    ------
    ConfigError
        If a throughput is negative, NaN or infinite, or ``floor`` is not in (0, 1].

    """
    if not _is_number(floor) or not 0.0 < floor <= 1.0:
        raise ConfigError(f"work fraction floor must be in (0, 1], got {floor!r}")
    _check_measurements(samples_per_s, "samples/s")
    measured = [float(s) for s in samples_per_s if s is not None and s > 0]
    if not measured:
        return [1.0] * len(samples_per_s)
    if work_samples is not None:
        return _time_fractions(samples_per_s, work_samples, floor, round_floor_s)
    reference = statistics.median(measured)
    return [
        1.0 if s is None or s <= 0 else min(1.0, max(floor, s / reference)) for s in samples_per_s
    ]


def _time_fractions(
    samples_per_s: Sequence[float | None],
    work_samples: Sequence[float | None],
    floor: float,
    round_floor_s: float,
) -> list[float]:
    if len(work_samples) != len(samples_per_s):
        raise ConfigError("work_samples needs one value per device")
    _check_measurements(work_samples, "samples per round")
    if not _is_number(round_floor_s) or round_floor_s < 0:
        raise ConfigError(f"round_floor_s must be >= 0, got {round_floor_s!r}")
    times = [
        None if s is None or s <= 0 or w is None else float(w) / float(s)
        for s, w in zip(samples_per_s, work_samples, strict=True)
    ]
    by_speed = work_fractions(samples_per_s, floor=floor)  # where the time is unknown
    known = [t for t in times if t is not None]
    if not known:
        return by_speed
    target = max(float(round_floor_s), statistics.median(known))
    return [
        by_speed[i] if t is None else 1.0 if t <= 0 else min(1.0, max(floor, target / t))
        for i, t in enumerate(times)
    ]


def byte_budgets(
    uplink_bytes_per_s: Sequence[float | None],
    *,
    budget_s: float,
    dense_bytes: int,
    floor_bytes: int = 256,
) -> list[int]:
    """Return each device's payload byte budget per message (0: unconstrained).

    ``b_i = int(uplink_i · budget_s)``: the bytes device ``i`` can upload in
    ``budget_s`` seconds. When ``b_i >= dense_bytes`` the full message fits and the
    device is unconstrained (0); otherwise its budget is ``max(b_i, floor_bytes)``, and
    :meth:`meshfl.codecs.CodecPolicy.from_options` turns it into a sparser top-k or
    random-k density. For a 1 Mbit/s uplink (125 000 B/s) and ``budget_s = 0.05`` the
    budget is 6 250 bytes.

    Parameters
    ----------
    uplink_bytes_per_s : sequence of float or None
        Measured uplink throughput per device, bytes per second; ``None``: not measured
        (budget 0).
    budget_s : float
        Seconds of uplink time one message may take, > 0.
    dense_bytes : int
        Bytes of one message under the job's codec without a budget, >= 1.
    floor_bytes : int, default 256
        Smallest budget given to a constrained device, bytes, >= 0.

    Returns
    -------
    list of int
        Bytes per message per device, in input order; 0 means no budget.

    Raises
    ------
    ConfigError
        If ``budget_s <= 0``, ``dense_bytes < 1``, ``floor_bytes < 0`` or an uplink is
        negative, NaN or infinite.

    """
    budget_s = _check_positive(budget_s, "uplink budget (seconds per message)")
    for value, what, low in ((dense_bytes, "dense_bytes", 1), (floor_bytes, "floor_bytes", 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{what} must be an integer >= {low}, got {value!r}")
    _check_measurements(uplink_bytes_per_s, "uplink bytes/s")
    budgets = []
    for uplink in uplink_bytes_per_s:
        if uplink is None:
            budgets.append(0)
            continue
        fits = int(uplink * budget_s)
        budgets.append(0 if fits >= dense_bytes else max(fits, floor_bytes))
    return budgets


def battery_sit_out(
    battery_percent: Sequence[float | None],
    charging: Sequence[bool | None],
    threshold: float,
) -> dict[int, str]:
    """Return the devices that sit out to save their battery, with the reason.

    A device sits out when its battery is below ``threshold`` percent and it is not
    charging (``charging`` False or unknown). A device without a battery (``None``,
    mains powered) never sits out.

    Parameters
    ----------
    battery_percent : sequence of float or None
        Battery level per device in percent [0, 100]; ``None``: no battery.
    charging : sequence of bool or None
        Whether each device is charging; ``None``: unknown (counts as not charging).
    threshold : float
        Minimum battery percent in [0, 100]; 0 turns the rule off.

    Returns
    -------
    dict of int to str
        Index -> reason, e.g. ``{2: "battery 12% < 20%, not charging"}``; empty when
        nobody sits out.

    Raises
    ------
    ConfigError
        If the sequences differ in length, ``threshold`` is outside [0, 100] or a battery
        level is outside [0, 100].

    """
    if len(battery_percent) != len(charging):
        raise ConfigError(
            f"battery levels ({len(battery_percent)}) and charging flags ({len(charging)}) "
            "must describe the same devices"
        )
    if not _is_number(threshold) or not 0.0 <= threshold <= 100.0:
        raise ConfigError(f"minimum battery percent must be in [0, 100], got {threshold!r}")
    for i, level in enumerate(battery_percent):
        if level is not None and (not _is_number(level) or not 0.0 <= level <= 100.0):
            raise ConfigError(f"battery of device {i} must be in [0, 100] percent, got {level!r}")
    if threshold == 0:
        return {}
    return {
        i: f"battery {level:g}% < {threshold:g}%, not charging"
        for i, (level, plugged) in enumerate(zip(battery_percent, charging, strict=True))
        if level is not None and level < threshold and not plugged
    }


def quorum_size(degree: int, quorum: float) -> int:
    """Return how many of ``degree`` neighbours a synchronous round waits for.

    ``k = ceil(quorum · degree)`` clipped to ``[min(1, degree), degree]``: a round
    proceeds once ``k`` neighbours answered (or at the deadline). ``quorum = 1`` waits
    for all; a small quorum still waits for one neighbour, and a node without
    neighbours waits for none.

    Parameters
    ----------
    degree : int
        Number of neighbours, >= 0.
    quorum : float
        Fraction of the neighbours, in (0, 1].

    Returns
    -------
    int
        ``k`` in ``[min(1, degree), degree]``.

    Raises
    ------
    ConfigError
        If ``degree < 0`` or ``quorum`` is not in (0, 1].

    """
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 0:
        raise ConfigError(f"degree must be an integer >= 0, got {degree!r}")
    if not _is_number(quorum) or not 0.0 < quorum <= 1.0:
        raise ConfigError(f"quorum must be in (0, 1], got {quorum!r}")
    k = math.ceil(round(quorum * degree, 9))  # 0.7 · 10 is 7.000000000000001 in binary
    return min(degree, max(min(1, degree), k))


@dataclass(frozen=True)
class Plan:
    """What the planner decided for a set of devices.

    Attributes
    ----------
    participants : tuple of int
        Indices (into the input sequences) of the devices that take part, ascending.
    sit_out : dict of int to str
        Index -> reason for the devices that do not take part.
    work_fraction : tuple of float
        Share of the local work in (0, 1], one per participant, in ``participants``'
        order.
    byte_budget : tuple of int
        Payload bytes per message (0: none), one per participant, in ``participants``'
        order.

    """

    participants: tuple[int, ...]
    sit_out: dict[int, str]
    work_fraction: tuple[float, ...]
    byte_budget: tuple[int, ...]


def plan_devices(
    samples_per_s: Sequence[float | None],
    uplink_bytes_per_s: Sequence[float | None],
    battery_percent: Sequence[float | None],
    charging: Sequence[bool | None],
    *,
    budget_s: float,
    dense_bytes: int,
    min_battery_percent: float,
    work_samples: Sequence[float | None] | None = None,
    round_floor_s: float = 0.0,
) -> Plan:
    """Plan a round for ``n`` devices from their measured capability profiles.

    First :func:`battery_sit_out` removes the devices low on battery; then
    :func:`work_fractions` and :func:`byte_budgets` are computed over the remaining
    participants only (the median speed is that of the devices that take part).

    Parameters
    ----------
    samples_per_s, uplink_bytes_per_s, battery_percent, charging : sequence
        Per device, length ``n`` each, as in the functions above (``None``: unmeasured,
        or no battery).
    budget_s : float
        Seconds of uplink per message (see :func:`byte_budgets`), > 0.
    dense_bytes : int
        Bytes of one message without a budget, >= 1.
    min_battery_percent : float
        Battery threshold in [0, 100]; 0 turns it off.
    work_samples, round_floor_s : optional
        As in :func:`work_fractions` (compute-time planning with a round floor).

    Returns
    -------
    Plan
        Possibly with no participants (every device low on battery).

    Raises
    ------
    ConfigError
        If the sequences differ in length or any value is out of range.

    """
    lengths = {len(samples_per_s), len(uplink_bytes_per_s), len(battery_percent), len(charging)}
    if len(lengths) != 1:
        raise ConfigError(
            "plan_devices needs one profile value per device in every sequence, got lengths "
            f"{len(samples_per_s)}, {len(uplink_bytes_per_s)}, {len(battery_percent)}, "
            f"{len(charging)}"
        )
    sit_out = battery_sit_out(battery_percent, charging, min_battery_percent)
    participants = tuple(i for i in range(len(samples_per_s)) if i not in sit_out)
    fractions = work_fractions(
        [samples_per_s[i] for i in participants],
        work_samples=None if work_samples is None else [work_samples[i] for i in participants],
        round_floor_s=round_floor_s,
    )
    budgets = byte_budgets(
        [uplink_bytes_per_s[i] for i in participants], budget_s=budget_s, dense_bytes=dense_bytes
    )
    return Plan(participants, sit_out, tuple(fractions), tuple(budgets))
