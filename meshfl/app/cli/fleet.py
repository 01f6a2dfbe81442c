"""``meshfl fleet``: the operator's client of the coordinator's REST API.

Devices (``ls``, ``show``, ``tag``, ``drain``, ``undrain``, ``revoke``, ``delete``), jobs
(``jobs``), tokens (``tokens``, in :mod:`meshfl.app.cli.fleet_tokens`) and the fleet topology
(``topology``, in :mod:`meshfl.app.cli.fleet_topology`). Every command prints a rich table by
default and exactly the API's JSON with ``--json``; the coordinator's refusals end the
command with its one-line reason (exit 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshfl.app.cli.fleet_common import (
    Api,
    ago,
    connection,
    console,
    with_api,
    with_api_no_json,
)
from meshfl.app.cli.fleet_tokens import tokens_app
from meshfl.app.cli.fleet_topology import fleet_topology_app
from meshfl.errors import ConfigError, CoordinatorError

if TYPE_CHECKING:
    from rich.table import Table

    from meshfl.contract import DevicePublic, JobPublic

__all__ = ["fleet_app"]

fleet_app = typer.Typer(
    help="Manage the fleet over REST: devices, enrolment and API tokens, jobs, topology.",
    no_args_is_help=True,
)
fleet_app.callback()(connection)  # --coordinator-ca, --insecure-http before the command
fleet_app.add_typer(tokens_app, name="tokens")
fleet_app.add_typer(fleet_topology_app, name="topology")

DeviceArg = Annotated[str, typer.Argument(help="The device id.", show_default=False)]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


@fleet_app.command("ls")
@with_api
def ls(
    api: Api,
    tag: Annotated[
        list[str] | None, typer.Option("--tag", help="Only devices with this tag (repeatable).")
    ] = None,
    state: Annotated[
        str | None, typer.Option(help="Only devices in this state: active, draining, revoked.")
    ] = None,
    online: Annotated[
        bool | None,
        typer.Option("--online/--offline", help="Only devices online / not (Last Will, polls)."),
    ] = None,
    min_cores: Annotated[
        int | None, typer.Option(min=0, help="Only devices with at least this many cores.")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many devices.")] = None,
    offset: Annotated[int | None, typer.Option(min=0, help="Skip this many first.")] = None,
) -> None:
    """List devices: id, name, state, online, tags, cores, samples/s, last seen."""
    from meshfl.app.local.fleet_client import DeviceFilter

    query = DeviceFilter(
        tags=tuple(tag or ()),
        state=state,
        status=None if online is None else ("online" if online else "offline"),
        min_cores=min_cores,
        limit=limit,
        offset=offset,
    )
    with api.client() as fleet:
        page = fleet.list_devices(query)
    if api.printed_json(page.items):
        return
    out = console()
    if page.items:
        out.print(_device_table(page.items))
    start = (offset or 0) + 1
    end = (offset or 0) + len(page.items)
    total = page.total if page.total is not None else end
    shown = f"{start}-{end}" if page.items else "0"
    out.print(f"{shown} of {total} devices" if page.items else f"no devices (of {total})")


def _device_table(devices: list[DevicePublic]) -> Table:
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for name, justify in [("ID", "left"), ("NAME", "left"), ("STATE", "left"),
                          ("ONLINE", "left"), ("TAGS", "left"), ("CORES", "right"),
                          ("SAMPLES/S", "right"), ("LAST SEEN", "right")]:  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for d in devices:
        profile = d.get("profile") or {}
        rate = profile.get("train_samples_per_s")
        table.add_row(
            d["device_id"],
            d["name"],
            str(d.get("state", "-")),
            _yes_no(d.get("online")),
            ",".join(d.get("tags") or []) or "-",
            str(profile.get("cores", "-")),
            "-" if rate is None else f"{rate:,.0f}",
            ago(d.get("last_seen")),
        )
    return table


@fleet_app.command("show")
@with_api
def show(
    api: Api,
    device_id: DeviceArg,
) -> None:
    """Show one device: state, tags, labels, capability profile and ε spent.

    With --json, prints the device object of GET /devices/{id} (ε is at
    GET /devices/{id}/privacy).
    """
    with api.client() as fleet:
        device = fleet.device(device_id)
        privacy = None if api.as_json else _privacy(fleet, device_id)
    if api.printed_json(device):
        return
    from rich.table import Table

    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    labels = device.get("labels") or {}
    rows: list[tuple[str, str]] = [
        ("id", device["device_id"]),
        ("name", device["name"]),
        ("fleet", device["fleet"]),
        ("state", str(device.get("state", "-"))),
        ("online", _yes_no(device.get("online"))),
        ("tags", ", ".join(device.get("tags") or []) or "-"),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"),
        ("enrolled", ago(device.get("enrolled_at"))),
        ("last seen", ago(device.get("last_seen"))),
    ]
    if device.get("revoked_at"):
        rows.append(("revoked", ago(device["revoked_at"])))
    profile = device.get("profile") or {}
    rows.append(("profile", "" if profile else "none reported yet"))
    rows += [(f"  {k}", _profile_value(k, v)) for k, v in profile.items()]
    rows.append(("privacy", str(privacy)))
    for row in rows:
        table.add_row(*row)
    console().print(table)


def _privacy(fleet: Any, device_id: str) -> str:
    """ε spent at δ over all the device's jobs; the reason when it cannot be read."""
    try:
        p = fleet.device_privacy(device_id)
    except CoordinatorError as exc:
        return f"unavailable ({exc})"
    if not p["releases"]:
        return "no differentially private releases yet"
    budget = "" if p["epsilon_budget"] is None else f" of a budget of {p['epsilon_budget']:g}"
    return (
        f"ε spent {p['epsilon_spent']:.3g}{budget} at δ = {p['delta']:g} ({p['releases']} releases)"
    )


