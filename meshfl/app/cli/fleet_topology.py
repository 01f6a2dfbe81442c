"""``meshfl fleet topology``: the fleet's default topology, shown and set."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from meshfl.app.cli.fleet_common import (
    Api,
    ago,
    console,
    with_api,
)
from meshfl.errors import ConfigError

if TYPE_CHECKING:
    from meshfl.contract import FleetTopology, TopologySetting

__all__ = ["fleet_topology_app"]

fleet_topology_app = typer.Typer(
    help="The fleet's default topology (jobs without --topology use it): show or set.",
    invoke_without_command=True,
)

_EDGE_TABLE_MAX = 200
"""Most edges listed one per line; a larger graph shows its summary only."""

_PARAMETERS = ("topology_degree", "topology_probability", "topology_seed", "mixing")


@fleet_topology_app.callback()
@with_api
def show(ctx: typer.Context, api: Api) -> None:
    """Show the fleet topology: kind, parameters, nodes, edges with weights, spectral gap."""
    if ctx.invoked_subcommand is not None:
        return
    with api.client() as fleet:
        document = fleet.fleet_topology()
    if api.printed_json(document):
        return
    render(document)


def render(document: FleetTopology) -> None:
    """Print a ``GET /topology`` document: the setting, a summary and the edge table."""
    from rich.table import Table

    out = console()
    setting = document["setting"]
    params = [f"{p.removeprefix('topology_')} {setting[p]}"  # type: ignore[literal-required]
              for p in _PARAMETERS if setting.get(p) is not None]  # fmt: skip
    if "custom_graph" in setting:
        graph = setting["custom_graph"]
        params.append(f"{graph['n']} nodes, {len(graph['edges'])} edges given")
    since = (
        "built-in default"
        if document["updated_at"] is None
        else "set " + ago(document["updated_at"])
    )
    gap = document["spectral_gap"]
    out.print(
        f"fleet topology: {setting['topology']}"
        + (f" ({', '.join(params)})" if params else "")
        + f"; {since}"
    )
    out.print(
        f"over the live active devices: nodes {len(document['nodes'])}, edges"
        f" {len(document['edges'])}, spectral gap {'-' if gap is None else f'{gap:.4f}'}"
    )
    if document["error"]:
        out.print(f"no graph: {document['error']}")
        return
    if not document["nodes"]:
        out.print("no live active devices: the graph appears when devices are online")
        return
    if not document["edges"]:
        return  # a single device has no neighbour
    if len(document["edges"]) > _EDGE_TABLE_MAX:
        out.print(f"({len(document['edges'])} edges; --json lists them)")
        return
    names = {n["device_id"]: f"{n['name']} ({n['device_id']})" for n in document["nodes"]}
    table = Table(box=None, pad_edge=False)
    for title, justify in (("DEVICE", "left"), ("NEIGHBOUR", "left"), ("WEIGHT", "right")):
        table.add_column(title, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for edge in document["edges"]:
        table.add_row(
            names.get(edge["source"], edge["source"]),
            names.get(edge["target"], edge["target"]),
            f"{edge['weight']:.4f}",
        )
    out.print(table)


@fleet_topology_app.command("set")
@with_api
def set_topology(
    api: Api,
    kind: Annotated[
        str | None,
        typer.Option(
            help="ring, torus, exponential, one-peer-exponential, random-regular,"
            " erdos-renyi, small-world, star, complete."
        ),
    ] = None,
    degree: Annotated[
        int | None, typer.Option(help="random-regular degree, small-world lattice degree k.")
    ] = None,
    probability: Annotated[
        float | None, typer.Option(help="erdos-renyi edge / small-world rewiring probability.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the random topologies.")] = None,
    mixing: Annotated[
        str | None, typer.Option(help="Mixing weights: metropolis-hastings or max-degree.")
    ] = None,
    custom: Annotated[
        Path | None,
        typer.Option(help='A JSON edge list {"n": N, "edges": [[i, j], ...]} instead of a kind.'),
    ] = None,
) -> None:
    """Set the fleet's default topology: a kind with its parameters, or a custom graph."""
    body = _setting(kind, custom)
    for field, value in (("topology_degree", degree), ("topology_probability", probability),
                         ("topology_seed", seed), ("mixing", mixing)):  # fmt: skip
        if value is not None:
            body[field] = value
    with api.client() as fleet:
        document = fleet.set_fleet_topology(cast("TopologySetting", body))
    if api.printed_json(document):
        return
    render(document)


def _setting(kind: str | None, custom: Path | None) -> dict[str, Any]:
    """``{"topology": kind}`` or ``{"topology": "custom", "custom_graph": ...}``.

    Raises
    ------
    ConfigError
        Neither or both of ``--kind`` and ``--custom``, an unknown kind, or a bad file.

    """
    from meshfl.contract import JOB_TOPOLOGIES

    if (kind is None) == (custom is None):
        raise ConfigError("give either --kind KIND or --custom FILE.json (one of the two)")
    if custom is not None:
        from meshfl.topology import from_edge_list

        graph = from_edge_list(str(custom))  # refuses a missing, bad or disconnected file
        return {"topology": "custom", "custom_graph": {"n": graph.n, "edges": sorted(graph.edges)}}
    kinds = [k for k in JOB_TOPOLOGIES if k != "custom"]
    if kind not in kinds:
        raise ConfigError(f"--kind {kind!r}: use one of {', '.join(kinds)}")
    return {"topology": kind}
