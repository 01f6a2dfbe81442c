"""W1 (digits-8): Flower FedAvg on each of its engines against meshfl on the same work.

Flower runs in its own virtual environment (created here if missing; flwr is never a
meshfl dependency) from :mod:`flower_w1`, which rebuilds W1 without meshfl. Engines:
``grpc`` (the legacy ``start_server`` / ``start_client`` API, one process per client on
loopback), ``sim`` (Ray ``start_simulation``), ``deploy`` (``flower-superlink`` + one
``flower-supernode`` per client + ``flwr run``); then ``meshfl`` (``meshfl local``
defaults, embedded broker), ``meshfl-mosquitto`` (the same on a Mosquitto),
``meshfl-tuned`` (the settings that reach 0.90 first, :data:`TUNED`, on the Mosquitto) and
``meshfl-tuned-inprocess`` (the same agents as threads of 2 ``meshfl agent fleet``
processes, ``--in-process 2``: one torch import per process instead of per agent).

    python benchmarks/w1_flower.py                    # everything, 3 repeats
    python benchmarks/w1_flower.py --repeats 1 --deploy-rounds 5
    python benchmarks/w1_flower.py --smoke            # 2 clients, 2 rounds: grpc, meshfl

Everything it needs is in the repository (W1's partition: ``benchmarks/data/``; the
workloads: ``docs/workloads.md``). It exits 1, naming the cause, when a requested engine
fails or is unavailable, or when a run does not train (flat accuracy, 0 bytes up) or
loses clients: such a table is no side by side.

Accuracy: Flower's global model evaluated centrally on W1's test set after each round;
meshfl's mean test accuracy over the devices' models. Bytes: serialized parameters
(numpy ``.npy`` bytes, without protobuf/gRPC framing) sent to and received from clients
for Flower; meshfl's payload bytes published / delivered (chunk headers included).
Peak RSS: ``VmHWM`` of every descendant process, sampled every 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
PARTITION = BENCH / "data" / "w1_partition.json"
TORCH_PIN = "2.13.0"
PINS = [f"torch=={TORCH_PIN}", "flwr==1.42.0", "scikit-learn==1.9.1", "numpy==2.4.6", "psutil"]
SIMULATION_PIN = "flwr[simulation]==1.42.0"
"""Ray, for the simulation engine only: added to the venv when ``sim`` runs (~1.5 min)."""
TARGETS = (0.80, 0.85, 0.90)
ROLES = [  # (substring of the command line, role), first match wins
    ("--meshfl-child", "meshfl launcher"), ("agent run", "meshfl agent"),
    ("agent fleet", "meshfl fleet"),
    ("coordinator serve", "meshfl coordinator"), ("broker serve", "embedded broker"),
    ("mosquitto", "mosquitto"), ("flower_w1.engines server", "flower server"),
    ("flower_w1.engines client", "flower client"), ("flower_w1.engines sim", "ray driver"),
    ("flower-superlink", "superlink"), ("flower-supernode", "supernode"),
    ("flower-superexec", "superexec"), ("flwr-serverapp", "serverapp"),
    ("flwr-clientapp", "clientapp"), ("flwr run", "flwr run"), ("raylet", "ray system"),
    ("gcs_server", "ray system"), ("ray::", "ray worker"), ("default_worker", "ray worker"),
]  # fmt: skip


def ensure_venv(venv: Path, simulation: bool) -> Path:
    """Create Flower's venv at ``venv`` if missing; return its python. Prints the time.

    ``simulation``: also Flower's simulation extra (Ray), installed into an existing
    venv that lacks it. Without it: flwr, torch (CPU), scikit-learn (~45 s, ~1.4 GB).
    Where this interpreter already has the pinned torch (meshfl's venv), Flower's venv
    sees this interpreter's packages after its own (a ``.pth`` line), so pip installs
    flwr and whatever of its requirements is missing there, not torch again (~10 s).
    """
    python = venv / "bin" / "python"
    ok = python.exists() and subprocess.run(
        [str(python), "-c", "import flwr, torch, sklearn, psutil"], capture_output=True
    ).returncode == 0  # fmt: skip
    if not ok:
        start = time.monotonic()
        shared = pinned_torch_site()
        what = "flwr; torch shared, ~10 s" if shared else "flwr, torch; about a minute, ~1.4 GB"
        print(f"creating {venv} ({what})", flush=True)
        subprocess.run(["python3", "-m", "venv", "--clear", str(venv)], check=True)
        if shared:
            purelib = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            (Path(purelib) / "meshfl-shared-torch.pth").write_text(f"{shared}\n")
            print(f"torch {TORCH_PIN}: {shared}", flush=True)
        pip = [str(python), "-m", "pip", "install", "-q", *PINS]
        # pip's resolver also lists conflicts among the shared packages (meshfl's own
        # requirements), which Flower never imports: its output is shown on failure only.
        proc = subprocess.run(pip, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(pip)} failed:\n{proc.stdout}{proc.stderr}")
        print(f"created {venv} in {time.monotonic() - start:.0f} s", flush=True)
    if simulation and ray_available(python) is not None:
        start = time.monotonic()
        print(f"adding Flower's simulation extra (Ray) to {venv}", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", SIMULATION_PIN], check=True)
        print(f"added in {time.monotonic() - start:.0f} s", flush=True)
    return python


def pinned_torch_site() -> str | None:
    """The folder holding this interpreter's torch if it is the pinned version, else None.

    pip never changes what a ``.pth`` line adds: it installs into Flower's venv only.
    """
    from importlib import metadata

    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return None
    local = dist.version.split("+")[0]  # the CPU wheel is 2.13.0+cpu
    return str(dist.locate_file("")) if local == TORCH_PIN else None


def ray_available(python: Path) -> str | None:
    """None if ``ray`` imports in Flower's venv, else the reason."""
    proc = subprocess.run([str(python), "-c", "import ray"], capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]


class PeakRss:
    """Samples ``VmHWM`` (peak RSS) of every descendant of this process, per role."""

    def __init__(self) -> None:
        import psutil

        self.me, self.peaks = psutil.Process(), {}  # type: ignore[var-annotated]
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            for proc in self.me.children(recursive=True):
                try:
                    cmd = " ".join(proc.cmdline())
                    with open(f"/proc/{proc.pid}/status") as f:
                        hwm = next(int(x.split()[1]) for x in f if x.startswith("VmHWM"))
                except (OSError, StopIteration, Exception):  # it exited meanwhile
                    continue
                role = next((r for key, r in ROLES if key in cmd), "other")
                if "zygote_server" in cmd:  # meshfl local's agents are forks of its zygote
                    parent = proc.parent()
                    forked = parent is not None and "zygote_server" in " ".join(parent.cmdline())
                    role = "meshfl agent" if forked else "meshfl zygote"
                old = self.peaks.get(proc.pid, (role, 0))
                self.peaks[proc.pid] = (role, max(old[1], hwm * 1024))
            self.stop_event.wait(0.2)

    def by_role(self) -> dict[str, dict[str, float]]:
        """``{role: {"max_mib", "processes"}}``."""
        out: dict[str, dict[str, float]] = {}
        for role, peak in self.peaks.values():
            row = out.setdefault(role, {"max_mib": 0.0, "processes": 0})
            row["max_mib"] = max(row["max_mib"], peak / 2**20)
            row["processes"] += 1
        return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_stop(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def flower_env(workdir: Path, python: Path) -> dict[str, str]:
    """The environment of Flower's processes: its venv first on PATH, flower_w1 importable."""
    env = dict(os.environ, PYTHONPATH=str(BENCH), W1_PARTITION=str(PARTITION),
               FLWR_HOME=str(workdir / "flwr-home"), FLWR_TELEMETRY_ENABLED="0",
               PATH=f"{python.parent}:{os.environ['PATH']}")  # fmt: skip
    env.pop("VIRTUAL_ENV", None)
    return env


def run_flower(engine: str, python: Path, n: int, rounds: int, trivial: str | None,
               workdir: Path, timeout: float) -> dict[str, Any]:  # fmt: skip
    """One Flower run; returns the server's log plus ``t_launch`` and the command."""
    out, env = workdir / f"{engine}.json", flower_env(workdir, python)
    logs = open(workdir / f"{engine}.log", "wb")  # noqa: SIM115 - closed below
    base = [str(python), "-m", "flower_w1.engines"]
    extra = ["--clients", str(n), "--rounds", str(rounds), "--out", str(out),
             *(["--trivial", trivial] if trivial else [])]  # fmt: skip
    t_launch, procs, command = time.time(), [], ""
    try:
        if engine == "grpc":
            port = free_port()
            server = [*base, "server", "--port", str(port), *extra]
            procs.append(subprocess.Popen(server, env=env, stdout=logs, stderr=logs))
            for cid in range(n):
                client = [*base, "client", "--port", str(port), "--cid", str(cid), *extra]
                procs.append(subprocess.Popen(client, env=env, stdout=logs, stderr=logs))
            command = " ".join(server[1:]) + f" + {n} × flower_w1.engines client"
            _wait_stop(procs, timeout)
        elif engine == "sim":
            sim = [*base, "sim", *extra]
            command = " ".join(sim[1:])
            procs.append(subprocess.Popen(sim, env=env, stdout=logs, stderr=logs))
            _wait_stop(procs, timeout)
        else:
            command = _deploy(procs, env, workdir, n, rounds, trivial, logs, timeout)
    finally:
        _wait_stop(procs, 0.1)
        logs.close()
    if not out.exists():
        tail = (workdir / f"{engine}.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"flower {engine} wrote no result:\n{tail}")
    log = json.loads(out.read_text())
    return {**log, "t_launch": t_launch, "command": command}


def _deploy(procs: list[subprocess.Popen[bytes]], env: dict[str, str], workdir: Path, n: int,
            rounds: int, trivial: str | None, logs: Any, timeout: float) -> str:  # fmt: skip
    """SuperLink + ``n`` SuperNodes on loopback, then ``flwr run`` the W1 app."""
    port = free_port()
    home = Path(env["FLWR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "bench"\n[superlink.bench]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n"
    )
    env["FLOWER_W1_OUT"] = str(workdir / "deploy.json")
    link = ["flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(port),
            "--disable-runtime-dependency-installation"]  # fmt: skip
    procs.append(subprocess.Popen(link, env=env, cwd=workdir, stdout=logs, stderr=logs))
    for cid in range(n):
        node = ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{port}",
                "--port", str(free_port()), "--node-config", f"partition-id={cid}"]  # fmt: skip
        procs.append(subprocess.Popen(node, env=env, cwd=workdir, stdout=logs, stderr=logs))
    import socket

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    config = f"num-server-rounds={rounds} clients={n} trivial='{trivial or ''}'"
    run = ["flwr", "run", str(BENCH / "flower_w1" / "app"), "--run-config", config, "--stream"]
    subprocess.run(run, env=env, cwd=workdir, stdout=logs, stderr=logs, timeout=timeout)
    return (
        f"flower-superlink --insecure + {n} × flower-supernode + "
        + " ".join(run[:2])
        + f' benchmarks/flower_w1/app --run-config "{config}"'
    )


TUNED = {"topology": "complete", "codec": "sign", "consensus_step": 1.0}
"""``meshfl-tuned``: the settings that reached 0.90 first near 20x fewer bytes up."""

TUNED_ROUNDS = 40
"""Rounds of ``meshfl-tuned`` at least: complete + sign reached 0.90 at rounds 25-32."""

IN_PROCESS = 2
"""Fleet processes of ``meshfl-tuned-inprocess``: one per core of the 2-core reference."""

ON_MOSQUITTO = ("meshfl-mosquitto", "meshfl-tuned", "meshfl-tuned-inprocess")
"""The meshfl engines run on the benchmark's Mosquitto (the first also for the overhead)."""

ENGINES = ("grpc", "sim", "deploy", "meshfl", *ON_MOSQUITTO)
"""Every engine, in the order they run."""


def run_meshfl(n: int, rounds: int, trivial: str | None, broker: str | None,
               workdir: Path, timeout: float, tuned: bool = False,
               in_process: int = 0) -> dict[str, Any]:  # fmt: skip
    """``meshfl local`` in a child process (the launcher); its report plus timestamps."""
    spec = {"agents": n, "rounds": rounds, "out": str(workdir / "meshfl"), "broker": broker,
            "trivial": trivial, "t_launch": time.time(), "tuned": tuned,
            "in_process": in_process}  # fmt: skip
    proc = subprocess.run([sys.executable, __file__, "--meshfl-child", json.dumps(spec)],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"meshfl local failed:\n{(proc.stdout + proc.stderr)[-1500:]}")
    timing: dict[str, Any] = json.loads((workdir / "meshfl" / "timing.json").read_text())
    return timing


def meshfl_child(spec: dict[str, Any]) -> None:
    """Run ``run_local`` (W1 defaults; the trivial model on a CSV); write timing.json."""
    from meshfl.app.local.run import LocalConfig, run_local

    marks: dict[str, float] = {}

    def notify(line: str) -> None:
        if "job" in line and "started" in line:
            marks["t_job_start"] = time.time()

    kw: dict[str, Any] = {"agents": spec["agents"], "rounds": spec["rounds"],
                          "out": Path(spec["out"]), "broker": spec["broker"]}  # fmt: skip
    if spec["trivial"]:
        kw.update(dataset=spec["trivial"], model="logreg", alpha=1000.0)
    if spec.get("tuned"):
        kw.update(TUNED)
    if spec.get("in_process"):
        kw.update(in_process=int(spec["in_process"]))
    result = run_local(LocalConfig(**kw), notify=notify)
    timing = {**marks, "t_launch": spec["t_launch"], "t_done": time.time(),
              "report": str(result.report_path)}  # fmt: skip
    (Path(spec["out"]) / "timing.json").write_text(json.dumps(timing))


def normalize(engine: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Per-round rows ``{round, accuracy, wall_s, run_s, bytes_up, bytes_down}``.

    ``wall_s`` counts from the launch of the first process (start-up included); ``run_s``
    from the start of round 1 (all clients connected / the job started).
    """
    if engine.startswith("meshfl"):
        report = json.loads(Path(raw["report"]).read_text())
        offset = raw["t_job_start"] - raw["t_launch"]
        rows = [{"round": r["round"], "accuracy": r["mean_accuracy"], "run_s": r["elapsed_s"],
                 "wall_s": offset + r["elapsed_s"], "bytes_up": r["bytes_sent"],
                 "bytes_down": r["bytes_received"], "clients": r["devices_reporting"]}
                for r in report["rounds"]]  # fmt: skip
        return {"rounds": rows, "train_s": None, "final_wall_s": raw["t_done"] - raw["t_launch"]}
    rows = [{"round": r["round"], "accuracy": r["accuracy"],
             "run_s": r["t_end"] - raw["t_first_fit"], "wall_s": r["t_end"] - raw["t_launch"],
             "bytes_up": r["bytes_up"], "bytes_down": r["bytes_down"],
             "clients": r.get("clients", 0) - r.get("failures", 0)}
            for r in raw["rounds"]]  # fmt: skip
    return {
        "rounds": rows,
        "train_s": [r["train_s_max"] for r in raw["rounds"]],
        "final_wall_s": raw.get("t_done", raw["t_launch"]) - raw["t_launch"],
    }


def problems(results: dict[str, Any], engines: list[str], clients: int) -> list[str]:
    """Why these results are no fair side by side (empty: none); the run then exits 1.

    A requested engine that did not run or failed; a run whose accuracy never moved or
    that sent no bytes up in a round (a peer that never trained, issue 24 item 7); a
    round with fewer than ``clients`` clients reporting (clients lost or failed).
    """
    found = [f"{key}: {why.strip().splitlines()[-1] if why.strip() else 'failed'}"
             for key, why in results["unavailable"].items()]  # fmt: skip
    for phase in ("engines", "overhead"):
        for engine, runs in results[phase].items():
            for k, run in enumerate(runs):
                name, rows = f"{phase}:{engine} run {k + 1}", run["rounds"]
                if not rows:
                    found.append(f"{name}: no round completed")
                    continue
                accuracies = [r["accuracy"] for r in rows]
                if len(rows) > 1 and max(accuracies) - min(accuracies) < 1e-9:
                    found.append(f"{name}: accuracy flat at {accuracies[0]:.4f}: it never trained")
                if any(r["bytes_up"] <= 0 for r in rows):
                    found.append(f"{name}: a round sent 0 bytes up: clients did not train")
                short = [r for r in rows if r.get("clients", clients) < clients]
                if short:
                    found.append(f"{name}: round {short[0]['round']} had"
                                 f" {short[0]['clients']} of {clients} clients")  # fmt: skip
    ran = set(results["engines"])
    found += [f"{e}: requested, no run" for e in engines if e not in ran
              and not any(key.endswith(e) for key in results["unavailable"])]  # fmt: skip
    return found


def to_targets(rows: list[dict[str, Any]]) -> dict[str, dict[str, float] | None]:
    """First round reaching each target: round, wall_s, run_s, cumulative bytes up+down."""
    out: dict[str, dict[str, float] | None] = {f"{t:.2f}": None for t in TARGETS}
    total = 0
    for r in rows:
        total += r["bytes_up"] + r["bytes_down"]
        for t in TARGETS:
            if out[f"{t:.2f}"] is None and r["accuracy"] >= t:
                out[f"{t:.2f}"] = {"round": r["round"], "wall_s": r["wall_s"],
                                   "run_s": r["run_s"], "bytes": total}  # fmt: skip
    return out


def overhead(norm: dict[str, Any]) -> dict[str, float]:
    """Per-round wall time over rounds 2..N (round 1 warms up), and minus training."""
    rows = norm["rounds"]
    n = len(rows) - 1
    per_round = (rows[-1]["run_s"] - rows[0]["run_s"]) / n
    train = statistics.mean(norm["train_s"][1:]) if norm["train_s"] else None
    return {"round_s": per_round, "train_s": train if train is not None else float("nan"),
            "overhead_s": per_round - (train or 0.0)}  # fmt: skip


def trivial_table(path: Path) -> str:
    """A 400-row, 4-feature, 2-class CSV (seeded Gaussian blobs) for the trivial model."""
    import numpy as np

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    x = rng.normal(size=(400, 4)) + y[:, None]
    rows = "\n".join(
        ",".join(f"{v:.5f}" for v in xi) + f",{yi}" for xi, yi in zip(x, y, strict=True)
    )
    path.write_text("f0,f1,f2,f3,label\n" + rows + "\n")
    return str(path)


def median_dict(runs: list[dict[str, Any]], key: str) -> float | None:
    """Median of ``key`` over the dicts that have it; None if none."""
    vals = [r[key] for r in runs if r is not None and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def one_run(args: argparse.Namespace, phase: str, engine: str, python: Path, table: str,
            mosquitto: Any, work: Path) -> dict[str, Any]:  # fmt: skip
    """One run of ``engine`` in ``phase`` (``w1`` or ``overhead``), normalized.

    Raises ``RuntimeError`` (the run failed) or ``subprocess.TimeoutExpired``.
    """
    trivial = table if phase == "overhead" else None
    rounds = args.rounds if phase == "w1" else args.overhead_rounds
    if engine == "deploy":
        rounds = min(rounds, args.deploy_rounds or rounds)
    with PeakRss() as rss:
        if engine.startswith("meshfl"):
            tuned = engine.startswith("meshfl-tuned")
            in_process = IN_PROCESS if engine == "meshfl-tuned-inprocess" else 0
            broker = mosquitto.url if engine in ON_MOSQUITTO else None
            rounds = max(rounds, TUNED_ROUNDS) if tuned else rounds
            raw = run_meshfl(args.clients, rounds, trivial, broker, work, args.timeout, tuned,
                             in_process)  # fmt: skip
            command = f"meshfl local --agents {args.clients} --rounds {rounds}"
            if tuned:
                command += " --topology complete --codec sign --consensus-step 1.0"
            command += f" --in-process {in_process}" if in_process else ""
            command += f" --broker {broker}" if broker else ""
            command += " --dataset trivial.csv --model logreg --alpha 1000" if trivial else ""
        else:
            raw = run_flower(engine, python, args.clients, rounds, trivial, work, args.timeout)
            command = raw["command"]
    norm = normalize(engine, raw)
    peaks = rss.by_role()
    if engine not in ON_MOSQUITTO:  # the run-wide Mosquitto is not theirs
        peaks.pop("mosquitto", None)
    norm.update(command=command, rss=peaks, rounds_run=rounds,
                targets=to_targets(norm["rounds"]))  # fmt: skip
    if phase == "overhead":
        norm["overhead"] = overhead(norm)
    return norm


def main() -> None:
    """Parse the options, run every engine ``--repeats`` times, print, save, plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--deploy-rounds",
        type=int,
        default=None,
        help="rounds for the deployment engine (default: --rounds)",
    )
    parser.add_argument("--overhead-rounds", type=int, default=20)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--no-overhead", action="store_true")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2 clients, 2 rounds: grpc and meshfl (--engines grpc,sim,meshfl adds Ray)",
    )
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-flower")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "w1_flower.png")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--meshfl-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.meshfl_child:
        meshfl_child(json.loads(args.meshfl_child))
        return
    if args.smoke:
        args.clients, args.rounds, args.repeats = 2, 2, 1
        # Ray's simulation engine stays out of the suite's smoke run: installing Ray and its
        # node's start-up take minutes and time out on a loaded 2-core machine.
        if args.engines == ",".join(ENGINES):  # not chosen: the smoke set
            args.engines = "grpc,meshfl"
        args.no_overhead = True
    engines = args.engines.split(",")
    print("workload: W1 digits-8 (docs/workloads.md): FedAvg (Flower) vs meshfl local")
    print("command: python benchmarks/w1_flower.py " + " ".join(sys.argv[1:]))
    print("machine:", describe())
    python = ensure_venv(args.venv, simulation="sim" in engines)
    unavailable: dict[str, str] = {}
    if "sim" in engines and (why := ray_available(python)):
        unavailable["sim"] = f"ray does not import: {why}"
    results: dict[str, Any] = {"engines": {}, "overhead": {}, "unavailable": unavailable,
                               "machine": describe(), "argv": sys.argv[1:]}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="w1-flower-") as tmp:
        tmpdir = Path(tmp)
        table = trivial_table(tmpdir / "trivial.csv")
        mosquitto = None
        if any(e in ON_MOSQUITTO for e in engines) or not args.no_overhead:
            from broker.mosquitto import MosquittoProcess

            mosquitto = MosquittoProcess(workdir=tmpdir / "mosquitto", start_timeout_s=30.0)
            (tmpdir / "mosquitto").mkdir()
            mosquitto.start()
        try:
            for phase in ["w1", *([] if args.no_overhead else ["overhead"])]:
                for engine in engines:
                    if engine in unavailable or (
                        phase == "overhead" and engine in ("meshfl", *ON_MOSQUITTO[1:])
                    ):
                        continue  # meshfl's overhead row is meshfl-mosquitto's (a real broker)
                    runs = []
                    for rep in range(args.repeats):
                        print(f"... {phase} {engine} run {rep + 1}/{args.repeats}", flush=True)
                        work = tmpdir / f"{phase}-{engine}-{rep}"
                        work.mkdir()
                        try:
                            runs.append(
                                one_run(args, phase, engine, python, table, mosquitto, work)
                            )
                        except (RuntimeError, subprocess.TimeoutExpired) as exc:
                            unavailable[f"{phase}:{engine}"] = str(exc)[-600:]
                            print(f"    failed: {str(exc)[-600:]}", flush=True)
                            break
                    if runs:
                        results["engines" if phase == "w1" else "overhead"][engine] = runs
        finally:
            if mosquitto is not None:
                mosquitto.stop()
    print_tables(results, args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    if results["engines"]:
        plot(results, args.out)
        print(f"plot: {args.out}")
    if found := problems(results, engines, args.clients):
        print("\nFAILED: these results are not a fair side by side:", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        sys.exit(1)


def _fmt(v: float | None, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def print_tables(results: dict[str, Any], args: argparse.Namespace) -> None:
    """Medians over the repeats, one table per phase, then peak RSS by role."""
    print(f"\n## W1: {args.clients} clients, {args.rounds} rounds, medians of {args.repeats}")
    print(
        "engine | final acc | wall s (incl start-up) | run s | bytes/round up | down"
        " | " + " | ".join(f"to {t:.2f}: round, wall s, run s, MB" for t in TARGETS)
    )
    for engine, runs in results["engines"].items():
        final = statistics.median(r["rounds"][-1]["accuracy"] for r in runs)
        wall = statistics.median(r["rounds"][-1]["wall_s"] for r in runs)
        run_s = statistics.median(r["rounds"][-1]["run_s"] for r in runs)
        up = statistics.median(statistics.median(x["bytes_up"] for x in r["rounds"]) for r in runs)
        down = statistics.median(
            statistics.median(x["bytes_down"] for x in r["rounds"]) for r in runs
        )
        cells = []
        for t in TARGETS:
            hits = [r["targets"][f"{t:.2f}"] for r in runs]
            got = [h for h in hits if h]
            if len(got) < len(hits):
                cells.append(f"{len(got)}/{len(hits)} reached")
                if not got:
                    continue
            cells.append(
                f"{median_dict(got, 'round'):.0f}, {median_dict(got, 'wall_s'):.1f},"
                f" {median_dict(got, 'run_s'):.1f}, {(median_dict(got, 'bytes') or 0) / 1e6:.3f}"
            )
        rounds = runs[0]["rounds_run"]
        print(f"{engine} ({rounds} rounds) | {final:.4f} | {wall:.1f} | {run_s:.1f} | {up:,.0f}"
              f" | {down:,.0f} | " + " | ".join(cells))  # fmt: skip
        print(f"    command: {runs[0]['command']}")
        print("    accuracy per round (run 1): " +
              " ".join(f"{x['accuracy']:.3f}" for x in runs[0]["rounds"]))  # fmt: skip
    if results["overhead"]:
        print(
            f"\n## per-round overhead: 10-parameter linear model, {args.clients} clients,"
            f" {args.overhead_rounds} rounds (rounds 2..N), medians of {args.repeats}"
        )
        print("engine | round s | training s (slowest client) | overhead ms")
        for engine, runs in results["overhead"].items():
            o = [r["overhead"] for r in runs]
            print(
                f"{engine} | {statistics.median(x['round_s'] for x in o):.4f}"
                f" | {_fmt(statistics.median(x['train_s'] for x in o), '.4f')}"
                f" | {statistics.median(x['overhead_s'] for x in o) * 1e3:.1f}"
            )
    print("\n## peak RSS (MiB, max over processes of the role; repeats' median)")
    for phase in ("engines", "overhead"):
        for engine, runs in results[phase].items():
            roles = sorted({k for r in runs for k in r["rss"]})
            cells = []
            for k in roles:
                peak = statistics.median(r["rss"][k]["max_mib"] for r in runs if k in r["rss"])
                count = runs[0]["rss"].get(k, {}).get("processes", 0)
                cells.append(f"{k} ×{count}: {peak:.0f}")
            print(f"{'W1' if phase == 'engines' else 'trivial'} {engine}: " + ", ".join(cells))
    for what, why in results["unavailable"].items():
        print(f"unavailable: {what}: {why}")


def plot(results: dict[str, Any], out: Path) -> None:
    """Accuracy vs cumulative bytes (up + down) and vs wall seconds, first run of each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_bytes, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for engine, runs in results["engines"].items():
        rows = runs[0]["rounds"]
        total, cum = 0, []
        for r in rows:
            total += r["bytes_up"] + r["bytes_down"]
            cum.append(total / 1e6)
        acc = [r["accuracy"] for r in rows]
        label = engine if engine.startswith("meshfl") else f"Flower {engine}"
        by_bytes.plot(cum, acc, marker=".", label=label)
        by_time.plot([r["wall_s"] for r in rows], acc, marker=".", label=label)
    by_bytes.set_xscale("log")
    by_bytes.set_xlabel("bytes on the wire, both directions, cumulative (MB, log)")
    by_time.set_xlabel("wall seconds since launch (start-up included)")
    for ax in (by_bytes, by_time):
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.axhline(0.9, color="gray", lw=0.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("W1 digits-8: Flower FedAvg (global model) vs meshfl (mean over devices)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
