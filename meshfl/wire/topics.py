"""MQTT topic scheme of wire v1: builders, a parser, and the id rule that keeps ACLs safe.

::

    meshfl/v1/{fleet}/node/{device}/delta      a device's deltas, fanned out by the broker
    meshfl/v1/{fleet}/node/{device}/status     retained liveness (and Last Will "offline")
    meshfl/v1/{fleet}/node/{dst}/inbox/{src}   per-edge messages from src to dst
    meshfl/v1/{fleet}/node/{device}/probe      a device's link probe, looped back to itself
    meshfl/v1/{fleet}/control                  coordinator → agents
    meshfl/v1/{fleet}/node/+/status            (filter) the coordinator watches liveness

Every id is ``[A-Za-z0-9_.-]{1,64}``, so it can never contain the topic separator ``/``
or the wildcards ``+`` and ``#``: a device may be granted exactly the topics that carry
its own id (``.../node/{id}/...`` for delta, status and probe, ``.../inbox/{id}`` as
src). The probe topic is written and read by its own device only: the agent measures its
round trip and throughput to the broker *through* the broker by publishing there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from meshfl.errors import ConfigError, VersionError, WireError

__all__ = [
    "TOPIC_ROOT",
    "TopicInfo",
    "TopicKind",
    "control_topic",
    "delta_topic",
    "inbox_filter",
    "inbox_topic",
    "parse_topic",
    "probe_topic",
    "status_filter",
    "status_topic",
    "validate_id",
]

TOPIC_ROOT = "meshfl/v1"
"""Prefix of every wire v1 topic."""

TopicKind = Literal["delta", "status", "probe", "inbox", "control"]
_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_VERSION = re.compile(r"v[0-9]+")
_NODE_KINDS: dict[str, TopicKind] = {"delta": "delta", "status": "status", "probe": "probe"}


def validate_id(value: str, what: str = "device id") -> str:
    """Return ``value`` if it is a valid fleet, job or device id.

    Parameters
    ----------
    value : str
        1 to 64 characters from ``A-Z a-z 0-9 _ . -`` (ASCII only).
    what : str, default "device id"
        What the id names, for the error message.

    Raises
    ------
    ConfigError
        If ``value`` is not a str or breaks the rule (``/``, ``+``, ``#``, spaces, ...).

    """
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        raise ConfigError(
            f"invalid {what} {value!r}: use 1-64 characters from A-Z, a-z, 0-9, '_', '.', '-'"
        )
    return value


def delta_topic(fleet: str, device: str) -> str:
    """Return ``meshfl/v1/{fleet}/node/{device}/delta``; raises ConfigError on a bad id."""
    return f"{_node(fleet, device)}/delta"


def status_topic(fleet: str, device: str) -> str:
    """Return ``meshfl/v1/{fleet}/node/{device}/status``; raises ConfigError on a bad id."""
    return f"{_node(fleet, device)}/status"


def status_filter(fleet: str) -> str:
    """Return ``meshfl/v1/{fleet}/node/+/status``: every device's status, to subscribe to.

    The coordinator watches this filter to learn of each device's ``online`` or Last Will
    ``offline`` at once (:mod:`coordinator.presence`). Raises ConfigError on a bad fleet id.
    """
    return f"{TOPIC_ROOT}/{validate_id(fleet, 'fleet id')}/node/+/status"


def probe_topic(fleet: str, device: str) -> str:
    """Return ``meshfl/v1/{fleet}/node/{device}/probe``; raises ConfigError on a bad id."""
    return f"{_node(fleet, device)}/probe"


def inbox_topic(fleet: str, dst: str, src: str) -> str:
    """Return ``meshfl/v1/{fleet}/node/{dst}/inbox/{src}``; raises ConfigError on a bad id."""
    return f"{_node(fleet, dst)}/inbox/{validate_id(src, 'source device id')}"


def inbox_filter(fleet: str, dst: str) -> str:
    """Return ``meshfl/v1/{fleet}/node/{dst}/inbox/+``: every inbox topic of ``dst``."""
    return f"{_node(fleet, dst)}/inbox/+"


def control_topic(fleet: str) -> str:
    """Return ``meshfl/v1/{fleet}/control``; raises ConfigError on a bad fleet id."""
    return f"{TOPIC_ROOT}/{validate_id(fleet, 'fleet id')}/control"


def _node(fleet: str, device: str) -> str:
    return f"{TOPIC_ROOT}/{validate_id(fleet, 'fleet id')}/node/{validate_id(device)}"


@dataclass(frozen=True)
class TopicInfo:
    """A parsed wire v1 topic.

    ``device`` is the node the topic belongs to (the destination for ``inbox``) and is
    ``None`` for ``control``; ``peer`` is the source device of an ``inbox`` topic and
    ``None`` otherwise.
    """

    fleet: str
    device: str | None
    kind: TopicKind
    peer: str | None = None


def parse_topic(topic: str) -> TopicInfo:
    """Parse a concrete (wildcard-free) wire v1 topic.

    Raises
    ------
    VersionError
        For a ``meshfl/vN/...`` topic with N other than 1.
    WireError
        For anything else that is not one of the five topic forms with valid ids.

    """
    if not isinstance(topic, str):
        raise WireError(f"topic must be a str, not {type(topic).__name__}")
    parts = topic.split("/")
    if (
        len(parts) >= 2
        and parts[0] == "meshfl"
        and parts[1] != "v1"
        and _VERSION.fullmatch(parts[1])
    ):
        raise VersionError(f"topic {topic!r} is wire {parts[1]}; this build speaks v1")
    if len(parts) < 4 or parts[:2] != ["meshfl", "v1"]:
        raise WireError(f"not a meshfl v1 topic: {topic!r}")
    if any(_ID.fullmatch(p) is None for p in parts[2:]):
        raise WireError(f"topic {topic!r} has an empty or invalid segment")
    fleet, rest = parts[2], parts[3:]
    if rest == ["control"]:
        return TopicInfo(fleet, None, "control")
    if len(rest) == 3 and rest[0] == "node" and rest[2] in _NODE_KINDS:
        return TopicInfo(fleet, rest[1], _NODE_KINDS[rest[2]])
    if len(rest) == 4 and rest[0] == "node" and rest[2] == "inbox":
        return TopicInfo(fleet, rest[1], "inbox", rest[3])
    raise WireError(f"unknown meshfl v1 topic form: {topic!r}")
