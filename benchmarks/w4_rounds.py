"""W4's round driver, shared by both sides: N device threads in lock step, timed per round.

Each device has its own thread for the whole run. A round starts when every thread and
the driver reach the start barrier (its action stamps the start time), each thread runs
its device's step — publish, then wait for its neighbours' messages — and stamps its
finish time; the round time is the last finish minus the start. The driver then reads
the delivered-bytes counter, so a round's bytes are exactly what arrived during it (no
device starts the next round before every device finished this one).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Step = Callable[[int, int], None]
"""``step(device_index, round)``: one device's round; returns once its neighbours' data came."""


@dataclass
class SideResult:
    """What one side (meshfl or raw paho) measured on one graph in one repeat.

    Attributes
    ----------
    side : str
        ``"meshfl"`` or ``"raw"``.
    round_s : list of float
        Round times in seconds, measured rounds only (warm-up rounds dropped).
    delivered_bytes : list of int
        MQTT payload bytes delivered to all devices during each measured round.
    messages_sent : int
        Application messages published in measured rounds (meshfl: envelopes, each
        split into ``chunks_per_message`` MQTT messages; raw: the same count).
    deliveries_expected, deliveries : int
        Messages that should have arrived (``messages_sent`` × degree) and that did
        arrive (meshfl: envelopes applied; raw: complete sets of chunks), measured rounds.
    cpu_s : float
        CPU seconds (user + system) of this whole process over the measured rounds.
    extra : dict
        Side-specific counters (meshfl: repairs, duplicates, missing neighbours).

    """

    side: str
    round_s: list[float] = field(default_factory=list)
    delivered_bytes: list[int] = field(default_factory=list)
    messages_sent: int = 0
    deliveries_expected: int = 0
    deliveries: int = 0
    cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def goodput_mb_s(self) -> list[float]:
        """Delivered payload MB/s (10^6 bytes) per measured round."""
        return [b / t / 1e6 for b, t in zip(self.delivered_bytes, self.round_s, strict=True)]

    def summary(self) -> dict[str, Any]:
        """Medians over the measured rounds, and the raw per-round figures."""
        return {
            "side": self.side,
            "median_round_s": statistics.median(self.round_s),
            "median_goodput_mb_s": statistics.median(self.goodput_mb_s),
            "round_s": self.round_s,
            "delivered_bytes": self.delivered_bytes,
            "goodput_mb_s": self.goodput_mb_s,
            "messages_sent": self.messages_sent,
            "deliveries_expected": self.deliveries_expected,
            "deliveries": self.deliveries,
            "cpu_s": self.cpu_s,
            "cpu_ms_per_mb": self.cpu_s * 1e3 / (sum(self.delivered_bytes) / 1e6),
            **self.extra,
        }


def drive(
    n: int,
    rounds: int,
    step: Step,
    delivered: Callable[[], int],
    timeout_s: float,
) -> tuple[list[float], list[int], float]:
    """Run ``rounds`` lock-step rounds of ``n`` devices; return round seconds, bytes, CPU.

    Parameters
    ----------
    n : int
        Devices (threads).
    rounds : int
        Rounds, numbered 1..rounds in the calls to ``step``.
    step : Step
        One device's round.
    delivered : callable
        Payload bytes delivered to all devices so far (read between rounds).
    timeout_s : float
        Seconds a round may take before the run is abandoned.

    Returns
    -------
    (round_s, delivered_bytes, cpu_s)
        Per round: seconds from start to the last device's finish, and bytes delivered;
        then the CPU seconds this process used over all the rounds.

    Raises
    ------
    RuntimeError
        A round timed out; or the first exception a step raised, re-raised.

    """
    started: list[float] = []
    start = threading.Barrier(n + 1, action=lambda: started.append(time.perf_counter()))
    end = threading.Barrier(n + 1)
    finished = [0.0] * n
    errors: list[BaseException] = []

    def device(i: int) -> None:
        try:
            for r in range(1, rounds + 1):
                start.wait(timeout_s)
                step(i, r)
                finished[i] = time.perf_counter()
                end.wait(timeout_s)
        except threading.BrokenBarrierError:
            return
        except BaseException as exc:  # re-raised by the driver
            errors.append(exc)
            start.abort()
            end.abort()

    threads = [threading.Thread(target=device, args=(i,), daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    round_s: list[float] = []
    delivered_bytes: list[int] = []
    before = delivered()
    cpu0 = _cpu_s()
    try:
        for _ in range(rounds):
            start.wait(timeout_s)
            end.wait(timeout_s)
            round_s.append(max(finished) - started[-1])
            now = delivered()
            delivered_bytes.append(now - before)
            before = now
    except threading.BrokenBarrierError:
        start.abort()
        end.abort()
        if errors:
            raise errors[0] from None
        raise RuntimeError(f"a round took longer than {timeout_s:g} s") from None
    finally:
        for th in threads:
            th.join(timeout=5.0)
    return round_s, delivered_bytes, _cpu_s() - cpu0


def _cpu_s() -> float:
    return time.process_time()  # user + system of all threads, finer than os.times()
