"""Bounded JSON: the one loader behind every JSON payload a device or coordinator reads.

Status, control, repair-request and secure-aggregation payloads are JSON objects sent by
peers that may be hostile. :func:`load_object` reads one within a byte bound and a
nesting bound *before* :func:`json.loads` runs (a scan of the brackets outside strings),
so a deeply nested payload costs one linear scan and never a ``RecursionError``. It
rejects everything that is not strict UTF-8 JSON: a byte-order mark, UTF-16, ``NaN`` or
``Infinity``, a duplicate key, an integer of more than 4300 digits. Every failure is a
:class:`~meshfl.errors.PayloadError` naming the message kind.

:func:`dump` is the matching encoder (compact or with the default separators, sorted
keys on request) so that each message module states its exact bytes in one call.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any

from meshfl.errors import ConfigError, PayloadError
from meshfl.wire.topics import validate_id

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "b64",
    "dump",
    "load_json",
    "load_object",
    "need_b64",
    "need_bool",
    "need_id",
    "need_ids",
    "need_int",
    "need_str",
    "nesting_depth",
]

DEFAULT_MAX_DEPTH = 8
"""Deepest nesting of arrays and objects a payload may have (the outer object is 1)."""

# A string, or an unterminated one up to the end: a match started at a quote never fails,
# so re.sub never retries at later quotes (linear time; a pattern requiring the closing
# quote is quadratic on '"' followed by many '\\"').
_STRING = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_BRACKETS = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in "[]{}"))


def nesting_depth(text: str, limit: int) -> int:
    """Deepest bracket nesting of JSON ``text`` outside strings, counted up to ``limit + 1``.

    Linear in ``len(text)`` and iterative: a scan, not a parse, so it is safe on any
    input. An unterminated string runs to the end (such text is not JSON anyway, and
    :func:`json.loads` fails there before it nests any deeper).
    """
    brackets = _STRING.sub("", text)
    if not brackets.isascii():
        brackets = "".join(c for c in brackets if c in "[]{}")
    else:
        brackets = brackets.translate(_BRACKETS)
    depth = deepest = 0
    for c in brackets:
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        else:
            depth -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    body = dict(pairs)
    if len(body) != len(pairs):
        raise ValueError("a key appears twice")
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(
    data: bytes | bytearray | memoryview,
    what: str,
    *,
    max_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Any:
    """Parse JSON of at most ``max_bytes`` bytes and ``max_depth`` nesting levels.

    As :func:`load_object`, for any JSON value (an array, say).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise PayloadError(f"a {what} must be bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise PayloadError(f"a {what} of {len(data)} bytes exceeds the {max_bytes}-byte limit")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise PayloadError(f"a {what} is not UTF-8") from None
    depth = nesting_depth(text, max_depth)
    if depth > max_depth:
        raise PayloadError(f"a {what} is nested deeper than {max_depth} levels")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, long ints, duplicates
        raise PayloadError(f"a {what} is not valid JSON: {str(exc)[:200]}") from None


def load_object(
    data: bytes | bytearray | memoryview,
    what: str,
    *,
    max_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> dict[str, Any]:
    """Parse a JSON object of at most ``max_bytes`` bytes and ``max_depth`` nesting levels.

    Parameters
    ----------
    data : bytes
        The payload, strict UTF-8 (no byte-order mark).
    what : str
        The message kind, for error messages ("status", "control message", ...).
    max_bytes : int
        Largest payload accepted, bytes.
    max_depth : int, default 8
        Deepest nesting of arrays and objects, the outer object counting 1.

    Returns
    -------
    dict
        The object, keys in payload order.

    Raises
    ------
    PayloadError
        Not bytes, over ``max_bytes`` or ``max_depth``, not UTF-8, not JSON (``NaN``
        and duplicate keys included), or not a JSON object.

    """
    body = load_json(data, what, max_bytes=max_bytes, max_depth=max_depth)
    if not isinstance(body, dict):
        raise PayloadError(f"a {what} must be a JSON object, got {type(body).__name__}")
    return body


def dump(body: object, *, compact: bool = True, sort_keys: bool = False) -> bytes:
    """UTF-8 JSON of ``body``: ``compact`` drops the spaces after ``,`` and ``:``."""
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(body, separators=separators, sort_keys=sort_keys).encode()


# -- field checks shared by the message modules ------------------------------------------


def need_str(body: Mapping[str, Any], key: str, what: str, max_chars: int = 256) -> str:
    """``body[key]`` as a string of at most ``max_chars`` characters, or PayloadError."""
    value = body.get(key)
    if not isinstance(value, str) or len(value) > max_chars:
        raise PayloadError(f"{what}.{key} must be a string of at most {max_chars} characters")
    return value


def need_int(body: Mapping[str, Any], key: str, what: str, low: int = 0, high: int = 2**64) -> int:
    """``body[key]`` as an int in ``[low, high)`` (a bool is not one), or PayloadError."""
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        raise PayloadError(f"{what}.{key} must be an integer in [{low}, {high})")
    return value


def need_bool(body: Mapping[str, Any], key: str, what: str) -> bool:
    """``body[key]`` as a bool, or PayloadError."""
    value = body.get(key)
    if not isinstance(value, bool):
        raise PayloadError(f"{what}.{key} must be true or false")
    return value


def need_id(value: object, what: str) -> str:
    """``value`` as a valid id (:func:`~meshfl.wire.validate_id`), or PayloadError."""
    if not isinstance(value, str):
        raise PayloadError(f"{what} must be a string id, got {type(value).__name__}")
    try:
        return validate_id(value, what)
    except ConfigError as exc:
        raise PayloadError(str(exc)) from None


def need_ids(value: object, what: str, max_items: int) -> tuple[str, ...]:
    """``value`` as a list of at most ``max_items`` valid ids, or PayloadError."""
    if not isinstance(value, list) or len(value) > max_items:
        raise PayloadError(f"{what} must be a list of at most {max_items} ids")
    return tuple(need_id(v, what) for v in value)


def b64(data: bytes) -> str:
    """Standard base64 text of ``data`` (how binary fields travel in JSON)."""
    return base64.b64encode(data).decode("ascii")


def need_b64(value: object, what: str, length: int | None = None) -> bytes:
    """Strict standard base64 ``value`` decoded; ``length`` (bytes) if given must match."""
    if not isinstance(value, str):
        raise PayloadError(f"{what} must be a base64 string, got {type(value).__name__}")
    try:
        data = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise PayloadError(f"{what} is not valid base64") from None
    if length is not None and len(data) != length:
        raise PayloadError(f"{what} must be {length} bytes, got {len(data)}")
    return data
