"""The embedded amqtt broker and the project's Mosquitto: start, stop, config, errors."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from broker.embedded import EmbeddedBroker
from broker.mosquitto import MAX_PACKET_BYTES, MosquittoProcess, find_mosquitto, mosquitto_config
from broker.ports import free_port, port_accepts
from meshfl.errors import ConfigError

pytestmark = pytest.mark.mqtt


def test_embedded_broker_listens_until_stopped() -> None:
    port = free_port()
    broker = EmbeddedBroker(port=port)
    broker.start()
    assert broker.running and broker.url == f"mqtt://127.0.0.1:{port}"
    broker.stop()
    assert not broker.running
    assert not port_accepts("127.0.0.1", port)


def test_embedded_broker_refuses_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} is in use; choose another with --port"):
            EmbeddedBroker(port=port).start()


def test_mosquitto_config_sets_limits_and_persistence(tmp_path: Path) -> None:
    text = mosquitto_config(1999, persistence_dir=tmp_path)
    lines = {line.split(" ", 1)[0]: line for line in text.splitlines() if not line.startswith("#")}
    assert lines["listener"] == "listener 1999 127.0.0.1"
    assert lines["allow_anonymous"] == "allow_anonymous true"
    assert lines["max_packet_size"] == f"max_packet_size {MAX_PACKET_BYTES}"
    assert lines["persistence"] == "persistence true"
    assert lines["persistence_location"] == f"persistence_location {tmp_path}/"
    assert {"max_inflight_messages", "max_queued_messages", "log_dest"} <= lines.keys()
    assert "persistence false" in mosquitto_config(1999)


def test_mosquitto_process_starts_restarts_and_stops(tmp_path: Path) -> None:
    assert find_mosquitto().endswith("mosquitto")
    with MosquittoProcess(workdir=tmp_path) as process:
        assert process.port != 1883 and port_accepts("127.0.0.1", process.port)
        process.restart()
        assert process.running and port_accepts("127.0.0.1", process.port)
    assert not process.running and not port_accepts("127.0.0.1", process.port)


def test_find_mosquitto_names_the_fix_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("broker.mosquitto._FALLBACK_PATHS", ())
    with pytest.raises(ConfigError, match="apt-get install mosquitto"):
        find_mosquitto()
