"""The link shaping proxy of ``meshfl local --link``: real sockets on loopback."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from meshfl.app.local.lab.shaping import LinkSpec, ShapingProxy, parse_link
from meshfl.errors import ConfigError

FAST = LinkSpec(rate_bytes_per_s=1e9, latency_s=0.0)


class _Handler(socketserver.BaseRequestHandler):
    """Echo (the default); ``sink N``: read N bytes, answer b"ok"; b"CLOSE" hangs up."""

    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        self.server.connections += 1
        while data := sock.recv(65536):
            self.server.received.extend(data)
            if data.endswith(b"CLOSE"):
                return  # the upstream side closes first
            if self.server.sink is None:
                sock.sendall(data)
            elif len(self.server.received) >= self.server.sink:
                sock.sendall(b"ok")
        self.server.saw_eof.set()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, sink: int | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.sink = sink
        self.received = bytearray()
        self.connections = 0
        self.saw_eof = threading.Event()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@pytest.fixture
def echo() -> Iterator[_Server]:
    server = _Server()
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def sink() -> Iterator[_Server]:
    server = _Server(sink=100_000)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _proxy(server: _Server, link: LinkSpec) -> tuple[ShapingProxy, socket.socket]:
    proxy = ShapingProxy("127.0.0.1", server.port, link)
    port = proxy.start()
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    return proxy, client


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(65536, n - got))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


@pytest.mark.parametrize("link", [FAST, LinkSpec(50e6, 0.01)], ids=["fast", "50MBps-10ms"])
def test_bytes_arrive_intact_and_in_order_both_ways(echo: _Server, link: LinkSpec) -> None:
    rng = np.random.default_rng(0)
    payloads = [rng.bytes(n) for n in (1, 7, 4096, 4097, 65_537, 200_000)]
    proxy, client = _proxy(echo, link)
    try:
        for payload in payloads:
            sender = threading.Thread(target=client.sendall, args=(payload,))
            sender.start()
            back = _recv_exactly(client, len(payload))
            sender.join()
            assert back == payload  # downstream: the echo, byte for byte
        sent = b"".join(payloads)
        assert bytes(echo.received) == sent  # upstream: what the server read
        assert proxy.bytes_up == proxy.bytes_down == len(sent)
    finally:
        client.close()
        proxy.stop()


def test_100_kb_at_1_mbit_per_s_takes_at_least_0_75_s(sink: _Server) -> None:
    proxy, client = _proxy(sink, parse_link("1mbit"))
    try:
        started = time.monotonic()
        client.sendall(bytes(100_000))
        answer = _recv_exactly(client, 2)
        elapsed = time.monotonic() - started
    finally:
        client.close()
        proxy.stop()

    assert answer == b"ok"
    # (100 000 − 4 096 burst) bytes / 125 000 bytes/s = 0.767 s: a physical lower bound
    assert elapsed >= 0.75


def test_a_200_ms_link_has_an_echo_rtt_of_at_least_0_19_s(echo: _Server) -> None:
    proxy, client = _proxy(echo, parse_link("100mbit:200ms"))
    try:
        rtts = []
        for _ in range(2):
            started = time.monotonic()
            client.sendall(b"x")
            assert _recv_exactly(client, 1) == b"x"
            rtts.append(time.monotonic() - started)
    finally:
        client.close()
        proxy.stop()

    assert min(rtts) >= 0.19


def test_upstream_close_propagates_to_the_client(echo: _Server) -> None:
    proxy, client = _proxy(echo, FAST)
    try:
        client.sendall(b"CLOSE")
        assert client.recv(10) == b""  # EOF, not a timeout
    finally:
        client.close()
        proxy.stop()


def test_client_close_propagates_to_the_server(echo: _Server) -> None:
    proxy, client = _proxy(echo, FAST)
    try:
        client.sendall(b"hello")
        assert _recv_exactly(client, 5) == b"hello"
        client.close()
        assert echo.saw_eof.wait(5.0)
    finally:
        proxy.stop()


def test_stop_closes_open_connections_and_an_absent_target_closes_at_once(echo: _Server) -> None:
    proxy, client = _proxy(echo, FAST)
    client.sendall(b"hi")
    assert _recv_exactly(client, 2) == b"hi"
    proxy.stop()
    assert client.recv(10) == b""
    client.close()

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    dead = ShapingProxy("127.0.0.1", closed.getsockname()[1], FAST)
    try:
        with socket.create_connection(("127.0.0.1", dead.start()), timeout=5) as orphan:
            assert orphan.recv(10) == b""
    finally:
        dead.stop()
        closed.close()


@pytest.mark.parametrize(
    ("text", "rate", "latency"),
    [
        ("1mbit:200ms", 125_000.0, 0.2),
        ("1MBIT:200MS", 125_000.0, 0.2),
        ("256kbit:1.5s", 32_000.0, 1.5),
        ("1gbit:0ms", 125e6, 0.0),
        ("10kbyte:20ms", 10_000.0, 0.02),
        ("2mbyte", 2e6, 0.0),
        (" 0.5mbit:50ms ", 62_500.0, 0.05),
    ],
)
def test_parse_link(text: str, rate: float, latency: float) -> None:
    link = parse_link(text)

    assert link.rate_bytes_per_s == pytest.approx(rate)
    assert link.latency_s == pytest.approx(latency)


@pytest.mark.parametrize(
    "text",
    ["", "1mbit:", "1mb:200ms", "fast", "1mbit:200", "1mbit:2min", "0mbit:10ms", "1..2mbit",
     "-1mbit", "1mbit:200ms:3", "mbit"],
)  # fmt: skip
def test_parse_link_refuses_bad_specs_in_one_line(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_link(text)

    assert "\n" not in str(info.value)
    assert "1mbit:200ms" in str(info.value) or "positive" in str(info.value)


@pytest.mark.parametrize(
    ("rate", "latency"), [(0.0, 0.0), (-1.0, 0.0), (float("inf"), 0.0), (1.0, -0.1)]
)
def test_link_spec_validates(rate: float, latency: float) -> None:
    with pytest.raises(ConfigError, match="link"):
        LinkSpec(rate, latency)
