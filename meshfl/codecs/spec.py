"""Codec spec strings: the one parser from user text to a :class:`Codec`.

Grammar (case and surrounding spaces ignored)::

    spec  := base [ "+zstd" [ ":" LEVEL ] ]
    base  := "identity" | "fp32" | "fp16" | "bf16" | "sign"
           | "int8" [ ":" CHUNK ]             CHUNK  int >= 1, default 1024
           | "qsgd:" S [ ":" BUCKET ]          S      int in [1, 65535], BUCKET default 512
           | "topk:" DENSITY                  DENSITY in (0, 1]
           | "randk:" DENSITY [ ":unbiased" ]
           | "powersgd:" R                    R      int in [1, 65535]
    LEVEL := int in [1, 22], default 3

``codec.spec`` is the canonical form and parses back to an equal codec.
"""

from __future__ import annotations

import math

from meshfl.codecs.base import Codec
from meshfl.codecs.bf16 import BFloat16
from meshfl.codecs.fp16 import Float16
from meshfl.codecs.identity import Identity
from meshfl.codecs.int8 import Int8
from meshfl.codecs.powersgd import PowerSGD
from meshfl.codecs.qsgd import QSGD
from meshfl.codecs.randk import RandK
from meshfl.codecs.sign import Sign
from meshfl.codecs.topk import TopK
from meshfl.codecs.zstd import DEFAULT_LEVEL, Zstd
from meshfl.errors import CodecSpecError

__all__ = ["VALID_FORMS", "parse_codec"]

VALID_FORMS = (
    "identity|fp32, fp16, bf16, int8[:CHUNK], qsgd:S[:BUCKET], topk:DENSITY (0 < DENSITY <= 1), "
    "randk:DENSITY[:unbiased], sign, powersgd:RANK, each optionally +zstd[:LEVEL]"
)


def _fail(spec: str, why: str = "") -> CodecSpecError:
    reason = f": {why}" if why else ""
    return CodecSpecError(f"invalid codec spec {spec!r}{reason}; valid forms: {VALID_FORMS}")


def _int(spec: str, text: str, what: str) -> int:
    if not text.isdigit():
        raise _fail(spec, f"{what} must be a positive integer")
    return int(text)


def _density(spec: str, text: str) -> float:
    try:
        density = float(text)
    except ValueError:
        density = math.nan
    if not (math.isfinite(density) and 0.0 < density <= 1.0):
        raise _fail(spec, "density must be in (0, 1]")
    return density


def _base(spec: str, text: str, seed: int | None) -> Codec:
    kind, _, arg = text.partition(":")
    simple: dict[str, type[Codec]] = {
        "identity": Identity,
        "fp32": Identity,
        "fp16": Float16,
        "bf16": BFloat16,
        "sign": Sign,
    }
    if kind in simple and text == kind:
        return simple[kind]()
    try:
        if kind == "int8":
            return Int8(_int(spec, arg, "chunk")) if text != kind else Int8()
        if kind == "qsgd":
            levels, colon, bucket = arg.partition(":")
            if colon:
                return QSGD(_int(spec, levels, "levels"), _int(spec, bucket, "bucket"), seed=seed)
            return QSGD(_int(spec, levels, "levels"), seed=seed)
        if kind == "powersgd":
            return PowerSGD(_int(spec, arg, "rank"), seed=seed)
        if kind == "topk":
            return TopK(_density(spec, arg))
        if kind == "randk":
            density, _, flag = arg.partition(":")
            if flag not in ("", "unbiased") or arg.endswith(":"):
                raise _fail(spec, "randk takes an optional ':unbiased'")
            return RandK(_density(spec, density), unbiased=bool(flag), seed=seed)
    except CodecSpecError as exc:
        if "valid forms" in str(exc):
            raise
        raise _fail(spec, str(exc)) from exc
    raise _fail(spec)


def parse_codec(spec: str, seed: int | None = None) -> Codec:
    """Build a codec from its spec string.

    Parameters
    ----------
    spec : str
        See the module docstring, e.g. ``"topk:0.01+zstd"``, ``"int8:256"``, ``"qsgd:16"``.
    seed : int or None, default None
        Seed for the encoders that draw random numbers (qsgd, randk, powersgd);
        ``None`` draws OS entropy. Never part of the spec or the wire.

    Returns
    -------
    Codec
        A codec whose ``.spec`` parses back to an equal codec.

    Raises
    ------
    CodecSpecError
        If the spec does not parse; the one-line message lists the valid forms.

    """
    if not isinstance(spec, str):
        raise CodecSpecError(f"codec spec must be a string; valid forms: {VALID_FORMS}")
    text = spec.strip().lower()
    base, plus, layer = text.partition("+")
    codec = _base(spec, base, seed)
    if not plus:
        return codec
    name, colon, level = layer.partition(":")
    if name != "zstd" or (colon and not level):
        raise _fail(spec, "the only layer is +zstd[:LEVEL]")
    try:
        return Zstd(codec, _int(spec, level, "zstd level") if colon else DEFAULT_LEVEL)
    except CodecSpecError as exc:
        if "valid forms" in str(exc):
            raise
        raise _fail(spec, str(exc)) from exc
