"""Job options shared by ``meshfl local`` and ``meshfl job start`` (one definition each)."""

from __future__ import annotations

from typing import Annotated

import typer

Topology = Annotated[
    str,
    typer.Option(help="ring, complete, star, exponential, torus, small-world or erdos-renyi."),
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
