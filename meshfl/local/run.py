"""``meshfl local``: a whole fleet on this machine, end to end.

Starts the embedded broker (unless a broker URL is given), a coordinator on a free port
and N agent *processes* — the same ``meshfl agent run`` a device runs — partitions the
dataset into per-device files, runs one job, and writes ``DIR/report.json`` and
``DIR/report.png``. Everything it started is stopped on success, on Ctrl-C and on
failure; a failure names the part that failed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshfl.contract import JOB_TOPOLOGIES, JobPublic, JobSpec, RoundSummary
from meshfl.errors import ConfigError, DataError, Interrupted, MeshflError
from meshfl.local.admin import AdminClient, settled_rounds
from meshfl.local.processes import Supervisor, free_port, wait_for_port

__all__ = ["LocalConfig", "LocalRun", "run_local"]


@dataclass(frozen=True)
class LocalConfig:
    """Options of ``meshfl local`` (defaults: workload W1, CHOCO-SGD with top-k)."""

    agents: int = 8
    rounds: int = 30
    dataset: str = "digits"
    alpha: float = 0.5
    topology: str = "ring"
    algorithm: str = "choco"
    codec: str = "topk:0.15"
    consensus_step: float = 0.9
    keyframe_growth: float = 1.5
    dense_below: int = 0
    byte_budget: int = 0
    learning_rate: float = 0.1
    batch_size: int = 32
    local_epochs: int = 1
    round_deadline_s: float = 30.0
    max_payload_bytes: int = 131072
    broker: str | None = None
    seed: int = 0
    out: Path = Path("meshfl-run")
    label_column: str = "label"
    sketch_dim: int = 256


DEFAULTS = LocalConfig()


@dataclass
class LocalRun:
    """What a local run produced: the report (as written to ``report.json``) and paths."""

    report: dict[str, Any]
    report_path: Path
    plot_path: Path | None
    failed_agents: dict[str, str] = field(default_factory=dict)


RoundHook = Callable[[RoundSummary, Supervisor], None]


def run_local(
    config: LocalConfig,
    on_round: RoundHook | None = None,
    show: Callable[[list[RoundSummary]], None] | None = None,
) -> LocalRun:
    """Run one job on a local fleet and return its report.

    Parameters
    ----------
    config
        The run's options.
    on_round
        Called once per new round summary with the supervisor (tests use it to kill an
        agent mid-run).
    show
        Called with all round summaries whenever a new one arrives (the live table).

    Raises
    ------
    meshfl.errors.ConfigError
        Bad options or data.
    meshfl.errors.MeshflError
        A part of the fleet failed; the message names it.

    """
    validate(config)
    out = config.out
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".meshfl-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"--out {out} is not a writable directory ({exc.strerror}); choose another"
        ) from None
    device_files, test_file = _prepare_data(config)
    spec = _job_spec(config, test_file)
    _check_codec_policy(spec)
    supervisor = Supervisor(out / "logs")
    started = time.monotonic()
    admin: AdminClient | None = None
    try:
        broker_url = config.broker or _start_broker(supervisor)
        enrol_token = secrets.token_urlsafe(16)
        url, admin = _start_coordinator(supervisor, out, broker_url, enrol_token)
        for i, path in enumerate(device_files):
            supervisor.start(
                f"device-{i}",
                [
                    "agent", "run", "--coordinator", url, "--token", enrol_token,
                    "--data", str(path), "--name", f"device-{i}",
                    "--out", str(out / "models"), "--once",
                    "--label-column", config.label_column,
                ],
            )  # fmt: skip
        _wait_for_enrolment(admin, supervisor, config.agents)
        job = admin.create_job(spec)
        job = admin.start_job(job["job_id"])
        try:
            final_job, rounds, failed = _monitor(admin, supervisor, job, config, on_round, show)
        except KeyboardInterrupt:
            raise _interrupted(config, admin, job, started) from None
        declined = [d for d in final_job["devices"] if d["error"]]
        if not rounds and declined:
            raise MeshflError(
                f"no round completed: {declined[0]['name']} declined the job"
                f" ({declined[0]['error']})"
            )
        if not rounds and failed:
            name, why = next(iter(failed.items()))
            raise MeshflError(f"no round completed: agent {name} failed ({why})")
        report = build_report(config, final_job, rounds, time.monotonic() - started, failed)
    finally:
        if admin is not None:
            admin.close()
        supervisor.stop_all()
    from meshfl.local.report import write_report

    report_path, plot_path = write_report(out, report)
    return LocalRun(report, report_path, plot_path, failed)


def _interrupted(
    config: LocalConfig, admin: AdminClient, job: JobPublic, started: float
) -> Interrupted:
    """Stop the job, write the partial report, and say so (the caller stops the processes)."""
    from meshfl.local.report import write_report

    try:
        final_job = admin.stop_job(job["job_id"])
        rounds = admin.rounds(job["job_id"])
    except MeshflError:
        return Interrupted("interrupted; every process of the run was stopped")
    report = build_report(config, final_job, rounds, time.monotonic() - started, {})
    report["status"] = "interrupted"
    path, _ = write_report(config.out, report)
    return Interrupted(
        f"interrupted after round {len(rounds)}; every process of the run was stopped;"
        f" partial report in {path}"
    )


MAX_AGENTS = 64
"""One process per agent (≈ 250 MB each with torch): past this, use a real fleet."""


def validate(config: LocalConfig) -> None:
    """Check the options before anything starts.

    Raises
    ------
    meshfl.errors.ConfigError
        An option is out of range; the message names it and the valid range.

    """
    import math

    if not 2 <= config.agents <= MAX_AGENTS:
        raise ConfigError(f"--agents must be between 2 and {MAX_AGENTS} (got {config.agents})")
    for name, value in (("--rounds", config.rounds), ("--batch-size", config.batch_size),
                        ("--local-epochs", config.local_epochs)):  # fmt: skip
        if value < 1:
            raise ConfigError(f"{name} must be at least 1 (got {value})")
    for name, number in (("--learning-rate", config.learning_rate), ("--alpha", config.alpha),
                         ("--deadline", config.round_deadline_s)):  # fmt: skip
        if not (math.isfinite(number) and number > 0):
            raise ConfigError(f"{name} must be a positive number (got {number})")
    growth = config.keyframe_growth
    if not (math.isfinite(growth) and (growth == 0 or growth > 1)):
        raise ConfigError(f"--keyframe-growth must be 0 (off) or > 1 (got {growth})")
    if not (math.isfinite(config.consensus_step) and 0 < config.consensus_step <= 1):
        raise ConfigError(f"--consensus-step must be in (0, 1] (got {config.consensus_step})")
    if config.algorithm not in ("choco", "dpsgd"):
        raise ConfigError(f"--algorithm must be choco or dpsgd (got {config.algorithm!r})")
    from meshfl.codecs import parse_codec
    from meshfl.topology import build_graph

    parse_codec(config.codec)
    if config.topology not in JOB_TOPOLOGIES:
        raise ConfigError(f"--topology {config.topology!r}: use one of {', '.join(JOB_TOPOLOGIES)}")
    build_graph(config.topology, config.agents)
    if config.broker is not None:
        from edge_agent.transport.mqtt import parse_broker_url

        parse_broker_url(config.broker)
    if config.dense_below < 0 or config.byte_budget < 0:
        raise ConfigError("--dense-below and --byte-budget must be >= 0")
    if config.byte_budget and parse_codec(config.codec).name not in ("topk", "randk"):
        raise ConfigError(
            "--byte-budget sets a sparsifier's density: use --codec topk:D or randk:D"
        )
    if config.algorithm == "dpsgd" and parse_codec(config.codec).spec not in ("identity",):
        raise ConfigError("--algorithm dpsgd sends whole models: use --codec identity")


def _prepare_data(config: LocalConfig) -> tuple[list[Path], Path]:
    from models.datasets import (
        dirichlet_partition,
        load_digits_split,
        split_dataset_file,
        write_partition,
    )

    if config.dataset == "digits":
        split = load_digits_split(config.seed)
    else:
        path = Path(config.dataset)
        if not path.exists():
            raise ConfigError(
                f"--dataset {config.dataset!r} is neither 'digits' nor an existing .npz/.csv file"
            )
        split = split_dataset_file(
            path, config.agents, config.alpha, config.seed, label_column=config.label_column
        )
        _check_labels(path, split.x_train, np.concatenate([split.y_train, split.y_test]))
    parts = dirichlet_partition(split.y_train, config.agents, config.alpha, config.seed)
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError(
            f"the Dirichlet(α={config.alpha}) partition left device(s) {empty} without data;"
            " use fewer --agents, a larger --alpha or another --seed"
        )
    files, test_file = write_partition(config.out / "data", split, parts)
    return list(files), test_file


MAX_CLASSES = 100_000


def _check_labels(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """A user dataset must have features and labels 0..K-1 with 2 <= K <= MAX_CLASSES."""
    if x.shape[1] == 0:
        raise DataError(f"{path}: no feature columns; add features besides the label")
    classes = np.unique(y)
    if len(classes) < 2:
        raise DataError(f"{path}: only one class ({classes[0]}); a classifier needs two or more")
    if int(classes[-1]) >= MAX_CLASSES or int(classes[-1]) >= 10 * len(classes):
        raise DataError(
            f"{path}: labels go up to {int(classes[-1])} for {len(classes)} classes; number"
            " the classes 0..K-1"
        )


def _check_codec_policy(spec: JobSpec) -> None:
    """Refuse a byte budget that cannot work for the job's model before agents decline it."""
    if not spec.get("byte_budget"):
        return
    from meshfl.codecs import CodecPolicy, parse_codec
    from models.arrays import to_arrays
    from models.zoo import build_model

    layout = [(k, tuple(v.shape)) for k, v in to_arrays(build_model(spec["model"], 0)).items()]
    try:
        CodecPolicy.from_options(
            parse_codec(spec["codec"]), layout, spec.get("dense_below", 0), spec["byte_budget"]
        )
    except ConfigError as exc:
        raise ConfigError(f"--byte-budget {spec['byte_budget']}: {exc}") from None


