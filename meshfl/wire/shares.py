"""SHARES and REVEAL: the sealed messages of secure aggregation's holders.

In round r, member j of aggregator i's instance sends each other member its Shamir
shares (SHARES); on i's signed declaration, each holder answers i with the shares the
declaration allows (REVEAL) — Bonawitz et al., CCS 2017, §4; the holder's rules are in
``edge_agent.secagg.holder``. Both travel sealed (AES-GCM) inside a secure-aggregation
body (:mod:`meshfl.wire.secagg`); the plaintext is compact JSON with binary fields in
standard base64, keys in this order::

    {"v":1,"type":"shares","owner":"dev-a","round":3,
     "shares":{"dev-i":{"b":[2,"<32 bytes>"],"s":[2,"<32 bytes>"]}}}
    {"v":1,"type":"reveal","round":3,"aggregator":"dev-i","b":{"dev-a":[2,"…"]},
     "s":{},"refused":[]}

Decoding (:func:`decode_sealed`, or one kind with :func:`decode_shares` /
:func:`decode_reveal`) bounds every size and checks every type and field, raising
:class:`~meshfl.errors.PayloadError`. Nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshfl.errors import PayloadError
from meshfl.wire.jsonbody import b64, dump, load_object, need_b64, need_id

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Reveal",
    "Share",
    "SharesMessage",
    "decode_reveal",
    "decode_sealed",
    "decode_shares",
    "encode_reveal",
    "encode_shares",
]

Share = tuple[int, bytes]
"""A Shamir share: (index ≥ 1, 32 bytes)."""

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Largest SHARES/REVEAL JSON document decoded (bytes)."""
SHARE_BYTES = 32
"""Bytes of one share (a share of a 32-byte seed or key)."""
_MAX_ENTRIES = 4096  # instances per SHARES message, owners per REVEAL
_MAX_INDEX = 65535  # Shamir share index (position in a neighbourhood + 1)
_MAX_ROUND = 2**31 - 1
_VERSION = 1
_DEPTH = 5  # reveal → b → owner → [index, share]; shares → aggregator → b → share


@dataclass(frozen=True)
class SharesMessage:
    """Member ``owner``'s shares for one other member in round ``round``.

    ``shares`` maps each aggregator i whose instance both share to (share of
    b_{owner,round,i}, share of s_sk_{owner,round}) — the s-share from the split made
    for instance i.
    """

    owner: str
    round: int
    shares: Mapping[str, tuple[Share, Share]]


@dataclass(frozen=True)
class Reveal:
    """A holder's answer to aggregator ``aggregator``'s request for round ``round``.

    The holder is the sender of the sealed message that carries it (bound by the AAD).

    ``b_shares``: owner (a survivor) → the holder's share of b_{owner,round,aggregator};
    ``s_shares``: owner (dropped) → its share of s_sk_{owner,round}; ``refused``: owners
    refused under the never-both rule (sorted). An owner whose share the holder lacks
    is in none of them.
    """

    round: int
    aggregator: str
    b_shares: Mapping[str, Share] = field(default_factory=dict)
    s_shares: Mapping[str, Share] = field(default_factory=dict)
    refused: tuple[str, ...] = ()


def _share_json(share: Share) -> list[Any]:
    return [share[0], b64(share[1])]


def encode_shares(message: SharesMessage) -> bytes:
    """The JSON bytes of a SHARES message (to be sealed for its recipient)."""
    body = {
        "v": _VERSION,
        "type": "shares",
        "owner": message.owner,
        "round": message.round,
        "shares": {
            aggregator: {"b": _share_json(b), "s": _share_json(s)}
            for aggregator, (b, s) in sorted(message.shares.items())
        },
    }
    return dump(body)


def decode_shares(data: bytes) -> SharesMessage:
    """Parse and check a SHARES message.

    Raises
    ------
    PayloadError
        Not JSON, too large or deep, an unknown or missing field, a wrong type, a bad
        id, or a share that is not (index in 1..65535, base64 of 32 bytes).

    """
    return _shares(_load(data, "shares", {"v", "type", "owner", "round", "shares"}))


def _shares(body: dict[str, Any]) -> SharesMessage:
    owner = need_id(body["owner"], "owner")
    round_ = _round(body["round"])
    shares: dict[str, tuple[Share, Share]] = {}
    for aggregator, entry in _entries(body["shares"], "shares", dict).items():
        _fields(entry, {"b", "s"}, f"shares[{aggregator}]")
        shares[need_id(aggregator, "aggregator")] = (_share(entry["b"]), _share(entry["s"]))
    return SharesMessage(owner, round_, shares)


