"""The generated Mosquitto configs carry the settings behind meshfl's guarantees, and Mosquitto
accepts them; a clean broker stop (SIGTERM) loses no queued QoS 1 message."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.mosquitto import MosquittoProcess, mosquitto_config
from broker.secure import secure_mosquitto_config
from broker.tls import TlsFiles
from broker.tuning import MosquittoTuning
from edge_agent.transport.mqtt import MqttTransport
from meshfl.errors import ConfigError

pytestmark = pytest.mark.mqtt

GUARANTEES = {
    "persistence": "persistence true",
    "autosave_interval": "autosave_interval 2",
    "autosave_on_changes": "autosave_on_changes false",
    "max_queued_messages": "max_queued_messages 10000",
    "max_queued_bytes": f"max_queued_bytes {256 * 1024 * 1024}",
    "queue_qos0_messages": "queue_qos0_messages false",
    "persistent_client_expiration": "persistent_client_expiration 1h",
    "max_inflight_messages": "max_inflight_messages 20",
    "max_packet_size": f"max_packet_size {4 * 1024 * 1024}",
}


def settings(text: str) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line for line in text.splitlines() if line[:1] not in "#"}


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_both_generated_configs_set_persistence_and_queue_limits_deliberately(
    tmp_path: Path,
) -> None:
    tls = TlsFiles(*(tmp_path / name for name in ("ca.crt", "ca.key", "s.crt", "s.key")))
    anonymous = settings(mosquitto_config(1999, persistence_dir=tmp_path))
    secure = settings(
        secure_mosquitto_config(
            8883,
            tls=tls,
            password_file=tmp_path / "passwd",
            acl_file=tmp_path / "acl",
            persistence_dir=tmp_path,
        )
    )

    for config in (anonymous, secure):
        assert {key: config.get(key) for key in GUARANTEES} == GUARANTEES


def test_mosquitto_accepts_the_default_and_a_tuned_config(tmp_path: Path) -> None:
    tuning = MosquittoTuning(
        max_packet_bytes=1048576,
        max_inflight_messages=5,
        max_queued_messages=100,
        max_queued_bytes=10_000_000,
        autosave_interval_s=1,
        persistent_client_expiration="2d",
    )
    for name, chosen in (("default", None), ("tuned", tuning)):
        workdir = tmp_path / name
        workdir.mkdir()
        with MosquittoProcess(workdir=workdir, tuning=chosen) as process:
            transport = MqttTransport(process.url)
            transport.connect("probe")
            limits = transport.limits
            transport.close()
            assert process.running
        expected = chosen or MosquittoTuning()
        assert limits.max_packet_bytes == expected.max_packet_bytes
        assert limits.receive_maximum == expected.max_inflight_messages
        assert "Error" not in process.log_path.read_text()


def test_a_sigterm_restart_loses_no_queued_qos1_message(tmp_path: Path) -> None:
    got: list[bytes] = []
    with MosquittoProcess(workdir=tmp_path) as process:
        sub = MqttTransport(process.url, keepalive_s=5)
        sub.subscribe("q/#")
        sub.connect("away")
        sub.close()  # offline, persistent session kept by the broker
        pub = MqttTransport(process.url, keepalive_s=5)
        pub.connect("pub")
        for i in range(20):
            pub.publish("q/x", str(i).encode())
        assert pub.flush(10.0)
        pub.close()

        process.restart()  # SIGTERM: Mosquitto saves its database on exit

        back = MqttTransport(process.url, keepalive_s=5)
        back.set_handler(lambda topic, payload: got.append(payload))
        back.connect("away")
        assert wait_until(lambda: len(got) >= 20)
        back.close()
    assert got == [str(i).encode() for i in range(20)]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_queued_messages", 0),
        ("max_packet_bytes", -1),
        ("autosave_interval_s", 1.5),
        ("max_inflight_messages", True),
        ("persistent_client_expiration", "forever"),
        ("persistent_client_expiration", "h"),
    ],
)
def test_bad_tuning_is_a_one_line_config_error(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        MosquittoTuning(**{field: value})  # type: ignore[arg-type]


def test_a_tuning_is_refused_for_the_fleet_setup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="anonymous setup only"):
        MosquittoProcess(workdir=tmp_path, fleet="f", tuning=MosquittoTuning())
