"""The chaos proxy of ``meshfl local --chaos``: MQTT framing and each fault on real sockets.

Each test relays crafted MQTT packets between a client socket (the agent) and a
listening socket (the broker) through a :class:`ChaosProxy` on loopback, and reads
back whole packets with the proxy's own splitter.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest

from meshfl.app.local.lab.chaos import Partition, chaos_line, parse_chaos
from meshfl.app.local.lab.chaos_proxy import ChaosProxy, Faults
from meshfl.app.local.lab.mqtt_frames import (
    PacketSplitter,
    connect_level,
    packet_id,
    parse_publish,
    puback,
)
from meshfl.app.local.lab.process_faults import ProcessFault, broker_faults
from meshfl.app.local.run import LocalConfig, validate
from meshfl.errors import ConfigError, WireError
from meshfl.wire import delta_topic, status_topic
from meshfl.wire.chunking import split_message
from meshfl.wire.serde import decode_chunk

DATA = delta_topic("local", "device-1")
STATUS = status_topic("local", "device-1")
PINGRESP = b"\xd0\x00"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _varint(len(body)) + body


def connect(level: int) -> bytes:
    """A CONNECT of protocol level 4 (3.1.1) or 5, clean, keepalive 30 s, client id "c"."""
    props = b"\x00" if level == 5 else b""
    return _packet(
        0x10, b"\x00\x04MQTT" + bytes((level, 0x02)) + b"\x00\x1e" + props + b"\x00\x01c"
    )


def publish(
    topic: str, payload: bytes, ident: int | None = None, props: bytes | None = None
) -> bytes:
    """A PUBLISH at QoS 1 with ``ident``, else QoS 0; ``props``: MQTT 5 properties."""
    name = topic.encode()
    header = len(name).to_bytes(2, "big") + name
    if ident is not None:
        header += ident.to_bytes(2, "big")
    if props is not None:
        header += _varint(len(props)) + props
    return _packet(0x32 if ident is not None else 0x30, header + payload)


class Pipe:
    """A client socket and the broker's end of the same connection, through a proxy."""

    def __init__(self, client: socket.socket, broker: socket.socket) -> None:
        self.client, self.broker = client, broker
        self._splitters = {id(client): PacketSplitter(), id(broker): PacketSplitter()}
        self._pending: dict[int, list[bytes]] = {id(client): [], id(broker): []}

    def read(self, sock: socket.socket, n: int, timeout_s: float = 5.0) -> list[bytes]:
        """The next ``n`` whole packets that reach ``sock`` (fewer only at a timeout)."""
        pending = self._pending[id(sock)]
        deadline = time.monotonic() + timeout_s
        while len(pending) < n and time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            pending.extend(self._splitters[id(sock)].feed(data))
        taken, pending[:] = pending[:n], pending[n:]
        return taken

    def read_until(self, sock: socket.socket, marker: bytes) -> list[bytes]:
        """Every packet that reaches ``sock`` up to and including ``marker``."""
        got: list[bytes] = []
        while not got or got[-1] != marker:
            more = self.read(sock, 1)
            assert more, f"{marker!r} never arrived; got {got!r}"
            got += more
        return got


@contextmanager
def piped(faults: Faults, seed: int | str = 0, level: int = 4) -> Iterator[tuple[ChaosProxy, Pipe]]:
    listener = socket.create_server(("127.0.0.1", 0))
    proxy = ChaosProxy("127.0.0.1", listener.getsockname()[1], faults, seed)
    port = proxy.start()
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    listener.settimeout(5)
    broker, _ = listener.accept()
    pipe = Pipe(client, broker)
    try:
        client.sendall(connect(level))
        assert pipe.read(broker, 1) == [connect(level)]
        yield proxy, pipe
    finally:
        client.close()
        broker.close()
        listener.close()
        proxy.stop()


# --- the MQTT packet splitter -------------------------------------------------------


def test_the_splitter_cuts_packets_however_the_stream_is_cut() -> None:
    stream_packets = [
        PINGRESP,
        publish(DATA, bytes(50), 7),  # a remaining length of 1 byte
        publish(DATA, bytes(300), 8),  # 2 bytes
        publish(DATA, bytes(20_000)),  # 3 bytes
        publish(DATA, bytes(2_100_000), 9),  # 4 bytes
        puback(9),
    ]
    stream = b"".join(stream_packets)
    rng = np.random.default_rng(0)
    every_byte = list(range(1, 25_000))  # through the first four packets
    for cuts in ([], every_byte, sorted(rng.choice(len(stream), 40))):
        splitter, got, start = PacketSplitter(), [], 0
        for end in [*cuts, len(stream)]:
            got += splitter.feed(stream[start:end])
            start = end
        assert got == stream_packets
        assert splitter.pending == 0


