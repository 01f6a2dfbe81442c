"""`meshfl coordinator serve --broker-url` sees a device's Last Will: offline at once.

A real coordinator process subscribes to the fleet's status topics on a real broker
(amqtt 3.1.1 and Mosquitto 5); a plain paho client stands in for an agent: it sets the
retained Will ``offline`` and publishes ``online``, then is SIGKILLed so that its socket
closes without DISCONNECT and the broker publishes the Will.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.ports import free_port, wait_for_port
from edge_agent.transport.address import parse_broker_address
from meshfl.wire import status_topic

pytestmark = pytest.mark.mqtt

REPO = Path(__file__).resolve().parents[2]
ENROL, ADMIN = "enrol-secret", "admin-secret"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}

_DEVICE = r"""
import json, sys, threading
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
host, port, topic, cid = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv311)
client.will_set(topic, json.dumps({"state": "offline"}), qos=1, retain=True)
client.connect(host, port, keepalive=5)
client.loop_start()
body = {"state": "online", "job": "job-1", "round": 2}
client.publish(topic, json.dumps(body), qos=1, retain=True).wait_for_publish(5)
print("ready", flush=True)
threading.Event().wait()
"""


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.fixture
def coordinator(broker_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A `meshfl coordinator serve` process for fleet "lab": (its URL, its log file)."""
    port = free_port()
    log = tmp_path / "coordinator.log"
    args = [
        sys.executable, "-m", "meshfl", "coordinator", "serve", "--port", str(port),
        "--db", f"sqlite:///{tmp_path / 'coordinator.db'}", "--fleet", "lab",
        "--broker-url", broker_url, "--enrol-token", ENROL, "--admin-token", ADMIN,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHFL_")}
    with log.open("w") as out:
        child = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        assert wait_for_port("127.0.0.1", port, 60.0), log.read_text()
        yield f"http://127.0.0.1:{port}", log
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def shown(url: str, device_id: str) -> dict[str, Any]:
    reply = httpx.get(f"{url}/api/v1/devices/{device_id}", headers=ADMIN_H)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def test_a_killed_agent_shows_offline_from_its_last_will(
    coordinator: tuple[str, Path], broker_url: str
) -> None:
    url, log = coordinator
    assert "device status: Last Will over MQTT" in log.read_text()
    reply = httpx.post(f"{url}/api/v1/devices/enrol", json={"token": ENROL, "name": "pi-0"})
    assert reply.status_code == 200, reply.text
    device_id = reply.json()["device_id"]
    address = parse_broker_address(broker_url)
    host, port = address.host, address.port
    topic = status_topic("lab", device_id)
    device = subprocess.Popen(
        [sys.executable, "-c", _DEVICE, host, str(port), topic, device_id],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert device.stdout is not None and device.stdout.readline().strip() == "ready"
        assert wait_until(lambda: shown(url, device_id)["online_source"] == "last_will"), (
            log.read_text()
        )
        assert shown(url, device_id)["online"] is True

        device.send_signal(signal.SIGKILL)
        device.wait()
        # Long before live_within_s (15 s) would have turned it offline by heartbeats.
        assert wait_until(lambda: shown(url, device_id)["online"] is False, 5.0)
        assert shown(url, device_id)["online_source"] == "last_will"
        offline = httpx.get(f"{url}/api/v1/devices?status=offline", headers=ADMIN_H).json()
        assert [d["device_id"] for d in offline] == [device_id]
    finally:
        if device.poll() is None:
            device.kill()
            device.wait()
        if device.stdout is not None:
            device.stdout.close()
