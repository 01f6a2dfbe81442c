"""W5, the coordinator half (issue 6): enrolled devices sending heartbeats.

For each database (a SQLite file, and PostgreSQL where one answers at
``postgresql://postgres@127.0.0.1:5432``, in a database of its own created and dropped
here):

1. **Setup**: migrate a fresh store and insert ``--devices`` device rows directly (the
   columns ``store.enrol_device`` writes, without a profile; each device a fresh
   ``secrets.token_urlsafe(32)`` token stored as its SHA-256 digest; last seen an hour
   ago). Enrolment is not what is measured, and 10,000 API enrolments would take minutes.
2. **Server**: ``meshfl coordinator serve`` in its own process on loopback: uvicorn, one
   worker (the coordinator keeps its liveness buffer, token cache and job lock in
   process, so it runs as one process; see docs/coordinator.md).
3. **Load** (``--generator``): **wrk** (default; ``benchmarks/w5_wrk.py``): 50
   connections take the devices in turn, each heartbeat with its device's own token,
   paced to ``--rate`` (1,000/s), one run of ``--warmup`` seconds, 5 s that measure
   the round trip the pacing takes off its wait, then ``--seconds``; or **locust**,
   headless, in its own process: one user per device at a constant throughput of
   ``--rate / --devices`` heartbeats a second (10,000 devices × 0.1/s = 1,000/s),
   spawned over ``--devices / 1000`` seconds, then ``--warmup`` seconds before
   ``--seconds`` of measurement. The default warm-up is one heartbeat
   period + 5 s, so every device has sent once and the coordinator has cached its token
   (the steady state; a freshly restarted coordinator looks each token up once, at the
   naive route's cost). By default every heartbeat opens a new connection
   (``Connection: close``: a device that reports every 10 s keeps none open);
   ``--keepalive`` reuses connections.
4. **Report**: achieved rate, p50/p95/p99/max latency (locust's per-request timings of
   requests *sent* in the window), errors (any answer but 204, any failed connection),
   the CPU of the server, of the load generator and of everything else on the machine over the
   window (% of one core), and, after the server stopped (its shutdown flushes the
   liveness buffer), how many devices' ``last_seen`` moved into the window in the DB.

The load generator and the server share the machine's cores: the generator's CPU is
reported next to the server's.

    python benchmarks/w5_coordinator.py                  # 10,000 devices, 1,000/s, 60 s, both DBs
    python benchmarks/w5_coordinator.py --db sqlite --seconds 30 --json w5.json
    python benchmarks/w5_coordinator.py --smoke          # 50 devices, 50/s, 5 s (the e2e test)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe
from w5_wrk import drive_wrk, wrk_missing

from meshfl.app.local.processes import free_port, wait_for_port

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
LOCUSTFILE = Path(__file__).with_name("w5_locustfile.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000, help="enrolled devices")
    parser.add_argument("--rate", type=float, default=1000.0, help="heartbeats/s, all devices")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window (s)")
    parser.add_argument(
        "--warmup",
        type=float,
        help="seconds after spawning before measuring (default: one heartbeat period"
        " + 5 s, so that every device has sent once and its token is cached)",
    )
    parser.add_argument("--db", default="sqlite,postgresql", help="comma-separated list")
    parser.add_argument("--keepalive", action="store_true", help="reuse connections")
    parser.add_argument(
        "--generator",
        choices=("wrk", "locust"),
        default="wrk",
        help="load generator (default wrk; locust: one user per device)",
    )
    parser.add_argument(
        "--connections", type=int, default=50, help="wrk's connections (default 50)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs per DB; medians shown")
    parser.add_argument("--smoke", action="store_true", help="50 devices, 50/s, 5 s")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.devices, args.rate, args.seconds = 50, 50.0, 5.0
        args.warmup = 1.0 if args.warmup is None else args.warmup
    if args.warmup is None:
        args.warmup = args.devices / args.rate + 5.0
    return args


@contextlib.contextmanager
def database(kind: str, workdir: Path) -> Iterator[str]:
    """Yield the URL of an empty database of ``kind``; a PostgreSQL one is dropped after."""
    if kind == "sqlite":
        yield f"sqlite:///{workdir / 'w5.db'}"
        return
    import psycopg

    name = f"meshfl_w5_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def postgres_missing() -> str | None:
    """Why PostgreSQL cannot be used here, or ``None`` when it answers."""
    try:
        import psycopg

        psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
    except Exception as exc:  # no driver or no server: say which
        return f"no PostgreSQL at {PG_ADMIN_URL}: {str(exc).splitlines()[0]}"
    return None


def enrol(db_url: str, devices: int, now: float) -> list[tuple[str, str]]:
    """Migrate the store and insert ``devices`` device rows; return (id, token) pairs."""
    from coordinator import migrate, store
    from coordinator.db import Device, make_engine, make_sessionmaker

    engine = make_engine(db_url)
    migrate.upgrade(engine)
    pairs = [
        (f"dev-{i:06d}{secrets.token_hex(3)}", secrets.token_urlsafe(32)) for i in range(devices)
    ]
    with make_sessionmaker(engine)() as session:
        session.add_all(
            Device(
                id=device_id,
                name=f"w5-{i}",
                fleet="default",
                token_hash=store.hash_token(token),
                profile={},
                enrolled_at=now - 3600,
                last_seen=now - 3600,
            )
            for i, (device_id, token) in enumerate(pairs)
        )
        session.commit()
    engine.dispose()
    return pairs


def seen_since(db_url: str, since: float) -> int:
    """How many devices the DB shows as seen at or after ``since``."""
    from sqlalchemy import func, select

    from coordinator.db import Device, make_engine

    engine = make_engine(db_url)
    with engine.connect() as conn:
        count = conn.execute(select(func.count()).where(Device.last_seen >= since)).scalar_one()
    engine.dispose()
    return int(count)


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds of ``proc`` and its children so far (0 once it is gone)."""
    try:
        total = sum(proc.cpu_times()[:2])
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += sum(child.cpu_times()[:2])
    except psutil.Error:
        return 0.0
    return float(total)


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores) so far."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def run_once(kind: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One measurement on database ``kind``; returns the row of the results table."""
    with database(kind, workdir) as db_url:
        started = time.time()
        pairs = enrol(db_url, args.devices, started)
        setup_s = time.time() - started
        devices_file = workdir / f"devices-{kind}.txt"
        devices_file.write_text("".join(f"{d} {t}\n" for d, t in pairs))
        port = free_port()
        admin, enrol_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        env = {
            **os.environ,
            "MESHFL_COORDINATOR_ADMIN_TOKEN": admin,
            "MESHFL_COORDINATOR_ENROL_TOKEN": enrol_token,
        }
        server_cmd = [
            sys.executable,
            "-m",
            "meshfl",
            "coordinator",
            "serve",
            "--db",
            db_url,
            "--port",
            str(port),
            "--artifacts-dir",
            str(workdir / "artifacts"),
        ]
        server_log = (workdir / f"server-{kind}.log").open("wb")
        server = subprocess.Popen(server_cmd, env=env, stdout=server_log, stderr=subprocess.STDOUT)
        try:
            wait_for_port("127.0.0.1", port, timeout_s=60)
            if args.generator == "wrk":
                result = drive_wrk(args, port, devices_file, workdir, kind, server, sample_cpu)
                trace = result.pop("trace")
                result["cpu_pct"] = window_cpu(trace, result["window_start"], result["window_end"])
            else:
                result = drive(args, port, devices_file, workdir, kind, server)
        finally:
            server.send_signal(signal.SIGINT)  # uvicorn's graceful stop: lifespan shutdown
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            server_log.close()
        result["server_exit"] = server.returncode
        result["devices_seen_in_db"] = seen_since(db_url, result["window_start"])
        result["setup_s"] = setup_s
        return result


