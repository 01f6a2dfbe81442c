"""``meshfl coordinator serve``, ``meshfl broker serve``, ``meshfl broker config`` and ``tls``."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshfl.app.cli.logs import LogFormat, LogFormatOption

if TYPE_CHECKING:
    from broker.passwords import PasswordFile
    from coordinator.presence import Subscribe
    from edge_agent.transport.mqtt import MqttTransport

coordinator_app = typer.Typer(help="The fleet's control plane (FastAPI).", no_args_is_help=True)
broker_app = typer.Typer(
    help="MQTT brokers: the embedded one (amqtt), Mosquitto configuration, TLS material.",
    no_args_is_help=True,
)


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
        str | None,
        typer.Option(
            envvar="MESHFL_COORDINATOR_ENROL_TOKEN",
            help="The fleet's shared enrolment token (default: off; devices enrol with"
            " `meshfl fleet tokens create` tokens). Operators can disable and rotate it."
            " Better in the env var or --enrol-token-file, out of the process list.",
        ),
    ] = None,
    enrol_token_file: Annotated[
        Path | None, typer.Option(help="Read the enrolment token from this file's first line.")
    ] = None,
    enrol_token_ttl: Annotated[
        float | None,
        typer.Option(min=1, metavar="SECONDS", help="--enrol-token expires this long after start."),
    ] = None,
    enrol_token_uses: Annotated[
        int | None, typer.Option(min=1, help="--enrol-token enrols at most this many devices.")
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="MESHFL_COORDINATOR_ADMIN_TOKEN",
            help="Admin API token (default: generated and printed); better in the env var or"
            " --admin-token-file, out of the process list.",
        ),
    ] = None,
    admin_token_file: Annotated[
        Path | None, typer.Option(help="Read the admin token from this file's first line.")
    ] = None,
    artifacts_dir: Annotated[
        Path | None,
        typer.Option(help="Where published models are kept (default: next to the database)."),
    ] = None,
    broker_password_file: Annotated[
        Path | None,
        typer.Option(
            help="Mosquitto password file the coordinator manages: a login per enrolled"
            " device, removed on revocation (needs --broker-pid-file)."
        ),
    ] = None,
    broker_pid_file: Annotated[
        Path | None,
        typer.Option(help="Mosquitto's pid file: SIGHUP makes it reload its logins."),
    ] = None,
    broker_ca_file: Annotated[
        Path | None,
        typer.Option(
            help="CA (PEM) of the broker's TLS certificate: handed to devices at enrolment"
            " and trusted by the coordinator's own mqtts:// connection."
        ),
    ] = None,
    broker_username: Annotated[
        str | None,
        typer.Option(help="The coordinator's broker login (default coordinator-FLEET)."),
    ] = None,
    broker_password: Annotated[
        str | None,
        typer.Option(
            envvar="MESHFL_COORDINATOR_BROKER_PASSWORD",
            help="Its password (default with --broker-password-file: a new one at each start).",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="Serve HTTPS with this certificate (PEM; chain allowed).")
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(help="The private key (PEM) of --tls-cert.")
    ] = None,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Serve the coordinator's REST API (OpenAPI docs at /docs).

    Every option can also be set by an environment variable MESHFL_COORDINATOR_<NAME>
    (e.g. MESHFL_COORDINATOR_DB_URL); without --broker-url devices need --broker. With
    --broker-url the coordinator also publishes each topology version, retained, on the
    fleet's control topic (meshfl/v1/FLEET/control), and watches the devices' status
    topics (meshfl/v1/FLEET/node/+/status): a device whose agent dies shows offline as
    soon as the broker publishes its Last Will.

    With a secured Mosquitto (`meshfl broker config --secure`, docs/security.md):
    --broker-password-file and --broker-pid-file let enrolment create each device's
    broker login and revocation remove it; the coordinator also (re)creates its own
    login there at each start and publishes with it over TLS (--broker-ca-file).

    Off loopback, serve HTTPS (--tls-cert/--tls-key; `meshfl coordinator tls` makes a
    development pair) and give agents and the CLI its CA with --coordinator-ca: they
    refuse a plain http:// URL to another host unless told --insecure-http.
    """
    import socket

    from coordinator.server import check_tls
    from coordinator.server import serve as serve_app
    from coordinator.settings import CoordinatorSettings
    from meshfl.app.cli.secret_files import optional_secret
    from meshfl.errors import ConfigError

    json_logs = log_format is LogFormat.JSON
    if json_logs:  # one JSON object per line, uvicorn's too; text keeps uvicorn's own
        from meshfl.app.cli.logs import configure_logging

        configure_logging(log_format="json")
    serve = partial(serve_app, uvicorn_logging=not json_logs)

    with socket.socket() as probe:
        # As uvicorn binds: a restart right after a crash is not refused for TIME-WAIT.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
        "enrol_token": optional_secret(enrol_token, enrol_token_file, "--enrol-token"),
        "enrol_token_ttl_s": enrol_token_ttl,
        "enrol_token_uses": enrol_token_uses,
        "admin_token": optional_secret(admin_token, admin_token_file, "--admin-token"),
        "artifacts_dir": artifacts_dir,
        "broker_ca_file": broker_ca_file,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
    }
    settings = CoordinatorSettings(**{k: v for k, v in overrides.items() if v is not None})
    serve = partial(serve, tls=check_tls(settings.tls_cert, settings.tls_key))  # one-line errors
    _check_fleet(settings.fleet)
    accounts = _broker_accounts(broker_password_file, broker_pid_file)
    login = _coordinator_login(accounts, settings.fleet, broker_username, broker_password)
    transport = _control_transport(
        settings.broker_url, settings.fleet, login=login, ca_file=settings.broker_ca_file
    )
    if transport is None:
        serve(settings, host=host, port=port, broker_accounts=accounts)
        return

    def publish(topic: str, payload: bytes) -> None:
        transport.publish(topic, payload, qos=1, retain=True)

    try:
        serve(
            settings,
            host=host,
            port=port,
            publish=publish,
            broker_accounts=accounts,
            subscribe=_subscriber(transport),
        )
    finally:
        transport.flush(2.0)
        transport.close()


