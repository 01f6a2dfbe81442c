"""What a device holds for its neighbours' secure-aggregation instances, and when it tells.

In round r, member j of instance (r, i) Shamir-shares its self-mask seed b_{j,r,i} and
its masking key s_sk_{j,r} among the members of N(i) (Bonawitz et al., CCS 2017, §4).
Each member k keeps its shares in a :class:`ShareHolder` and, on aggregator i's signed
declaration, reveals k's share of b_{j,r,i} for each survivor j and of s_sk_{j,r} for
each dropped j — but never both kinds for the same (j, r), whatever the aggregator:
with both, an aggregator could strip every mask off j's input. A request that would
break this is refused for that owner (counted in :attr:`ShareHolder.refusals`, logged)
and the rest of it is answered.

The SHARES and REVEAL messages are JSON (binary fields standard base64) made and
checked by :func:`encode_shares` / :func:`decode_shares` and :func:`encode_reveal` /
:func:`decode_reveal`; they travel sealed (:func:`edge_agent.secagg.crypto.seal`), and
decoding bounds every size and checks every type (:class:`~meshfl.errors.WireError`).
Nothing is pickled.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from edge_agent.secagg.crypto import KEY_BYTES, b64decode, b64encode
from meshfl.errors import ConfigError, SecurityError, WireError
from meshfl.wire import validate_id

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Reveal",
    "Share",
    "ShareHolder",
    "SharesMessage",
    "decode_reveal",
    "decode_shares",
    "encode_reveal",
    "encode_shares",
]

log = logging.getLogger("meshfl.agent.secagg")

Share = tuple[int, bytes]
"""A Shamir share: (index ≥ 1, 32 bytes)."""

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Largest SHARES/REVEAL JSON document decoded (bytes)."""
_MAX_ENTRIES = 4096  # instances per SHARES message, owners per REVEAL
_MAX_INDEX = 65535  # Shamir share index (position in a neighbourhood + 1)
_MAX_ROUND = 2**31 - 1
_VERSION = 1


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


class ShareHolder:
    """The shares one device (``device``) holds as a member of other devices' instances.

    Parameters
    ----------
    device
        This device's id, for log messages (``None``: unnamed).

    Attributes
    ----------
    refusals : int
        Owners refused so far because a request asked for the other kind of share.

    """

    def __init__(self, device: str | None = None) -> None:
        self.device = "holder" if device is None else validate_id(device, "device id")
        self.refusals = 0
        self._shares: dict[tuple[str, int, str], tuple[Share, Share]] = {}
        self._revealed: dict[tuple[str, int, str], Literal["b", "s"]] = {}

    def __len__(self) -> int:
        """Number of (owner, round, aggregator) instances held."""
        return len(self._shares)

    def store(
        self, owner: str, round_: int, aggregator: str, b_share: Share, s_share: Share
    ) -> None:
        """Keep ``owner``'s shares for instance (``round_``, ``aggregator``).

        Storing the same shares again (a retransmission) is a no-op.

        Raises
        ------
        SecurityError
            Different shares were already stored for this instance (the first are kept).

        """
        key = (owner, round_, aggregator)
        held = self._shares.get(key)
        if held is not None and held != (b_share, s_share):
            raise SecurityError(
                f"{owner} sent different shares for round {round_}, aggregator {aggregator};"
                " the first ones are kept"
            )
        self._shares[key] = (b_share, s_share)

    def store_message(self, message: SharesMessage) -> None:
        """:meth:`store` every instance of a decoded SHARES message."""
        for aggregator, (b_share, s_share) in message.shares.items():
            self.store(message.owner, message.round, aggregator, b_share, s_share)

    def missing(
        self,
        round_: int,
        aggregator: str,
        survivors: Iterable[str],
        dropped: Iterable[str] = (),
    ) -> list[str]:
        """The owners among ``survivors`` and ``dropped`` (sorted) whose shares are not held.

        Shares for instance (``round_``, ``aggregator``); a request may wait for them.
        """
        owners = set(survivors) | set(dropped)
        return sorted(o for o in owners if (o, round_, aggregator) not in self._shares)

    def reveal(
        self, round_: int, aggregator: str, survivors: Iterable[str], dropped: Iterable[str]
    ) -> Reveal:
        """Answer aggregator ``aggregator``'s request after its (verified) declaration.

        Reveals the b-share of every survivor and the s-share of every dropped owner
        whose shares are held, except where that would reveal both kinds for one
        instance (owner, round, aggregator) — the masking key of an instance is its own
        (:class:`~edge_agent.secagg.crypto.JobKeys` slots), so only the same instance's
        self-mask must stay secret once it is revealed: such an owner — or one listed both
        as survivor and dropped — is refused, counted and logged. An aborted declaration
        must not be answered at all (the caller's job).
        """
        survivors, dropped = set(survivors), set(dropped)
        b_shares: dict[str, Share] = {}
        s_shares: dict[str, Share] = {}
        refused: list[str] = []
        for owner in sorted(survivors | dropped):
            kind: Literal["b", "s"] = "b" if owner in survivors else "s"
            held = self._shares.get((owner, round_, aggregator))
            before = self._revealed.get((owner, round_, aggregator))
            if owner in survivors and owner in dropped:
                reason = "it is declared both a survivor and dropped"
            elif before is not None and before != kind:
                reason = f"its {before}-share of this instance was already revealed"
            elif held is None:
                continue  # nothing to reveal; see missing()
            else:
                self._revealed[(owner, round_, aggregator)] = kind
                (b_shares if kind == "b" else s_shares)[owner] = held[0 if kind == "b" else 1]
                continue
            refused.append(owner)
            self.refusals += 1
            log.warning(
                "%s refuses %s's %s-share of round %d to %s: %s",
                self.device, owner, kind, round_, aggregator, reason,
            )  # fmt: skip
        return Reveal(round_, aggregator, b_shares, s_shares, tuple(refused))

    def forget_before(self, round_: int) -> None:
        """Drop the shares and reveal records of rounds before ``round_`` (bounds memory)."""
        self._shares = {k: v for k, v in self._shares.items() if k[1] >= round_}
        self._revealed = {k: v for k, v in self._revealed.items() if k[1] >= round_}


