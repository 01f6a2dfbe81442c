"""The wire-tag registry: tag → codec class, checked once when the package is imported.

Building :data:`CODECS` refuses a duplicate tag or name and a tag outside u8, as
hivemind's ``compression/serialization.py`` does, so two codecs can never claim one tag.
The plain codecs are listed in :mod:`meshfl.codecs.plain`; the zstd layer, which wraps
them, is added here.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshfl.codecs.base import Codec
from meshfl.codecs.plain import PLAIN_CODECS, build_registry
from meshfl.codecs.zstd import Zstd

__all__ = ["CODECS", "build_registry"]

CODECS: Mapping[int, type[Codec]] = build_registry((*PLAIN_CODECS.values(), Zstd))
"""Wire tag → codec class, read-only."""