def _check_fleet(fleet: str) -> None:
    """Refuse a fleet id that cannot be a topic level, before anything enrols."""
    from meshfl.errors import ConfigError
    from meshfl.wire import validate_id

    try:
        validate_id(fleet, "fleet id")
    except ConfigError:
        raise ConfigError(
            f"fleet id {fleet[:80]!r} is invalid: it names MQTT topics, so use 1-64 letters,"
            " digits, '_', '.' or '-' (no '/', '+', '#' or spaces); fix --fleet"
        ) from None


def _broker_accounts(password_file: Path | None, pid_file: Path | None) -> PasswordFile | None:
    """The broker's login table the coordinator manages, or None without a password file.

    Raises
    ------
    ConfigError
        A pid file without a password file or the reverse.

    """
    from meshfl.errors import ConfigError

    if password_file is None and pid_file is None:
        return None
    if password_file is None or pid_file is None:
        raise ConfigError(
            "--broker-password-file and --broker-pid-file go together: the broker reloads"
            " the logins the coordinator writes when it is signalled"
        )
    from broker.passwords import PasswordFile, sighup_reloader

    return PasswordFile(password_file, sighup_reloader(pid_file))


def _coordinator_login(
    accounts: PasswordFile | None, fleet: str, username: str | None, password: str | None
) -> tuple[str, str] | None:
    """The coordinator's own broker login, written into ``accounts`` when it manages them.

    With ``accounts``: username ``coordinator-{fleet}`` unless given, the password given
    or a new random one, (re)written at each start. Without: the login given, if any.
    """
    import secrets

    from broker.secure import coordinator_username
    from meshfl.errors import ConfigError

    if accounts is None:
        if password is not None and username is None:
            username = coordinator_username(fleet)
        if username is not None and password is None:
            raise ConfigError("--broker-username needs --broker-password (or its env variable)")
        return None if username is None or password is None else (username, password)
    username = username or coordinator_username(fleet)
    password = password or secrets.token_urlsafe(24)
    accounts.add(username, password)
    return username, password


_NO_BROKER = "no control-topic push and no Last-Will presence"


