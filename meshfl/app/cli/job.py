"""``meshfl job``: start a job on a running coordinator and follow it (operator commands)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.app.cli.fleet_common import connection
from meshfl.app.cli.model import (
    HiddenOption,
    ImageShapeOption,
    ModelKwargsOption,
    ModelOption,
    model_layout,
    parse_model_options,
)
from meshfl.app.cli.options import privacy_defaults, with_job_options
from meshfl.app.local.admin import AdminClient
from meshfl.app.local.validation import topology_fields as local_topology_fields
from meshfl.contract import (
    DEFAULT_MODEL,
    JobDevicePublic,
    JobPublic,
    ModelSpec,
    RoundSummary,
    TopologyPublic,
    check_job_options,
    job_spec_fields,
    spec_value,
)
from meshfl.errors import MeshflError

job_app = typer.Typer(
    help="Create, start, follow and stop jobs (admin token).", no_args_is_help=True
)
job_app.callback()(connection)  # --coordinator-ca, --insecure-http before the command

Coordinator = Annotated[str, typer.Option(envvar="MESHFL_COORDINATOR", help="Coordinator URL.")]
AdminToken = Annotated[
    str, typer.Option(envvar="MESHFL_ADMIN_TOKEN", help="The coordinator's admin token.")
]


def _with_hash(spec: ModelSpec, model_hash: str | None) -> ModelSpec:
    """The job's model with its hash: --model-hash, or computed by building a user model here."""
    from meshfl.modelspec import is_custom

    if model_hash is not None:
        spec["hash"] = model_hash  # the coordinator checks its form (and a zoo model's value)
    elif is_custom(spec):
        spec["hash"] = model_layout(spec)[1]
    return spec


@job_app.command("start")
@with_job_options
def start(
    coordinator: Coordinator,
    admin_token: AdminToken,
    job: dict[str, Any],
    devices: Annotated[
        int, typer.Option(help="Devices the job needs (0: all live, idle devices).")
    ] = 0,
    input_dim: Annotated[int, typer.Option(help="Features per sample.")] = 64,
    num_classes: Annotated[int, typer.Option(help="Number of classes.")] = 10,
    model: ModelOption = DEFAULT_MODEL,
    model_kwargs: ModelKwargsOption = None,
    hidden: HiddenOption = None,
    image_shape: ImageShapeOption = None,
    model_hash: Annotated[
        str | None,
        typer.Option(help="A user model's spec hash (`meshfl model spec`); default: built here."),
    ] = None,
    test_data: Annotated[
        str | None, typer.Option(help="Test file path on the devices (default: their own).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Model seed.")] = 0,
    publish_model: Annotated[
        bool,
        typer.Option(
            help="Devices upload their final model.onnx; the coordinator builds the consensus."
        ),
    ] = False,
    follow: Annotated[bool, typer.Option(help="Print rounds until the job ends.")] = True,
) -> None:
    r"""Create a job and start it on the enrolled devices.

    --topology takes a kind or a JSON edge-list file {"n": N, "edges": [\[i, j], ...]},
    read here and sent as the job's custom graph (N devices take part).
    """
    # The job's options (``job``) are the table's: meshfl.contract.JOB_OPTIONS.
    from meshfl.codecs import parse_codec

    client = AdminClient(coordinator, admin_token)
    note = privacy_defaults(job)
    if note:
        typer.echo(note)
    check_job_options(job)
    job["codec"] = parse_codec(job["codec"]).spec
    topology_fields = local_topology_fields(job["topology"])
    custom = "custom_graph" in topology_fields
    label = Path(job["topology"]).stem if custom else topology_fields["topology"]
    spec = {
        "name": f"{job['algorithm']}-{job['codec']}-{label}",
        "model": _with_hash(
            parse_model_options(model, input_dim, num_classes, hidden, image_shape, model_kwargs),
            model_hash,
        ),
        **job_spec_fields(job),
        **topology_fields,
        "seed": seed,
        "devices": devices,
        "test_data": test_data,
    }
    if publish_model:
        spec["publish_model"] = True
    PrivacyOptions.from_spec(spec)  # refuse a combination that cannot work before any call
    created = client.create_job(spec)  # type: ignore[arg-type]
    try:
        started = client.start_job(created["job_id"])
    except MeshflError:
        client.stop_job(created["job_id"])  # leave no job behind that can never start
        raise
    typer.echo(f"job {started['job_id']} started on {len(started['devices'])} devices")
    if follow:
        _follow(client, started["job_id"])


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
            + (f"  joined at round {d['joined_round']}" if d["joined_round"] > 1 else "")
            + (f"  {_why_out(d)}" if d["error"] else "")
            + (f"  ε spent {d['epsilon_spent']:.3g}" if d.get("epsilon_spent") else "")
        )
    for r in client.rounds(job_id):
        typer.echo(_line(r))


