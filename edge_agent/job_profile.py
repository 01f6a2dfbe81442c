"""A job's capability profile: the link figures at its start, re-measured while it runs.

The :class:`~edge_agent.job.JobRunner` sends the coordinator the device's profile
(:mod:`edge_agent.capability_probe`) before the engine starts, with link figures
(:mod:`edge_agent.link_probe`) that are the agent's recent ones when young enough, and
re-measures what changes (link, battery) between rounds every ``profile_refresh_s``
seconds (at least :data:`MIN_REFRESH_S`). The probes are imported only when they run.
"""

from __future__ import annotations

import logging
import time

from edge_agent.transport.base import Transport
from meshfl.contract import CapabilityProfile

__all__ = ["MIN_REFRESH_S", "fresh_link", "measure_link", "refresh_profile"]

log = logging.getLogger("meshfl.agent.job")

MIN_REFRESH_S = 60.0
"""The capability profile is re-measured (link, battery) at most this often while running."""


def fresh_link(
    link: CapabilityProfile | None,
    refresh_s: float,
    transport: Transport,
    fleet: str,
    device_id: str,
) -> CapabilityProfile:
    """The link figures: ``link`` (with ``measured_at``) if young enough, else new ones.

    A probe through a slow link takes seconds (5 × 64 KiB at 1 Mbit/s is 2.6 s) and
    every neighbour waits for it at the start barrier; one made at connect time within
    ``max(MIN_REFRESH_S, refresh_s)`` seconds is reused (``measured_at`` dropped).
    """
    recent = link or {}
    age = time.time() - float(recent.get("measured_at", 0.0))
    if recent and 0 <= age < max(MIN_REFRESH_S, refresh_s):
        return {k: v for k, v in recent.items() if k != "measured_at"}  # type: ignore[return-value]
    return measure_link(transport, fleet, device_id)


def measure_link(transport: Transport, fleet: str, device_id: str) -> CapabilityProfile:
    """Probe the link to the broker now: the profile's rtt and bytes/s fields."""
    from edge_agent.link_probe import measure_link as probe

    link = probe(transport, fleet, device_id)
    log.info(
        "link to the broker: rtt %s s, %s bytes/s (min of up and down)",
        _fmt(link.broker_rtt_s),
        _fmt(link.uplink_bytes_per_s),
    )
    return link.profile_fields()


def refresh_profile(
    profile: CapabilityProfile, transport: Transport, fleet: str, device_id: str
) -> CapabilityProfile:
    """Re-measure what changes while running (link, battery); keep the rest."""
    from edge_agent.capability_probe import battery_status

    fresh = profile.copy()
    fresh.pop("broker_rtt_s", None)  # a figure not measured again is not kept stale
    fresh.pop("uplink_bytes_per_s", None)
    fresh.pop("downlink_bytes_per_s", None)
    fresh.update(measure_link(transport, fleet, device_id))
    fresh["battery_percent"], fresh["charging"] = battery_status()
    fresh["measured_at"] = time.time()
    return fresh


def _fmt(value: float | None) -> str:
    return "unmeasured" if value is None else f"{value:.3g}"
