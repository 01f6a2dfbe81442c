"""Broker fixtures shared by every test tier.

- ``amqtt_url``: the embedded amqtt broker (MQTT 3.1.1) on a free loopback port.
- ``mosquitto_process`` / ``mosquitto_url``: the project's Mosquitto (MQTT 5) on a free
  port, with its config, log and persistence under ``tmp_path`` (never the system 1883).
- ``broker_url``: parametrized over ["amqtt", "mosquitto"] so a test runs on both.
All are function-scoped: each test gets a fresh broker (both start in well under 0.1 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.embedded import EmbeddedBroker
from broker.mosquitto import MosquittoProcess
from broker.ports import free_port


@pytest.fixture
def amqtt_url() -> Iterator[str]:
    with EmbeddedBroker(port=free_port()) as broker:
        yield broker.url


@pytest.fixture
def mosquitto_process(tmp_path: Path) -> Iterator[MosquittoProcess]:
    workdir = tmp_path / "mosquitto"
    workdir.mkdir()
    with MosquittoProcess(workdir=workdir) as process:
        yield process


@pytest.fixture
def mosquitto_url(mosquitto_process: MosquittoProcess) -> str:
    return mosquitto_process.url


@pytest.fixture(params=["amqtt", "mosquitto"])
def broker_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url