@job_app.command("topology")
def topology_command(coordinator: Coordinator, admin_token: AdminToken, job_id: str) -> None:
    """Print a job's current topology version, its spectral gap and every change so far."""
    client = AdminClient(coordinator, admin_token)
    topo = cast(TopologyPublic, client.topology(job_id))
    started = client.job(job_id)["started_at"] or 0.0
    typer.echo(
        f"job {job_id}: {topo['kind']} topology, version {topo['version']} from round"
        f" {topo['from_round']}\n"
        f"  devices {len(topo['devices'])}, edges {len(topo['edges'])},"
        f" spectral gap {topo['spectral_gap']:.4f}"
    )
    typer.echo(f"  {'version':>7}  {'from':>5}  {'kind':<5}  {'device':<16}  {'at':>8}  reason")
    for e in topo["events"]:
        typer.echo(
            f"  {e['version']:>7}  {e['from_round']:>5}  {e['kind']:<5}"
            f"  {e['device_id'] or '-':<16}  {e['at'] - started:>7.1f}s  {e['reason']}"
        )


@job_app.command("stop")
def stop(coordinator: Coordinator, admin_token: AdminToken, job_id: str) -> None:
    """Stop a running job; devices finish their current round and save their model."""
    job = AdminClient(coordinator, admin_token).stop_job(job_id)
    typer.echo(f"job {job_id}: {job['status']}")


@job_app.command("pause")
def pause(coordinator: Coordinator, admin_token: AdminToken, job_id: str) -> None:
    """Pause a running job: devices finish the round they are in and wait."""
    with AdminClient(coordinator, admin_token) as client:
        job = client.pause_job(job_id)
    typer.echo(f"job {job_id}: {job['status']} (resume it with `meshfl job resume {job_id}`)")


@job_app.command("resume")
def resume(coordinator: Coordinator, admin_token: AdminToken, job_id: str) -> None:
    """Resume a paused job from its next round."""
    with AdminClient(coordinator, admin_token) as client:
        job = client.resume_job(job_id)
    typer.echo(f"job {job_id}: {job['status']}")


def _follow(client: AdminClient, job_id: str) -> None:
    from meshfl.app.local.admin import settled_rounds

    printed = 0
    while True:
        job = client.job(job_id)
        ended = job["status"] not in ("running", "paused")  # a paused job resumes later
        alive = sum(d["error"] is None for d in job["devices"])
        rounds = client.rounds(job_id)
        for r in rounds[printed:] if ended else settled_rounds(rounds, alive, lag=2)[printed:]:
            typer.echo(_line(r))
            printed += 1
        if ended:
            for d in job["devices"]:
                if d["error"]:
                    typer.echo(f"{d['name']} {_why_out(d)}")
            _summary(job, rounds)
            if job["status"] != "completed":
                raise typer.Exit(1)
            return
        time.sleep(1.0)


def _summary(job: JobPublic, rounds: list[RoundSummary]) -> None:
    """The last lines of ``--follow``: status, final accuracy, where the models are."""
    typer.echo(f"job {job['job_id']}: {job['status']}")
    finished = [d for d in job["devices"] if d["done"] and d["error"] is None]
    if rounds:
        last = rounds[-1]
        typer.echo(
            f"final mean accuracy {last['mean_accuracy']:.4f}, minimum"
            f" {last['min_accuracy']:.4f} after {len(rounds)} rounds;"
            f" {len(finished)} of {len(job['devices'])} devices finished"
        )
    if finished:
        typer.echo(
            "each device saved its model (model.pt, model.npz, model.onnx) under its --out"
            f" directory as {job['job_id']}/NAME/; with --publish-model, the consensus is at"
            f" GET /api/v1/jobs/{job['job_id']}/artifacts/consensus.onnx"
        )
    spent = [e for d in job["devices"] if (e := d.get("epsilon_spent"))]
    if spent:
        delta = spec_value(job["spec"], "dp_delta")
        typer.echo(f"ε spent per device {min(spent):.3g}–{max(spent):.3g} at δ = {delta:g}")
    if job["status"] == "failed":
        typer.echo("no device finished the job: see the reasons above", err=True)


def _why_out(device: JobDevicePublic) -> str:
    """``left: <reason>`` for a device that left mid-job, else ``declined: <reason>``."""
    return f"{'left' if device['left_round'] is not None else 'declined'}: {device['error']}"


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
