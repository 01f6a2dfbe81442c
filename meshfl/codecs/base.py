"""The codec interface: a tagged, stateless tensor compressor.

A codec turns one float32 tensor into a self-describing payload (every parameter the
decoder needs travels in the payload) and back. Error feedback, when a codec is biased,
lives in the caller's state object, never in the codec (torch's PowerSGD hook keeps the
same split).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from enum import IntEnum
from typing import ClassVar

import numpy as np

from meshfl.errors import CodecError, CodecSpecError

__all__ = [
    "F32_MAX",
    "Codec",
    "CodecTag",
    "as_float32",
    "check_finite_float32",
    "check_payload",
    "check_shape",
    "make_rng",
    "per_chunk",
    "reduce_chunks",
]

F32_MAX = float(np.finfo(np.float32).max)
"""Largest finite float32, about 3.4028e38."""


class CodecTag(IntEnum):
    """Wire codec tags (u8). A tag, once released, keeps its payload layout forever."""

    IDENTITY = 1
    TOPK = 2
    FP16 = 3
    BF16 = 4
    INT8 = 5
    QSGD = 6
    RANDK = 7
    SIGN = 8
    POWERSGD = 9
    ZSTD = 10


def check_payload(payload: object) -> bytes:
    """Return an untrusted payload as ``bytes``.

    Raises
    ------
    CodecError
        If ``payload`` is not bytes-like (``bytes``, ``bytearray``, ``memoryview``).

    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CodecError(f"payload must be bytes, got {type(payload).__name__}")
    return bytes(payload)


def make_rng(seed: int | None) -> np.random.Generator:
    """Return the encoder's generator: ``np.random.default_rng(seed)``.

    Parameters
    ----------
    seed : int or None
        A non-negative integer makes the encoder deterministic; ``None`` draws fresh
        entropy from the operating system.

    Raises
    ------
    CodecSpecError
        If ``seed`` is neither ``None`` nor a non-negative ``int``.

    """
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise CodecSpecError(f"codec seed must be None or an int >= 0, got {seed!r}")
    return np.random.default_rng(seed)


def check_shape(shape: tuple[int, ...]) -> int:
    """Validate a tensor shape and return its number of elements.

    Parameters
    ----------
    shape : tuple of int
        Dimensions, each a non-negative ``int``; ``()`` is a 0-d scalar (1 element).

    Returns
    -------
    int
        The element count ``prod(shape)``.

    Raises
    ------
    CodecError
        If a dimension is negative or not an integer.

    """
    if not isinstance(shape, tuple):
        raise CodecError(f"shape must be a tuple of ints, got {type(shape).__name__}")
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 0:
            raise CodecError(f"invalid tensor shape {shape!r}: dimensions must be ints >= 0")
    return math.prod(int(d) for d in shape)


def as_float32(x: np.ndarray) -> np.ndarray:
    """Return ``x`` as a C-contiguous little-endian float32 array, without a finiteness scan.

    For codecs that detect NaN/inf from a reduction they compute anyway (a finite sum
    of ``|x|`` in float64 proves every element finite); others use
    :func:`check_finite_float32`.

    Raises
    ------
    CodecError
        If the dtype is not floating.

    """
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise CodecError(f"codecs encode floating tensors, got dtype {arr.dtype}")
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(arr, dtype="<f4")


def check_finite_float32(x: np.ndarray) -> np.ndarray:
    """Return ``x`` as a C-contiguous little-endian float32 array, rejecting NaN/inf.

    Parameters
    ----------
    x : np.ndarray
        Any shape (0-d and empty included), a real floating dtype.

    Returns
    -------
    np.ndarray
        float32 ``'<f4'``, same shape, C order (a view when no conversion is needed).

    Raises
    ------
    CodecError
        If the dtype is not floating, or an element is NaN or infinite (also after the
        cast to float32, so a float64 value beyond the float32 range is rejected).

    """
    out = as_float32(x)
    if not bool(np.isfinite(out).all()):
        raise CodecError("tensor contains NaN or inf; refusing to encode it")
    return out


