"""``meshfl agent run``: join a fleet and do its work."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from edge_agent.config import DEFAULT_OUT
from meshfl.app.cli.agent_fleet import fleet
from meshfl.app.cli.agent_options import (
    CoordinatorCaOption,
    CoordinatorOption,
    InsecureHttpOption,
    with_agent_options,
)
from meshfl.app.cli.logs import LogFormat, LogFormatOption

agent_app = typer.Typer(help="Run an edge agent on this device.", no_args_is_help=True)
agent_app.command("fleet")(fleet)


@agent_app.command("run")
@with_agent_options
def run(
    agent: dict[str, Any],
    data: Annotated[
        Path, typer.Option(help="Local training data: .npz (x, y), .csv or an image folder.")
    ],
    broker: Annotated[
        str | None,
        typer.Option(
            help="Broker URL (mqtt://HOST:PORT, mqtts:// for TLS); default: the coordinator's."
        ),
    ] = None,
    broker_ca: Annotated[
        Path | None,
        typer.Option(
            help="CA (PEM) of an mqtts:// broker's certificate; default: the one given at"
            " enrolment, else the system's CA store."
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Device name (default: the host name).")] = None,
    out: Annotated[Path, typer.Option(help="Where final models are written.")] = DEFAULT_OUT,
    once: Annotated[bool, typer.Option(help="Exit after one job.")] = False,
    threads: Annotated[int, typer.Option(help="Torch threads for training.")] = 1,
    slowdown: Annotated[
        float,
        typer.Option(
            metavar="FACTOR",
            help="Train FACTOR times slower (sleep after each step); for tests and benchmarks.",
        ),
    ] = 1.0,
    step_time: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="Emulate a device whose training steps take at least SECONDS each (times"
            " --slowdown; sleep the difference); for tests and benchmarks.",
        ),
    ] = 0.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
    log_format: LogFormatOption = LogFormat.TEXT,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve Prometheus metrics on this port (GET /metrics; 0: any free port)."
            " Default: off.",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(help="Address the --metrics-port server listens on.")
    ] = "127.0.0.1",
) -> None:
    """Enrol with the coordinator, connect to the broker and run the jobs assigned.

    With --metrics-port the agent serves its Prometheus metrics (rounds, bytes, deltas
    applied/dropped/rejected, reconnects, queue depth, ε; docs/observability.md).
    """
    import logging
    import math
    import signal
    import socket
    import sys

    from edge_agent.daemon import AgentConfig, run_agent
    from meshfl.app.cli.logs import configure_logging
    from meshfl.errors import ConfigError

    if not (math.isfinite(slowdown) and slowdown >= 1):  # before enrolling, not at the job
        raise ConfigError(f"--slowdown must be a finite number >= 1 (got {slowdown})")
    if not (math.isfinite(step_time) and step_time >= 0):
        raise ConfigError(f"--step-time must be a finite number >= 0 seconds (got {step_time})")
    device_name = name or socket.gethostname().split(".")[0]
    configure_logging(verbose, prefix=device_name, log_format=log_format.value)
    telemetry = None
    if metrics_port is not None:
        from edge_agent.telemetry import AgentTelemetry

        telemetry = AgentTelemetry(device_name)
        port = telemetry.serve(metrics_host, metrics_port)  # ConfigError: in use
        # A log line, not a bare echo: with --log-format json stderr stays pure JSON.
        logging.getLogger("meshfl.agent").info("metrics: http://%s:%d/metrics", metrics_host, port)
    # SIGTERM ends the agent like Ctrl-C: finally-blocks publish "offline" and disconnect.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_agent(
        AgentConfig(
            **agent,
            data=data,
            name=device_name,
            broker=broker,
            out=out,
            once=once,
            threads=threads,
            slowdown=slowdown,
            step_time_s=step_time,
            broker_ca=broker_ca,
        ),
        observer=telemetry,
    )


@agent_app.command("health")
def health(
    out: Annotated[Path, typer.Option(help="The agent's --out directory.")] = DEFAULT_OUT,
    name: Annotated[
        str | None, typer.Option(help="The agent's --name (default: host name).")
    ] = None,
    max_age: Annotated[
        float, typer.Option(min=1, help="Seconds after which a silent agent is unhealthy.")
    ] = 60.0,
) -> None:
    """Exit 0 when the agent writing into --out is alive and connected, 1 otherwise.

    For container health checks: the agent rewrites OUT/NAME.health.json every 10 s.
    """
    import socket

    from edge_agent.health import check_health

    problem = check_health(out, name or socket.gethostname().split(".")[0], max_age)
    if problem is not None:
        typer.echo(f"unhealthy: {problem}", err=True)
        raise typer.Exit(1)
    typer.echo("healthy")


@agent_app.command("serve")
def serve(
    coordinator: CoordinatorOption,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="MESHFL_TOKEN", help="The fleet's enrolment token (enrols for inference only)."
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(envvar="MESHFL_ADMIN_TOKEN", help="Use the admin token instead of enrolling."),
    ] = None,
    job: Annotated[
        str, typer.Option(help="Job whose consensus model to serve, or 'latest' (completed).")
    ] = "latest",
    host: Annotated[str, typer.Option(help="Address to listen on (default: this host only).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free port).")] = 8500,
    poll: Annotated[
        float, typer.Option(min=0.1, help="Seconds between checks for a new model.")
    ] = 30.0,
    out: Annotated[Path, typer.Option(help="Where the downloaded model is kept.")] = Path(
        "meshfl-serve"
    ),
    name: Annotated[str | None, typer.Option(help="Device name (default: the host name).")] = None,
    threads: Annotated[int, typer.Option(min=1, help="onnxruntime threads per request.")] = 1,
    coordinator_ca: CoordinatorCaOption = None,
    insecure_http: InsecureHttpOption = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
) -> None:
    """Serve the latest consensus model's predictions locally (onnxruntime, no torch).

    POST /predict {"inputs": [[...], ...]} answers labels and probabilities; GET /healthz
    says whether a model is loaded. A new consensus model is pulled when its sha256 changes.
    """
    import signal
    import socket
    import sys

    from edge_agent.serve import ServeConfig, run_serve
    from meshfl.app.cli.logs import configure_logging

    device_name = name or socket.gethostname().split(".")[0]
    configure_logging(verbose, prefix=f"{device_name} serve")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_serve(
        ServeConfig(
            coordinator=coordinator, token=token, admin_token=admin_token, job=job, host=host,
            port=port, poll_s=poll, out=out, name=device_name, threads=threads,
            coordinator_ca=coordinator_ca, insecure_http=insecure_http,
        )
    )  # fmt: skip
