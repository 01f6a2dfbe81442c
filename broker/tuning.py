"""The Mosquitto settings behind meshfl's delivery guarantees, with the reasons in the config.

Deltas travel at QoS 1 on persistent sessions; what Mosquitto keeps, for how long and
what it drops silently decide what a receiver can miss. :class:`MosquittoTuning` holds
those settings and :func:`tuning_lines` writes them, commented, into both generated
configurations (:func:`broker.mosquitto.mosquitto_config` and
:func:`broker.secure.secure_mosquitto_config`). The loss window they leave is in
``docs/reliability.md``:

- SIGTERM: Mosquitto writes its database on exit; nothing is lost.
- SIGKILL or power loss: everything that changed since the last autosave (at most
  ``autosave_interval_s`` seconds) is lost — QoS 1 messages it had acknowledged but not yet
  delivered, sessions and subscriptions made meanwhile, retained status changes.
- A full per-client queue (``max_queued_messages`` / ``max_queued_bytes``): newer QoS 1
  messages for that client are dropped, and only the broker log says so
  ("Outgoing messages are being dropped for client ..."; our configs log notices).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshfl.errors import ConfigError

__all__ = [
    "MAX_PACKET_BYTES",
    "MosquittoTuning",
    "persistence_lines",
    "runtime_lines",
    "tuning_lines",
]

MAX_PACKET_BYTES = 4 * 1024 * 1024
"""Largest MQTT packet accepted by default: a 1 MiB un-chunked payload (keyframes in tests) fits."""


@dataclass(frozen=True)
class MosquittoTuning:
    """Mosquitto limits and persistence cadence (defaults: what meshfl's configs use).

    Attributes
    ----------
    max_packet_bytes : int, default 4 MiB
        ``max_packet_size``: larger packets get the client disconnected (0x95). Announced
        to MQTT 5 clients in CONNACK; agents chunk under it.
    max_inflight_messages : int, default 20
        QoS 1 messages in flight per client, each way. Announced to MQTT 5 clients as
        Receive Maximum; agents cap their in-flight window at it.
    max_queued_messages : int, default 10000
        QoS 1 messages queued per client beyond its in-flight window (or while it is
        offline with a persistent session). 10,000 keeps the per-message bookkeeping of a
        queue bounded when chunks are small; at the default 128 KiB chunks
        ``max_queued_bytes`` is the limit that binds first.
    max_queued_bytes : int, default 256 MiB
        Payload bytes queued per client: a device away for ``R`` rounds with ``d``
        neighbours sending ``S``-byte deltas needs ``R * d * S`` (e.g. 25 rounds of four
        2.5 MB deltas). Beyond either queue limit Mosquitto drops newer messages silently.
    autosave_interval_s : int, default 2
        Seconds between saves of the in-memory database: the SIGKILL loss window. Each
        save rewrites the whole database (sessions, retained and queued messages) from
        Mosquitto's single thread: a few ms every 2 s for a typical fleet, but up to the
        queued bytes of all offline clients in the worst case.
    persistent_client_expiration : str, default "1h"
        How long an offline persistent session is kept (Mosquitto's syntax, e.g. ``1h``,
        ``2d``); matches the agents' MQTT 5 Session Expiry Interval (3600 s), so 3.1.1
        sessions expire like MQTT 5 ones.

    Raises
    ------
    ConfigError
        A limit that is not a positive integer, or a malformed expiration.

    """

    max_packet_bytes: int = MAX_PACKET_BYTES
    max_inflight_messages: int = 20
    max_queued_messages: int = 10_000
    max_queued_bytes: int = 256 * 1024 * 1024
    autosave_interval_s: int = 2
    persistent_client_expiration: str = "1h"

    def __post_init__(self) -> None:
        for name in (
            "max_packet_bytes",
            "max_inflight_messages",
            "max_queued_messages",
            "max_queued_bytes",
            "autosave_interval_s",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"Mosquitto {name} must be a positive integer, got {value!r}")
        expiry = self.persistent_client_expiration
        if not (len(expiry) >= 2 and expiry[:-1].isdigit() and expiry[-1] in "hdwmy"):
            raise ConfigError(
                f"persistent_client_expiration must look like 1h, 2d, 1w, 1m or 1y, got {expiry!r}"
            )


def tuning_lines(tuning: MosquittoTuning) -> list[str]:
    """Return the commented limit lines of a Mosquitto 2 config for ``tuning``."""
    t = tuning
    return [
        "# Packets over this size get the client disconnected (0x95); MQTT 5 clients learn",
        "# it from CONNACK and meshfl agents chunk their deltas under it.",
        f"max_packet_size {t.max_packet_bytes}",
        "# QoS 1 messages in flight per client; MQTT 5 clients learn it as Receive Maximum",
        "# and meshfl agents cap their own in-flight window at it.",
        f"max_inflight_messages {t.max_inflight_messages}",
        "# Per-client queue of QoS 1 messages beyond the in-flight window or for an offline",
        "# persistent session. Mosquitto drops newer messages SILENTLY when either limit is",
        "# hit (only a notice in the log), so size them for the longest absence you want to",
        "# survive: rounds away x neighbours x delta bytes (see docs/reliability.md).",
        f"max_queued_messages {t.max_queued_messages}",
        f"max_queued_bytes {t.max_queued_bytes}",
        "queue_qos0_messages false",
        "# Offline persistent sessions are kept this long (the agents' MQTT 5 session",
        "# expiry is 1 h); 3.1.1 sessions (clean_session=false) then expire like MQTT 5 ones.",
        f"persistent_client_expiration {t.persistent_client_expiration}",
    ]


def persistence_lines(persistence_dir: str, tuning: MosquittoTuning) -> list[str]:
    """Return the persistence lines: on disk in ``persistence_dir``, saved every few seconds."""
    return [
        "# Sessions, subscriptions, retained and queued QoS 1 messages survive a restart.",
        "# Saved on a clean exit (SIGTERM: nothing lost) and every autosave_interval",
        "# seconds: a crash (SIGKILL) loses what changed since the last save.",
        "persistence true",
        f"persistence_location {persistence_dir.rstrip('/')}/",
        f"autosave_interval {tuning.autosave_interval_s}",
        "autosave_on_changes false",
    ]


def runtime_lines(
    persistence_dir: Path | None,
    log_file: Path | None,
    run_as_user: str | None,
    *,
    information: bool = False,
    tuning: MosquittoTuning | None = None,
) -> list[str]:
    """Return the config lines every meshfl Mosquitto shares: user, persistence, logging.

    ``information`` also logs Mosquitto's information messages (each login and reload;
    the fleet broker keeps them as an audit trail). ``tuning`` gives the autosave
    interval (None: :class:`~broker.tuning.MosquittoTuning`'s default).
    """
    lines = [f"user {run_as_user}"] if run_as_user else []
    if persistence_dir is not None:
        lines += persistence_lines(str(persistence_dir), tuning or MosquittoTuning())
    else:
        lines.append("persistence false")
    lines += [
        f"log_dest file {log_file}" if log_file is not None else "log_dest stderr",
        "log_type error",
        "log_type warning",
        "log_type notice",
        *(["log_type information"] if information else []),
        "connection_messages true",
        "log_timestamp true",
    ]
    return lines
