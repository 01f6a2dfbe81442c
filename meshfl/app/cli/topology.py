"""``meshfl topology``: inspect a topology and its mixing matrix before running a job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from meshfl.errors import ConfigError

if TYPE_CHECKING:
    from meshfl.topology import Graph

topology_app = typer.Typer(
    help="Inspect topologies: degrees, connectivity, mixing matrix, spectral gap.",
    no_args_is_help=True,
)

_NEIGHBOUR_TABLE_MAX = 32
"""Largest graph whose neighbour lists are printed."""


@topology_app.command("show")
def show(
    kind: Annotated[
        str,
        typer.Argument(
            help="ring, torus, exponential, one-peer-exponential, random-regular, "
            "erdos-renyi, small-world, star, complete, or a path to a JSON edge list."
        ),
    ],
    devices: Annotated[
        int | None,
        typer.Option(help="Number of devices (nodes); a JSON file defaults to its own n."),
    ] = None,
    degree: Annotated[
        int, typer.Option(help="random-regular: degree; small-world: lattice degree k.")
    ] = 4,
    probability: Annotated[
        float, typer.Option(help="erdos-renyi: edge probability; small-world: rewiring.")
    ] = 0.3,
    seed: Annotated[int, typer.Option(help="Seed of the random builders.")] = 0,
    mixing: Annotated[
        str, typer.Option(help="Mixing rule: metropolis-hastings or max-degree.")
    ] = "metropolis-hastings",
    round_: Annotated[
        int, typer.Option("--round", help="one-peer-exponential: the round to show.")
    ] = 0,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help='Print {"kind", "n", "edges", "mixing_matrix", "spectral_gap"}.'
        ),
    ] = False,
) -> None:
    """Build a topology and print its size, degrees, connectivity and spectral gap."""
    from meshfl.topology import build_graph, from_edge_list, mixing_matrix, spectral_gap

    if devices is None:
        if not kind.lower().endswith(".json"):
            raise ConfigError(f"topology {kind!r} needs --devices N (the number of nodes)")
        devices = from_edge_list(Path(kind)).n
    if devices > MAX_DEVICES:
        raise ConfigError(
            f"--devices {devices} is too many to compute a spectral gap here (dense"
            f" eigenvalues, O(n³) time, n² memory); use at most {MAX_DEVICES}"
        )
    graph = build_graph(
        kind, devices, degree=degree, probability=probability, seed=seed, round_=round_
    )
    w = mixing_matrix(graph, mixing)
    gap = spectral_gap(w)
    edges = sorted(graph.edges)
    if as_json:
        document = {
            "kind": kind,
            "n": graph.n,
            "edges": [list(e) for e in edges],
            "mixing_matrix": w.tolist(),
            "spectral_gap": gap,
        }
        typer.echo(json.dumps(document))
        return
    _print_summary(kind, graph, mixing, gap)


MAX_DEVICES = 2048
"""Largest graph ``meshfl topology show`` builds (a dense 2048² W takes ~32 MB, seconds)."""


def _print_summary(kind: str, graph: Graph, mixing: str, gap: float) -> None:
    from rich.console import Console
    from rich.table import Table

    degrees = [graph.degree(i) for i in range(graph.n)]
    connected = graph.is_connected()
    note = ""
    if kind == "one-peer-exponential" and not connected:
        note = " (one round; the union over ⌈log₂ n⌉ rounds is connected)"
    summary = Table(title=f"topology {kind}", show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("nodes", str(graph.n))
    summary.add_row("edges", str(len(graph.edges)))
    summary.add_row("degree min / max", f"{min(degrees)} / {max(degrees)}")
    summary.add_row("connected", ("yes" if connected else "no") + note)
    summary.add_row("mixing", mixing)
    summary.add_row("spectral gap 1 − |λ₂(W)|", f"{gap:.4g}")
    console = Console()
    console.print(summary)
    if graph.n <= _NEIGHBOUR_TABLE_MAX:
        neighbours = Table("node", "degree", "neighbours")
        for i in range(graph.n):
            neighbours.add_row(str(i), str(degrees[i]), ", ".join(map(str, graph.neighbours(i))))
        console.print(neighbours)
