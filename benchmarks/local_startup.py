"""``meshfl local`` from launch to report: wall time, CPU seconds and peak RSS by role.

Runs ``meshfl local ARGS`` (default: the W1 defaults) and samples every descendant process
every 0.1 s: its CPU time (user + system) and its ``VmHWM`` (peak RSS). Roles: the
launcher, the zygote (:mod:`meshfl.app.local.zygote`), its children (the agents and the
report's ONNX check), the agents' own short children (the end-of-job ONNX export), agents
started from scratch (``MESHFL_LOCAL_ZYGOTE=0``), the coordinator and the broker. CPU seconds add up
whatever else the machine runs, so they compare runs on a shared machine better than
wall time does (issue 24, item 1: a W1 default run in ≤ 12 s on 2 cores).

    python benchmarks/local_startup.py                       # meshfl local, defaults
    MESHFL_LOCAL_ZYGOTE=0 python benchmarks/local_startup.py # every agent from scratch
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe


def _hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(x.split()[1]) for x in status if x.startswith("VmHWM")) / 1024


def _role(entry: dict[str, Any], seen: dict[int, dict[str, Any]]) -> str:
    name = entry["name"]
    parent = seen.get(entry["ppid"], {})
    grandparent = seen.get(parent.get("ppid", -1), {}).get("name", "")
    if "zygote_server" in name:
        if "zygote_server" not in parent.get("name", ""):
            return "zygote"
        # The zygote's children: the agents and the report's ONNX check; theirs: exports.
        return "agent's child" if "zygote_server" in grandparent else "zygote child"
    if "agent run" in name or "agent fleet" in name:
        return "agent"
    if "coordinator serve" in name:
        return "coordinator"
    if "broker serve" in name or "mosquitto" in name:
        return "broker"
    if " local" in name:
        return "launcher"
    return "agent's child"  # forked by an agent started from scratch: its ONNX export


def sample(command: list[str]) -> dict[str, Any]:
    """Run ``command``; CPU seconds and peak RSS of each descendant, and the wall time."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = psutil.Process(process.pid)
    seen: dict[int, dict[str, Any]] = {}
    while process.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = [root]
        for p in procs:
            try:
                cpu = p.cpu_times()
                old = seen.get(p.pid, {})
                seen[p.pid] = {
                    "name": old.get("name") or " ".join(p.cmdline()[:6]),
                    "ppid": p.ppid(),
                    "cpu_s": cpu.user + cpu.system,
                    "hwm_mib": max(old.get("hwm_mib", 0.0), _hwm_mib(p.pid)),
                }
            except (psutil.Error, OSError, StopIteration):
                pass
        time.sleep(0.1)
    wall = time.monotonic() - start
    roles: dict[str, dict[str, Any]] = {}
    for entry in seen.values():
        role = roles.setdefault(_role(entry, seen), {"n": 0, "cpu_s": 0.0, "hwm": []})
        role["n"] += 1
        role["cpu_s"] += entry["cpu_s"]
        role["hwm"].append(round(entry["hwm_mib"]))
    return {"wall_s": wall, "cpu_s": sum(e["cpu_s"] for e in seen.values()), "roles": roles,
            "returncode": process.returncode}  # fmt: skip


def main() -> None:
    """Run and print one measurement."""
    with tempfile.TemporaryDirectory(prefix="local-startup-") as tmp:
        out = Path(tmp) / "run"
        command = ["meshfl", "local", "--out", str(out), *sys.argv[1:]]
        print("command: python benchmarks/local_startup.py " + " ".join(sys.argv[1:]))
        print("machine:", describe())
        print("load average before:", " ".join(f"{x:.1f}" for x in psutil.getloadavg()))
        result = sample(command)
        report = json.loads((out / "report.json").read_text())
    last = report["rounds"][-1]
    total_mb = sum(r["bytes_sent"] for r in report["rounds"]) / 1e6
    print(f"exit {result['returncode']}; final mean accuracy {last['mean_accuracy']:.4f},"
          f" {total_mb:.3f} MB sent")  # fmt: skip
    print(f"wall {result['wall_s']:.1f} s, CPU {result['cpu_s']:.1f} s")
    print(f"{'role':16s} {'n':>3s} {'CPU s':>7s}  peak RSS MiB (largest first)")
    for name, role in sorted(result["roles"].items(), key=lambda kv: -kv[1]["cpu_s"]):
        peaks = sorted(role["hwm"], reverse=True)
        print(f"{name:16s} {role['n']:3d} {role['cpu_s']:7.1f}  {peaks[:8]}")


if __name__ == "__main__":
    main()
