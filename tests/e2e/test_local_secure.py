"""``meshfl local --secure``: the one-machine fleet with TLS, per-device logins, ACL and signatures.

One secure run of the CLI for the module (4 agents, 5 rounds, the run's own Mosquitto 2.0),
checked three ways:

- it computes what the lockstep reference computes (every signed delta was accepted, none
  refused), like ``test_local.py::test_the_cli_runs_a_small_fleet_that_beats_chance``;
- while it runs, its broker refuses plain TCP, anonymous TLS and a wrong password, and
  afterwards its log shows each device logged in under its own username;
- no secret (device tokens, broker passwords, the enrol and admin tokens, private keys)
  appears in any log, the report, stdout or stderr. Secrets stored only as hashes (device
  tokens: SHA-256 in the coordinator's database; broker passwords: ``$7$`` in the
  password file) are found by hashing every token-shaped substring of the texts.

The launcher runs under a small wrapper that records the tokens it draws with
:func:`secrets.token_urlsafe` (the enrol and admin tokens live only in its memory and in
its children's command lines).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from broker.passwords import hash_password, verify_password
from coordinator.tokens import API_TOKEN_PREFIX, ENROLMENT_TOKEN_PREFIX
from edge_agent.transport.mqtt import MqttTransport
from meshfl.app.local.lab.lockstep import run_lockstep
from meshfl.app.local.run import LocalConfig, run_local
from meshfl.app.local.secure_broker import FLEET, SECURITY_LINE
from meshfl.errors import ConfigError, MeshflError

pytestmark = [pytest.mark.e2e, pytest.mark.mqtt]

LAUNCHER = """
import os, runpy, secrets
real = secrets.token_urlsafe
def recording(nbytes=None):
    token = real(nbytes)
    with open(os.environ["MESHFL_TEST_SECRETS"], "a") as f:
        f.write(token + "\\n")
    return token
secrets.token_urlsafe = recording
runpy.run_module("meshfl", run_name="__main__", alter_sys=True)
"""


@dataclass
class SecureRun:
    out: Path
    returncode: int
    stdout: str
    stderr: str
    launcher_tokens: list[str]
    refusals: dict[str, str] = field(default_factory=dict)


def wait_for_line(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll ``path`` (another process writes it) until it holds ``text``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} did not show {text!r} within {timeout_s} s")


def probe_broker(out: Path) -> dict[str, str]:
    """Try the run's broker as an intruder would; return how each attempt was refused."""
    conf = (out / "broker" / "mosquitto.conf").read_text()
    port = int(re.search(r"^listener (\d+) ", conf, re.M)[1])  # type: ignore[index]
    ca = out / "broker" / "tls" / "ca.crt"
    refusals: dict[str, str] = {}
    # A plain MQTT 3.1.1 CONNECT gets no CONNACK: only TLS is spoken there.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x0a\x00\x04abcd")
        try:
            answer = sock.recv(16)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    refusals["plain_connack"] = answer.hex()
    attempts = {
        "plain": MqttTransport(f"mqtt://127.0.0.1:{port}", connect_timeout_s=2),
        "anonymous": MqttTransport(f"mqtts://127.0.0.1:{port}", ca_file=ca, connect_timeout_s=5),
        "wrong_password": MqttTransport(
            f"mqtts://127.0.0.1:{port}",
            ca_file=ca,
            username=f"coordinator-{FLEET}",
            password="not-the-password",
            connect_timeout_s=5,
        ),
    }
    for name, transport in attempts.items():
        try:
            transport.connect(f"intruder-{name}")
        except MeshflError as exc:
            refusals[name] = f"{type(exc).__name__}: {exc}"
        else:
            refusals[name] = "connected"
        finally:
            transport.close()
    return refusals


@pytest.fixture(scope="module")
def secure_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureRun]:
    base = tmp_path_factory.mktemp("secure")
    out, record = base / "run", base / "launcher-tokens.txt"
    stdout, stderr = base / "stdout.txt", base / "stderr.txt"
    args = ["local", "--agents", "4", "--rounds", "5", "--secure", "--out", str(out)]
    with stdout.open("wb") as so, stderr.open("wb") as se:
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, *args],
            stdout=so,
            stderr=se,
            env={**os.environ, "MESHFL_TEST_SECRETS": str(record)},
        )
        try:
            wait_for_line(out / "broker" / "mosquitto.log", "running", proc, 120)
            refusals = probe_broker(out)
            still_running = proc.poll() is None
            returncode = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert still_running, "the run ended before its broker was probed"
    yield SecureRun(
        out=out,
        returncode=returncode,
        stdout=stdout.read_text(),
        stderr=stderr.read_text(),
        launcher_tokens=record.read_text().split(),
        refusals=refusals,
    )


