"""The wire envelope: what one gossip message carries, independent of its byte layout.

An :class:`Envelope` is a header (kind, fleet, job, round, sender, message id, sequence
number) plus a manifest of :class:`TensorEntry` values, each an opaque codec payload with
the tensor's name, shape and dtype. :mod:`meshfl.wire.serde` turns it into bytes.

Construction validates every field against the wire limits below and raises
:class:`~meshfl.errors.WireError` for a value the wire format cannot carry, so a decoded
envelope and a hand-built one obey the same invariants.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from meshfl.errors import CodecError, WireError

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_NDIM",
    "MAX_PAYLOAD_BYTES",
    "MAX_STRING_BYTES",
    "MAX_TENSORS",
    "MESSAGE_ID_BYTES",
    "DType",
    "Envelope",
    "MessageKind",
    "TensorEntry",
    "new_message_id",
]

MESSAGE_ID_BYTES = 16
"""Length of a message id, bytes."""
MAX_STRING_BYTES = 255
"""Longest fleet, job or sender string, UTF-8 bytes."""
MAX_NAME_BYTES = 255
"""Longest tensor name, UTF-8 bytes (at least 1)."""
MAX_TENSORS = 4096
"""Most tensors in one envelope."""
MAX_NDIM = 8
"""Most dimensions of one tensor."""
MAX_PAYLOAD_BYTES = 2**32 - 1
"""Largest codec payload of one tensor, bytes (u32 length field)."""
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1


class DType(IntEnum):
    """Element type of a tensor as carried on the wire (u8 tag; values are frozen).

    ``BFLOAT16`` has no numpy dtype: :meth:`to_numpy` raises
    :class:`~meshfl.errors.CodecError` for it; codecs that produce bfloat16 store its
    raw bits as ``uint16`` themselves.
    """

    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    INT8 = 4
    UINT8 = 5
    INT32 = 6
    INT64 = 7
    FLOAT64 = 8

    @classmethod
    def from_numpy(cls, dtype: np.dtype[Any] | type[np.generic] | str) -> DType:
        """Return the wire dtype of a numpy dtype (byte order is ignored).

        Raises
        ------
        CodecError
            If the dtype has no wire tag (bool, complex, uint16, ...).

        """
        try:
            native = np.dtype(dtype).newbyteorder("=")
        except TypeError as exc:
            raise CodecError(f"not a numpy dtype: {dtype!r}") from exc
        for tag, np_dtype in _TO_NUMPY.items():
            if native == np_dtype:
                return tag
        raise CodecError(f"numpy dtype {native} has no wire dtype; use one of {_names()}")

    def to_numpy(self) -> np.dtype[Any]:
        """Return the native-byte-order numpy dtype of this wire dtype.

        Raises
        ------
        CodecError
            For ``BFLOAT16``, which numpy cannot represent.

        """
        if self is DType.BFLOAT16:
            raise CodecError("bfloat16 has no numpy dtype; codecs store its bits as uint16")
        return _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element (2 for ``BFLOAT16``)."""
        return 2 if self is DType.BFLOAT16 else _TO_NUMPY[self].itemsize


_TO_NUMPY: dict[DType, np.dtype[Any]] = {
    DType.FLOAT32: np.dtype(np.float32),
    DType.FLOAT16: np.dtype(np.float16),
    DType.INT8: np.dtype(np.int8),
    DType.UINT8: np.dtype(np.uint8),
    DType.INT32: np.dtype(np.int32),
    DType.INT64: np.dtype(np.int64),
    DType.FLOAT64: np.dtype(np.float64),
}


def _names() -> str:
    return ", ".join(str(dt) for dt in _TO_NUMPY.values())


class MessageKind(IntEnum):
    """What an envelope's tensors mean (u8 tag; values are frozen)."""

    DELTA = 1
    """A CHOCO-SGD compressed difference q = C(x − x̂) (Koloskova et al., ICML 2019)."""
    MODEL = 2
    """A full model, for D-PSGD gossip averaging (Lian et al., NeurIPS 2017)."""
    KEYFRAME = 3
    """The full replica state x̂, losslessly packed, sent on join, gap or every K rounds."""
    SECURE_INPUT = 4
    """A masked fixed-point contribution on one edge (secure aggregation, per-edge inbox)."""
    SECAGG = 5
    """A secure-aggregation protocol message (shares, unmask request, reveal): one UINT8
    tensor ``body`` holding a JSON object; see ``docs/privacy.md``."""


def new_message_id() -> bytes:
    """Return a fresh random message id (16 bytes from :func:`os.urandom`)."""
    return os.urandom(MESSAGE_ID_BYTES)


