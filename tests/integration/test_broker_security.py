"""The generated fleet broker (TLS + logins + ACL) against a real Mosquitto 2.0.

One secure Mosquitto for the module (``MosquittoProcess(fleet=...)``: the exact files
``meshfl broker config --secure`` writes), with logins for dev-a, dev-b and dev-c made
by :class:`broker.passwords.PasswordFile` (so the ``$7$`` hashes are checked by the real
broker). What Mosquitto 2.0.11 really does, and what these tests pin:

- a denied QoS 1 PUBLISH gets PUBACK 0x87, which the transport turns into ConfigError;
- the ACL file never denies a SUBSCRIBE (SUBACK grants it) but filters every delivery,
  so a device subscribed to another's inbox receives nothing;
- a wrong password gets CONNACK 0x87 (not 0x86);
- removing a login + SIGHUP disconnects that device at once and refuses it afterwards.

A second Mosquitto with the dynamic-security plugin, which does deny SUBSCRIBEs (SUBACK
0x87, as EMQX and HiveMQ do), checks the transport's ConfigError for a denied subscribe.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.mosquitto import MosquittoProcess, find_mosquitto
from broker.passwords import PasswordFile, hash_password
from broker.ports import free_port, wait_for_port
from broker.tls import CertificateAuthority
from edge_agent.transport.mqtt import MqttTransport
from meshfl.errors import ConfigError, MeshflError
from meshfl.wire import control_topic, delta_topic, inbox_topic, probe_topic, status_topic

pytestmark = pytest.mark.mqtt

FLEET = "f1"
DEVICES = ("dev-a", "dev-b", "dev-c")


def inbox_filter(dst: str) -> str:
    """Every message to ``dst``'s inbox (``dst`` may be ``+``)."""
    return f"meshfl/v1/{FLEET}/node/{dst}/inbox/+"


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class Recorder:
    """A handler that records deliveries and sets an event per expected topic."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, bytes]] = []
        self.events: dict[str, threading.Event] = {}

    def expect(self, topic: str) -> threading.Event:
        return self.events.setdefault(topic, threading.Event())

    def __call__(self, topic: str, payload: bytes) -> None:
        with self.lock:
            self.items.append((topic, payload))
        self.expect(topic).set()

    def topics(self) -> list[str]:
        with self.lock:
            return [t for t, _ in self.items]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoProcess]:
    process = MosquittoProcess(workdir=tmp_path_factory.mktemp("secure"), fleet=FLEET)
    process.start()
    passwords = process.password_file()
    for device in DEVICES:
        passwords.add(device, f"pw-{device}")
    yield process
    process.stop()


@pytest.fixture
def transports() -> Iterator[list[MqttTransport]]:
    made: list[MqttTransport] = []
    yield made
    for t in made:
        t.close()


def device(
    broker: MosquittoProcess,
    made: list[MqttTransport],
    user: str,
    *,
    password: str | None = None,
    client_id: str | None = None,
    subs: tuple[str, ...] = (),
    handler: Recorder | None = None,
) -> MqttTransport:
    t = MqttTransport(
        broker.url,
        username=user,
        password=password or f"pw-{user}",
        ca_file=broker.ca_file,
        connect_timeout_s=5,
        reconnect_min_s=0.1,
        reconnect_max_s=1,
    )
    made.append(t)
    if handler is not None:
        t.set_handler(handler)
    for s in subs:
        t.subscribe(s)
    t.connect(client_id or user)
    return t


# -- TLS ------------------------------------------------------------------------------------


def test_the_only_listener_is_tls_and_anonymous_access_is_off(broker: MosquittoProcess) -> None:
    conf = broker.conf_path.read_text().splitlines()
    assert [line for line in conf if line.startswith("listener ")] == [
        f"listener {broker.port} 127.0.0.1"
    ]
    for setting in (
        "allow_anonymous false",
        "use_username_as_clientid true",
        "tls_version tlsv1.2",
    ):
        assert setting in conf
    # A plain MQTT CONNECT on the port gets no CONNACK: the TLS layer drops it.
    connect = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x0a\x00\x04abcd"
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(connect)
        try:
            answer = sock.recv(16)
        except ConnectionResetError:
            answer = b""
    assert not answer.startswith(b"\x20")
    with pytest.raises(MeshflError):
        MqttTransport(f"mqtt://127.0.0.1:{broker.port}", connect_timeout_s=1).connect("dev-a")


def test_a_certificate_from_another_ca_is_refused(broker: MosquittoProcess, tmp_path: Path) -> None:
    other = tmp_path / "other-ca.crt"
    other.write_text(CertificateAuthority.create("someone else").pem)
    t = MqttTransport(broker.url, username="dev-a", password="pw-dev-a", ca_file=other)
    with pytest.raises(ConfigError, match="does not verify"):
        t.connect("dev-a")


# -- logins ---------------------------------------------------------------------------------


def test_a_wrong_password_is_refused(broker: MosquittoProcess, transports: list) -> None:
    with pytest.raises(ConfigError, match=r"refused this device's login .*re-enrol"):
        device(broker, transports, "dev-a", password="not-the-password")


def test_a_revoked_device_is_dropped_and_cannot_reconnect(
    broker: MosquittoProcess, transports: list
) -> None:
    passwords = broker.password_file()
    passwords.add("dev-r", "pw-dev-r")
    live = device(broker, transports, "dev-r")  # retries once if the reload is still on its way
    assert live.connected

    passwords.remove("dev-r")

    assert wait_until(lambda: not live.connected), "Mosquitto kept the revoked device online"
    with pytest.raises(ConfigError, match="refused this device's login"):
        device(broker, transports, "dev-r")
    assert "dev-r" not in PasswordFile(passwords.path)


def test_the_client_id_is_the_username_so_no_session_can_be_taken_over(
    broker: MosquittoProcess, transports: list
) -> None:
    b_inbox = Recorder()
    b = device(broker, transports, "dev-b", subs=(inbox_filter("dev-b"),), handler=b_inbox)
    # dev-a logs in with its own login but dev-b's client id.
    a = device(broker, transports, "dev-a", client_id="dev-b")
    c = device(broker, transports, "dev-c")
    got = b_inbox.expect(inbox_topic(FLEET, "dev-b", "dev-c"))

    c.publish(inbox_topic(FLEET, "dev-b", "dev-c"), b"hello")

    assert got.wait(5)
    assert b.connected and b.reconnects == 0  # dev-b's session was never replaced
    a.publish(delta_topic(FLEET, "dev-a"), b"mine")  # a's ACL identity is still dev-a
    assert a.flush(5)
    a.publish(delta_topic(FLEET, "dev-b"), b"not mine")
    with pytest.raises(ConfigError, match="denies publishing to"):
        a.flush(5)


# -- ACL ------------------------------------------------------------------------------------


def test_a_device_cannot_publish_on_another_devices_topics(
    broker: MosquittoProcess, transports: list
) -> None:
    forbidden = [
        delta_topic(FLEET, "dev-b"),
        status_topic(FLEET, "dev-b"),
        probe_topic(FLEET, "dev-b"),
        inbox_topic(FLEET, "dev-b", "dev-c"),  # dev-a posing as dev-c
        control_topic(FLEET),
    ]
    seen = Recorder()
    marker = delta_topic(FLEET, "dev-a")
    device(broker, transports, "dev-b", subs=(*forbidden, marker), handler=seen)
    a = device(broker, transports, "dev-a")
    for topic in forbidden:
        a.publish(topic, b"forged")
        with pytest.raises(
            ConfigError, match=rf"ACL denies publishing to {re.escape(topic)} .*0x87"
        ):
            a.flush(5)
    done = seen.expect(marker)

    a.publish(marker, b"allowed")  # published after the forgeries: delivered after them

    assert done.wait(5)
    assert seen.topics() == [marker]


def test_a_device_cannot_read_another_devices_inbox(
    broker: MosquittoProcess, transports: list
) -> None:
    a_seen, b_seen = Recorder(), Recorder()
    marker = delta_topic(FLEET, "dev-c")
    b_inbox = inbox_filter("dev-b")
    device(broker, transports, "dev-b", subs=(b_inbox,), handler=b_seen)
    a = device(broker, transports, "dev-a", subs=(marker,), handler=a_seen)
    for snoop in (b_inbox, inbox_filter("+"), "meshfl/#"):
        # Mosquitto 2.0's ACL file grants it and filters deliveries; a broker that checks
        # subscriptions refuses it (ConfigError): just as good.
        with contextlib.suppress(ConfigError):
            a.subscribe(snoop)
    c = device(broker, transports, "dev-c")
    message = inbox_topic(FLEET, "dev-b", "dev-c")
    b_got, a_got_marker = b_seen.expect(message), a_seen.expect(marker)

    c.publish(message, b"for dev-b only")
    c.publish(marker, b"after it")

    assert b_got.wait(5) and a_got_marker.wait(5)
    assert message not in a_seen.topics()


def test_a_device_can_use_all_of_its_own_topics(broker: MosquittoProcess, transports: list) -> None:
    # The other side of the ACL: everything the agent does is allowed.
    seen = Recorder()
    own = [probe_topic(FLEET, "dev-a"), inbox_topic(FLEET, "dev-a", "dev-b")]
    read = [delta_topic(FLEET, "dev-b"), status_topic(FLEET, "dev-b"), *own]
    a = device(broker, transports, "dev-a", subs=(*read, control_topic(FLEET)), handler=seen)
    b = device(broker, transports, "dev-b")
    events = [seen.expect(t) for t in read]

    a.publish(probe_topic(FLEET, "dev-a"), b"ping")
    for topic in (delta_topic(FLEET, "dev-b"), status_topic(FLEET, "dev-b"), own[1]):
        b.publish(topic, b"x")
    a.publish(delta_topic(FLEET, "dev-a"), b"x")
    a.publish(status_topic(FLEET, "dev-a"), b"x", retain=True)
    a.publish(inbox_topic(FLEET, "dev-b", "dev-a"), b"x")

    assert a.flush(5) and b.flush(5)
    assert all(e.wait(5) for e in events)


def test_the_coordinator_writes_the_control_topic(
    broker: MosquittoProcess, transports: list
) -> None:
    broker.password_file().add("coordinator-f1", "pw-coordinator-f1")
    seen = Recorder()
    device(broker, transports, "dev-a", subs=(control_topic(FLEET),), handler=seen)
    coordinator = device(broker, transports, "coordinator-f1")
    got = seen.expect(control_topic(FLEET))

    coordinator.publish(control_topic(FLEET), b"topology v1", retain=True)

    assert coordinator.flush(5)
    assert got.wait(5)


# -- a broker that denies SUBSCRIBE (dynamic security plugin) -----------------------------

_DYNSEC_PLUGIN = [
    *glob.glob("/usr/lib/*/mosquitto_dynamic_security.so"),
    *glob.glob("/usr/lib/mosquitto_dynamic_security.so"),
    *glob.glob("/usr/local/lib/mosquitto_dynamic_security.so"),
]


@pytest.fixture(scope="module")
def dynsec_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # Debian's mosquitto package (.ci/run installs it) ships the plugin: absent is broken.
    assert _DYNSEC_PLUGIN, (
        "Mosquitto's dynamic-security plugin (mosquitto_dynamic_security.so) is missing;"
        " install Mosquitto 2 with it (apt-get install mosquitto)"
    )
    workdir = tmp_path_factory.mktemp("dynsec")
    _, _, iterations, salt, digest = hash_password("pw-dev-a").split("$")
    dynsec = {
        "clients": [
            {"username": "dev-a", "password": digest, "salt": salt,
             "iterations": int(iterations), "roles": [{"rolename": "device"}]}
        ],
        "roles": [
            {"rolename": "device", "acls": [
                {"acltype": "subscribePattern", "topic": inbox_filter("dev-a"),
                 "allow": True},
                {"acltype": "publishClientSend", "topic": delta_topic(FLEET, "dev-a"),
                 "allow": True},
            ]}
        ],
        "defaultACLAccess": {"publishClientSend": False, "publishClientReceive": True,
                             "subscribe": False, "unsubscribe": True},
    }  # fmt: skip
    (workdir / "dynsec.json").write_text(json.dumps(dynsec))
    port = free_port()
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    (workdir / "mosquitto.conf").write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous false\n"
        f"plugin {_DYNSEC_PLUGIN[0]}\nplugin_opt_config_file {workdir / 'dynsec.json'}\n"
        f"log_dest file {workdir / 'mosquitto.log'}\n" + ("user root\n" if root else "")
    )
    proc = subprocess.Popen(
        [find_mosquitto(), "-c", str(workdir / "mosquitto.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for_port("127.0.0.1", port, 10), "the dynsec Mosquitto did not start"
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_denied_subscribe_is_a_config_error(dynsec_url: str) -> None:
    t = MqttTransport(dynsec_url, username="dev-a", password="pw-dev-a", connect_timeout_s=5)
    t.subscribe(inbox_filter("dev-a"))  # allowed: its own inbox
    t.connect("dev-a")
    try:
        theirs = inbox_filter("dev-b")
        with pytest.raises(
            ConfigError, match=rf"ACL denies subscribe to {re.escape(theirs)} .*disagree"
        ):
            t.subscribe(theirs)
        t.publish(delta_topic(FLEET, "dev-b"), b"x")
        with pytest.raises(ConfigError, match="denies publishing to"):
            t.flush(5)
    finally:
        t.close()


def test_a_subscription_denied_at_connect_is_a_config_error(dynsec_url: str) -> None:
    t = MqttTransport(dynsec_url, username="dev-a", password="pw-dev-a", connect_timeout_s=5)
    t.subscribe(control_topic(FLEET))  # not granted by this broker's role
    with pytest.raises(
        ConfigError, match=f"ACL denies subscribe to {re.escape(control_topic(FLEET))}"
    ):
        t.connect("dev-a")


# -- the composition: meshfl coordinator serve manages the broker's logins -----------------


@pytest.mark.e2e
def test_coordinator_serve_creates_and_revokes_broker_logins(
    broker: MosquittoProcess, transports: list, tmp_path: Path
) -> None:
    import sys

    import httpx

    assert broker.secure_files is not None
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "meshfl", "coordinator", "serve", "--port", str(port),
         "--fleet", FLEET, "--db", f"sqlite:///{tmp_path / 'c.db'}", "--broker-url", broker.url,
         "--broker-password-file", str(broker.secure_files.password_file),
         "--broker-pid-file", str(broker.pid_path), "--broker-ca-file", str(broker.ca_file),
         "--enrol-token", "enrol-secret", "--admin-token", "admin-secret"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert wait_for_port("127.0.0.1", port, 60), "the coordinator did not listen"
        api = f"http://127.0.0.1:{port}/api/v1/devices"
        reply = httpx.post(
            f"{api}/enrol", json={"token": "enrol-secret", "name": "pi", "profile": {}}
        )
        assert reply.status_code == 200, reply.text
        enrolment = reply.json()
        assert enrolment["broker_ca"] == broker.ca_file.read_text()
        ca = tmp_path / "ca.pem"
        ca.write_text(enrolment["broker_ca"])
        t = MqttTransport(
            enrolment["broker_url"],
            username=enrolment["broker_username"],
            password=enrolment["broker_password"],
            ca_file=ca,
            connect_timeout_s=5,
        )
        transports.append(t)
        t.connect(enrolment["device_id"])
        assert "coordinator-f1" in broker.password_file()  # its own control-topic login

        revoked = httpx.post(
            f"{api}/{enrolment['device_id']}/revoke",
            headers={"Authorization": "Bearer admin-secret"},
        )

        assert revoked.status_code == 200, revoked.text
        assert wait_until(lambda: not t.connected), "the revoked device stayed online"
        assert enrolment["broker_username"] not in broker.password_file()
        serve.terminate()
        output = serve.communicate(timeout=10)[0]
        assert enrolment["broker_password"] not in output  # never printed or logged
    finally:
        serve.kill()
        serve.wait(10)
        if serve.stdout is not None:  # a failed test must not leave the pipe to the GC
            serve.stdout.close()
