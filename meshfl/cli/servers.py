"""``meshfl coordinator serve`` and ``meshfl broker serve``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

coordinator_app = typer.Typer(help="The fleet's control plane (FastAPI).", no_args_is_help=True)
broker_app = typer.Typer(help="The embedded MQTT broker (amqtt).", no_args_is_help=True)


@coordinator_app.command("serve")
def coordinator_serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8080,
    db: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL (default sqlite:///meshfl-coordinator.db).")
    ] = None,
    fleet: Annotated[str | None, typer.Option(help="Fleet name.")] = None,
    broker_url: Annotated[
        str | None, typer.Option(help="Broker URL advertised to devices at enrolment.")
    ] = None,
    enrol_token: Annotated[
        str | None, typer.Option(help="Enrolment token (default: generated and printed).")
    ] = None,
    admin_token: Annotated[
        str | None, typer.Option(help="Admin API token (default: generated and printed).")
    ] = None,
) -> None:
    """Serve the coordinator's REST API (OpenAPI docs at /docs).

    Every option can also be set by an environment variable MESHFL_COORDINATOR_<NAME>
    (e.g. MESHFL_COORDINATOR_DB_URL); without --broker-url devices need --broker.
    """
    import socket

    from coordinator.server import serve
    from coordinator.settings import CoordinatorSettings
    from meshfl.errors import ConfigError

    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror}); choose another with --port"
            ) from None

    overrides: dict[str, Any] = {
        "db_url": db,
        "fleet": fleet,
        "broker_url": broker_url,
        "enrol_token": enrol_token,
        "admin_token": admin_token,
    }
    settings = CoordinatorSettings(**{k: v for k, v in overrides.items() if v is not None})
    serve(settings, host=host, port=port)


@broker_app.command("serve")
def broker_serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 1883,
) -> None:
    """Run the embedded MQTT 3.1.1 broker until interrupted."""
    from broker.embedded import serve

    serve(host, port)
