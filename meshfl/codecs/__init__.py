"""Tensor codecs: tagged, registered compressors for model deltas.

Every codec has a one-byte wire tag and a spec keyword; :data:`CODECS` maps tags to
codec classes and is checked at import (a duplicate tag or name raises
:class:`~meshfl.errors.CodecError`), as hivemind's ``compression/serialization.py`` does.

Spec strings (``parse_codec``)::

    identity | fp32        raw float32, lossless (tag 1)
    topk:DENSITY           top-k sparsification, 0 < DENSITY <= 1 (tag 2)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import numpy as np

from meshfl.codecs.base import Codec
from meshfl.codecs.identity import Identity
from meshfl.codecs.topk import TopK
from meshfl.errors import CodecError, CodecSpecError

__all__ = ["CODECS", "Codec", "Identity", "TopK", "decode_tensor", "parse_codec"]

VALID_FORMS = "identity, topk:DENSITY (0 < DENSITY <= 1)"


def _build_registry(classes: Iterable[type[Codec]]) -> Mapping[int, type[Codec]]:
    """Map wire tag to codec class, refusing duplicate tags or names and tags outside u8.

    Raises
    ------
    CodecError
        If two codecs share a tag or a name, or a tag is not in ``[0, 255]``.

    """
    by_tag: dict[int, type[Codec]] = {}
    names: dict[str, type[Codec]] = {}
    for cls in classes:
        if not 0 <= cls.tag <= 255:
            raise CodecError(f"codec {cls.__name__} has tag {cls.tag}, outside u8")
        if cls.tag in by_tag:
            raise CodecError(
                f"duplicate codec tag {cls.tag}: {by_tag[cls.tag].__name__} and {cls.__name__}"
            )
        if cls.name in names:
            raise CodecError(
                f"duplicate codec name {cls.name!r}: {names[cls.name].__name__} and {cls.__name__}"
            )
        by_tag[cls.tag] = cls
        names[cls.name] = cls
    return MappingProxyType(by_tag)


CODECS: Mapping[int, type[Codec]] = _build_registry((Identity, TopK))
"""Wire tag → codec class, read-only."""


def parse_codec(spec: str) -> Codec:
    """Build a codec from its spec string.

    Parameters
    ----------
    spec : str
        ``"identity"``, ``"fp32"`` (alias of identity) or ``"topk:DENSITY"`` with
        ``0 < DENSITY <= 1``, e.g. ``"topk:0.1"``. Case and surrounding spaces are ignored.

    Returns
    -------
    Codec
        A codec whose ``.spec`` parses back to an equal codec.

    Raises
    ------
    CodecSpecError
        If the spec does not parse; the message lists the valid forms.

    """
    if not isinstance(spec, str):
        raise CodecSpecError(f"codec spec must be a string; valid forms: {VALID_FORMS}")
    text = spec.strip().lower()
    if text in ("identity", "fp32"):
        return Identity()
    kind, sep, arg = text.partition(":")
    if kind == "topk" and sep:
        try:
            density = float(arg)
        except ValueError:
            density = math.nan
        if not (math.isfinite(density) and 0.0 < density <= 1.0):
            raise CodecSpecError(
                f"invalid codec spec {spec!r}: density must be in (0, 1]; "
                f"valid forms: {VALID_FORMS}"
            )
        return TopK(density)
    raise CodecSpecError(f"invalid codec spec {spec!r}; valid forms: {VALID_FORMS}")


def decode_tensor(tag: int, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """Decode one tensor payload by its wire codec tag.

    Parameters
    ----------
    tag : int
        Wire codec tag (u8), a key of :data:`CODECS`.
    payload : bytes
        The codec payload (untrusted).
    shape : tuple of int
        The tensor shape from the message manifest.

    Returns
    -------
    np.ndarray
        float32 array of ``shape``.

    Raises
    ------
    CodecError
        If the tag is unknown or the payload is malformed.

    """
    cls = CODECS.get(tag)
    if cls is None:
        raise CodecError(f"unknown codec tag {tag!r}; known tags: {sorted(CODECS)}")
    return cls.decode(payload, shape)