def test_the_splitter_refuses_a_remaining_length_of_five_bytes() -> None:
    with pytest.raises(WireError, match="longer than 4 bytes"):
        PacketSplitter().feed(b"\x30\xff\xff\xff\xff\x01")


def test_publish_connect_and_ack_fields_are_read_in_3_1_1_and_5() -> None:
    p = publish(DATA, b"payload", 513)
    read = parse_publish(p, v5=False)
    assert (read.qos, read.packet_id, read.topic) == (1, 513, DATA)
    assert p[read.payload_start :] == b"payload"
    p5 = publish(DATA, b"payload", 2, props=b"\x01\x01")  # a payload format indicator
    assert p5[parse_publish(p5, v5=True).payload_start :] == b"payload"
    assert parse_publish(publish(STATUS, b"{}"), v5=False).packet_id is None
    assert (connect_level(connect(4)), connect_level(connect(5))) == (4, 5)
    assert packet_id(puback(65535)) == 65535


# --- each fault on a byte stream ------------------------------------------------------


def test_without_faults_every_packet_goes_through_unchanged_both_ways() -> None:
    sent = [publish(DATA, b"a", 1), publish(STATUS, b"{}"), PINGRESP]
    with piped(Faults()) as (proxy, pipe):
        pipe.broker.sendall(b"".join(sent))
        assert pipe.read(pipe.client, 3) == sent
        pipe.client.sendall(puback(1))
        assert pipe.read(pipe.broker, 1) == [puback(1)]
    assert proxy.counts.publishes == 1  # the data PUBLISH; the status is not counted


@pytest.mark.parametrize("level", [4, 5])
def test_a_dropped_qos1_publish_is_acknowledged_to_the_broker(level: int) -> None:
    props = b"" if level == 5 else None
    status = publish(STATUS, b"{}", props=props)
    with piped(Faults(drop=1.0), level=level) as (proxy, pipe):
        pipe.broker.sendall(publish(DATA, b"lost", 41, props=props) + status)
        assert pipe.read_until(pipe.client, status) == [status]
        assert pipe.read(pipe.broker, 1) == [puback(41)]  # forged: the slot is freed
    assert (proxy.counts.dropped, proxy.counts.acks_forged) == (1, 1)


def test_a_duplicate_arrives_twice_and_only_one_puback_goes_back() -> None:
    with piped(Faults(duplicate=1.0)) as (proxy, pipe):
        pipe.broker.sendall(publish(DATA, b"twice", 5))
        assert pipe.read(pipe.client, 2) == [publish(DATA, b"twice", 5)] * 2
        pipe.client.sendall(puback(5) + puback(5) + PINGRESP)
        assert pipe.read_until(pipe.broker, PINGRESP) == [puback(5), PINGRESP]
    assert (proxy.counts.duplicated, proxy.counts.acks_swallowed) == (1, 1)


@pytest.mark.parametrize("level", [4, 5])
def test_corruption_flips_one_payload_byte_and_the_chunk_crc_refuses_it(level: int) -> None:
    chunk = split_message(bytes(range(256)) * 4, bytes(16), 4096)[0]
    props = b"\x01\x01" if level == 5 else None  # v5: a payload format indicator
    sent = publish(DATA, chunk, 3, props=props)
    with piped(Faults(corrupt=1.0), level=level) as (proxy, pipe):
        pipe.broker.sendall(sent)
        (got,) = pipe.read(pipe.client, 1)
    start = parse_publish(sent, v5=level == 5).payload_start
    diff = [i for i in range(len(sent)) if got[i] != sent[i]]
    assert len(got) == len(sent) and len(diff) == 1 and diff[0] >= start  # framing intact
    with pytest.raises(WireError):
        decode_chunk(got[start:])
    assert proxy.counts.corrupted == 1


