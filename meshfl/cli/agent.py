"""``meshfl agent run``: join a fleet and do its work."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

agent_app = typer.Typer(help="Run an edge agent on this device.", no_args_is_help=True)


@agent_app.command("run")
def run(
    coordinator: Annotated[
        str,
        typer.Option(
            envvar="MESHFL_COORDINATOR", help="Coordinator URL, e.g. http://10.0.0.5:8080."
        ),
    ],
    token: Annotated[str, typer.Option(envvar="MESHFL_TOKEN", help="The fleet's enrolment token.")],
    data: Annotated[Path, typer.Option(help="Local training data: .npz (x, y) or .csv.")],
    broker: Annotated[
        str | None, typer.Option(help="Broker URL (mqtt://HOST:PORT); default: the coordinator's.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Device name (default: the host name).")] = None,
    test_data: Annotated[
        Path | None, typer.Option(help="Test data to evaluate on (overrides the job's).")
    ] = None,
    label_column: Annotated[str, typer.Option(help="Label column of CSV files.")] = "label",
    out: Annotated[Path, typer.Option(help="Where final models are written.")] = Path(
        "meshfl-agent"
    ),
    once: Annotated[bool, typer.Option(help="Exit after one job.")] = False,
    threads: Annotated[int, typer.Option(help="Torch threads for training.")] = 1,
    slowdown: Annotated[
        float,
        typer.Option(
            metavar="FACTOR",
            help="Train FACTOR times slower (sleep after each step); for tests and benchmarks.",
        ),
    ] = 1.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
) -> None:
    """Enrol with the coordinator, connect to the broker and run the jobs assigned."""
    import math
    import signal
    import socket
    import sys

    from edge_agent.daemon import AgentConfig, run_agent
    from meshfl.cli import setup_logging
    from meshfl.errors import ConfigError

    if not (math.isfinite(slowdown) and slowdown >= 1):  # before enrolling, not at the job
        raise ConfigError(f"--slowdown must be a finite number >= 1 (got {slowdown})")
    device_name = name or socket.gethostname().split(".")[0]
    setup_logging(verbose, prefix=device_name)
    # SIGTERM ends the agent like Ctrl-C: finally-blocks publish "offline" and disconnect.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_agent(
        AgentConfig(
            coordinator=coordinator,
            token=token,
            data=data,
            name=device_name,
            broker=broker,
            test_data=test_data,
            out=out,
            label_column=label_column,
            once=once,
            threads=threads,
            slowdown=slowdown,
        )
    )
