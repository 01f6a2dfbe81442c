"""The repair request: a receiver asks a neighbour to re-send what it lacks.

Published on the sender's per-edge inbox topic ``meshfl/v1/{fleet}/node/{sender}/inbox/
{receiver}`` (the topic names the requester; the broker's ACL lets a device write only
inbox topics whose source is itself). Compact JSON::

    {"job":"job-1","after":41}

``after`` is the sequence number up to which the receiver holds every message of the
sender (``edge_agent.outbox``). The same inbox topic carries chunk frames (magic
``MFLC``), so :func:`is_repair_request` tells the two apart by the first byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshfl.errors import PayloadError
from meshfl.wire.jsonbody import dump, load_object, need_id, need_int

__all__ = ["MAX_REQUEST_BYTES", "RepairRequest", "decode_repair_request", "encode_repair_request",
           "is_repair_request"]  # fmt: skip

MAX_REQUEST_BYTES = 512
"""Largest repair request decoded, bytes."""


@dataclass(frozen=True, slots=True)
class RepairRequest:
    """Re-send ``job``'s messages with a sequence number above ``after`` (0 ≤ after < 2**64)."""

    job: str
    after: int


def encode_repair_request(job: str, after: int) -> bytes:
    """The compact JSON bytes of a repair request."""
    return dump({"job": job, "after": after})


def is_repair_request(payload: bytes) -> bool:
    """Whether an inbox-topic payload is a repair request (JSON) rather than a chunk."""
    return payload[:1] == b"{"


def decode_repair_request(payload: bytes) -> RepairRequest:
    """The repair request in ``payload``.

    Raises
    ------
    PayloadError
        Over :data:`MAX_REQUEST_BYTES` or nested, not a JSON object, fields other than
        ``job`` and ``after``, an invalid job id, ``after`` not an integer in [0, 2**64).

    """
    body = load_object(payload, "repair request", max_bytes=MAX_REQUEST_BYTES, max_depth=1)
    if set(body) != {"job", "after"}:
        raise PayloadError(f"a repair request has the fields job and after, got {sorted(body)}")
    return RepairRequest(
        job=need_id(body["job"], "repair request job"),
        after=need_int(body, "after", "repair request", 0, 2**64),
    )