def test_reordering_delivers_each_held_publish_after_the_next() -> None:
    sent = [publish(DATA, bytes((k,)), k + 1) for k in range(4)]
    with piped(Faults(reorder=1.0)) as (proxy, pipe):
        pipe.broker.sendall(b"".join(sent))
        got = pipe.read(pipe.client, 4)
    assert got == [sent[1], sent[0], sent[3], sent[2]]
    assert proxy.counts.reordered == 2


def test_a_delayed_publish_is_overtaken_by_a_ping_response() -> None:
    with piped(Faults(delay_s=0.3)) as (proxy, pipe):
        started = time.monotonic()
        pipe.broker.sendall(publish(DATA, b"late", 1) + PINGRESP)
        assert pipe.read(pipe.client, 2) == [PINGRESP, publish(DATA, b"late", 1)]
        assert time.monotonic() - started >= 0.3
    assert proxy.counts.delayed == 1


def test_a_partition_holds_both_directions_until_it_heals() -> None:
    with piped(Faults()) as (proxy, pipe):
        proxy.partition(0.5)
        while proxy.counts.partitions == 0:  # the proxy's thread takes it on
            time.sleep(0.01)
        started = time.monotonic()
        pipe.broker.sendall(publish(DATA, b"held", 1))
        pipe.client.sendall(PINGRESP)
        assert pipe.read(pipe.client, 1) == [publish(DATA, b"held", 1)]
        assert pipe.read(pipe.broker, 1) == [PINGRESP]
        assert time.monotonic() - started >= 0.45  # nothing lost, all of it late
    assert proxy.counts.partitioned_s == 0.5


def test_a_partitioned_device_is_refused_new_connections_until_it_heals() -> None:
    with piped(Faults()) as (proxy, _):
        assert proxy.port is not None
        proxy.partition(0.3)
        while proxy.counts.partitions == 0:
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as late:
            assert late.recv(10) == b""  # closed at once, not relayed
        deadline = time.monotonic() + 5
        while proxy.counts.connections < 2 and time.monotonic() < deadline:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5):
                time.sleep(0.05)  # refused until the partition heals, then relayed
    assert proxy.counts.connections == 2
    assert proxy.counts.reconnects == 1  # the first connection after the partition
    assert proxy.counts.refused >= 1


def test_the_same_seed_gives_the_same_faults_and_another_seed_others() -> None:
    sent = [publish(DATA, bytes((k,)), k + 1) for k in range(60)]
    marker = publish(STATUS, b"{}")

    def delivered(seed: str) -> list[bytes]:
        with piped(Faults(drop=0.5), seed=seed) as (_, pipe):
            pipe.broker.sendall(b"".join(sent) + marker)
            return pipe.read_until(pipe.client, marker)

    first = delivered("7:device-1")
    assert first == delivered("7:device-1")
    assert first != delivered("8:device-1")
    assert 10 < len(first) < 50


# --- the option ---------------------------------------------------------------------


def test_a_spec_parses_into_faults_a_seed_and_partitions() -> None:
    spec = parse_chaos(
        "drop=0.1, dup=0.1,reorder=0.05,corrupt=0.01,delay=20,seed=3,partition=2@5:40"
    )
    assert spec.faults == Faults(0.1, 0.1, 0.05, 0.01, 0.02)
    assert spec.seed == 3
    assert spec.partitions == (Partition("device-2", 5, 40.0),)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("drop=2", "drop must be a probability in"),
        ("drop=x", "use a probability"),
        ("loss=0.1", "unknown key 'loss'"),
        ("drop=0.1,drop=0.2", "drop is given twice"),
        ("delay=5000", "delay must be 0..2000 ms"),
        ("partition=device-2@5", "use DEVICE@ROUND:SECONDS"),
        ("partition=device-2@5:0", "SECONDS must be in"),
        ("partition=laptop@5:10", "is not a device"),
        ("seed=-1", "use an integer"),
        ("drop=0.1,seed=\u00b2", "use an integer"),  # str.isdigit() takes superscripts
        ("partition=device-1@\u00b3:5", "use DEVICE@ROUND:SECONDS"),
        ("drop", "use KEY=VALUE pairs"),
        (",", "injects nothing"),
        ("broker=5", r"use broker=ROUND:term\|kill\[:SECONDS\]"),
        ("broker=5:stop", r"use broker=ROUND:term\|kill"),
        ("broker=0:kill", "use broker=ROUND"),
        ("broker=x:kill", "use broker=ROUND"),
        ("broker=5:kill:0", r"SECONDS must be in \(0, 600\]"),
        ("broker=5:kill:nan", "SECONDS must be in"),
        ("broker=5:kill:2:3", "use broker=ROUND"),
        ("broker=\u00b3:kill", "use broker=ROUND"),
        ("coordinator=5:kill", "use coordinator=ROUND\\[:SECONDS\\]"),
        ("coordinator=-1", "use coordinator=ROUND"),
        ("coordinator=5:1e9", "SECONDS must be in"),
        ("restart=5", r"use restart=DEVICE@ROUND\[:SECONDS\]"),
        ("restart=laptop@5", "is not a device"),
        ("restart=2@", "use restart=DEVICE@ROUND"),
        ("restart=2@5:-1", "SECONDS must be in"),
    ],
)
def test_bad_specs_are_refused_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_chaos(spec)
    assert "\n" not in str(caught.value)


