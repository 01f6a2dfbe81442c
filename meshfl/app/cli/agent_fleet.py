"""``meshfl agent fleet``: many agents as threads of one process (:mod:`edge_agent.fleet`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from edge_agent.config import DEFAULT_OUT
from meshfl.app.cli.agent_options import with_agent_options
from meshfl.app.cli.logs import LogFormat, LogFormatOption

__all__ = ["fleet"]


@with_agent_options
def fleet(
    agent: dict[str, Any],
    data: Annotated[
        str,
        typer.Option(
            help="Each agent's training data; '{i}' stands for its number, e.g."
            " 'parts/device-{i}.npz' (without it, every agent reads the same file)."
        ),
    ],
    count: Annotated[int, typer.Option(min=1, help="How many agents this process runs.")],
    first: Annotated[int, typer.Option(min=0, help="Number of the first agent.")] = 0,
    name_prefix: Annotated[
        str, typer.Option(help="Agent i is named PREFIX{i}, e.g. device-0, device-1, ...")
    ] = "device-",
    broker: Annotated[
        str | None,
        typer.Option(help="Broker URL (mqtt://HOST:PORT); default: the coordinator's."),
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Where the agents write (every file is named after its agent).")
    ] = DEFAULT_OUT,
    once: Annotated[bool, typer.Option(help="Each agent exits after one job.")] = False,
    threads: Annotated[
        int, typer.Option(min=1, help="Torch threads of the process (shared by its agents).")
    ] = 1,
    poll: Annotated[
        float,
        typer.Option(min=0.05, metavar="SECONDS", help="Each agent's assignment polling period."),
    ] = 0.5,
    stagger: Annotated[
        float, typer.Option(min=0.0, metavar="SECONDS", help="Pause between agent starts.")
    ] = 0.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Run COUNT agents as threads of this process, each a device of its own.

    Each agent has its own identity key, enrolment, REST client and MQTT session; they
    share the process's torch (one --threads). One agent's failure never stops the
    others; the exit code is 1 when any failed, naming them. SIGTERM ends the process
    at once (the broker publishes each agent's Last Will).
    """
    import logging
    import os
    import resource
    import signal

    from edge_agent.daemon import AgentConfig
    from edge_agent.fleet import fleet_configs, run_fleet
    from meshfl.app.cli.logs import log_handler
    from meshfl.errors import MeshflError

    handler = log_handler(log_format.value)
    if log_format is LogFormat.TEXT:  # each agent's thread is named after it
        handler.setFormatter(
            logging.Formatter("%(asctime)s [%(threadName)s] %(levelname)s %(message)s")
        )
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    logging.getLogger("httpx").setLevel(logging.WARNING)
    names = [f"{name_prefix}{i}" for i in range(first, first + count)]
    files = [Path(data.replace("{i}", str(i))) for i in range(first, first + count)]
    template = AgentConfig(
        **agent, data=files[0], name=names[0], broker=broker, out=out, once=once,
        poll_s=poll, threads=threads,
    )  # fmt: skip
    configs = fleet_configs(template, names, files)

    def terminate(*_: object) -> None:
        # Not sys.exit: finalising the interpreter under a hundred busy agent threads can
        # take long; each agent's TCP connection closes and the broker sends its Last Will.
        os.write(2, f"meshfl agent fleet: SIGTERM, ending {count} agents\n".encode())
        os._exit(143)

    signal.signal(signal.SIGTERM, terminate)
    outcomes = run_fleet(configs, stagger_s=stagger)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    failed = [o for o in outcomes if o.error is not None]
    logging.getLogger("meshfl.agent.fleet").info(
        "fleet of %d agents ended: %d failed; peak RSS %.1f MiB",
        len(outcomes), len(failed), peak_mib,
    )  # fmt: skip
    if failed:
        listed = "; ".join(f"{o.name}: {o.error}" for o in failed[:5])
        raise MeshflError(f"{len(failed)} of {len(outcomes)} agents failed ({listed})")