def _profile_value(key: str, value: Any) -> str:
    if isinstance(value, float) and key.endswith("bytes_per_s"):
        return f"{value / 1e6:.2f} MB/s"
    if key == "memory_bytes" and isinstance(value, int):
        return f"{value / 2**30:.1f} GiB"
    if key == "broker_rtt_s" and isinstance(value, float):
        return f"{value * 1e3:.1f} ms"
    if key == "measured_at" and isinstance(value, float):
        return ago(value)
    if isinstance(value, float):
        return f"{value:,.4g}"
    return "-" if value is None else str(value)


def _yes_no(value: object) -> str:
    return "-" if value is None else ("yes" if value else "no")


@fleet_app.command("tag")
@with_api
def tag(
    api: Api,
    device_id: DeviceArg,
    add: Annotated[list[str] | None, typer.Option("--add", help="Add this tag.")] = None,
    remove: Annotated[list[str] | None, typer.Option("--remove", help="Remove this tag.")] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Set a label, KEY=VALUE.")
    ] = None,
    unlabel: Annotated[
        list[str] | None, typer.Option("--unlabel", help="Remove the label KEY.")
    ] = None,
) -> None:
    """Change a device's tags and labels (all options repeatable).

    Reads the device's current tags and labels, applies the changes and sends the full
    lists (PATCH /devices/{id}).
    """
    if not (add or remove or label or unlabel):
        raise ConfigError("nothing to change: pass --add, --remove, --label or --unlabel")
    set_labels = dict(_label(text) for text in label or ())
    with api.client() as fleet:
        device = fleet.device(device_id)
        tags = labels = None
        if add or remove:
            tags = [t for t in device.get("tags") or [] if t not in set(remove or ())]
            tags += [t for t in dict.fromkeys(add or ()) if t not in tags]
        if label or unlabel:
            current = device.get("labels") or {}
            labels = {k: v for k, v in current.items() if k not in set(unlabel or ())}
            labels.update(set_labels)
        device = fleet.patch_device(device_id, tags=tags, labels=labels)
    if api.printed_json(device):
        return
    shown = ", ".join(f"{k}={v}" for k, v in sorted((device.get("labels") or {}).items()))
    typer.echo(
        f"device {device['device_id']} ({device['name']}): tags"
        f" {', '.join(device.get('tags') or []) or '-'}; labels {shown or '-'}"
    )


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--label {text!r}: write it as KEY=VALUE, e.g. --label site=lab-2")
    return key, value


