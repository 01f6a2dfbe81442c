"""The array codecs, by wire tag, and the check that builds a tag table.

A *plain* codec encodes an array itself; the zstd layer (:mod:`meshfl.codecs.zstd`)
wraps one of them and names it by its tag inside its payload, so it reads this table,
and :mod:`meshfl.codecs.registry` adds zstd on top: neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

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
from meshfl.errors import CodecError

__all__ = ["PLAIN_CODECS", "build_registry"]


def build_registry(classes: Iterable[type[Codec]]) -> Mapping[int, type[Codec]]:
    """Map wire tag to codec class, refusing duplicate tags or names and tags outside u8.

    Parameters
    ----------
    classes : iterable of Codec subclasses
        Each with class variables ``tag`` and ``name``.

    Returns
    -------
    Mapping of int to type[Codec]
        Read-only, in the order given.

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
        by_tag[int(cls.tag)] = cls
        names[cls.name] = cls
    return MappingProxyType(by_tag)


PLAIN_CODECS: Mapping[int, type[Codec]] = build_registry(
    (Identity, TopK, Float16, BFloat16, Int8, QSGD, RandK, Sign, PowerSGD)
)
"""Wire tag → codec class of every codec that encodes an array itself (all but zstd)."""
