"""Broker security without a broker: $7$ hashes, the password file, the ACL, TLS material, CLI.

The real-broker checks are in tests/integration/test_broker_security.py.
"""

from __future__ import annotations

import base64
import ipaddress
import signal
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from typer.testing import CliRunner

from broker.passwords import (
    ITERATIONS,
    PasswordFile,
    hash_password,
    sighup_reloader,
    validate_username,
    verify_password,
)
from broker.secure import acl_text, coordinator_username, secure_mosquitto_config
from broker.tls import CertificateAuthority, write_tls_dir
from edge_agent.daemon import AgentConfig, _broker_transport
from edge_agent.transport.address import parse_broker_address, tls_context
from edge_agent.transport.mqtt import MqttTransport
from meshfl.app.cli import app
from meshfl.app.cli.servers import _broker_accounts, _coordinator_login
from meshfl.errors import ConfigError

# Made by Mosquitto 2.0.11's own tool: `mosquitto_passwd -b FILE alice secret`.
MOSQUITTO_PASSWD_LINE = (
    "alice:$7$101$0Eh+MmYNMQlzvUiA$lGzKQiqA9RkVQ1Ec4dqXnM7wsz3Qr6VIavQO4ClcYvhxgGWgdZeFY05VONa"
    "dsFnFDLTMJhPHM9GSasg3CuRJOQ=="
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- $7$ hashes -------------------------------------------------------------------------------


def test_hash_matches_mosquitto_passwd_byte_for_byte() -> None:
    _, encoded = MOSQUITTO_PASSWD_LINE.split(":", 1)
    salt = base64.b64decode(encoded.split("$")[3])

    assert hash_password("secret", salt=salt) == encoded
    assert verify_password("secret", encoded)
    assert not verify_password("Secret", encoded)


def test_hash_layout_and_fresh_salts() -> None:
    first, second = hash_password("pw"), hash_password("pw")

    empty, kind, iterations, salt, digest = first.split("$")
    assert (empty, kind, int(iterations)) == ("", "7", ITERATIONS)
    assert len(base64.b64decode(salt)) == 12 and len(base64.b64decode(digest)) == 64
    assert first != second and verify_password("pw", second)


@pytest.mark.parametrize("encoded", ["", "$6$abc$def", "$7$x$AAAA$AAAA", "$7$101$!!$AAAA"])
def test_verify_refuses_malformed_hashes(encoded: str) -> None:
    assert not verify_password("pw", encoded)


def test_hash_refuses_an_empty_password() -> None:
    with pytest.raises(ConfigError, match="empty"):
        hash_password("")


@pytest.mark.parametrize("name", ["", "a:b", "a/b", "a+b", "a#b", "a b", "x" * 129, "é"])
def test_usernames_that_would_break_the_file_or_the_acl_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid broker username"):
        validate_username(name)


# -- PasswordFile -----------------------------------------------------------------------------


def test_password_file_adds_replaces_removes_and_reloads(tmp_path: Path) -> None:
    reloads: list[int] = []
    path = tmp_path / "passwd"
    path.write_text("# managed by meshfl\nother:$7$101$AAAA$AAAA\n")
    path.chmod(0o640)
    passwords = PasswordFile(path, reload=lambda: reloads.append(1))

    passwords.add("dev-a", "one")
    passwords.add("dev-a", "two")
    passwords.add("dev-b", "three")
    passwords.remove("dev-b")
    passwords.remove("never-there")

    assert passwords.usernames() == ["other", "dev-a"]
    assert passwords.check("dev-a", "two") and not passwords.check("dev-a", "one")
    assert path.read_text().startswith("# managed by meshfl\nother:")
    assert mode(path) == 0o640  # an existing file keeps its mode
    assert len(reloads) == 5


def test_a_new_password_file_is_private(tmp_path: Path) -> None:
    passwords = PasswordFile(tmp_path / "sub" / "passwd")

    passwords.add("dev-a", "pw")

    assert mode(passwords.path) == 0o600 and "dev-a" in passwords


def test_concurrent_adds_lose_no_login(tmp_path: Path) -> None:
    passwords = PasswordFile(tmp_path / "passwd", iterations=1)
    names = [f"dev-{i}" for i in range(40)]

    threads = [threading.Thread(target=lambda n=n: passwords.add(n, f"pw-{n}")) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(passwords.usernames()) == sorted(names)
    assert all(passwords.check(n, f"pw-{n}") for n in names)


def test_an_unwritable_password_file_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")

    with pytest.raises(ConfigError, match="broker password file"):
        PasswordFile(blocker / "passwd").add("dev-a", "pw")


def _default_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_sighup_reloader_signals_the_pid_in_the_file(tmp_path: Path) -> None:
    # An ignored SIGHUP is inherited through exec (e.g. a suite run under nohup): the
    # child takes the default action back before it runs, so SIGHUP ends it.
    child = subprocess.Popen(["sleep", "30"], preexec_fn=_default_sighup)
    try:
        pid_file = tmp_path / "mosquitto.pid"
        pid_file.write_text(f"{child.pid}\n")

        sighup_reloader(pid_file)()

        assert child.wait(5) == -signal.SIGHUP  # the signal went to that pid
    finally:
        child.kill()
        child.wait()


def test_sighup_reloader_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no pid in"):
        sighup_reloader(tmp_path / "missing.pid")()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "gone.pid").write_text(str(gone.pid))
    with pytest.raises(ConfigError, match="signal to pid"):
        sighup_reloader(tmp_path / "gone.pid")()


# -- ACL and configuration --------------------------------------------------------------------


def test_acl_grants_each_device_only_its_own_topics() -> None:
    rules = [line for line in acl_text("f1").splitlines() if line and not line.startswith("#")]

    node = "meshfl/v1/f1/node"
    assert rules == [
        "user coordinator-f1",
        "topic write meshfl/v1/f1/control",
        f"topic read {node}/+/status",
        f"pattern write {node}/%u/delta",
        f"pattern write {node}/%u/status",
        f"pattern readwrite {node}/%u/probe",
        f"pattern write {node}/+/inbox/%u",
        f"pattern read {node}/+/delta",
        f"pattern read {node}/+/status",
        f"pattern read {node}/%u/inbox/+",
        "pattern read meshfl/v1/f1/control",
    ]


def test_acl_refuses_a_fleet_id_that_could_widen_it() -> None:
    with pytest.raises(ConfigError, match="invalid fleet"):
        acl_text("f1/#")
    assert coordinator_username("f1") == "coordinator-f1"


def test_secure_config_has_tls_logins_and_the_acl(tmp_path: Path) -> None:
    tls = write_tls_dir(tmp_path / "tls")

    text = secure_mosquitto_config(
        8883, tls=tls, password_file=tmp_path / "passwd", acl_file=tmp_path / "acl"
    )

    lines = text.splitlines()
    for expected in (
        "listener 8883 0.0.0.0",
        "allow_anonymous false",
        f"password_file {tmp_path / 'passwd'}",
        f"acl_file {tmp_path / 'acl'}",
        f"cafile {tls.ca_cert}",
        f"certfile {tls.server_cert}",
        f"keyfile {tls.server_key}",
        "tls_version tlsv1.2",
        "use_username_as_clientid true",
        "persistence false",
    ):
        assert expected in lines
    assert sum(line.startswith("listener") for line in lines) == 1


# -- TLS material -----------------------------------------------------------------------------


def test_tls_dir_has_a_ca_a_server_certificate_and_private_keys(tmp_path: Path) -> None:
    files = write_tls_dir(tmp_path, ["broker.example", "10.0.0.5"], clients=["dev-a"])

    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    client = x509.load_pem_x509_certificate((tmp_path / "client-dev-a.crt").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["broker.example"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    server.verify_directly_issued_by(ca)
    client.verify_directly_issued_by(ca)
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for key in (files.ca_key, files.server_key, tmp_path / "client-dev-a.key"):
        assert mode(key) == 0o600
    assert mode(files.ca_cert) == 0o644


def test_tls_dir_reuses_its_ca(tmp_path: Path) -> None:
    first = write_tls_dir(tmp_path).ca_cert.read_bytes()
    old_server = (tmp_path / "server.crt").read_bytes()

    write_tls_dir(tmp_path, ["other.example"])

    assert (tmp_path / "ca.crt").read_bytes() == first
    assert (tmp_path / "server.crt").read_bytes() != old_server


def test_tls_refuses_bad_hosts_and_unreadable_cas(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid host"):
        write_tls_dir(tmp_path / "a", ["not a host"])
    with pytest.raises(ConfigError, match="at least one host"):
        CertificateAuthority.create().issue("x", hosts=[])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "ca.crt").write_text("garbage")
    (tmp_path / "b" / "ca.key").write_text("garbage")
    with pytest.raises(ConfigError, match="cannot read the CA"):
        write_tls_dir(tmp_path / "b")


# -- agent side: URLs, TLS context, enrolment wiring ------------------------------------------


def test_broker_addresses() -> None:
    assert parse_broker_address("mqtts://broker.example").port == 8883
    assert parse_broker_address("mqtts://broker.example:9883").tls
    assert not parse_broker_address("10.0.0.5:1883").tls
    with pytest.raises(ConfigError, match="mqtts://HOST:PORT"):
        parse_broker_address("https://broker.example")


def test_transport_option_mistakes_are_config_errors(tmp_path: Path) -> None:
    ca = write_tls_dir(tmp_path).ca_cert
    with pytest.raises(ConfigError, match="not a TLS URL"):
        MqttTransport("mqtt://127.0.0.1:1883", ca_file=ca)
    with pytest.raises(ConfigError, match="without a username"):
        MqttTransport("mqtts://127.0.0.1", password="pw")
    with pytest.raises(ConfigError, match="cannot load the broker CA"):
        tls_context(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="cannot load the broker CA"):
        tls_context(tmp_path / "server.key")  # a key, not a certificate


def test_agent_saves_the_enrolment_ca_and_uses_its_login(tmp_path: Path) -> None:
    pem = CertificateAuthority.create().pem
    config = AgentConfig(coordinator="http://c", token="t", data=tmp_path / "d", name="pi-1",
                         out=tmp_path / "out")  # fmt: skip
    enrolment = {
        "device_id": "dev-1", "device_token": "x", "fleet": "f1",
        "broker_url": "mqtts://127.0.0.1:8883", "broker_username": "dev-1",
        "broker_password": "pw", "broker_ca": pem,
    }  # fmt: skip

    transport = _broker_transport(config, enrolment, "mqtts://127.0.0.1:8883")  # type: ignore[arg-type]

    assert isinstance(transport, MqttTransport)
    assert (tmp_path / "out" / "pi-1.broker-ca.pem").read_text() == pem
    assert transport.port == 8883


# -- CLI ----------------------------------------------------------------------------------------


def test_broker_config_secure_writes_a_complete_broker(tmp_path: Path) -> None:
    out = tmp_path / "broker"
    result = CliRunner().invoke(
        app,
        ["broker", "config", "--secure", "--out", str(out), "--fleet", "f1",
         "--tls-host", "broker.example"],
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert (
        "--broker-password-file" in result.output and "mqtts://broker.example:8883" in result.output
    )
    assert (out / "acl").read_text() == acl_text("f1")
    assert (out / "passwd").read_text() == "" and mode(out / "passwd") == 0o600
    conf = (out / "mosquitto.conf").read_text()
    assert f"acl_file {out.resolve() / 'acl'}" in conf and "listener 8883 0.0.0.0" in conf
    assert mode(out / "tls" / "server.key") == 0o600


def test_broker_config_options_that_need_secure(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["broker", "config", "--out", str(tmp_path)])
    assert isinstance(result.exception, ConfigError)
    result = CliRunner().invoke(app, ["broker", "config", "--secure"])
    assert isinstance(result.exception, ConfigError) and "--out" in str(result.exception)


def test_broker_tls_command(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["broker", "tls", "--out", str(tmp_path), "--host", "b.example", "--client", "dev-a"]
    )

    assert result.exit_code == 0, result.output
    assert {p.name for p in tmp_path.iterdir()} == {
        "ca.crt", "ca.key", "server.crt", "server.key", "client-dev-a.crt", "client-dev-a.key"
    }  # fmt: skip


def test_coordinator_login_goes_into_the_managed_password_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="go together"):
        _broker_accounts(tmp_path / "passwd", None)
    accounts = PasswordFile(tmp_path / "passwd")

    username, password = _coordinator_login(accounts, "f1", None, None) or ("", "")

    assert username == "coordinator-f1" and accounts.check(username, password)
    assert _coordinator_login(None, "f1", None, "given") == ("coordinator-f1", "given")
    assert _coordinator_login(None, "f1", None, None) is None
    with pytest.raises(ConfigError, match="needs --broker-password"):
        _coordinator_login(None, "f1", "someone", None)


class _Code:
    def __init__(self, value: int, text: str) -> None:
        self.value, self.text = value, text

    def __str__(self) -> str:
        return self.text


def test_refusals_that_retrying_cannot_fix_are_config_errors() -> None:
    from edge_agent.transport.refusals import connack_error, suback_error

    where = "b.example:8883"
    bad_id = connack_error(_Code(0x85, "Client identifier not valid"), where, "x y", True)
    no_login = connack_error(_Code(0x87, "Not authorized"), where, "dev-1", False)
    busy = connack_error(_Code(0x89, "Server busy"), where, "dev-1", True)

    assert isinstance(bad_id, ConfigError) and "refused the client id 'x y'" in str(bad_id)
    assert isinstance(no_login, ConfigError) and "--broker-password-file" in str(no_login)
    assert not isinstance(busy, ConfigError) and "Server busy" in str(busy)
    assert suback_error("t/#", [], where, "dev-1") is None
    quota = suback_error("t/#", [_Code(0x97, "Quota exceeded")], where, "dev-1")
    assert quota is not None and not isinstance(quota, ConfigError)
