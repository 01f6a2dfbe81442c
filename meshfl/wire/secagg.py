"""Secure-aggregation payloads: the signed declaration, protocol bodies and mask sets.

Secure rounds (``edge_agent.secure_engine``; Bonawitz et al., CCS 2017, with
neighbourhoods as in SecAgg+, Bell et al., CCS 2020) carry three JSON payloads inside
chunked envelopes on the per-edge inbox topics, plus the bytes the coordinator signs:

- the **declaration** (:func:`encode_declaration`): an aggregator's survivors and
  dropouts of one round. The coordinator signs these exact bytes (Ed25519) and every
  member verifies them: sorted keys, compact, UTF-8 —
  ``{"aborted":false,"aggregator":"i","dropped":[],"job":"j","round":3,"survivors":[…]}``;
- a **protocol body** (a SECAGG envelope's one tensor): either an aggregator's request
  ``{"type":"request","signed":{"declaration":{…},"signature":"<base64>"}}`` or a sealed
  SHARES/REVEAL message ``{"sealed":"<base64 AES-GCM>"}`` (:mod:`meshfl.wire.shares`
  for the plaintext) — :func:`encode_request`, :func:`encode_sealed`,
  :func:`decode_body`;
- the **mask set** of a masked input (its ``masked_with`` tensor): the sorted members it
  masked with, ``["a", "b"]`` — :func:`encode_mask_set`, :func:`decode_mask_set`.

Every decoder bounds size and nesting and raises :class:`~meshfl.errors.PayloadError`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, cast

from meshfl.contract import Declaration
from meshfl.errors import PayloadError
from meshfl.wire.jsonbody import b64, dump, load_json, load_object, need_b64, need_id, need_ids

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_MEMBERS",
    "Sealed",
    "SignedRequest",
    "check_declaration",
    "decode_body",
    "decode_declaration",
    "decode_mask_set",
    "encode_declaration",
    "encode_mask_set",
    "encode_request",
    "encode_sealed",
]

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest protocol body decoded, bytes."""
MAX_MEMBERS = 4096
"""Most members a neighbourhood (a declaration's survivors + dropped, a mask set) lists."""
_SIGNATURE_BYTES = 64
_DECLARATION_KEYS = frozenset({"job", "round", "aggregator", "survivors", "dropped", "aborted"})


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """An aggregator's request for shares: its declaration and the coordinator's signature."""

    declaration: Declaration
    signature: bytes  # 64 bytes, Ed25519 over encode_declaration(declaration)


@dataclass(frozen=True, slots=True)
class Sealed:
    """A sealed SHARES or REVEAL message (AES-GCM ciphertext and tag)."""

    ciphertext: bytes


def encode_declaration(declaration: Mapping[str, Any]) -> bytes:
    """The bytes the coordinator signs: sorted-key compact UTF-8 JSON of the declaration."""
    return dump(dict(declaration), sort_keys=True)


def check_declaration(value: object) -> Declaration:
    """``value`` (a parsed JSON object) as a declaration, or PayloadError.

    Exactly the fields of :class:`~meshfl.contract.Declaration`: ``job`` and
    ``aggregator`` valid ids, ``round`` in [0, 2**32), ``survivors`` and ``dropped``
    lists of at most :data:`MAX_MEMBERS` ids, ``aborted`` a bool.
    """
    if not isinstance(value, dict) or set(value) != _DECLARATION_KEYS:
        raise PayloadError(
            f"a declaration is an object with the fields {sorted(_DECLARATION_KEYS)}"
        )
    round_ = value["round"]
    if isinstance(round_, bool) or not isinstance(round_, int) or not 0 <= round_ < 2**32:
        raise PayloadError("declaration.round must be an integer in [0, 2**32)")
    if not isinstance(value["aborted"], bool):
        raise PayloadError("declaration.aborted must be true or false")
    need_id(value["job"], "declaration.job")
    need_id(value["aggregator"], "declaration.aggregator")
    need_ids(value["survivors"], "declaration.survivors", MAX_MEMBERS)
    need_ids(value["dropped"], "declaration.dropped", MAX_MEMBERS)
    return cast(Declaration, value)


def decode_declaration(data: bytes) -> Declaration:
    """The declaration in ``data`` (:func:`encode_declaration`'s bytes); PayloadError if not."""
    return check_declaration(load_object(data, "declaration", max_bytes=MAX_BODY_BYTES))


def encode_request(declaration: Mapping[str, Any], signature: str) -> bytes:
    """A request body: the coordinator-signed ``declaration`` and its base64 ``signature``."""
    signed = {"declaration": dict(declaration), "signature": signature}
    return dump({"type": "request", "signed": signed})


def encode_sealed(ciphertext: bytes) -> bytes:
    """A sealed body: ``ciphertext`` (AES-GCM of a SHARES or REVEAL message) in base64."""
    return dump({"sealed": b64(ciphertext)})


def decode_body(data: bytes) -> SignedRequest | Sealed:
    """The protocol body in ``data``: a request or a sealed message.

    Raises
    ------
    PayloadError
        Over :data:`MAX_BODY_BYTES` or 8 levels deep, not a JSON object, neither form,
        a malformed declaration, a signature that is not 64 bytes of base64.

    """
    body = load_object(data, "protocol message", max_bytes=MAX_BODY_BYTES)
    if set(body) == {"sealed"}:
        return Sealed(need_b64(body["sealed"], "sealed body"))
    if set(body) != {"type", "signed"} or body["type"] != "request":
        raise PayloadError("a protocol message is a request or a sealed message")
    signed = body["signed"]
    if not isinstance(signed, dict) or set(signed) != {"declaration", "signature"}:
        raise PayloadError("a request carries a signed declaration (declaration, signature)")
    return SignedRequest(
        declaration=check_declaration(signed["declaration"]),
        signature=need_b64(signed["signature"], "declaration signature", _SIGNATURE_BYTES),
    )


def encode_mask_set(members: Collection[str]) -> bytes:
    """The mask set of a masked input: its members, as given (the caller sorts)."""
    return dump(list(members), compact=False)


def decode_mask_set(data: bytes) -> tuple[str, ...]:
    """The members a masked input masked with; PayloadError if not a list of ids."""
    value = load_json(data, "mask set", max_bytes=MAX_MEMBERS * 70, max_depth=1)
    return need_ids(value, "mask set", MAX_MEMBERS)