def _start_broker(supervisor: Supervisor) -> str:
    port = free_port()
    child = supervisor.start("broker", ["broker", "serve", "--port", str(port)])
    try:
        wait_for_port("127.0.0.1", port, 30.0, alive=child)
    except MeshflError as exc:
        raise MeshflError(f"the embedded broker failed to start: {exc}") from None
    return f"mqtt://127.0.0.1:{port}"


def _start_coordinator(
    supervisor: Supervisor, out: Path, broker_url: str, enrol_token: str
) -> tuple[str, AdminClient]:
    admin_token = secrets.token_urlsafe(16)
    port = free_port()
    db = out / "coordinator.db"
    db.unlink(missing_ok=True)
    child = supervisor.start(
        "coordinator",
        [
            "coordinator", "serve", "--port", str(port), "--db", f"sqlite:///{db}",
            "--broker-url", broker_url, "--enrol-token", enrol_token,
            "--admin-token", admin_token,
        ],
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", port, 60.0, alive=child)
    except MeshflError as exc:
        raise MeshflError(f"the coordinator failed to start: {exc}") from None
    url = f"http://127.0.0.1:{port}"
    return url, AdminClient(url, admin_token)


def _agents(supervisor: Supervisor) -> list[Any]:
    return [c for c in supervisor.children if c.name.startswith("device-")]


def _check_servers(supervisor: Supervisor) -> None:
    for child in supervisor.children:
        if child.name in ("broker", "coordinator") and child.returncode is not None:
            raise MeshflError(f"the {child.name} exited unexpectedly ({child.describe_exit()})")


def _wait_for_enrolment(admin: AdminClient, supervisor: Supervisor, n: int) -> None:
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        _check_servers(supervisor)
        for child in _agents(supervisor):
            if child.returncode is not None:
                raise MeshflError(f"agent {child.name} failed at start-up: {child.last_line()}")
        if len(admin.devices()) >= n:
            return
        time.sleep(0.2)
    raise MeshflError(f"only {len(admin.devices())} of {n} agents enrolled within 120 s")


def _job_spec(config: LocalConfig, test_file: Path) -> JobSpec:
    from models.data import load_dataset_file

    x, y = load_dataset_file(test_file)
    classes = int(y.max()) + 1
    if config.dataset == "digits":
        classes = 10
    return {
        "name": f"local-{Path(config.dataset).stem}",
        "model": {"name": "mlp", "input_dim": int(x.shape[1]), "num_classes": classes,
                  "hidden": [64]},
        "algorithm": config.algorithm,  # type: ignore[typeddict-item]
        "codec": config.codec,
        "topology": config.topology,
        "rounds": config.rounds,
        "learning_rate": config.learning_rate,
        "batch_size": config.batch_size,
        "local_epochs": config.local_epochs,
        "consensus_step": config.consensus_step,
        "round_deadline_s": config.round_deadline_s,
        "max_payload_bytes": config.max_payload_bytes,
        "seed": config.seed,
        "devices": config.agents,
        "test_data": str(test_file.resolve()),
        "sketch_dim": config.sketch_dim,
        "keyframe_growth": config.keyframe_growth,
        "dense_below": config.dense_below,
        "byte_budget": config.byte_budget,
    }  # fmt: skip


def _monitor(
    admin: AdminClient,
    supervisor: Supervisor,
    job: JobPublic,
    config: LocalConfig,
    on_round: RoundHook | None,
    show: Callable[[list[RoundSummary]], None] | None,
) -> tuple[JobPublic, list[RoundSummary], dict[str, str]]:
    job_id = job["job_id"]
    seen = 0
    failed: dict[str, str] = {}
    last_progress = time.monotonic()
    stall_s = 4 * config.round_deadline_s + 60.0
    while True:
        _check_servers(supervisor)
        agents = _agents(supervisor)
        rounds = settled_rounds(
            admin.rounds(job_id), sum(c.returncode in (None, 0) for c in agents)
        )
        if len(rounds) > seen:
            for summary in rounds[seen:]:
                if on_round is not None:
                    on_round(summary, supervisor)
            seen = len(rounds)
            last_progress = time.monotonic()
            if show is not None:
                show(rounds)
        for child in agents:
            code = child.returncode
            if code not in (None, 0) and child.name not in failed:
                failed[child.name] = child.describe_exit()
        job = admin.job(job_id)
        if job["status"] != "running" or all(c.returncode is not None for c in agents):
            rounds = admin.rounds(job_id)
            if show is not None and len(rounds) > seen:
                show(rounds)
            if job["status"] == "running":
                job = admin.stop_job(job_id)
            return job, rounds, failed
        if time.monotonic() - last_progress > stall_s:
            raise MeshflError(
                f"no round finished for {stall_s:.0f} s; see the logs in {supervisor.log_dir}"
            )
        time.sleep(0.3)


TARGETS = (0.80, 0.85, 0.90)
"""Mean test accuracies whose first round, elapsed seconds and bytes the report gives."""


def build_report(
    config: LocalConfig,
    job: JobPublic,
    rounds: list[RoundSummary],
    wall_s: float,
    failed: dict[str, str],
) -> dict[str, Any]:
    """The ``report.json`` document of a local run."""
    devices = [
        {
            "id": d["device_id"],
            "name": d["name"],
            "index": d["index"],
            "final_accuracy": d["final_accuracy"],
            "bytes_sent": d["bytes_sent"],
            "bytes_received": d["bytes_received"],
            "missing_rounds": d["missing_rounds"],
            "isolated_rounds": d["isolated_rounds"],
            "failed": failed.get(d["name"]) or d["error"],
        }
        for d in job["devices"]
    ]
    names = {d["device_id"]: d["name"] for d in job["devices"]}
    last = rounds[-1] if rounds else None
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    reached: dict[str, dict[str, float] | None] = {}
    sent = 0
    for target in TARGETS:
        reached[f"{target:.2f}"] = None
    for r in rounds:
        sent += r["bytes_sent"]
        for target in TARGETS:
            key = f"{target:.2f}"
            if reached[key] is None and r["mean_accuracy"] >= target:
                reached[key] = {"round": r["round"], "elapsed_s": r["elapsed_s"],
                                "bytes_sent": sent}  # fmt: skip
    return {
        "config": cfg,
        "job_id": job["job_id"],
        "status": job["status"],
        "rounds": [
            {
                "round": r["round"],
                "mean_accuracy": r["mean_accuracy"],
                "min_accuracy": r["min_accuracy"],
                "consensus_distance": r["consensus_distance"],
                "bytes_sent": r["bytes_sent"],
                "bytes_received": r["bytes_received"],
                "elapsed_s": r["elapsed_s"],
                "devices_reporting": r["devices_reporting"],
                "missing_devices": [names.get(i, i) for i in r["missing_devices"]],
            }
            for r in rounds
        ],
        "devices": devices,
        "final": {
            "mean_accuracy": last["mean_accuracy"] if last else None,
            "min_accuracy": last["min_accuracy"] if last else None,
            "rounds_completed": len(rounds),
            "bytes_sent_total": sum(r["bytes_sent"] for r in rounds),
            "bytes_received_total": sum(r["bytes_received"] for r in rounds),
            "wall_s": wall_s,
        },
        "time_to_accuracy": reached,
    }