def _check_text(value: object, what: str, limit: int, minimum: int = 0) -> None:
    if not isinstance(value, str):
        raise WireError(f"{what} must be a str, not {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise WireError(f"{what} is not encodable as UTF-8") from exc
    if not minimum <= size <= limit:
        raise WireError(f"{what} must be {minimum}..{limit} UTF-8 bytes, got {size}")


def _check_uint(value: object, what: str, limit: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise WireError(f"{what} must be an int in 0..{limit}, got {value!r}")


def _as_bytes(value: object, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise WireError(f"{what} must be bytes, not {type(value).__name__}")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of an envelope: manifest fields plus the codec's opaque payload.

    Parameters
    ----------
    name : str
        Tensor name (a ``state_dict`` key), 1..255 UTF-8 bytes, unique in its envelope.
    shape : tuple of int
        Logical shape, at most 8 dimensions, each 0..2**32-1. Whether it matches the
        payload is the codec's business, not the wire's.
    dtype : DType
        Logical element type of the decoded tensor.
    codec : int
        Wire tag (u8, 0..255) of the codec that produced ``payload``.
    payload : bytes
        The codec's opaque bytes, at most 2**32-1.

    Raises
    ------
    WireError
        If a field cannot be carried by the wire format.

    """

    name: str
    shape: tuple[int, ...]
    dtype: DType
    codec: int
    payload: bytes

    def __post_init__(self) -> None:
        _check_text(self.name, "tensor name", MAX_NAME_BYTES, minimum=1)
        try:
            shape = tuple(operator.index(d) for d in self.shape)
            dtype = DType(self.dtype)
        except (TypeError, ValueError) as exc:
            raise WireError(f"tensor {self.name!r}: bad shape or dtype: {exc}") from exc
        if len(shape) > MAX_NDIM:
            raise WireError(f"tensor {self.name!r} has {len(shape)} dims; at most {MAX_NDIM}")
        for d in shape:
            _check_uint(d, f"tensor {self.name!r} dimension", _U32_MAX)
        _check_uint(self.codec, f"tensor {self.name!r} codec tag", 255)
        payload = _as_bytes(self.payload, f"tensor {self.name!r} payload")
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise WireError(f"tensor {self.name!r} payload exceeds {MAX_PAYLOAD_BYTES} bytes")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "payload", payload)


@dataclass(frozen=True)
class Envelope:
    """One gossip message: header plus tensor manifest and payloads.

    Parameters
    ----------
    kind : MessageKind
        What the tensors mean (delta, full model, keyframe).
    fleet, job, sender : str
        Fleet id, job id and the sending device id, each 0..255 UTF-8 bytes.
    round : int
        Training round, u32.
    message_id : bytes
        Exactly 16 bytes (see :func:`new_message_id`); keys chunk reassembly.
    sequence : int
        Per-sender counter, u64; receivers drop duplicates by (sender, sequence).
    tensors : tuple of TensorEntry
        At most 4096 entries with unique names; a list is converted to a tuple.

    Raises
    ------
    WireError
        If a field cannot be carried by the wire format.

    """

    kind: MessageKind
    fleet: str
    job: str
    round: int
    sender: str
    message_id: bytes
    sequence: int
    tensors: tuple[TensorEntry, ...]

    def __post_init__(self) -> None:
        try:
            kind = MessageKind(self.kind)
        except ValueError as exc:
            raise WireError(f"unknown message kind {self.kind!r}") from exc
        for what, text in (("fleet", self.fleet), ("job", self.job), ("sender", self.sender)):
            _check_text(text, what, MAX_STRING_BYTES)
        _check_uint(self.round, "round", _U32_MAX)
        _check_uint(self.sequence, "sequence", _U64_MAX)
        message_id = _as_bytes(self.message_id, "message id")
        if len(message_id) != MESSAGE_ID_BYTES:
            raise WireError(f"message id must be {MESSAGE_ID_BYTES} bytes, got {len(message_id)}")
        tensors = tuple(self.tensors)
        if len(tensors) > MAX_TENSORS:
            raise WireError(f"{len(tensors)} tensors in one envelope; at most {MAX_TENSORS}")
        if not all(isinstance(t, TensorEntry) for t in tensors):
            raise WireError("tensors must be TensorEntry values")
        if len({t.name for t in tensors}) != len(tensors):
            raise WireError("tensor names must be unique within an envelope")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "message_id", message_id)
        object.__setattr__(self, "tensors", tensors)