@pytest.mark.slow
def test_the_secure_cli_runs_a_small_fleet_that_equals_lockstep(secure_run: SecureRun) -> None:
    out = secure_run.out

    assert secure_run.returncode == 0, secure_run.stdout + secure_run.stderr
    assert " ".join(SECURITY_LINE.split()) in " ".join(secure_run.stdout.split())
    assert "coordinator https://127.0.0.1:" in secure_run.stdout  # HTTPS, agents pin its CA
    report = json.loads((out / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3, 4, 5]
    assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in report["rounds"])
    assert len(report["devices"]) == 4
    assert all(d["missing_rounds"] == [] for d in report["devices"])
    assert report["final"]["mean_accuracy"] > 0.5  # chance is 0.1
    assert (out / "report.png").stat().st_size > 10_000
    assert "final mean accuracy" in secure_run.stdout
    assert report["config"]["secure"] is True
    security = report["security"]
    assert security["secure"] and security["tls"] and security["broker_logins"]
    assert security["acl"] and security["signed_deltas"] and security["broker"] == "mosquitto"
    # every device counted refusals in every round, and refused nothing
    assert security["rejected"] == {
        "unsigned": 0,
        "bad_signature": 0,
        "replayed": 0,
        "rounds_counted": 4 * 5,
    }
    onnx = report["onnx"]
    assert onnx["failures"] == []
    assert onnx["consensus"]["accuracy_onnx"] == onnx["consensus"]["accuracy_torch"] > 0.5
    # every signed delta arrived and verified: the fleet computed what lockstep computes
    lockstep = run_lockstep(LocalConfig(agents=4, rounds=5))
    np.testing.assert_allclose([r["mean_accuracy"] for r in report["rounds"]],
                               lockstep.mean_accuracy, atol=1e-9)  # fmt: skip


@pytest.mark.slow
def test_the_runs_broker_had_tls_logins_and_the_acl_in_force(secure_run: SecureRun) -> None:
    broker = secure_run.out / "broker"
    assert secure_run.returncode == 0, secure_run.stderr
    conf = (broker / "mosquitto.conf").read_text().splitlines()
    listeners = [line for line in conf if line.startswith("listener ")]
    assert len(listeners) == 1 and listeners[0].endswith(" 127.0.0.1")
    for setting in (
        "allow_anonymous false",
        f"password_file {broker / 'passwd'}",
        f"acl_file {broker / 'acl'}",
        f"cafile {broker / 'tls' / 'ca.crt'}",
        "use_username_as_clientid true",
        "tls_version tlsv1.2",
    ):
        assert setting in conf
    assert f"pattern write meshfl/v1/{FLEET}/node/%u/delta" in (broker / "acl").read_text()
    # while the run was going: no plain MQTT, no anonymous login, no wrong password
    refusals = secure_run.refusals
    assert not bytes.fromhex(refusals["plain_connack"]).startswith(b"\x20"), refusals
    assert refusals["plain"].startswith("BrokerUnreachable"), refusals
    assert refusals["anonymous"].startswith("ConfigError"), refusals
    assert "requires a login (Not authorized)" in refusals["anonymous"], refusals
    assert "refused this device's login (Not authorized)" in refusals["wrong_password"]
    # the coordinator and each device logged in under their own username, over the listener
    report = json.loads((secure_run.out / "report.json").read_text())
    devices = sorted(d["id"] for d in report["devices"])
    logins = sorted(line.split(":", 1)[0] for line in (broker / "passwd").read_text().split())
    assert logins == sorted([f"coordinator-{FLEET}", *devices])
    log = (broker / "mosquitto.log").read_text()
    for user in [f"coordinator-{FLEET}", *devices]:
        assert f" as {user} (p5, " in log and f"u'{user}')" in log, user
    assert "intruder" not in re.findall(r"New client connected .* as (\S+)", log)