def per_chunk(
    op: np.ufunc, values: np.ndarray, operands: np.ndarray, chunk: int, out: np.ndarray
) -> None:
    """Apply ``out[i] = op(values[i], operands[i // chunk])`` without padding the tensor.

    Parameters
    ----------
    op : np.ufunc
        A binary ufunc such as ``np.multiply``.
    values : np.ndarray
        shape (n,).
    operands : np.ndarray
        shape (ceil(n / chunk),), one operand per chunk.
    chunk : int
        Elements per chunk, ``>= 1``.
    out : np.ndarray
        shape (n,), written in place.

    """
    n = values.size
    full = (n // chunk) * chunk
    if full:
        op(
            values[:full].reshape(-1, chunk),
            operands[: n // chunk, None],
            out=out[:full].reshape(-1, chunk),
        )
    if full < n:
        op(values[full:], operands[-1], out=out[full:])


def reduce_chunks(
    op: np.ufunc, values: np.ndarray, chunk: int, dtype: type | None = None
) -> np.ndarray:
    """Return ``op.reduce`` of each chunk of ``values`` (shape (ceil(n / chunk),)).

    Parameters
    ----------
    op : np.ufunc
        A reducing ufunc such as ``np.maximum`` or ``np.add``.
    values : np.ndarray
        shape (n,), ``n >= 1``.
    chunk : int
        Elements per chunk, ``>= 1``.
    dtype : type or None
        Accumulator dtype (``None``: that of ``values``).

    """
    n = values.size
    full = (n // chunk) * chunk
    parts = []
    if full:
        parts.append(op.reduce(values[:full].reshape(-1, chunk), axis=1, dtype=dtype))
    if full < n:
        parts.append(op.reduce(values[full:], keepdims=True, dtype=dtype))
    return np.concatenate(parts)


class Codec(ABC):
    """A tensor codec with a one-byte wire tag.

    Subclasses set the class variables ``tag`` (u8, unique in
    :data:`meshfl.codecs.CODECS`) and ``name`` (the spec keyword), and implement
    :meth:`encode`, :meth:`decode`, :meth:`estimate_ratio` and :attr:`spec`.
    Two codecs are equal when their specs are equal.
    """

    tag: ClassVar[int]
    name: ClassVar[str]

    @abstractmethod
    def encode(self, x: np.ndarray) -> bytes:
        """Compress one tensor.

        Parameters
        ----------
        x : np.ndarray
            float32 (other floating dtypes are cast), any shape including 0-d and empty.

        Returns
        -------
        bytes
            The payload; :meth:`decode` with ``x.shape`` rebuilds the (approximate) tensor.

        Raises
        ------
        CodecError
            If ``x`` holds NaN or inf or is not floating: such a tensor is never sent.

        """

    @classmethod
    @abstractmethod
    def decode(cls, payload: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """Rebuild a tensor from a payload, without the encoder's parameters.

        Parameters
        ----------
        payload : bytes
            Bytes produced by :meth:`encode` (untrusted: bounds-checked).
        shape : tuple of int
            The tensor's shape from the message manifest.

        Returns
        -------
        np.ndarray
            A fresh, writable float32 array of ``shape``.

        Raises
        ------
        CodecError
            If the payload is malformed, truncated, too long, or decodes to NaN/inf.
            No other exception type escapes.

        """

    @abstractmethod
    def estimate_ratio(self, numel: int) -> float:
        """Return the expected compression ratio for a tensor of ``numel`` elements.

        Parameters
        ----------
        numel : int
            Number of elements (not bytes), ``>= 0``.

        Returns
        -------
        float
            ``4 * numel / payload_bytes`` (float32 bytes over payload bytes), computed
            from sizes alone, without encoding anything.

        """

    @property
    @abstractmethod
    def spec(self) -> str:
        """The spec string that :func:`meshfl.codecs.parse_codec` turns back into this codec."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and type(other) is type(self) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash((type(self), self.spec))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"
