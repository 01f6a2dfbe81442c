"""One identity, one process (issue 25): a second agent of one device is refused.

Two agents with the same ``--out`` and ``--name`` are refused at start by an OS lock on
the identity (:mod:`edge_agent.identity_lock`); the same identity connected twice to the
broker (another folder, another host) is detected by the session takeover: the client
that lost its session stops, saying why, instead of taking it back forever.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from broker.ports import free_port
from edge_agent.identity_lock import lock_identity
from edge_agent.transport.mqtt import MqttTransport
from edge_agent.transport.refusals import Reason, SessionTakenOver
from meshfl.app.cli.servers import _control_transport
from meshfl.errors import ConfigError

HOLD = """
import sys, time
from broker.ports import free_port
from edge_agent.identity_lock import lock_identity
lock = lock_identity(sys.argv[1], "pi-1")
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_lock_of_one_identity_is_refused_and_a_released_one_is_taken(
    tmp_path: Path,
) -> None:
    first = lock_identity(tmp_path, "pi-1")
    with pytest.raises(ConfigError, match=r"another agent already runs as 'pi-1'.*pid \d+"):
        lock_identity(tmp_path, "pi-1")
    other = lock_identity(tmp_path, "pi-2")  # another identity in the same folder: fine
    first.close()
    again = lock_identity(tmp_path, "pi-1")
    assert again.held and other.held
    again.close()
    other.close()


def test_a_second_agent_with_the_same_out_and_name_is_refused_in_one_line(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        proc = subprocess.run(
            [sys.executable, "-m", "meshfl", "agent", "run", "--coordinator",
             "http://127.0.0.1:9", "--token", "t", "--data", str(tmp_path / "none.npz"),
             "--name", "pi-1", "--out", str(tmp_path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("meshfl: error:")]
    assert len(errors) == 1, proc.stderr
    assert "already runs as 'pi-1'" in errors[0] and f"pid {holder.pid}" in errors[0]


@pytest.mark.mqtt
def test_a_session_taken_over_stops_the_old_client_instead_of_fighting(mosquitto_url: str) -> None:
    # Mosquitto 2.0.11 closes the old connection without a DISCONNECT; a broker that
    # follows MQTT 5 (3.14.2.1) sends reason 0x8E, which paho hands to the callback.
    # The callback is driven here with that reason on a live connection.
    first = MqttTransport(mosquitto_url, reconnect_min_s=0.05, reconnect_max_s=0.1)
    first.connect("device-7")
    client = first._client
    assert client is not None
    try:
        taken_over = ReasonCode(PacketTypes.DISCONNECT, identifier=Reason.SESSION_TAKEN_OVER)
        first._on_disconnect(client, None, None, taken_over, None)
        with pytest.raises(SessionTakenOver, match="took over"):
            first.flush(0.0)
        time.sleep(1.0)  # ten reconnect delays: it does not take the session back
        assert not first.connected and first.reconnects == 0
        with pytest.raises(SessionTakenOver):
            first.publish("meshfl/v1/f/node/device-7/status", b"{}")
    finally:
        first.close()


@pytest.mark.mqtt
def test_two_coordinators_of_one_fleet_have_their_own_client_ids(mosquitto_url: str) -> None:
    # Before issue 25 both connected as "coordinator-default" and disconnected each other
    # for the whole run.
    first = _control_transport(mosquitto_url, "default")
    second = _control_transport(mosquitto_url, "default")
    assert first is not None and second is not None
    try:
        time.sleep(1.0)
        assert first.connected and second.connected
        assert first.reconnects == second.reconnects == 0
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("fleet", ["a+b", "a/b", "#", "a b"])
def test_an_invalid_fleet_id_is_refused_when_the_coordinator_starts(
    tmp_path: Path, fleet: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "meshfl", "coordinator", "serve", "--fleet", fleet,
         "--db", f"sqlite:///{tmp_path / 'c.db'}", "--port", str(free_port())],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("meshfl: error:")]
    assert len(errors) == 1 and "fleet id" in errors[0] and "--fleet" in errors[0], proc.stderr
    assert not (tmp_path / "c.db").exists()  # refused before anything was stored
