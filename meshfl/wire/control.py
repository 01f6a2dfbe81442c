"""The control message: the coordinator's announcement of a job's topology version.

Published retained (QoS 1) on ``meshfl/v1/{fleet}/control`` at every new topology
version, pause, resume and end of a job (``coordinator.control``); agents read it with
:func:`decode_control`. Compact JSON, keys in this order::

    {"job":"job-1","version":3,"from_round":9,"kind":"ring","devices":["dev-a","dev-b"],
     "edges":[[0,1]],"status":"running"}

plus ``"pause_round"`` (the first round held back) when ``status`` is ``"paused"``.
``edges`` are ``[i, j]`` positions in ``devices`` with ``i < j``; W is not sent (each
agent computes its row from the graph, :mod:`edge_agent.versions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshfl.errors import PayloadError
from meshfl.wire.jsonbody import dump, load_object, need_id, need_ids, need_int, need_str

__all__ = [
    "MAX_CONTROL_BYTES",
    "MAX_CONTROL_DEVICES",
    "ControlMessage",
    "decode_control",
    "encode_control",
]

MAX_CONTROL_BYTES = 16 * 2**20
"""Largest control payload decoded, bytes (100,000 devices of degree 8 fit)."""
MAX_CONTROL_DEVICES = 200_000
"""Most devices a topology version may list."""
_KEYS = ("job", "version", "from_round", "kind", "devices", "edges", "status")


@dataclass(frozen=True, slots=True)
class ControlMessage:
    """One topology version of a job as announced.

    ``edges`` holds ``(i, j)`` positions in ``devices`` with ``i < j``; ``pause_round``
    is set only while ``status`` is ``"paused"``.
    """

    job: str
    version: int
    from_round: int
    kind: str | None
    devices: tuple[str, ...]
    edges: tuple[tuple[int, int], ...]
    status: str
    pause_round: int | None = None


def encode_control(message: ControlMessage) -> bytes:
    """The compact JSON bytes of ``message`` (layout in the module docstring)."""
    body: dict[str, Any] = {
        "job": message.job,
        "version": message.version,
        "from_round": message.from_round,
        "kind": message.kind,
        "devices": list(message.devices),
        "edges": [[i, j] for i, j in message.edges],
        "status": message.status,
    }
    if message.status == "paused":
        body["pause_round"] = message.pause_round
    return dump(body)


def _edges(value: object, n: int) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or len(value) > n * (n - 1) // 2:
        raise PayloadError(f"control.edges must be a list of at most {n}·({n}-1)/2 pairs")
    edges = []
    for pair in value:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(k, int) and not isinstance(k, bool) for k in pair)
        ):
            raise PayloadError("every control edge must be a pair of integer positions")
        i, j = min(pair), max(pair)
        if not 0 <= i < j < n:
            raise PayloadError(
                f"control edge {pair[:2]} is not two distinct positions in 0..{n - 1}"
            )
        edges.append((i, j))
    return tuple(edges)


def decode_control(payload: bytes) -> ControlMessage:
    """The control message in ``payload``.

    Raises
    ------
    PayloadError
        Over :data:`MAX_CONTROL_BYTES` or 8 levels deep, not a JSON object, a missing or
        unknown field, an invalid job or device id, an edge that is not two distinct
        positions in ``devices``, a version or round that is not a positive integer.

    """
    body = load_object(payload, "control message", max_bytes=MAX_CONTROL_BYTES)
    missing = [k for k in _KEYS if k not in body]
    unknown = set(body) - {*_KEYS, "pause_round"}
    if missing or unknown:
        raise PayloadError(f"a control message lacks {missing} or has unknown fields {unknown}")
    devices = need_ids(body["devices"], "control.devices", MAX_CONTROL_DEVICES)
    kind = body["kind"]
    pause = body.get("pause_round")
    return ControlMessage(
        job=need_id(body["job"], "control.job"),
        version=need_int(body, "version", "control", 1, 2**63),
        from_round=need_int(body, "from_round", "control", 0, 2**32),
        kind=None if kind is None else need_str(body, "kind", "control", 64),
        devices=devices,
        edges=_edges(body["edges"], len(devices)),
        status=need_str(body, "status", "control", 32),
        pause_round=None if pause is None else need_int(body, "pause_round", "control", 0, 2**32),
    )
