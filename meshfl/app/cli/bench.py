"""``meshfl bench``: the measurements behind BENCHMARKS.md (workloads of WORKLOADS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from meshfl.files import writable_dir

bench_app = typer.Typer(help="Benchmarks on the fixed workloads.", no_args_is_help=True)

Out = Annotated[Path, typer.Option(help="Directory for the results (JSON; frontier: plot too).")]


@bench_app.command("codecs")
def codecs(
    size: Annotated[
        int, typer.Option(min=1, help="Elements of the N(0,1) float32 delta (W3).")
    ] = 10_000_000,
    specs: Annotated[
        str | None, typer.Option("--codecs", help="Comma-separated codec specs (default: all).")
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats; medians are reported.")] = 5,
    out: Out = Path("meshfl-bench"),
) -> None:
    """W3: bytes, ratio, encode/decode MB/s (one thread), relative error, vs memory copy."""
    from meshfl.app.bench.codecs import main

    specs_list = None if specs is None else specs.split(",")
    main(size=size, specs=specs_list, repeats=repeats, out=writable_dir(out))


@bench_app.command("wire")
def wire(
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats; medians are reported.")] = 5,
    out: Out = Path("meshfl-bench"),
) -> None:
    """Envelope and chunking overhead for deltas of 1 KiB, 64 KiB and 1 MiB."""
    from meshfl.app.bench.wire import main

    main(repeats=repeats, out=writable_dir(out))


@bench_app.command("frontier")
def frontier(
    workload: Annotated[str, typer.Option(help="W1 (digits-8) or W2 (mnist1d-16).")] = "W1",
    specs: Annotated[
        str | None, typer.Option("--codecs", help="Comma-separated codec specs (default: a sweep).")
    ] = None,
    rounds: Annotated[int | None, typer.Option(help="Rounds (default: the workload's).")] = None,
    seeds: Annotated[int, typer.Option(help="Model seeds to average over.")] = 1,
    out: Out = Path("meshfl-bench"),
) -> None:
    """Accuracy against payload bytes for each codec (lockstep fleet), with a plot."""
    from meshfl.app.bench.frontier import main

    main(
        workload=workload,
        specs=None if specs is None else specs.split(","),
        rounds=rounds,
        seeds=seeds,
        out=writable_dir(out),
    )


@bench_app.command("quality")
def quality(
    workload: Annotated[
        str, typer.Option(help="W1 (digits, 8 devices) or W2 (mnist1d, 16).")
    ] = "W1",
    seeds: Annotated[str, typer.Option(help="Model seeds, comma-separated; medians.")] = "0,1,2",
    only: Annotated[
        str,
        typer.Option(help="Keep these algorithms: fedavg, choco, efavg, pga, epidemic, tracking."),
    ] = "",
    full: Annotated[
        bool, typer.Option("--full", help="Every algorithm × topology × codec × momentum (hours).")
    ] = False,
    rounds: Annotated[
        int | None, typer.Option(help="Rounds (default: the workload's, W1 30, W2 60).")
    ] = None,
    out: Out = Path("meshfl-bench"),
) -> None:
    """Lockstep sweep of algorithm × topology × codec × momentum: accuracy, rounds, bytes."""
    from meshfl.app.bench.quality import main, parse_only, parse_seeds

    seed_list, keep = parse_seeds(seeds), parse_only(only)
    main(workload, seed_list, keep, full, rounds, writable_dir(out))