def encode_reveal(reveal: Reveal) -> bytes:
    """The JSON bytes of a REVEAL message (to be sealed for the aggregator)."""
    body = {
        "v": _VERSION,
        "type": "reveal",
        "round": reveal.round,
        "aggregator": reveal.aggregator,
        "b": {o: _share_json(s) for o, s in sorted(reveal.b_shares.items())},
        "s": {o: _share_json(s) for o, s in sorted(reveal.s_shares.items())},
        "refused": sorted(reveal.refused),
    }
    return dump(body)


_REVEAL_KEYS = {"v", "type", "round", "aggregator", "b", "s", "refused"}


def decode_reveal(data: bytes) -> Reveal:
    """Parse and check a REVEAL message.

    Raises
    ------
    PayloadError
        As :func:`decode_shares`; also an owner listed in more than one of ``b``, ``s``
        and ``refused``.

    """
    return _reveal(_load(data, "reveal", _REVEAL_KEYS))


def _reveal(body: dict[str, Any]) -> Reveal:
    b_shares = {need_id(o, "owner"): _share(s) for o, s in _entries(body["b"], "b", list).items()}
    s_shares = {need_id(o, "owner"): _share(s) for o, s in _entries(body["s"], "s", list).items()}
    refused = body["refused"]
    if not isinstance(refused, list) or len(refused) > _MAX_ENTRIES:
        raise PayloadError(f"reveal refused must be a list of at most {_MAX_ENTRIES} ids")
    refused_ids = tuple(need_id(o, "refused owner") for o in refused)
    listed = [*b_shares, *s_shares, *refused_ids]
    if len(set(listed)) != len(listed):
        raise PayloadError("reveal lists an owner more than once across b, s and refused")
    return Reveal(
        round=_round(body["round"]),
        aggregator=need_id(body["aggregator"], "aggregator"),
        b_shares=b_shares,
        s_shares=s_shares,
        refused=refused_ids,
    )


def decode_sealed(data: bytes) -> SharesMessage | Reveal:
    """The SHARES or REVEAL message in a sealed body's plaintext (by its ``type``).

    Raises
    ------
    PayloadError
        As :func:`decode_shares` / :func:`decode_reveal`, or an unknown ``type``.

    """
    body = load_object(data, "sealed message", max_bytes=MAX_MESSAGE_BYTES, max_depth=_DEPTH)
    kind = body.get("type")
    if kind == "shares":
        return _shares(_check(body, "shares", {"v", "type", "owner", "round", "shares"}))
    if kind == "reveal":
        return _reveal(_check(body, "reveal", _REVEAL_KEYS))
    raise PayloadError(f"unknown protocol message type {str(kind)[:32]!r}")


def _load(data: bytes, kind: str, keys: set[str]) -> dict[str, Any]:
    body = load_object(data, f"{kind} message", max_bytes=MAX_MESSAGE_BYTES, max_depth=_DEPTH)
    return _check(body, kind, keys)


def _check(body: dict[str, Any], kind: str, keys: set[str]) -> dict[str, Any]:
    _fields(body, keys, f"{kind} message")
    if body["v"] != _VERSION or isinstance(body["v"], bool):
        raise PayloadError(f"{kind} message version {str(body['v'])[:16]!r} is not {_VERSION}")
    if body["type"] != kind:
        raise PayloadError(f"expected a {kind} message, got type {str(body['type'])[:32]!r}")
    return body


def _fields(value: object, keys: set[str], what: str) -> None:
    if not isinstance(value, dict):
        raise PayloadError(f"{what} must be a JSON object")
    if set(value) != keys:
        raise PayloadError(f"{what} must have exactly the fields {sorted(keys)}")


def _entries(value: object, what: str, kind: type) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > _MAX_ENTRIES:
        raise PayloadError(f"{what} must be a JSON object of at most {_MAX_ENTRIES} entries")
    if not all(isinstance(v, kind) for v in value.values()):
        raise PayloadError(f"every entry of {what} must be a JSON {kind.__name__}")
    return value


def _round(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_ROUND:
        raise PayloadError(f"round must be an integer in 1..{_MAX_ROUND}")
    return value


def _share(value: object) -> Share:
    if not isinstance(value, list) or len(value) != 2:
        raise PayloadError("a share must be [index, base64]")
    index, text = value
    if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= _MAX_INDEX:
        raise PayloadError(f"a share index must be an integer in 1..{_MAX_INDEX}")
    return index, need_b64(text, "share", SHARE_BYTES)