def drive(
    args: argparse.Namespace,
    port: int,
    devices_file: Path,
    workdir: Path,
    kind: str,
    server: subprocess.Popen[bytes],
) -> dict[str, Any]:
    """Run locust against the server on ``port``; return the window's figures."""
    spawn_rate = min(args.devices, 1000)
    results_file = workdir / f"samples-{kind}.json"
    env = {
        **os.environ,
        "W5_DEVICES": str(devices_file),
        "W5_RESULTS": str(results_file),
        "W5_RATE": str(args.rate / args.devices),
        "W5_WARMUP_S": str(args.warmup),
        "W5_SECONDS": str(args.seconds),
        "W5_KEEPALIVE": "1" if args.keepalive else "0",
    }
    limit = args.devices / spawn_rate + args.warmup + args.seconds + 60
    locust_cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "-u",
        str(args.devices),
        "-r",
        str(spawn_rate),
        "-t",
        f"{limit:.0f}s",
        "--host",
        f"http://127.0.0.1:{port}",
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--exit-code-on-error",
        "0",
    ]
    server_ps = psutil.Process(server.pid)
    log = (workdir / f"locust-{kind}.log").open("wb")
    locust = subprocess.Popen(locust_cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    trace = sample_cpu(server_ps, psutil.Process(locust.pid), locust)
    log.close()
    if not results_file.exists():
        tail = (workdir / f"locust-{kind}.log").read_text(errors="replace")[-2000:]
        raise SystemExit(f"locust wrote no results (exit {locust.returncode}):\n{tail}")
    recorded = json.loads(results_file.read_text())
    start, end = recorded["window"]
    if not recorded["samples"]:
        tail = (workdir / f"server-{kind}.log").read_text(errors="replace")[-2000:]
        raise SystemExit(f"no heartbeat was answered in the window; the server's log ends:\n{tail}")
    samples = np.asarray(recorded["samples"], dtype=np.float64).reshape(-1, 3)
    latency = samples[:, 1]
    ok = samples[:, 2].astype(bool)
    return {
        "db": kind,
        "generator": "locust",
        "window_start": start,
        "sent": len(samples),
        "achieved_per_s": len(samples) / (end - start),
        "ok": int(ok.sum()),
        "errors": int((~ok).sum()),
        "p50_ms": float(np.percentile(latency, 50)) if len(latency) else float("nan"),
        "p95_ms": float(np.percentile(latency, 95)) if len(latency) else float("nan"),
        "p99_ms": float(np.percentile(latency, 99)) if len(latency) else float("nan"),
        "max_ms": float(latency.max()) if len(latency) else float("nan"),
        "cpu_pct": window_cpu(trace, start, end),
    }


def sample_cpu(
    server_ps: psutil.Process, generator_ps: psutil.Process, generator: subprocess.Popen[bytes]
) -> list[tuple[float, float, float, float]]:
    """(time, server CPU s, generator CPU s, machine busy s) every 0.5 s while it runs."""
    trace: list[tuple[float, float, float, float]] = []
    while generator.poll() is None:
        trace.append(
            (time.time(), cpu_seconds(server_ps), cpu_seconds(generator_ps), busy_seconds())
        )
        time.sleep(0.5)
    return trace  # (not sampled after it exited: its counters read 0 then)


def window_cpu(
    trace: list[tuple[float, float, float, float]], start: float, end: float
) -> dict[str, float]:
    """CPU % of one core over [start, end] from the sampled counters (linear in between)."""
    if len(trace) < 2:
        return {}
    t = np.asarray(trace)
    at = [np.interp([start, end], t[:, 0], t[:, k]) for k in (1, 2, 3)]
    span = end - start
    server, generator, busy = (100 * (b - a) / span for a, b in at)
    return {
        "server": server,
        "generator": generator,
        "others": max(busy - server - generator, 0.0),
    }


def stack() -> str:
    """The HTTP stack the server runs on (``coordinator.server.http_stack``)."""
    from coordinator.server import http_stack

    loop, http = http_stack()
    return f"uvicorn 1 worker, {loop} loop, {http} parser"


def show(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the medians of ``rows`` (one DB's repeats)."""
    med = {
        k: statistics.median(r[k] for r in rows)
        for k in ("achieved_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms", "errors", "sent")
    }
    cpu = {
        k: statistics.median(r["cpu_pct"].get(k, float("nan")) for r in rows)
        for k in ("server", "generator", "others")
    }
    seen = min(r["devices_seen_in_db"] for r in rows)
    print(
        f"  {rows[0]['db']:<10}  {med['achieved_per_s']:8.1f}/s  p50 {med['p50_ms']:6.1f} ms  "
        f"p95 {med['p95_ms']:6.1f} ms  p99 {med['p99_ms']:6.1f} ms  max {med['max_ms']:7.1f} ms  "
        f"errors {med['errors']:.0f}/{med['sent']:.0f}  CPU server {cpu['server']:.0f} % "
        f"({10 * cpu['server'] / med['achieved_per_s']:.2f} ms a heartbeat) "
        f"{rows[0]['generator']} {cpu['generator']:.0f} % others {cpu['others']:.0f} %  "
        f"last_seen in DB {seen}/{args.devices}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kinds = [k.strip() for k in args.db.split(",") if k.strip()]
    command = "python benchmarks/w5_coordinator.py " + shlex.join(argv or sys.argv[1:])
    if args.generator == "wrk" and wrk_missing():
        raise SystemExit(f"{wrk_missing()} (or --generator locust)")
    if args.generator == "wrk":
        load = (
            f"wrk, {args.connections} connections taking the {args.devices} devices in turn"
            f" (own tokens), paced to {args.rate:g}/s"
        )
    else:
        load = (
            f"locust {args.devices} users (one per device, own token), "
            f"{args.rate / args.devices:g} heartbeat/s each = {args.rate:g}/s"
        )
    print(
        f"W5 coordinator heartbeats\n  command:  {command.strip()}\n  machine:  {describe()}\n"
        f"  load avg: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min, at start)\n"
        f"  server:   meshfl coordinator serve ({stack()}) on loopback\n"
        f"  load:     {load}, "
        f"{'keep-alive' if args.keepalive else 'a new connection per heartbeat'}; "
        f"{args.seconds:g} s measured after {args.warmup:g} s warm-up; "
        f"median of {args.repeats} run(s)",
        flush=True,
    )
    report: dict[str, Any] = {"command": command, "machine": describe(), "runs": []}
    for kind in kinds:
        missing = postgres_missing() if kind == "postgresql" else None
        if missing:
            print(f"  {kind:<10}  not measured: {missing}", flush=True)
            report["runs"].append({"db": kind, "skipped": missing})
            continue
        rows = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="w5-") as tmp:
                rows.append(run_once(kind, args, Path(tmp)))
        show(rows, args)
        report["runs"].extend(rows)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
