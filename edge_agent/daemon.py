"""The agent daemon: enrol, connect, wait for work, run jobs, report.

``meshfl agent run`` calls :func:`run_agent`. The lifecycle:

1. load and check the local data file (a bad file fails here, before any network);
2. load (or create, the first time) the device's Ed25519 identity key,
   ``<out>/<name>.identity.key``, and enrol with the coordinator over REST, sending its
   public key (device id, device token, broker URL come back). The answer is kept in
   ``<out>/<name>.enrolment.json`` (mode 0600: it holds the device token and the broker
   password): a restarted
   agent of the same coordinator and key is the same device again, so it keeps its jobs
   and its broker session; a saved identity the coordinator no longer knows is replaced
   by a new enrolment;
3. connect to the broker (MQTT 5 or 3.1.1), retained ``online`` status, Last Will
   ``offline``;
4. poll for an assignment; for each job: build the model, measure and report the
   capability profile, run the rounds (:mod:`edge_agent.job`; resumed from the job's
   checkpoint after a restart, :mod:`edge_agent.checkpoint`), save the final model,
   report done;
5. with ``once`` set, exit after the first job; otherwise wait for the next one.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edge_agent.checkpoint import CheckpointStore
from edge_agent.config import AgentConfig
from edge_agent.health import HealthWriter
from edge_agent.identity_lock import lock_identity
from edge_agent.job import JobRunner
from edge_agent.observer import AgentObserver, NullObserver
from edge_agent.rest import CoordinatorClient, DeviceRevoked
from edge_agent.transport.base import Message, Transport
from meshfl import logcontext
from meshfl.contract import Assignment, CapabilityProfile, EnrolResponse, ModelSpec
from meshfl.errors import ConfigError, CoordinatorError, MeshflError, SecurityError
from meshfl.files import atomic_write
from meshfl.modelspec.allow import check_allow_list
from meshfl.pathids import path_id
from meshfl.wire import status_topic, validate_id
from meshfl.wire.status import encode_status
from models.data import load_dataset_file

if TYPE_CHECKING:
    from edge_agent.secagg.crypto import IdentityKey

__all__ = ["AgentConfig", "run_agent"]

log = logging.getLogger("meshfl.agent")


def run_agent(
    config: AgentConfig,
    transport: Transport | None = None,
    observer: AgentObserver | None = None,
) -> None:
    """Run the agent until its work is done (``once``) or it is interrupted.

    ``observer`` hears of the connection, each job and each round
    (:mod:`edge_agent.observer`; the CLI passes :class:`edge_agent.telemetry.AgentTelemetry`
    with ``--metrics-port``); default: nobody. Log records carry the device id once
    enrolled and the job id while one runs (:mod:`meshfl.logcontext`).

    Raises
    ------
    meshfl.errors.DataError
        The local data file is missing, empty or malformed.
    meshfl.errors.CoordinatorUnreachable, meshfl.errors.BrokerUnreachable
        The coordinator or the broker cannot be reached.
    edge_agent.rest.DeviceRevoked
        An operator revoked this device (exit code 3): it stops at once, whether idle or
        in a job, instead of retrying a token that no longer works.

    """
    path_id(config.name, "device name")  # it names files and folders under --out
    check_allow_list(config.allowed_models)  # a bad or standard-library entry: refused now
    lock = lock_identity(config.out, config.name)  # one process per identity, held until exit
    try:
        _run_locked(config, transport, observer)
    finally:
        lock.close()


def _run_locked(
    config: AgentConfig, transport: Transport | None, observer: AgentObserver | None
) -> None:
    x, y = load_dataset_file(config.data, config.label_column)
    log.info("%s: %d local samples, %d features", config.name, len(x), x.shape[1])
    client = CoordinatorClient(
        config.coordinator, retry_s=config.start_retry_s, ca_file=config.coordinator_ca,
        insecure_http=config.insecure_http,
    )  # fmt: skip
    try:
        from edge_agent.capability_probe import capability_profile
        from edge_agent.secagg.crypto import IdentityKey, identity_key_path

        identity = IdentityKey.load_or_create(identity_key_path(config.out, config.name))
        enrolment = _saved_enrolment(config, client, identity.public_b64)
        if enrolment is None:
            enrolment = client.enrol(
                config.token, config.name, capability_profile(None), identity.public_b64,
                sign=identity.sign,  # the proof that lets this key enrol again
            )  # fmt: skip
            _save_enrolment(config, enrolment, identity.public_b64)
        client.retry_s = config.run_retry_s  # once enrolled, ride out longer outages
        with logcontext.bind(device=enrolment["device_id"]):
            _connected(
                config, client, enrolment, transport, observer or NullObserver(), identity, x, y
            )
    finally:
        client.close()


def enrolment_path(out: Path, name: str) -> Path:
    """Where an agent keeps its enrolment: ``<out>/<name>.enrolment.json``."""
    return Path(out) / f"{name}.enrolment.json"


def _save_enrolment(config: AgentConfig, enrolment: EnrolResponse, public_key: str) -> None:
    """Keep the enrolment for a restart (0600: the device token and broker password)."""
    body = {"coordinator": config.coordinator, "identity_key": public_key, **enrolment}
    path = enrolment_path(config.out, config.name)
    try:
        atomic_write(path, lambda f: f.write(json.dumps(body).encode()), mode=0o600)
    except OSError as exc:
        log.warning("could not save the enrolment to %s (%s): a restart enrols anew", path, exc)


def _saved_enrolment(
    config: AgentConfig, client: CoordinatorClient, public_key: str
) -> EnrolResponse | None:
    """The saved enrolment, if it is this coordinator's and key's and its token still works.

    The token is checked with the profile the enrolment would send. A token the
    coordinator refuses (another coordinator database, a deleted device) means None; a
    revoked device raises :class:`~edge_agent.rest.DeviceRevoked`.
    """
    from edge_agent.capability_probe import capability_profile

    path = enrolment_path(config.out, config.name)
    try:
        saved = json.loads(path.read_text())
        if saved["coordinator"] != config.coordinator or saved["identity_key"] != public_key:
            return None
        enrolment = EnrolResponse(
            device_id=validate_id(saved["device_id"]),
            device_token=str(saved["device_token"]),
            fleet=str(saved["fleet"]),
            broker_url=saved["broker_url"],
        )
        for key in ("broker_username", "broker_password", "broker_ca"):
            if isinstance(saved.get(key), str):
                enrolment[key] = saved[key]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, ConfigError) as exc:
        log.warning("ignoring the saved enrolment %s (%s): enrolling again", path, exc)
        return None
    client.device_token = enrolment["device_token"]
    try:
        client.put_profile(enrolment["device_id"], capability_profile(None))
    except DeviceRevoked:
        raise
    except CoordinatorError as exc:
        if exc.status is None or exc.status >= 500:
            raise
        log.info("the saved enrolment of %s was refused (%s): enrolling again", config.name, exc)
        client.device_token = None
        return None
    log.info("%s: enrolled before as %s: carrying on as that device", config.name,
             enrolment["device_id"])  # fmt: skip
    return enrolment


def _connected(
    config: AgentConfig,
    client: CoordinatorClient,
    enrolment: EnrolResponse,
    transport: Transport | None,
    observer: AgentObserver,
    identity: IdentityKey,
    x: Any,
    y: Any,
) -> None:
    """Connect to the broker, say online, report the profile and serve jobs; then offline."""
    device_id, fleet = enrolment["device_id"], enrolment["fleet"]
    if transport is None:
        broker = config.broker or enrolment["broker_url"]
        if not broker:
            raise ConfigError(
                "the coordinator advertises no broker URL; pass --broker mqtt[s]://HOST:PORT"
            )
        transport = _broker_transport(config, enrolment, broker)
    will = Message(status_topic(fleet, device_id), _status("offline"), qos=1, retain=True)
    transport.connect(device_id, will=will)
    log.info("%s: enrolled as %s, connected (%s)", config.name, device_id, transport.protocol)
    transport.publish(status_topic(fleet, device_id), _status("online"), retain=True)
    live = transport  # the health thread and the observer read this transport's state
    observer.connected(device_id, lambda: live.reconnects, lambda: live.callback_errors)
    health = HealthWriter(config.out, device_id, config.name, lambda: live.connected)
    health.start()
    failed = True
    try:
        link = _report_profile(config, client, transport, device_id, fleet, x, y)
        _serve(config, client, transport, device_id, fleet, x, y, link, health, identity, observer)
        failed = False
    finally:
        health.stop()
        _say_offline(transport, fleet, device_id, quiet=failed)


def _say_offline(transport: Transport, fleet: str, device_id: str, *, quiet: bool) -> None:
    """Publish the retained ``offline`` status, flush, disconnect.

    ``quiet``: the agent is already stopping on an error (a revoked device, whose broker
    login may be gone too): a failure here is logged, not raised over the first one.
    """
    try:
        transport.publish(status_topic(fleet, device_id), _status("offline"), retain=True)
        transport.flush(10.0)
    except MeshflError as exc:
        if not quiet:
            raise
        log.warning("could not publish the offline status: %s", exc)
    finally:
        transport.close()


def _report_profile(
    config: AgentConfig,
    client: CoordinatorClient,
    transport: Transport,
    device_id: str,
    fleet: str,
    x: Any,
    y: Any,
) -> CapabilityProfile:
    """Measure what a planner needs before the first job and report it.

    The link through the broker, and training throughput on an MLP over the local data
    (a job re-measures on its own model at its start): the coordinator plans a job's
    first version from these figures. Returns the link figures (with ``measured_at``),
    which the first job reuses instead of probing again.
    """
    from edge_agent.capability_probe import capability_profile
    from edge_agent.link_probe import measure_link
    from edge_agent.trainer import Trainer

    spec: ModelSpec = {"name": "mlp", "input_dim": int(x.shape[1]),
                       "num_classes": int(y.max()) + 1, "hidden": [64]}  # fmt: skip
    trainer = Trainer(spec, seed=0, learning_rate=0.1, batch_size=32, local_epochs=1,
                      threads=config.threads, slowdown=config.slowdown,
                      step_time_s=config.step_time_s)  # fmt: skip
    profile = capability_profile(trainer, x, y)
    link = measure_link(transport, fleet, device_id).profile_fields()
    link["measured_at"] = time.time()
    profile.update(link)
    client.put_profile(device_id, profile)
    return link


def _serve(
    config: AgentConfig,
    client: CoordinatorClient,
    transport: Transport,
    device_id: str,
    fleet: str,
    x: object,
    y: object,
    link: CapabilityProfile,
    health: HealthWriter,
    identity: IdentityKey | None = None,
    observer: AgentObserver | None = None,
) -> None:
    finished: set[str] = set()
    checkpoints = CheckpointStore(config.out, config.name)
    while True:
        transport.flush(0.0)  # raises if another process took over this device's session
        assignment = client.assignment(device_id)
        if assignment is None or not _runnable(assignment, finished):
            if assignment is not None and assignment["status"] in _ENDED:
                checkpoints.remove(assignment["job_id"])  # it ended while this agent was down
            time.sleep(config.poll_s)
            continue
        job_id = assignment["job_id"]
        finished.add(job_id)
        for old in checkpoints.prune(keep=job_id):  # never resumable: another job came
            log.info("removed the checkpoint of job %s", old)
        health.job_id = job_id
        runner = JobRunner(
            config, client, transport, device_id, assignment, link, identity, observer
        )
        with logcontext.bind(job=job_id):
            try:
                runner.run(x, y)  # type: ignore[arg-type]
            except (ConfigError, SecurityError) as exc:  # this job does not fit: decline it
                log.error("declining job %s: %s", job_id, exc)
                transport.publish(
                    status_topic(fleet, device_id),
                    encode_status("declined", job_id),
                    retain=True,
                )
                client.post_decline(job_id, str(exc))
                checkpoints.remove(job_id)
                if config.once:
                    raise
            # The retained "declined" status stays: neighbours that subscribe later must
            # see it. The next job's engine announces readiness for that job itself.
        health.job_id = None
        if config.once:
            return


_ENDED = ("completed", "failed", "stopped")


def _runnable(assignment: Assignment, finished: set[str]) -> bool:
    return assignment["status"] == "running" and assignment["job_id"] not in finished


def _status(state: Literal["online", "offline"]) -> bytes:
    return encode_status(state)


def _broker_transport(config: AgentConfig, enrolment: EnrolResponse, broker: str) -> Transport:
    """The MQTT transport with the broker login and CA given at enrolment.

    The device's username (its device id, also its client id) and password are used as
    given; they are kept with the enrolment (``<out>/<name>.enrolment.json``, mode 0600)
    so that a restarted agent is the same device with the same login. The CA's PEM is saved as
    ``<out>/<name>.broker-ca.pem`` next to the identity key; ``--broker-ca`` wins over it.
    """
    from edge_agent.transport.address import parse_broker_address
    from edge_agent.transport.mqtt import MqttTransport
    from meshfl.files import atomic_write

    ca_file = config.broker_ca
    pem = enrolment.get("broker_ca")
    if ca_file is None and pem and parse_broker_address(broker).tls:
        ca_file = Path(config.out) / f"{config.name}.broker-ca.pem"
        atomic_write(ca_file, lambda f: f.write(pem.encode()))
    return MqttTransport(
        broker,
        username=enrolment.get("broker_username"),
        password=enrolment.get("broker_password"),
        ca_file=ca_file,
        keepalive_s=config.keepalive_s,
    )
