"""Agent idle cost (issue 8): CPU and memory of an enrolled agent with no job, and of serve mode.

Starts the embedded broker and a coordinator (as ``meshfl local`` does, with its process
helpers), then one real ``meshfl agent run`` on a digits partition. Once the agent is
idle — enrolled, its profile reported, polling for work — it is measured for
``--seconds``: CPU % as the median of ``psutil`` ``cpu_percent`` samples over
``--window``-second windows (100 % = one core) and the mean over the whole period from
the process's CPU times, and its RSS at the end. For the
"beyond torch" figure the same is measured for a bare ``python -c "import torch"``
process. Then ``meshfl agent serve`` (the inference-only agent, no torch) is measured
the same way while it serves a cached 64-64-10 model, next to a bare
``python -c "import onnxruntime"``.

Goal (issue 8): idle CPU < 1 %, RSS beyond torch < 60 MB.

    python benchmarks/agent_idle.py                     # 30 s per process, about 2 minutes
    python benchmarks/agent_idle.py --seconds 60 --json idle.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe

from meshfl.app.local.admin import AdminClient
from meshfl.app.local.processes import Supervisor, free_port, wait_for_port

MB = 1e6


def measure(pid: int, seconds: float, window: float) -> dict[str, float]:
    """CPU % (median of windows, and the whole period's mean) and memory of process ``pid``."""
    proc = psutil.Process(pid)
    before = {t.id: t.user_time + t.system_time for t in proc.threads()}
    start_cpu, start = sum(proc.cpu_times()[:2]), time.monotonic()
    proc.cpu_percent(None)
    samples = []
    while time.monotonic() - start < seconds:
        samples.append(proc.cpu_percent(interval=window))
    elapsed = time.monotonic() - start
    mean = 100 * (sum(proc.cpu_times()[:2]) - start_cpu) / elapsed
    used = {t.id: t.user_time + t.system_time - before.get(t.id, 0.0) for t in proc.threads()}
    return {
        "cpu_median_pct": statistics.median(samples),
        "cpu_mean_pct": mean,
        "cpu_max_window_pct": max(samples),
        "rss_mb": proc.memory_info().rss / MB,
        "threads": proc.num_threads(),
        # The main thread (id == pid) and the busiest other thread, % of one core.
        "main_thread_pct": 100 * used.get(pid, 0.0) / elapsed,
        "other_threads_max_pct": 100
        * max((v for k, v in used.items() if k != pid), default=0.0)
        / elapsed,
    }


def bare(module: str, seconds: float, window: float) -> dict[str, float]:
    """Measure ``python -c "import MODULE"`` once the import is done, blocked on stdin."""
    code = f"import {module}, sys; print('ready', flush=True); sys.stdin.read()"
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdout.readline()
        try:
            return measure(proc.pid, seconds, window)
        finally:
            proc.stdin.close()
            proc.wait()


def write_data(directory: Path) -> Path:
    from models.builtin import load_split

    split = load_split("digits", 0, n_devices=1)
    path = directory / "device-0.npz"
    np.savez(path, x=split.x_train, y=split.y_train, x_test=split.x_test, y_test=split.y_test)
    return path


def write_cached_model(directory: Path) -> None:
    """A 64-64-10 MLP in meshfl's ONNX layout, as the serve agent's cached model."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    shapes = {"w1": (64, 64), "b1": (64,), "w2": (10, 64), "b2": (10,)}
    init = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n)
            for n, s in shapes.items()]  # fmt: skip
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["input", "w1", "b1"], ["h"], transB=1),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"], transB=1),
        ],
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        init,
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data.ir_version = 8
    onnx.checker.check_model(data)
    raw = data.SerializeToString()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "consensus.onnx").write_bytes(raw)
    meta = {"job_id": "job-bench", "sha256": hashlib.sha256(raw).hexdigest()}
    (directory / "consensus.json").write_text(json.dumps(meta))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds each")
    parser.add_argument("--window", type=float, default=2.0, help="seconds per CPU sample")
    parser.add_argument("--settle", type=float, default=5.0, help="idle seconds before")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": describe()}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        supervisor = Supervisor(root / "logs")
        try:
            broker_port, port = free_port(), free_port()
            broker = supervisor.start("broker", ["broker", "serve", "--port", str(broker_port)])
            wait_for_port("127.0.0.1", broker_port, 30.0, alive=broker)
            enrol, admin_token = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
            coordinator = supervisor.start(
                "coordinator",
                ["coordinator", "serve", "--port", str(port), "--db",
                 f"sqlite:///{root / 'c.db'}", "--broker-url", f"mqtt://127.0.0.1:{broker_port}",
                 "--enrol-token", enrol, "--admin-token", admin_token],
            )  # fmt: skip
            wait_for_port("127.0.0.1", port, 60.0, alive=coordinator)
            url = f"http://127.0.0.1:{port}"
            admin = AdminClient(url, admin_token)
            agent = supervisor.start(
                "agent",
                ["agent", "run", "--coordinator", url, "--token", enrol, "--data",
                 str(write_data(root)), "--name", "idle-0", "--out", str(root / "models")],
            )  # fmt: skip
            deadline = time.monotonic() + 120
            while not any("train_samples_per_s" in d["profile"] for d in admin.devices()):
                if agent.returncode is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the agent did not come up: {agent.last_line()}")
                time.sleep(0.5)
            time.sleep(args.settle)
            results["agent"] = measure(agent.process.pid, args.seconds, args.window)
            agent.stop()
            results["bare_torch"] = bare("torch", args.seconds, args.window)
            write_cached_model(root / "serve")
            serve_port = free_port()
            serve = supervisor.start(
                "serve",
                ["agent", "serve", "--coordinator", url, "--token", enrol, "--port",
                 str(serve_port), "--out", str(root / "serve"), "--poll", "30"],
            )  # fmt: skip
            wait_for_port("127.0.0.1", serve_port, 60.0, alive=serve)
            time.sleep(args.settle)
            results["serve"] = measure(serve.process.pid, args.seconds, args.window)
            results["bare_onnxruntime"] = bare("onnxruntime", args.seconds, args.window)
            admin.close()
        finally:
            supervisor.stop_all()
    agent, torch_ = results["agent"], results["bare_torch"]
    results["agent_rss_beyond_torch_mb"] = agent["rss_mb"] - torch_["rss_mb"]
    print(f"machine: {results['machine']}")
    print(f"{'process':<18}{'CPU med %':>10}{'CPU mean %':>11}{'max win %':>10}"
          f"{'RSS MB':>9}{'threads':>8}")  # fmt: skip
    for name in ("agent", "bare_torch", "serve", "bare_onnxruntime"):
        r = results[name]
        print(f"{name:<18}{r['cpu_median_pct']:>10.2f}{r['cpu_mean_pct']:>11.2f}"
              f"{r['cpu_max_window_pct']:>10.2f}{r['rss_mb']:>9.1f}"
              f"{r['threads']:>8d}")  # fmt: skip
    for name in ("agent", "serve"):
        r = results[name]
        print(f"{name}: main thread {r['main_thread_pct']:.2f} %, busiest other thread"
              f" {r['other_threads_max_pct']:.2f} %")  # fmt: skip
    print(f"agent RSS beyond torch: {results['agent_rss_beyond_torch_mb']:.1f} MB"
          " (goal < 60 MB); idle CPU goal < 1 %")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