class Secrets:
    """The run's secrets: known plaintexts, and hashes of those stored only as hashes."""

    WINDOWS = sorted({22, 32, 43, len(API_TOKEN_PREFIX) + 43, len(ENROLMENT_TOKEN_PREFIX) + 43})
    TOKENISH = re.compile(r"[A-Za-z0-9_\-]{22,}")

    def __init__(self, plain: list[str], sha256: set[str], mosquitto: list[str]) -> None:
        self.plain = [p for p in plain if len(p) >= 16]
        self.sha256 = sha256  # hex digests of bearer tokens
        self.mosquitto = mosquitto  # $7$ hashes of 32-character broker passwords

    def leaks(self, text: str) -> list[str]:
        """What of the secrets ``text`` holds (described, never quoted)."""
        found = [f"plaintext secret #{i}" for i, p in enumerate(self.plain) if p in text]
        for run in self.TOKENISH.findall(text):
            for n in self.WINDOWS:
                for i in range(len(run) - n + 1):
                    candidate = run[i : i + n]
                    if hashlib.sha256(candidate.encode()).hexdigest() in self.sha256:
                        found.append(f"a bearer token ({n} characters)")
                    if n == 32:
                        found += [
                            "a broker password"
                            for h in self.mosquitto
                            if verify_password(candidate, h)
                        ]
        return found


def encodings(data: bytes) -> list[str]:
    b64 = base64.b64encode(data).decode()
    url = base64.urlsafe_b64encode(data).decode()
    return [b64, b64.rstrip("="), url, url.rstrip("="), data.hex()]


def run_secrets(run: SecureRun) -> Secrets:
    out = run.out
    plain = list(run.launcher_tokens)  # the enrol and admin tokens
    for key in sorted((out / "models").glob("*.identity.key")):  # Ed25519 private keys
        plain += encodings(key.read_bytes())
    for key in sorted((out / "broker" / "tls").glob("*.key")):  # TLS private keys (PEM)
        body = [line for line in key.read_text().splitlines() if not line.startswith("-----")]
        plain += body + encodings(base64.b64decode("".join(body)))
    with sqlite3.connect(out / "coordinator.db") as db:
        hashes = {
            h
            for table in ("devices", "api_tokens", "enrolment_tokens")
            for (h,) in db.execute(f"SELECT token_hash FROM {table}")
        }
    mosquitto = [line.split(":", 1)[1] for line in (out / "broker" / "passwd").read_text().split()]
    return Secrets(plain, hashes, mosquitto)


@pytest.mark.slow
def test_no_secret_appears_in_any_log_the_report_or_the_output(secure_run: SecureRun) -> None:
    out = secure_run.out
    secrets_ = run_secrets(secure_run)
    assert len(secure_run.launcher_tokens) >= 2  # enrol and admin tokens
    assert len(list((out / "models").glob("*.identity.key"))) == 4
    assert len(secrets_.sha256) >= 4 and len(secrets_.mosquitto) == 5
    # the scanner finds what it looks for (a password stored only as a $7$ hash)
    probe = "pw0-" + "x" * 28
    check = Secrets([], set(), [hash_password(probe)])
    assert check.leaks(f"connecting with password={probe}.") == ["a broker password"]

    texts = {"stdout": secure_run.stdout, "stderr": secure_run.stderr}
    logs = [*sorted((out / "logs").iterdir()), out / "broker" / "mosquitto.log"]
    for path in [*logs, out / "report.json"]:
        texts[str(path.relative_to(out))] = path.read_text(errors="replace")
    # coordinator, agents, the agents' zygote, the ONNX check and the pooled reference
    # (children of it), broker
    assert len(logs) == 1 + 4 + 1 + 1 + 1 + 1, logs

    leaks = {name: found for name, text in texts.items() if (found := secrets_.leaks(text))}
    assert leaks == {}
    assert all("PRIVATE KEY" not in text for text in texts.values())


def test_secure_refuses_another_broker_and_shaped_links(tmp_path: Path) -> None:
    for extra, word in ((["--broker", "mqtt://127.0.0.1:1883"], "--broker"),
                        (["--link", "1:1mbit"], "--link")):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "meshfl", "local", "--secure", "--agents", "2",
             "--rounds", "2", "--out", str(tmp_path / "run"), *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("meshfl: error:")]
        assert len(errors) == 1 and word in errors[0] and "--secure" in errors[0], proc.stderr
        assert not (tmp_path / "run" / "logs").exists()  # refused before anything started


def test_a_missing_mosquitto_names_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import broker.mosquitto

    def not_installed() -> str:
        raise ConfigError("mosquitto not found")

    monkeypatch.setattr(broker.mosquitto, "find_mosquitto", not_installed)

    with pytest.raises(ConfigError, match=r"apt-get install mosquitto") as caught:
        run_local(LocalConfig(agents=2, rounds=1, secure=True, out=tmp_path / "run"))

    assert "\n" not in str(caught.value)
    assert not (tmp_path / "run" / "logs").exists()
