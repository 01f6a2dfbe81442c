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
TLS: certificate does not verify             ConfigError (wrong CA, or host not in cert)
TLS: handshake fails otherwise               TransportError (not a TLS listener?)
plain: a TLS alert comes back                ConfigError (a TLS listener: use mqtts://)
==========================================  =========================================

Over TLS (``mqtts://``) the probe runs inside the same TLS context as the real client.
It carries no username, so a broker that requires logins answers it with a refusal
(reason 0x86/0x87 in a v5 CONNACK, which still says "MQTT 5"): a broker log line "not
authorised" per agent connection is the probe, not the agent's own login.

The probe uses a throw-away client id with clean start, so it never touches the real
client's persistent session, and it ends with a DISCONNECT on a v5 broker.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import ssl
import time

from meshfl.errors import BrokerUnreachable, ConfigError, TransportError

__all__ = ["probe_protocol"]

_V5_UNSUPPORTED_PROTOCOL = 0x84
_DISCONNECT = b"\xe0\x00"
_TLS_ALERT = 0x15  # TLS record type "alert": a TLS listener answering plain bytes


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


def _wrap(sock: socket.socket, context: ssl.SSLContext, host: str, where: str) -> socket.socket:
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise ConfigError(
            f"the broker at {where} presented a TLS certificate that does not verify"
            f" ({exc.verify_message}); check --broker-ca and that {host} is in the certificate"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        sock.close()
        raise TransportError(
            f"TLS handshake with the broker at {where} failed ({exc}); is it a TLS listener"
            " (mqtts://), and is this the right port?"
        ) from None


def probe_protocol(
    host: str, port: int, timeout_s: float, context: ssl.SSLContext | None = None
) -> str:
    """Return "MQTTv5" or "MQTTv311": the best protocol the broker at ``host:port`` speaks.

    Parameters
    ----------
    host, port : str, int
        Broker address.
    timeout_s : float
        Seconds for the TCP connect, the TLS handshake and the CONNACK together.
    context : ssl.SSLContext or None
        The TLS context of an ``mqtts://`` broker; None: plain TCP.

    Raises
    ------
    BrokerUnreachable
        The TCP connection failed (refused, no route, timed out).
    ConfigError
        The broker's certificate does not verify, or a plain connection reached a TLS
        listener.
    TransportError
        The broker accepted TCP but did not answer a CONNECT in time, sent garbage, or
        the TLS handshake failed.

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
    if context is not None:
        sock = _wrap(sock, context, host, where)
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
        if answer[:1] == bytes([_TLS_ALERT]) and context is None:
            raise ConfigError(
                f"the broker at {where} speaks TLS; use mqtts://{where} (and --broker-ca)"
            )
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