def _control_transport(
    broker_url: str | None,
    fleet: str,
    *,
    login: tuple[str, str] | None = None,
    ca_file: Path | None = None,
) -> MqttTransport | None:
    """Connect the coordinator's control-topic publisher (``None``: no broker, or it failed).

    The client id is the login's username, else ``coordinator-{fleet}``, with a random
    suffix (unique per process); ``ca_file`` is
    trusted for an ``mqtts://`` URL. Once connected, the transport reconnects by itself. A
    broker that cannot be reached now is not retried (the first connect probes the broker's
    protocol, so it needs the broker up): the coordinator warns and runs without control
    push (agents poll the REST API every round) and without Last-Will presence (device
    status follows heartbeats only) until it is restarted with the broker up.
    """
    if not broker_url:
        return None
    import secrets

    from edge_agent.transport.address import parse_broker_address
    from meshfl.errors import MeshflError

    tls = parse_broker_address(broker_url).tls  # ConfigError: a URL that does not parse
    username, password = login if login is not None else (None, None)
    try:
        from edge_agent.transport.mqtt import MqttTransport

        transport = MqttTransport(
            broker_url,
            connect_timeout_s=5.0,
            username=username,
            password=password,
            ca_file=ca_file if tls else None,
        )
        # Unique per process: two coordinators on one broker must not take each other's
        # session (with use_username_as_clientid the broker detects a second one instead).
        transport.connect(f"{username or f'coordinator-{fleet}'}-{secrets.token_hex(4)}")
    except ImportError as exc:  # a coordinator-only install has no MQTT client
        typer.echo(f"warning: {_NO_BROKER} ({exc}); install paho-mqtt", err=True)
        return None
    except MeshflError as exc:
        typer.echo(
            f"warning: {_NO_BROKER} ({exc}); agents learn topology changes by polling and"
            " online follows heartbeats only. Start the broker first, or restart the"
            " coordinator once it runs",
            err=True,
        )
        return None
    return transport


def _subscriber(transport: MqttTransport) -> Subscribe:
    """``subscribe(topic_filter, on_message)`` over the coordinator's MQTT connection.

    Each message goes to the ``on_message`` of every filter it matches
    (:func:`edge_agent.transport.mqtt_utils.topic_matches`); subscriptions are QoS 1 and
    restored after a reconnect (:meth:`MqttTransport.subscribe`). A refused subscription
    raises a meshfl error.
    """
    from edge_agent.transport.mqtt_utils import topic_matches

    handlers: list[tuple[str, Callable[[str, bytes], None]]] = []

    def dispatch(topic: str, payload: bytes) -> None:
        for topic_filter, on_message in list(handlers):
            if topic_matches(topic_filter, topic):
                on_message(topic, payload)

    def subscribe(topic_filter: str, on_message: Callable[[str, bytes], None]) -> None:
        handlers.append((topic_filter, on_message))
        transport.set_handler(dispatch)
        transport.subscribe(topic_filter, qos=1)

    return subscribe


