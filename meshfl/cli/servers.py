"""``meshfl coordinator serve`` and ``meshfl broker serve``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from edge_agent.transport.mqtt import MqttTransport

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
    artifacts_dir: Annotated[
        Path | None,
        typer.Option(help="Where published models are kept (default: next to the database)."),
    ] = None,
) -> None:
    """Serve the coordinator's REST API (OpenAPI docs at /docs).

    Every option can also be set by an environment variable MESHFL_COORDINATOR_<NAME>
    (e.g. MESHFL_COORDINATOR_DB_URL); without --broker-url devices need --broker. With
    --broker-url the coordinator also publishes each topology version, retained, on the
    fleet's control topic (meshfl/v1/FLEET/control).
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
        "artifacts_dir": artifacts_dir,
    }
    settings = CoordinatorSettings(**{k: v for k, v in overrides.items() if v is not None})
    transport = _control_transport(settings.broker_url, settings.fleet)
    if transport is None:
        serve(settings, host=host, port=port)
        return

    def publish(topic: str, payload: bytes) -> None:
        transport.publish(topic, payload, qos=1, retain=True)

    try:
        serve(settings, host=host, port=port, publish=publish)
    finally:
        transport.flush(2.0)
        transport.close()


def _control_transport(broker_url: str | None, fleet: str) -> MqttTransport | None:
    """Connect the coordinator's control-topic publisher (``None``: no broker, or it failed).

    The client id is ``coordinator-{fleet}``; once connected, the transport reconnects by
    itself. A broker that cannot be reached now only costs the push: agents also poll the
    REST API every round, so the coordinator warns and runs without it.
    """
    if not broker_url:
        return None
    from meshfl.errors import MeshflError

    try:
        from edge_agent.transport.mqtt import MqttTransport

        transport = MqttTransport(broker_url, connect_timeout_s=5.0)
        transport.connect(f"coordinator-{fleet}")
    except ImportError as exc:  # a coordinator-only install has no MQTT client
        typer.echo(f"warning: no control-topic push ({exc}; install paho-mqtt)", err=True)
        return None
    except MeshflError as exc:
        typer.echo(
            f"warning: no control-topic push ({exc}); agents will learn topology changes by"
            " polling",
            err=True,
        )
        return None
    return transport


@broker_app.command("serve")
def broker_serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 1883,
) -> None:
    """Run the embedded MQTT 3.1.1 broker until interrupted."""
    from broker.embedded import serve

    serve(host, port)


@broker_app.command("config")
def broker_config(
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 1883,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    persistence_dir: Annotated[
        Path | None, typer.Option(help="Where Mosquitto keeps sessions across restarts.")
    ] = None,
) -> None:
    """Print meshfl's Mosquitto 2 configuration (the one tests and `meshfl local` run).

    docker/mosquitto.conf is this command's output for the compose fleet:
    meshfl broker config --host 0.0.0.0 --persistence-dir /mosquitto/data
    """
    from broker.mosquitto import mosquitto_config

    typer.echo(mosquitto_config(port, host=host, persistence_dir=persistence_dir), nl=False)