def test_process_faults_parse_with_their_default_down_times() -> None:
    spec = parse_chaos("broker=5:term, broker=9:KILL:0.5,coordinator=7,restart=2@6:3.5")
    assert spec.processes == (
        ProcessFault("broker", 5, 2.0, signal.SIGTERM),
        ProcessFault("broker", 9, 0.5, signal.SIGKILL),
        ProcessFault("coordinator", 7, 2.0, signal.SIGKILL),
        ProcessFault("device-2", 6, 3.5, signal.SIGKILL),
    )
    assert parse_chaos("restart=device-3@4").processes == (
        ProcessFault("device-3", 4, 1.0, signal.SIGKILL),
    )
    assert not spec.network and spec.faults == Faults()  # no proxy for process faults
    mixed = parse_chaos("drop=0,coordinator=3")
    assert mixed.network and mixed.processes[0].key == "coordinator"
    assert broker_faults("drop=0.1, Broker=3:kill") and not broker_faults("coordinator=3")


def test_the_chaos_line_names_each_process_fault() -> None:
    section = {
        "totals": {},
        "devices": {},
        "partitions": [],
        "processes": [
            {"target": "broker", "signal": "SIGKILL", "round": 10, "at_s": 3.0,
             "restarted_at_s": 5.25},
            {"target": "device-2", "signal": "SIGKILL", "round": 12, "at_s": 6.0,
             "restarted_at_s": None},
        ],
    }  # fmt: skip
    assert chaos_line(section) == (
        "chaos: broker SIGKILL in round 10, back after 2.2 s;"
        " device-2 SIGKILL in round 12, never restarted"
    )


def test_a_broker_fault_without_mosquitto_names_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import broker.mosquitto

    def missing() -> str:
        raise ConfigError("mosquitto not found")

    monkeypatch.setattr(broker.mosquitto, "find_mosquitto", missing)
    with pytest.raises(ConfigError, match="apt-get install mosquitto") as caught:
        validate(LocalConfig(agents=4, rounds=6, chaos="broker=2:term"))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chaos": "partition=device-9@2:10"}, "device-9 is not in this fleet"),
        ({"chaos": "partition=1@6:10"}, r"use a round in 1\.\.5"),
        ({"chaos": "drop=0.1", "secure": True}, "TLS hides them"),
        ({"chaos": "drop=0.1", "broker": "mqtts://broker:8883"}, "TLS hides them"),
        ({"chaos": "coordinator=6"}, r"coordinator=6: use a round in 1\.\.5"),
        ({"chaos": "restart=device-9@2"}, "device-9 is not in this fleet"),
        ({"chaos": "restart=2@3", "kill": (("device-2", 4),)}, "--kill also names device-2"),
        ({"chaos": "restart=4@2", "join_at": (3,)}, "it joins after round 3; restart it later"),
        ({"chaos": "broker=2:kill,broker=2:term"}, "broker is stopped twice in round 2"),
        (
            {"chaos": "broker=2:kill", "broker": "mqtt://127.0.0.1:1883"},
            "restarts only a broker it starts itself; drop --broker",
        ),
    ],
)
def test_the_run_refuses_chaos_that_cannot_apply(options: dict[str, object], message: str) -> None:
    config = replace(LocalConfig(agents=4, rounds=6), **options)
    with pytest.raises(ConfigError, match=message) as caught:
        validate(config)
    assert "\n" not in str(caught.value)