@coordinator_app.command("tls")
def coordinator_tls(
    out: Annotated[Path, typer.Option(help="Directory for ca.crt/.key, coordinator.crt/.key.")],
    host: Annotated[
        list[str] | None,
        typer.Option(
            help="DNS name or IP agents dial (repeatable; default localhost and 127.0.0.1)."
        ),
    ] = None,
    days: Annotated[int, typer.Option(min=1, help="Validity of the certificate.")] = 825,
) -> None:
    """Make the coordinator's development HTTPS certificate, signed by OUT's CA.

    The CA in OUT is re-used (the one `meshfl broker tls`/`broker config --secure` made
    there, so devices trust one CA for broker and coordinator), else made. Keys are
    written 0600. Then: meshfl coordinator serve --tls-cert OUT/coordinator.crt
    --tls-key OUT/coordinator.key, and agents/CLI --coordinator-ca OUT/ca.crt.
    """
    from broker.tls import DEFAULT_HOSTS, write_tls_dir

    files = write_tls_dir(out, host or list(DEFAULT_HOSTS), days=days, server="coordinator")
    typer.echo(
        f"CA: {files.ca_cert}\ncoordinator: {files.server_cert} {files.server_key}\n"
        f"serve:  meshfl coordinator serve --tls-cert {files.server_cert}"
        f" --tls-key {files.server_key} --host 0.0.0.0 --port 8443\n"
        f"agents: meshfl agent run --coordinator https://{(host or ['localhost'])[0]}:8443"
        f" --coordinator-ca {files.ca_cert} ..."
    )


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
    port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="TCP port (default 1883; 8883 with --secure)."),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(help="Interface to listen on (default 127.0.0.1; 0.0.0.0 with --secure)."),
    ] = None,
    persistence_dir: Annotated[
        Path | None, typer.Option(help="Where Mosquitto keeps sessions across restarts.")
    ] = None,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure", help="A fleet's broker: TLS, per-device logins, the fleet's ACL (--out)."
        ),
    ] = False,
    out: Annotated[
        Path | None, typer.Option(help="With --secure: the directory to write everything into.")
    ] = None,
    fleet: Annotated[str, typer.Option(help="With --secure: the fleet the ACL is for.")] = (
        "default"
    ),
    tls_host: Annotated[
        list[str] | None,
        typer.Option(
            help="With --secure: a DNS name or IP devices dial (repeatable; default"
            " localhost and 127.0.0.1)."
        ),
    ] = None,
) -> None:
    """Print meshfl's Mosquitto 2 configuration, or write a fleet's secure broker (--secure).

    Without --secure: the anonymous configuration tests and `meshfl local` run, printed.
    docker/mosquitto.conf is this command's output for the compose fleet:
    meshfl broker config --host 0.0.0.0 --persistence-dir /mosquitto/data

    With --secure: OUT/mosquitto.conf (one TLS listener, no anonymous access), OUT/acl
    (a device writes only its own topics), an empty OUT/passwd, OUT/tls/ (a development
    CA and the server certificate) and OUT/data/. See docs/security.md.
    """
    from meshfl.errors import ConfigError

    if not secure:
        if out is not None or tls_host:
            raise ConfigError("--out and --tls-host need --secure")
        from broker.mosquitto import mosquitto_config

        text = mosquitto_config(
            port or 1883, host=host or "127.0.0.1", persistence_dir=persistence_dir
        )
        typer.echo(text, nl=False)
        if persistence_dir is not None:  # else Mosquitto logs a permission error every autosave
            typer.echo(
                f"note: started as root, Mosquitto runs as user 'mosquitto': create"
                f" {persistence_dir} and let that user write it (mkdir -p DIR && chown"
                " mosquitto DIR), or nothing is saved",
                err=True,
            )
        return
    if out is None:
        raise ConfigError("--secure writes several files: pass --out DIR")
    if persistence_dir is not None:
        raise ConfigError("--secure keeps persistence in OUT/data; drop --persistence-dir")
    from broker.secure import SECURE_PORT, coordinator_username, write_secure_broker
    from broker.tls import DEFAULT_HOSTS

    files = write_secure_broker(
        out, fleet, port=port or SECURE_PORT, host=host or "0.0.0.0",
        tls_hosts=tls_host or list(DEFAULT_HOSTS),
    )  # fmt: skip
    dial = (tls_host or ["localhost"])[0]
    typer.echo(
        f"wrote {files.config}, {files.acl}, {files.password_file} (empty) and {files.tls.ca_cert}"
        f" (+ server certificate)\n"
        f"start the broker:      mosquitto -c {files.config}\n"
        f"start the coordinator: meshfl coordinator serve --fleet {fleet}"
        f" --broker-url mqtts://{dial}:{port or SECURE_PORT}"
        f" --broker-password-file {files.password_file} --broker-pid-file {files.pid_file}"
        f" --broker-ca-file {files.tls.ca_cert}\n"
        f"  (it logs in as {coordinator_username(fleet)} and adds a login per enrolled device)"
    )


@broker_app.command("tls")
def broker_tls(
    out: Annotated[Path, typer.Option(help="Directory for ca.crt/.key, server.crt/.key.")],
    host: Annotated[
        list[str] | None,
        typer.Option(
            help="DNS name or IP in the server certificate (repeatable; default localhost"
            " and 127.0.0.1)."
        ),
    ] = None,
    client: Annotated[
        list[str] | None,
        typer.Option(help="Also issue client-NAME.crt/.key for this username (repeatable)."),
    ] = None,
    days: Annotated[int, typer.Option(min=1, help="Validity of issued certificates.")] = 825,
) -> None:
    """Make development TLS material: a CA (re-used if OUT has one) and a server certificate.

    Keys are written 0600. Devices trust OUT/ca.crt (handed out at enrolment by
    `meshfl coordinator serve --broker-ca-file OUT/ca.crt`).
    """
    from broker.tls import DEFAULT_HOSTS, write_tls_dir

    files = write_tls_dir(out, host or list(DEFAULT_HOSTS), clients=client or (), days=days)
    typer.echo(f"CA: {files.ca_cert}\nserver: {files.server_cert} {files.server_key}")
