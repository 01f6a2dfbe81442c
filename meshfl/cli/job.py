"""``meshfl job``: start a job on a running coordinator and follow it (operator commands)."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from meshfl.cli.options import (
    Algorithm,
    BatchSize,
    ByteBudget,
    CodecSpec,
    ConsensusStep,
    Deadline,
    DenseBelow,
    KeyframeGrowth,
    LearningRate,
    LocalEpochs,
    Rounds,
    Topology,
)
from meshfl.contract import RoundSummary
from meshfl.errors import MeshflError
from meshfl.local.admin import AdminClient
from meshfl.local.run import DEFAULTS

job_app = typer.Typer(
    help="Create, start, follow and stop jobs (admin token).", no_args_is_help=True
)

Coordinator = Annotated[str, typer.Option(envvar="MESHFL_COORDINATOR", help="Coordinator URL.")]
AdminToken = Annotated[
    str, typer.Option(envvar="MESHFL_ADMIN_TOKEN", help="The coordinator's admin token.")
]


@job_app.command("start")
def start(
    coordinator: Coordinator,
    admin_token: AdminToken,
    devices: Annotated[
        int, typer.Option(help="Devices the job needs (0: all live, idle devices).")
    ] = 0,
    input_dim: Annotated[int, typer.Option(help="Features per sample.")] = 64,
    num_classes: Annotated[int, typer.Option(help="Number of classes.")] = 10,
    hidden: Annotated[str, typer.Option(help="Hidden layer widths, comma-separated.")] = "64",
    topology: Topology = DEFAULTS.topology,
    algorithm: Algorithm = DEFAULTS.algorithm,
    codec: CodecSpec = DEFAULTS.codec,
    consensus_step: ConsensusStep = DEFAULTS.consensus_step,
    keyframe_growth: KeyframeGrowth = DEFAULTS.keyframe_growth,
    dense_below: DenseBelow = DEFAULTS.dense_below,
    byte_budget: ByteBudget = DEFAULTS.byte_budget,
    rounds: Rounds = DEFAULTS.rounds,
    learning_rate: LearningRate = DEFAULTS.learning_rate,
    batch_size: BatchSize = DEFAULTS.batch_size,
    local_epochs: LocalEpochs = DEFAULTS.local_epochs,
    deadline: Deadline = DEFAULTS.round_deadline_s,
    test_data: Annotated[
        str | None, typer.Option(help="Test file path on the devices (default: their own).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Model seed.")] = 0,
    follow: Annotated[bool, typer.Option(help="Print rounds until the job ends.")] = True,
) -> None:
    """Create a job and start it on the enrolled devices."""
    from meshfl.codecs import parse_codec

    client = AdminClient(coordinator, admin_token)
    codec = parse_codec(codec).spec
    spec = {
        "name": f"{algorithm}-{codec}-{topology}",
        "model": {
            "name": "mlp",
            "input_dim": input_dim,
            "num_classes": num_classes,
            "hidden": [int(h) for h in hidden.split(",") if h.strip()],
        },
        "algorithm": algorithm,
        "codec": codec,
        "topology": topology,
        "rounds": rounds,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "local_epochs": local_epochs,
        "consensus_step": consensus_step,
        "round_deadline_s": deadline,
        "max_payload_bytes": DEFAULTS.max_payload_bytes,
        "seed": seed,
        "devices": devices,
        "test_data": test_data,
        "sketch_dim": DEFAULTS.sketch_dim,
        "keyframe_growth": keyframe_growth,
        "dense_below": dense_below,
        "byte_budget": byte_budget,
    }
    job = client.create_job(spec)  # type: ignore[arg-type]
    try:
        job = client.start_job(job["job_id"])
    except MeshflError:
        client.stop_job(job["job_id"])  # leave no job behind that can never start
        raise
    typer.echo(f"job {job['job_id']} started on {len(job['devices'])} devices")
    if follow:
        _follow(client, job["job_id"])


@job_app.command("list")
def list_jobs(coordinator: Coordinator, admin_token: AdminToken) -> None:
    """List every job with its status and devices."""
    jobs = AdminClient(coordinator, admin_token).jobs()
    if not jobs:
        typer.echo("no jobs yet; create one with `meshfl job start`")
    for job in jobs:
        spec = job["spec"]
        typer.echo(
            f"{job['job_id']}  {job['status']:<9}  {len(job['devices'])} devices"
            f"  {spec['algorithm']} {spec['codec']} {spec['topology']} {spec['rounds']} rounds"
        )


@job_app.command("status")
def status(coordinator: Coordinator, admin_token: AdminToken, job_id: str) -> None:
    """Print a job's status, devices and rounds."""
    client = AdminClient(coordinator, admin_token)
    job = client.job(job_id)
    typer.echo(f"job {job_id}: {job['status']}")
    for d in job["devices"]:
        acc = "-" if d["final_accuracy"] is None else f"{d['final_accuracy']:.4f}"
        typer.echo(
            f"  {d['name']:<16} rounds {d['rounds_reported']:>3}  final accuracy {acc}"
            f"  missing rounds {_ranges(d['missing_rounds'])}"
            + (f"  alone in rounds {_ranges(d['isolated_rounds'])}" if d["isolated_rounds"] else "")
            + (f"  declined: {d['error']}" if d["error"] else "")
        )
    for r in client.rounds(job_id):
        typer.echo(_line(r))


@job_app.command("stop")
def stop(coordinator: Coordinator, admin_token: AdminToken, job_id: str) -> None:
    """Stop a running job; devices finish their current round and save their model."""
    job = AdminClient(coordinator, admin_token).stop_job(job_id)
    typer.echo(f"job {job_id}: {job['status']}")


def _follow(client: AdminClient, job_id: str) -> None:
    from meshfl.local.admin import settled_rounds

    printed = 0
    while True:
        job = client.job(job_id)
        ended = job["status"] != "running"
        alive = sum(d["error"] is None for d in job["devices"])
        rounds = client.rounds(job_id)
        for r in rounds[printed:] if ended else settled_rounds(rounds, alive, lag=2)[printed:]:
            typer.echo(_line(r))
            printed += 1
        if ended:
            for d in job["devices"]:
                if d["error"]:
                    typer.echo(f"{d['name']} declined: {d['error']}")
            typer.echo(f"job {job_id}: {job['status']}")
            return
        time.sleep(1.0)


def _ranges(rounds: list[int]) -> str:
    """``[1, 2, 3, 7, 9, 10]`` → ``1-3, 7, 9-10`` (``-`` when empty)."""
    if not rounds:
        return "-"
    parts, start, prev = [], rounds[0], rounds[0]
    for r in [*rounds[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def _line(r: RoundSummary) -> str:
    cd = r["consensus_distance"]
    return (
        f"round {r['round']:>3}  mean acc {r['mean_accuracy']:.4f}  min acc"
        f" {r['min_accuracy']:.4f}  consensus {'-' if cd is None else f'{cd:.3g}'}"
        f"  sent {r['bytes_sent'] / 1e3:.1f} kB  devices {r['devices_reporting']}"
    )
