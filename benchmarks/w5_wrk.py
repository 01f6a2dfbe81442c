"""W5's heartbeat load from wrk (Debian's ``wrk``, C, one thread): ``--generator wrk``.

Used by ``benchmarks/w5_coordinator.py``. ``--connections`` C connections send the
enrolled devices' heartbeats in turn (``benchmarks/w5_wrk.lua``), each waiting
a fixed wait after an answer before its next request, so the load is bounded at
``--rate`` heartbeats a second. A connection's cycle is that wait plus one answer's
round trip, so the measured run's wait is ``C / --rate`` less the mean round trip that a
5 s run after the warm-up showed (``C / achieved − C / --rate``; the warm-up's own is
longer: the coordinator looks each token up once); the achieved rate is reported. It is
closed-loop per
connection: a stalled server delays at most C requests, which then show as slow (or as
timeouts after 10 s, counted as errors). wrk runs once for the warm-up (every device's
token cached) and once for the measured window; its latency is from the request written
to the answer read, recorded in an HdrHistogram (p50/p95/p99/max).

The reason for it: locust (Python, gevent) needs about a core for 1,000 requests a
second and sends them in bursts, which on a 2-core machine puts its own scheduling into
the server's tail latency (BENCHMARKS.md, W5); wrk needs a few % of a core.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

SCRIPT = Path(__file__).with_name("w5_wrk.lua")
CALIBRATION_S = 5
"""Seconds of load after the warm-up that measure the round trip the pacing takes off."""


def wrk_missing() -> str | None:
    """Why wrk cannot be used here, or ``None``."""
    if shutil.which("wrk") is None:
        return "wrk is not installed: apt-get install wrk"
    return None


def _wrk(
    args: argparse.Namespace, port: int, devices_file: Path, seconds: float, period_ms: float
) -> list[str]:
    return [
        "wrk", "-t", "1", "-c", str(args.connections), "-d", f"{max(1, round(seconds))}s",
        "--timeout", "10s", "-s", str(SCRIPT), f"http://127.0.0.1:{port}",
        "--", str(devices_file), f"{period_ms:.3f}", "0" if args.keepalive else "1",
        str(args.connections),  # each connection's first wait: a random phase
    ]  # fmt: skip


def drive_wrk(
    args: argparse.Namespace,
    port: int,
    devices_file: Path,
    workdir: Path,
    kind: str,
    server: subprocess.Popen[bytes],
    cpu_trace: Any,
) -> dict[str, Any]:
    """Warm up, then measure ``args.seconds`` of heartbeats; return the window's figures.

    ``cpu_trace(server_ps, generator_ps, process)`` samples CPU counters until
    ``process`` exits and returns the trace (``w5_coordinator``'s).
    """
    period_ms = 1000.0 * args.connections / args.rate
    warm = subprocess.run(
        _wrk(args, port, devices_file, args.warmup, period_ms),
        capture_output=True,
        text=True,
        timeout=args.warmup + 60,
    )
    if warm.returncode != 0:
        raise SystemExit(f"wrk failed in the warm-up:\n{warm.stdout}{warm.stderr}")
    calibration = subprocess.run(  # the warm server's round trip, for the pacing
        _wrk(args, port, devices_file, CALIBRATION_S, period_ms),
        capture_output=True,
        text=True,
        timeout=CALIBRATION_S + 60,
    )
    if calibration.returncode == 0:
        period_ms = _paced(period_ms, args.connections, _result(calibration.stdout))
    log = workdir / f"wrk-{kind}.log"
    start = time.time()
    with log.open("wb") as out:
        wrk = subprocess.Popen(
            _wrk(args, port, devices_file, args.seconds, period_ms),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        trace = cpu_trace(psutil.Process(server.pid), psutil.Process(wrk.pid), wrk)
    end = time.time()
    text = log.read_text(errors="replace")
    got = _result(text) if wrk.returncode == 0 else None
    if got is None:
        raise SystemExit(f"wrk wrote no results (exit {wrk.returncode}):\n{text[-2000:]}")
    seconds = got["duration_us"] / 1e6
    socket_errors = sum(got[k] for k in ("connect", "read", "write", "timeout"))
    errors = socket_errors + got["non204"]
    return {
        "db": kind,
        "generator": "wrk",
        "window_start": start,
        "window_end": end,
        "sent": got["requests"] + got["timeout"],
        "achieved_per_s": got["requests"] / seconds,
        "ok": got["requests"] - got["non204"],
        "errors": errors,
        "p50_ms": got["p50_us"] / 1000,
        "p95_ms": got["p95_us"] / 1000,
        "p99_ms": got["p99_us"] / 1000,
        "max_ms": got["max_us"] / 1000,
        "wait_ms": period_ms,
        "trace": trace,
    }


def _result(text: str) -> dict[str, Any] | None:
    """The JSON line ``w5_wrk.lua``'s ``done()`` printed, or ``None``."""
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _paced(period_ms: float, connections: int, calibration: dict[str, Any] | None) -> float:
    """The wait after an answer that makes ``connections`` cycles of ``period_ms`` each.

    A cycle is the wait plus the round trip; the calibration run's achieved rate tells the mean
    round trip (ms), which comes off the wait (never below 10 % of ``period_ms``).
    """
    warm = calibration
    if not warm or warm["requests"] <= 0 or warm["duration_us"] <= 0:
        return period_ms
    achieved_cycle_ms = connections * float(warm["duration_us"]) / 1000 / float(warm["requests"])
    trip_ms = max(0.0, achieved_cycle_ms - period_ms)
    return max(0.1 * period_ms, period_ms - trip_ms)
