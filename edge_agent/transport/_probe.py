"""Ask a broker, before paho connects, whether it speaks MQTT 5 (raw socket, no paho).

Why a probe: amqtt 0.12 (the embedded broker) speaks only MQTT 3.1.1 and does not refuse
a full MQTT 5 CONNECT. It parses the CONNECT as 3.1.1, reads the v5 property-length and
the Session Expiry Interval bytes as a client-id length (e.g. 0x0511 = 1297 bytes), and
waits for bytes that never come: no CONNACK, the socket stays open until the client
gives up. A *minimal* v5 CONNECT (clean start, no properties, no will, short client id)
parses cleanly as 3.1.1 up to the protocol level, and amqtt then answers the 3.1.1 way
(MQTT-3.1.2-2): a 2-byte CONNACK with return code 0x01 "unacceptable protocol version",
and closes. Decision table on the answer to that probe:

==========================================  =========================================
answer                                       protocol
==========================================  =========================================
CONNACK, remaining length ≥ 3 (v5 layout)    MQTTv5 (any reason code except 0x84)
v5 CONNACK with reason 0x84                  MQTTv311 (unsupported protocol version)
CONNACK, remaining length 2 (3.1.1 layout)   MQTTv311
socket closed without a CONNACK              MQTTv311 (a 3.1.1 server may just close)
nothing within the timeout                   TransportError
TCP connect fails                            BrokerUnreachable
==========================================  =========================================

The probe uses a throw-away client id with clean start, so it never touches the real
client's persistent session, and it ends with a DISCONNECT on a v5 broker.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import time

from meshfl.errors import BrokerUnreachable, TransportError

__all__ = ["probe_protocol"]

_V5_UNSUPPORTED_PROTOCOL = 0x84
_DISCONNECT = b"\xe0\x00"


def _connect_packet(client_id: str) -> bytes:
    cid = client_id.encode()
    # protocol name "MQTT", level 5, flags: clean start, keepalive 10 s, no properties
    variable = b"\x00\x04MQTT\x05\x02\x00\x0a\x00"
    body = variable + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(body)]) + body  # len(body) < 128: one-byte remaining length


def _read_connack(sock: socket.socket, deadline: float) -> bytes:
    data = b""
    while len(data) < 2 or len(data) < 2 + data[1]:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = sock.recv(64)
        if not chunk:
            break
        data += chunk
    return data


def probe_protocol(host: str, port: int, timeout_s: float) -> str:
    """Return "MQTTv5" or "MQTTv311": the best protocol the broker at ``host:port`` speaks.

    Parameters
    ----------
    host, port : str, int
        Broker address.
    timeout_s : float
        Seconds for the TCP connect and the CONNACK together.

    Raises
    ------
    BrokerUnreachable
        The TCP connection failed (refused, no route, timed out).
    TransportError
        The broker accepted TCP but did not answer a CONNECT in time, or sent garbage.

    """
    deadline = time.monotonic() + timeout_s
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise BrokerUnreachable(
            f"cannot reach MQTT broker at {where} ({reason.lower()}); start one with "
            f"`meshfl broker serve --port {port}` or pass the right --broker URL"
        ) from exc
    with sock:
        try:
            sock.sendall(_connect_packet(f"meshfl-probe-{secrets.token_hex(4)}"))
            answer = _read_connack(sock, deadline)
        except TimeoutError as exc:
            raise TransportError(
                f"MQTT broker at {where} accepted TCP but did not answer CONNECT within "
                f"{timeout_s:g} s; is it an MQTT listener (not TLS or WebSocket)?"
            ) from exc
        except OSError:
            return "MQTTv311"  # reset while we talk: a 3.1.1 server refusing level 5
        if len(answer) < 4:
            return "MQTTv311"
        if answer[0] != 0x20:
            raise TransportError(f"MQTT broker at {where} answered CONNECT with a non-CONNACK")
        if answer[1] == 2:
            return "MQTTv311"
        if answer[3] == _V5_UNSUPPORTED_PROTOCOL:
            return "MQTTv311"
        with contextlib.suppress(OSError):
            sock.sendall(_DISCONNECT)
        return "MQTTv5"
