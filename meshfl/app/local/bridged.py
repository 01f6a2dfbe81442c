"""``meshfl local --brokers N``: the fleet spread over N Mosquitto brokers joined by bridges.

Instead of the embedded broker, the run starts :class:`broker.bridge.BridgedBrokers` in
``OUT/brokers`` (``broker-0`` is the hub, ``broker-1`` ... the leaves, each with its
config, log and persistence): the coordinator uses the hub, and agent ``device-i``
connects to broker ``i mod N``, so with two brokers half the agents sit on each and every
delta between them crosses the bridge. ``$SYS`` statistics are on (every second): the
report's ``brokers`` section gives each broker's bytes received and sent, read after the
job (bridge traffic counts at both of its ends). See ``docs/scaling.md``.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshfl.errors import ConfigError, MeshflError

if TYPE_CHECKING:
    from broker.bridge import BridgedBrokers
    from meshfl.app.local.config import LocalConfig

__all__ = [
    "brokers_line",
    "brokers_section",
    "check_bridged_options",
    "start_bridged",
]

SYS_INTERVAL_S = 1
"""Seconds between the brokers' ``$SYS`` updates in a bridged run."""


def check_bridged_options(config: LocalConfig) -> None:
    """Refuse options that cannot run on bridged brokers.

    Raises
    ------
    meshfl.errors.ConfigError
        ``--brokers`` out of 1-8, or N > 1 with ``--broker`` (the run starts its own
        brokers), ``--secure`` (TLS and ACLs for bridges are not generated), ``--link`` or
        ``--chaos`` (their proxies lead to one broker).

    """
    from broker.bridge import MAX_BROKERS

    if not 1 <= config.brokers <= MAX_BROKERS:
        raise ConfigError(f"--brokers must be between 1 and {MAX_BROKERS} (got {config.brokers})")
    if config.brokers == 1:
        return
    conflicts = {
        "--broker": config.broker is not None,
        "--secure": config.secure,
        "--link": bool(config.links),
        "--chaos": bool(config.chaos),
    }
    for option, given in conflicts.items():
        if given:
            raise ConfigError(
                f"--brokers {config.brokers} starts its own bridged Mosquitto brokers and does"
                f" not combine with {option}; drop one of them"
            )


def start_bridged(out: Path, count: int) -> BridgedBrokers:
    """Start ``count`` bridged brokers in ``out/brokers`` (a previous run's state removed).

    Raises
    ------
    meshfl.errors.ConfigError
        Mosquitto is not installed.
    meshfl.errors.MeshflError
        A broker or a bridge did not come up (the message quotes the broker's log).

    """
    from broker.bridge import BridgedBrokers

    workdir = (out / "brokers").resolve()
    if workdir.exists():  # a previous run's sessions and retained statuses must not come back
        shutil.rmtree(workdir)
    brokers = BridgedBrokers(workdir, count, sys_interval_s=SYS_INTERVAL_S, start_timeout_s=30.0)
    try:
        brokers.start()
    except ConfigError:
        raise
    except MeshflError as exc:
        raise MeshflError(f"the bridged Mosquitto brokers failed to start: {exc}") from None
    return brokers


def brokers_section(brokers: BridgedBrokers, agents: int) -> dict[str, Any]:
    """The report's ``brokers`` section: layout, URLs, each agent's broker, bytes per broker.

    ``bytes`` lists ``{"url", "received", "sent"}`` per broker, hub first (``None`` values
    when one could not be read); the brokers are read in parallel, in about a second.
    """
    from edge_agent.transport.mqtt_utils import sys_bytes

    urls = brokers.urls
    readings: dict[str, dict[str, int] | None] = {}
    threads = [
        threading.Thread(target=lambda u=url: readings.__setitem__(u, sys_bytes(u))) for url in urls
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "layout": "bridged" if len(urls) > 1 else "single",
        "urls": urls,
        "agents": {f"device-{i}": brokers.url_for(i) for i in range(agents)},
        "bytes": [
            {"url": url, **(readings.get(url) or {"received": None, "sent": None})} for url in urls
        ],
        "directory": str(brokers.hub.workdir.parent),
    }


def brokers_line(section: dict[str, Any]) -> str:
    """One line for the operator: the brokers, and the bytes each received and sent (MB)."""
    parts = []
    for i, entry in enumerate(section["bytes"]):
        role = "hub" if i == 0 else f"leaf {i}"
        moved = (
            "bytes not read"
            if entry["received"] is None
            else f"{entry['received'] / 1e6:.3f} MB in, {entry['sent'] / 1e6:.3f} MB out"
        )
        parts.append(f"{role} {entry['url']} ({moved})")
    return f"{len(parts)} bridged Mosquitto brokers: " + "; ".join(parts)
