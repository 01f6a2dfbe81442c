"""Bridged Mosquitto brokers: one fleet spread over several brokers, joined by Mosquitto bridges.

Past one broker, meshfl runs on an existing distributed engine, never on a relay of its
own: an MQTT broker cluster (EMQX, HiveMQ, VerneMQ) or Mosquitto bridges. This module
writes the bridge part of a Mosquitto configuration (:func:`bridge_config`) and runs a
hub-and-leaves layout on loopback (:class:`BridgedBrokers`): broker 0 is the *hub* (the
coordinator's broker); every other broker is a *leaf* whose bridge connects to the hub
and carries the fleet's topics both ways, so a leaf-to-leaf message crosses two bridges.
``docs/scaling.md`` explains the layout, what it guarantees and how it maps onto a cluster.

The choices, with the reasons also written into the generated configuration:

- ``bridge_protocol_version mqttv311`` with ``try_private true``: the hub knows the
  client is a bridge, so it never sends a bridged message back (no loop, no duplicate)
  and keeps each message's retain flag (retained statuses and Last Wills stay retained
  on both sides). Mosquitto 2.0's MQTT 5 bridge sends no Session Expiry Interval, so the
  hub would drop the bridge's session at each disconnect (eclipse/mosquitto #2424, #2793);
  the 3.1.1 session persists.
- ``cleansession false`` and ``local_cleansession false``: QoS 1 messages for the other
  side are queued (on the hub for the leaf, on the leaf for the hub) while the bridge is
  down, within the queue limits of :class:`~broker.tuning.MosquittoTuning`, which both
  brokers share.
- ``bridge_max_packet_size``: the hub's ``max_packet_size``, so that a message the hub would
  refuse is dropped by the leaf (with a log line) instead of tearing the bridge down.
- Only the fleet's topics (:data:`BRIDGE_TOPICS`); an agent's probe stays on its broker.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from types import TracebackType

from broker.mosquitto import MosquittoProcess
from broker.tuning import MosquittoTuning
from meshfl.errors import ConfigError, TransportError
from meshfl.wire.topics import TOPIC_ROOT

__all__ = ["BRIDGE_TOPICS", "MAX_BROKERS", "BridgedBrokers", "BridgedMosquitto", "bridge_config"]

BRIDGE_TOPICS = (
    f"{TOPIC_ROOT}/+/node/+/delta",
    f"{TOPIC_ROOT}/+/node/+/status",
    f"{TOPIC_ROOT}/+/node/+/inbox/+",
    f"{TOPIC_ROOT}/+/control",
)
"""The topic patterns a bridge carries: every wire v1 topic but the probe (which an agent
publishes to read it back from its own broker)."""

PROTOCOLS = ("mqttv311", "mqttv50")
MAX_BROKERS = 8
"""Most brokers :class:`BridgedBrokers` runs (one hub, seven leaves)."""


def bridge_config(
    name: str,
    remote_port: int,
    *,
    remote_host: str = "127.0.0.1",
    topics: tuple[str, ...] = BRIDGE_TOPICS,
    qos: int = 1,
    protocol: str = "mqttv311",
    keepalive_s: int = 10,
    restart_timeout_s: tuple[int, int] = (1, 5),
    max_packet_bytes: int | None = None,
) -> str:
    """Return the commented lines of one Mosquitto 2 bridge, to append to a broker's config.

    Parameters
    ----------
    name : str
        The connection name, also the bridge's client id on the remote broker (local
        client id ``{name}.local``); 1-64 characters of ``A-Z a-z 0-9 _ . -``.
    remote_port : int
        The remote broker's MQTT port (1-65535).
    remote_host : str, default "127.0.0.1"
        The remote broker's address.
    topics : tuple of str, default :data:`BRIDGE_TOPICS`
        Topic patterns carried both ways, without remapping.
    qos : int, default 1
        QoS of the bridge's subscriptions on both sides: 1 keeps deltas at least once end
        to end (a message crosses at the lower of its own QoS and this).
    protocol : {"mqttv311", "mqttv50"}, default "mqttv311"
        The bridge's MQTT version; see the module docstring for why 3.1.1.
    keepalive_s : int, default 10
        Seconds between the bridge's pings; a dead link is noticed within about 1.5× this
        (Mosquitto's minimum is 5).
    restart_timeout_s : (int, int), default (1, 5)
        Reconnect backoff base and cap in seconds (Mosquitto's jittered backoff).
    max_packet_bytes : int or None
        ``bridge_max_packet_size``: larger messages are not forwarded. None: not limited
        beyond what an MQTT 5 remote announces.

    Returns
    -------
    str
        The bridge lines, newline-terminated.

    Raises
    ------
    ConfigError
        A bad name, host, pattern (empty, with a space or control character), QoS,
        protocol, port or timing.

    """
    _check(name, remote_host, topics)
    if qos not in (0, 1, 2):
        raise ConfigError(f"a bridge's QoS must be 0, 1 or 2 (got {qos!r})")
    if protocol not in PROTOCOLS:
        raise ConfigError(f"bridge protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}")
    if not 1 <= remote_port <= 65535:
        raise ConfigError(f"bridge remote port {remote_port} is not a TCP port")
    base, cap = restart_timeout_s
    if keepalive_s < 5 or not 1 <= base <= cap:
        raise ConfigError("a bridge needs keepalive_s >= 5 and 1 <= restart base <= cap seconds")
    lines = [
        f"# Bridge {name}: this broker <-> {remote_host}:{remote_port} (broker/bridge.py).",
        f"connection {name}",
        f"address {remote_host}:{remote_port}",
        f"remote_clientid {name}",
        f"local_clientid {name}.local",
        "# MQTT 3.1.1 with try_private: the remote knows this is a bridge, so it sends no",
        "# message back (no loop) and keeps retain flags (statuses, Last Wills). Mosquitto",
        "# 2.0's MQTT 5 bridge sends no session expiry: its remote session would not persist.",
        f"bridge_protocol_version {protocol}",
        "try_private true",
        "# Persistent sessions on both sides: QoS 1 messages wait while the bridge is down,",
        "# up to each broker's max_queued_messages / max_queued_bytes (then dropped).",
        "cleansession false",
        "local_cleansession false",
        "# Topics change only with a new meshfl version: no unsubscribe churn on restart.",
        "bridge_attempt_unsubscribe false",
        "start_type automatic",
        f"restart_timeout {base} {cap}",
        f"keepalive_interval {keepalive_s}",
        "# $SYS/broker/connection/<name>/state: 1 while connected, 0 (its Will) when not.",
        "notifications true",
    ]
    if max_packet_bytes is not None:
        lines += [
            "# A message larger than the remote accepts is dropped here, not sent (which",
            "# would get the bridge disconnected and the message retried for ever).",
            f"bridge_max_packet_size {max_packet_bytes}",
        ]
    lines += [f"topic {pattern} both {qos}" for pattern in topics]
    return "\n".join(lines) + "\n"


def _check(name: str, host: str, topics: tuple[str, ...]) -> None:
    from meshfl.wire.topics import validate_id

    validate_id(name, "bridge name")
    if not topics:
        raise ConfigError("a bridge needs at least one topic pattern")
    for what, text in (("host", host), *(("topic pattern", t) for t in topics)):
        if not text or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
            raise ConfigError(
                f"bridge {what} {text!r} is empty or holds a space or control character"
            )


class BridgedMosquitto(MosquittoProcess):
    """A :class:`~broker.mosquitto.MosquittoProcess` that can wait for lines in its log.

    Its ``extra_lines`` carry a bridge (:func:`bridge_config`), ``sys_interval`` and extra
    ``log_type`` lines; parameters and errors are the base class's.
    """

    def log_size(self) -> int:
        """Bytes in the log now (0 before the first start): an offset for :meth:`wait_logged`."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def wait_logged(self, needles: list[str], offset: int, timeout_s: float) -> bool:
        """Wait until every string of ``needles`` is in the log after byte ``offset``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.running:
            with contextlib.suppress(OSError), self.log_path.open("rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
                if all(n in text for n in needles):
                    return True
            time.sleep(0.02)
        return False


class BridgedBrokers:
    """``count`` Mosquitto brokers on loopback: a hub and leaves bridged to it.

    Parameters
    ----------
    workdir : Path
        Each broker gets ``workdir/broker-{i}`` (config, log, persistence).
    count : int, default 2
        Brokers, 1 to :data:`MAX_BROKERS`; 1 is a single Mosquitto (no bridge), the
        baseline of a comparison.
    tuning : MosquittoTuning or None
        Limits shared by every broker (a bridged message must fit all of them); None: the
        defaults. The bridges' ``bridge_max_packet_size`` is its ``max_packet_bytes``.
    sys_interval_s : int, default 0
        Seconds between ``$SYS`` updates (``$SYS/broker/bytes/received`` ...); 0: none.
    topics : tuple of str, default :data:`BRIDGE_TOPICS`
        What the bridges carry.
    start_timeout_s : float, default 10.0
        Seconds :meth:`start` waits for each broker's port, then for each bridge.

    Raises
    ------
    ConfigError
        ``count`` out of range, Mosquitto missing, a port in use.
    TransportError
        A broker did not start, or a bridge did not subscribe on the hub in time.

    """

    def __init__(
        self,
        workdir: Path,
        count: int = 2,
        *,
        tuning: MosquittoTuning | None = None,
        sys_interval_s: int = 0,
        topics: tuple[str, ...] = BRIDGE_TOPICS,
        start_timeout_s: float = 10.0,
    ):
        if not 1 <= count <= MAX_BROKERS:
            raise ConfigError(f"run 1 to {MAX_BROKERS} bridged brokers (got {count})")
        if sys_interval_s < 0:
            raise ConfigError(f"sys_interval_s must be >= 0 seconds (got {sys_interval_s})")
        self.tuning = tuning or MosquittoTuning()
        self.topics = topics
        self.start_timeout_s = start_timeout_s
        common = [f"sys_interval {sys_interval_s}"] if sys_interval_s else []
        # The hub logs each subscription: how start() knows a bridge's topics are in place.
        self.hub = BridgedMosquitto(
            workdir=Path(workdir) / "broker-0", tuning=self.tuning,
            extra_lines=(*common, "log_type subscribe"), start_timeout_s=start_timeout_s,
        )  # fmt: skip
        self.leaves = [self._leaf(Path(workdir), i, common) for i in range(1, count)]

    def _leaf(self, workdir: Path, index: int, common: list[str]) -> BridgedMosquitto:
        bridge = bridge_config(
            self.bridge_name(index), self.hub.port, topics=self.topics,
            max_packet_bytes=self.tuning.max_packet_bytes,
        )  # fmt: skip
        return BridgedMosquitto(
            workdir=workdir / f"broker-{index}", tuning=self.tuning,
            extra_lines=(*common, *bridge.splitlines()), start_timeout_s=self.start_timeout_s,
        )  # fmt: skip

    @staticmethod
    def bridge_name(index: int) -> str:
        """The bridge of leaf ``index``: ``meshfl-bridge-{index}`` (its client id on the hub)."""
        return f"meshfl-bridge-{index}"

    @property
    def brokers(self) -> list[BridgedMosquitto]:
        """The hub, then the leaves."""
        return [self.hub, *self.leaves]

    @property
    def urls(self) -> list[str]:
        """``mqtt://127.0.0.1:PORT`` of each broker, hub first."""
        return [b.url for b in self.brokers]

    def url_for(self, index: int) -> str:
        """The broker of agent ``index``: agents alternate over the brokers, hub first."""
        return self.urls[index % len(self.brokers)]

    def start(self) -> None:
        """Start the hub, then the leaves, and wait until every bridge is subscribed on the hub."""
        offset = self.hub.log_size()
        self.hub.start()
        try:
            for leaf in self.leaves:
                leaf.start()
            self.wait_bridged(offset)
        except BaseException:
            self.stop()
            raise

    def wait_bridged(self, hub_log_offset: int, timeout_s: float | None = None) -> None:
        """Wait until each leaf's bridge has subscribed to every topic on the hub.

        ``hub_log_offset`` is :meth:`BridgedMosquitto.log_size` of the hub before the
        (re)connection; ``timeout_s`` None means ``start_timeout_s``. From then on a message
        published on any broker reaches subscribers on all of them. Raises
        :class:`~meshfl.errors.TransportError` after the timeout, quoting the leaf's log.
        """
        for i, leaf in enumerate(self.leaves, start=1):
            needles = [f" {self.bridge_name(i)} 1 {pattern}" for pattern in self.topics]
            wait = self.start_timeout_s if timeout_s is None else timeout_s
            if not self.hub.wait_logged(needles, hub_log_offset, wait):
                raise TransportError(
                    f"the bridge of broker {i} did not connect to the hub within {wait:g} s:"
                    f" {leaf._log_tail()}"
                )

    def stop(self) -> None:
        """Stop the leaves, then the hub (SIGTERM: each saves its persistence)."""
        for broker in reversed(self.brokers):
            broker.stop()

    def __enter__(self) -> BridgedBrokers:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