def _transition(api: Api, device_id: str, action: str) -> None:
    """Drain, undrain or revoke a device and print its new state."""
    with api.client() as fleet:
        device = fleet.device_action(device_id, action)  # type: ignore[arg-type]
    if api.printed_json(device):
        return
    if device is None:
        typer.echo(f"device {device_id}: {action} done")
        return
    typer.echo(f"device {device['device_id']} ({device['name']}): {device.get('state', action)}")


@fleet_app.command("drain")
@with_api
def drain(
    api: Api,
    device_id: DeviceArg,
) -> None:
    """Drain a device: it finishes its current round and takes no new work."""
    _transition(api, device_id, "drain")


@fleet_app.command("undrain")
@with_api
def undrain(
    api: Api,
    device_id: DeviceArg,
) -> None:
    """Make a drained device active again (it can be given work)."""
    _transition(api, device_id, "undrain")


@fleet_app.command("revoke")
@with_api
def revoke(
    api: Api,
    device_id: DeviceArg,
    yes: Yes = False,
) -> None:
    """Revoke a device: its token and broker login stop working, it leaves every job.

    There is no undo: the device must enrol again with a new enrolment token.
    """
    if not yes:
        typer.confirm(
            f"revoke device {device_id}? It must enrol again to rejoin", abort=True, err=True
        )
    _transition(api, device_id, "revoke")


@fleet_app.command("delete")
@with_api_no_json
def delete(
    api: Api,
    device_id: DeviceArg,
    yes: Yes = False,
) -> None:
    """Delete a device from the fleet's listings for good (see docs/fleet.md)."""
    if not yes:
        typer.confirm(f"delete device {device_id} for good?", abort=True, err=True)
    with api.client() as fleet:
        fleet.delete_device(device_id)
    typer.echo(f"device {device_id}: deleted")


@fleet_app.command("jobs")
@with_api
def jobs(api: Api) -> None:
    """List jobs with their status, rounds and devices.

    Start, follow, pause, resume and stop jobs with `meshfl job`.
    """
    with api.client() as fleet:
        found = fleet.jobs()
    if api.printed_json(found):
        return
    out = console()
    if not found:
        out.print("no jobs yet; start one with `meshfl job start`")
        return
    out.print(_job_table(found))
    out.print(
        f"{len(found)} job{'' if len(found) == 1 else 's'}; `meshfl job status ID` for details,"
        " `meshfl job start|pause|resume|stop` to control them"
    )


def _job_table(found: list[JobPublic]) -> Table:
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for name, justify in [("ID", "left"), ("NAME", "left"), ("STATUS", "left"),
                          ("ROUNDS", "right"), ("DEVICES", "right"), ("TOPOLOGY", "left"),
                          ("STARTED", "right")]:  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for job in found:
        spec = job["spec"]
        done = max((d["rounds_reported"] for d in job["devices"]), default=0)
        active = sum(d["left_round"] is None and d["error"] is None for d in job["devices"])
        table.add_row(
            job["job_id"],
            spec.get("name", "-"),
            job["status"],
            f"{done}/{spec['rounds']}",
            f"{active}/{len(job['devices'])}" if job["devices"] else "0",
            spec.get("topology", "-"),
            ago(job["started_at"]) if job["started_at"] else "-",
        )
    return table
