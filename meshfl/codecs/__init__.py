"""Tensor codecs: tagged, registered compressors for model deltas.

Every codec has a one-byte wire tag (:class:`CodecTag`) and a spec keyword;
:data:`CODECS` maps tags to codec classes and is checked at import (a duplicate tag or
name raises :class:`~meshfl.errors.CodecError`), as hivemind's
``compression/serialization.py`` does. Each codec lives in its own module, whose
docstring gives its source, equation, error bound and payload layout; ``docs/codecs.md``
compares them.

Spec strings (``parse_codec``)::

    identity | fp32        raw float32, lossless                       (tag 1)
    topk:DENSITY           top-k sparsification, 0 < DENSITY <= 1      (tag 2)
    fp16                   half precision, per-tensor 2^e scale        (tag 3)
    bf16                   bfloat16, round to nearest even             (tag 4)
    int8[:CHUNK]           int8, max-abs scale per CHUNK (1024)        (tag 5)
    qsgd:S[:BUCKET]        QSGD, S levels, norm per BUCKET (512)       (tag 6)
    randk:DENSITY[:unbiased]  random-k from a seed in the payload      (tag 7)
    sign                   1 bit per element, mean |x| scale           (tag 8)
    powersgd:RANK          rank-r PowerSGD for ndim >= 2, dense else   (tag 9)
    SPEC+zstd[:LEVEL]      lossless zstd layer over any of the above   (tag 10)
"""

from __future__ import annotations

import numpy as np

from meshfl.codecs.base import Codec, CodecTag
from meshfl.codecs.bf16 import BFloat16
from meshfl.codecs.fp16 import Float16
from meshfl.codecs.identity import Identity
from meshfl.codecs.int8 import Int8
from meshfl.codecs.policy import CodecPolicy, budget_density
from meshfl.codecs.powersgd import PowerSGD
from meshfl.codecs.qsgd import QSGD
from meshfl.codecs.randk import RandK
from meshfl.codecs.registry import CODECS
from meshfl.codecs.sign import Sign
from meshfl.codecs.spec import VALID_FORMS, parse_codec
from meshfl.codecs.topk import TopK
from meshfl.codecs.zstd import Zstd
from meshfl.errors import CodecError

__all__ = [
    "CODECS",
    "QSGD",
    "VALID_FORMS",
    "BFloat16",
    "Codec",
    "CodecPolicy",
    "CodecTag",
    "Float16",
    "Identity",
    "Int8",
    "PowerSGD",
    "RandK",
    "Sign",
    "TopK",
    "Zstd",
    "budget_density",
    "decode_tensor",
    "parse_codec",
]


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
