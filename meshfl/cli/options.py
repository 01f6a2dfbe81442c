"""Job options shared by ``meshfl local`` and ``meshfl job start`` (one definition each)."""

from __future__ import annotations

from typing import Annotated

import typer

Topology = Annotated[
    str,
    typer.Option(
        help="ring, torus, exponential, one-peer-exponential, random-regular, erdos-renyi,"
        " small-world, star, complete, or a path to a JSON edge list {n, edges}."
    ),
]
Algorithm = Annotated[str, typer.Option(help="choco (CHOCO-SGD, compressed) or dpsgd.")]
CodecSpec = Annotated[
    str, typer.Option(help="Codec spec, e.g. topk:0.1, sign, int8+zstd (docs/codecs.md).")
]
ConsensusStep = Annotated[float, typer.Option(help="CHOCO-SGD consensus step size γ in (0, 1].")]
KeyframeGrowth = Annotated[
    float,
    typer.Option(help="Keyframe when the compression error is this many times normal (0: off)."),
]
DenseBelow = Annotated[
    int, typer.Option(help="Send tensors with fewer elements uncompressed (0: none).")
]
ByteBudget = Annotated[
    int, typer.Option(help="Payload bytes per message; sets top-k/random-k density (0: off).")
]
Rounds = Annotated[int, typer.Option(help="Gossip rounds.")]
LearningRate = Annotated[float, typer.Option(help="SGD learning rate.")]
BatchSize = Annotated[int, typer.Option(help="Minibatch size.")]
LocalEpochs = Annotated[int, typer.Option(help="Local epochs per round.")]
Deadline = Annotated[float, typer.Option(help="Round deadline in seconds.")]

# Topology, round and planning options (issue 4).
TopologyDegree = Annotated[
    int, typer.Option("--degree", help="random-regular degree, small-world lattice degree k.")
]
TopologyProbability = Annotated[
    float,
    typer.Option("--probability", help="erdos-renyi edge / small-world rewiring probability."),
]
TopologySeed = Annotated[
    int | None,
    typer.Option("--topology-seed", help="Seed of the random topologies (default: --seed)."),
]
Mixing = Annotated[
    str, typer.Option("--mixing", help="Mixing weights: metropolis-hastings or max-degree.")
]
Mode = Annotated[
    str,
    typer.Option("--mode", help="sync (rounds wait for the quorum) or async (bounded staleness)."),
]
Staleness = Annotated[
    int, typer.Option("--staleness", help="async: oldest usable neighbour lag τ, in rounds.")
]
Quorum = Annotated[
    float,
    typer.Option("--quorum", help="sync: proceed once this share of the neighbours answered."),
]
Plan = Annotated[
    bool, typer.Option("--plan/--no-plan", help="Capability-aware planning of work and codecs.")
]
UplinkBudget = Annotated[
    float,
    typer.Option(
        "--uplink-budget", help="Planner: seconds of uplink per message (sets byte budgets)."
    ),
]
MinBattery = Annotated[
    float,
    typer.Option(
        "--min-battery", help="Devices below this battery % (not charging) sit out; 0: off."
    ),
]
Elastic = Annotated[
    bool, typer.Option("--elastic/--no-elastic", help="Admit idle devices that appear mid-job.")
]
