"""W4's baseline: raw paho-mqtt clients moving the same bytes as the meshfl side.

One paho client per device, configured as meshfl's transport configures its own: MQTT 5,
persistent session (clean start off, session expiry 3600 s), QoS 1, an in-flight window
of 20, TCP_NODELAY, network thread from ``loop_start``. Each device publishes, per
round, the MQTT payloads of one meshfl message (the sizes of
:func:`w4_meshfl_side.chunk_sizes`, random bytes drawn once) on its own topic of the same
layout (``meshfl/v1/{fleet}/node/{device}/delta``); each device subscribes to its
neighbours' topics and finishes the round once all their payloads arrived. Nothing is
decoded, reassembled or checked: this is the broker and paho alone.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from w4_rounds import SideResult, drive

from meshfl.topology import Graph
from meshfl.wire import delta_topic

INFLIGHT = 20  # as edge_agent.transport.mqtt (min(20, Mosquitto's Receive Maximum 20))
SESSION_EXPIRY_S = 3600


class RawDevice:
    """One paho client: publishes its payloads, counts what its subscriptions deliver.

    Raises RuntimeError when the connection or a subscription fails within ``timeout_s``.
    """

    def __init__(self, host: str, port: int, client_id: str, timeout_s: float) -> None:
        self.received = 0
        self.received_bytes = 0
        self._cond = threading.Condition()
        self._connected = threading.Event()
        self._subacked: set[int] = set()
        self.timeout_s = timeout_s
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=paho.MQTTv5)  # fmt: skip
        client.max_inflight_messages_set(INFLIGHT)
        client.max_queued_messages_set(0)
        client.on_connect = self._on_connect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = SESSION_EXPIRY_S
        client.connect(host, port, 30, clean_start=False, properties=props)
        client.loop_start()
        self.client = client
        if not self._connected.wait(timeout_s):
            self.close()
            raise RuntimeError(f"{client_id}: no CONNACK from {host}:{port}")

    def _on_connect(self, client: paho.Client, *_: Any) -> None:
        sock = client.socket()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connected.set()

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, *_: Any) -> None:
        with self._cond:
            self._subacked.add(mid)
            self._cond.notify_all()

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        with self._cond:
            self.received += 1
            self.received_bytes += len(message.payload)
            self._cond.notify_all()

    def subscribe(self, topics: list[str]) -> None:
        """Subscribe at QoS 1 and wait for the SUBACK."""
        rc, mid = self.client.subscribe([(t, 1) for t in topics])
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise RuntimeError(f"subscribe failed: {paho.error_string(rc)}")
        with self._cond:
            if not self._cond.wait_for(lambda: mid in self._subacked, self.timeout_s):
                raise RuntimeError(f"no SUBACK for {topics}")

    def publish(self, topic: str, payloads: list[bytes]) -> None:
        """Publish each payload at QoS 1 (queued; paho's network thread sends them)."""
        for payload in payloads:
            info = self.client.publish(topic, payload, qos=1)
            if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                raise RuntimeError(f"publish failed: {paho.error_string(info.rc)}")

    def wait_received(self, count: int) -> None:
        """Block until ``count`` messages arrived in all (RuntimeError after ``timeout_s``)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.received >= count, self.timeout_s):
                raise RuntimeError(f"received {self.received} of {count} messages")

    def close(self) -> None:
        """Disconnect cleanly and stop the network thread."""
        self.client.disconnect()
        self.client.loop_stop()


def run_raw(
    host: str,
    port: int,
    graph: Graph,
    *,
    fleet: str,
    sizes: list[list[int]],
    rounds: int,
    warmup: int,
    seed: int,
    timeout_s: float,
) -> SideResult:
    """Publish ``sizes[i]`` payloads per device per round; time the last ``rounds`` of them.

    ``fleet`` must be new on this broker (fresh topics and sessions).
    """
    n = graph.n
    rng = np.random.default_rng(seed)
    payloads = [[rng.bytes(s) for s in sizes[i]] for i in range(n)]
    topics = [delta_topic(fleet, f"dev-{i}") for i in range(n)]
    per_round = [sum(len(sizes[j]) for j in graph.neighbours(i)) for i in range(n)]
    devices: list[RawDevice] = []
    try:
        for i in range(n):
            devices.append(RawDevice(host, port, f"{fleet}-dev-{i}", timeout_s))
            devices[i].subscribe([topics[j] for j in graph.neighbours(i)])

        def step(i: int, r: int) -> None:
            devices[i].publish(topics[i], payloads[i])
            devices[i].wait_received(per_round[i] * r)

        def delivered() -> int:
            return sum(d.received_bytes for d in devices)

        if warmup:
            drive(n, warmup, step, delivered, timeout_s)
        received0 = sum(d.received for d in devices)
        round_s, delivered_bytes, cpu_s = drive(
            n, rounds, lambda i, r: step(i, r + warmup), delivered, timeout_s
        )
        received = sum(d.received for d in devices) - received0
    finally:
        for device in devices:
            device.close()
    chunks = len(sizes[0])
    return SideResult(
        side="raw",
        round_s=round_s,
        delivered_bytes=delivered_bytes,
        messages_sent=n * rounds,
        deliveries_expected=sum(len(graph.neighbours(i)) for i in range(n)) * rounds,
        deliveries=received // chunks,
        cpu_s=cpu_s,
        extra={"chunks_delivered": received},
    )