# -- wire ---------------------------------------------------------------------------------


def _share_json(share: Share) -> list[Any]:
    return [share[0], b64encode(share[1])]


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
    return json.dumps(body, separators=(",", ":")).encode()


def decode_shares(data: bytes) -> SharesMessage:
    """Parse and check a SHARES message.

    Raises
    ------
    WireError
        Not JSON, too large, an unknown or missing field, a wrong type, a bad id, or a
        share that is not (index in 1..65535, base64 of 32 bytes).

    """
    body = _load(data, "shares", {"v", "type", "owner", "round", "shares"})
    owner = _id(body["owner"], "owner")
    round_ = _round(body["round"])
    shares: dict[str, tuple[Share, Share]] = {}
    for aggregator, entry in _entries(body["shares"], "shares", object).items():
        _fields(entry, {"b", "s"}, f"shares[{aggregator}]")
        shares[_id(aggregator, "aggregator")] = (_share(entry["b"]), _share(entry["s"]))
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
    return json.dumps(body, separators=(",", ":")).encode()


def decode_reveal(data: bytes) -> Reveal:
    """Parse and check a REVEAL message.

    Raises
    ------
    WireError
        As :func:`decode_shares`; also an owner listed in more than one of ``b``, ``s``
        and ``refused``.

    """
    keys = {"v", "type", "round", "aggregator", "b", "s", "refused"}
    body = _load(data, "reveal", keys)
    b_shares = {_id(o, "owner"): _share(s) for o, s in _entries(body["b"], "b", list).items()}
    s_shares = {_id(o, "owner"): _share(s) for o, s in _entries(body["s"], "s", list).items()}
    refused = body["refused"]
    if not isinstance(refused, list) or len(refused) > _MAX_ENTRIES:
        raise WireError(f"reveal refused must be a list of at most {_MAX_ENTRIES} ids")
    refused_ids = tuple(_id(o, "refused owner") for o in refused)
    listed = [*b_shares, *s_shares, *refused_ids]
    if len(set(listed)) != len(listed):
        raise WireError("reveal lists an owner more than once across b, s and refused")
    return Reveal(
        round=_round(body["round"]),
        aggregator=_id(body["aggregator"], "aggregator"),
        b_shares=b_shares,
        s_shares=s_shares,
        refused=refused_ids,
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise WireError("duplicate key in a secure-aggregation message")
    return result


def _load(data: bytes, kind: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"a {kind} message must be bytes, got {type(data).__name__}")
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"{kind} message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        body = json.loads(bytes(data), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError
        raise WireError(f"{kind} message is not valid UTF-8 JSON") from None
    _fields(body, keys, f"{kind} message")
    if body["v"] != _VERSION or isinstance(body["v"], bool):
        raise WireError(f"{kind} message version {body['v']!r} is not {_VERSION}")
    if body["type"] != kind:
        raise WireError(f"expected a {kind} message, got type {body['type']!r}")
    return body  # type: ignore[no-any-return]


def _fields(value: object, keys: set[str], what: str) -> None:
    if not isinstance(value, dict):
        raise WireError(f"{what} must be a JSON object")
    if set(value) != keys:
        raise WireError(f"{what} must have exactly the fields {sorted(keys)}, got {sorted(value)}")


def _entries(value: object, what: str, kind: type) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > _MAX_ENTRIES:
        raise WireError(f"{what} must be a JSON object of at most {_MAX_ENTRIES} entries")
    if not all(isinstance(v, kind) for v in value.values()):
        raise WireError(f"every entry of {what} must be a JSON {kind.__name__}")
    return value


def _id(value: object, what: str) -> str:
    try:
        return validate_id(value, what)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise WireError(str(exc)) from None


def _round(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_ROUND:
        raise WireError(f"round must be an integer in 1..{_MAX_ROUND}, got {value!r}")
    return value


def _share(value: object) -> Share:
    if not isinstance(value, list) or len(value) != 2:
        raise WireError("a share must be [index, base64]")
    index, text = value
    if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= _MAX_INDEX:
        raise WireError(f"a share index must be an integer in 1..{_MAX_INDEX}, got {index!r}")
    return index, b64decode(text, "share", KEY_BYTES)
