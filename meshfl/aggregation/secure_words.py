"""Words modulo 2^b for secure aggregation: the mask PRG, shared coordinates, packing.

The pieces of :mod:`meshfl.aggregation.secure` that deal in raw words rather than
fixed-point values: SHAKE-256 expansion of a seed (:func:`prg_words`), the shared-seed
random-k coordinates every sender of an instance agrees on (:func:`shared_indices`), and
tight b-bit packing for the wire (:func:`pack_words`, :func:`unpack_words`).
numpy + stdlib only.
"""

from __future__ import annotations

import hashlib

import numpy as np

from meshfl.errors import CodecError, ConfigError, WireError

__all__ = ["pack_words", "prg_words", "shared_indices", "unpack_words"]

_INDEX_DOMAIN = b"meshfl shared-indices v1\0"
_CHUNK_WORDS = 1 << 15  # a multiple of 8: packed chunks end on byte boundaries


def _check_bits(modulus_bits: int, low: int = 1, high: int = 64) -> int:
    if isinstance(modulus_bits, bool) or not isinstance(modulus_bits, int):
        raise ConfigError(f"modulus bits must be an integer, got {modulus_bits!r}")
    if not low <= modulus_bits <= high:
        raise ConfigError(f"modulus bits must be in [{low}, {high}], got {modulus_bits}")
    return modulus_bits


def _modulus_mask(modulus_bits: int) -> np.uint64:
    return np.uint64((1 << modulus_bits) - 1)


def prg_words(seed: bytes, n: int, modulus_bits: int) -> np.ndarray:
    """Expand ``seed`` into ``n`` pseudo-random words modulo 2^b (the mask PRG).

    SHAKE-256 (FIPS 202) of ``seed``, read as ``n`` little-endian 64-bit words and
    reduced modulo 2^b by keeping the low b bits (uniform, since 2^b divides 2^64).
    The output for ``n`` is a prefix of the output for any larger ``n``.

    Parameters
    ----------
    seed : bytes
        The PRG seed (a 32-byte self-mask seed or an HKDF-derived pairwise seed).
    n : int
        Number of words, ``>= 0``.
    modulus_bits : int
        b in [1, 64].

    Returns
    -------
    np.ndarray
        uint64, shape (n,), every value < 2^b.

    Raises
    ------
    ConfigError
        If ``seed`` is not bytes, ``n < 0`` or b is out of range.

    """
    if not isinstance(seed, (bytes, bytearray)):
        raise ConfigError(f"PRG seed must be bytes, got {type(seed).__name__}")
    if n < 0:
        raise ConfigError(f"PRG word count must be >= 0, got {n}")
    _check_bits(modulus_bits)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    raw = hashlib.shake_256(bytes(seed)).digest(8 * n)
    words = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
    if modulus_bits < 64:
        words &= _modulus_mask(modulus_bits)
    return words


def shared_indices(seed: bytes, n: int, k: int) -> np.ndarray:
    """The k coordinates of shared-seed random-k, derived from ``seed`` alone.

    Every sender of one instance calls this with the same public seed and gets the same
    coordinates, so masked values line up and no indices are sent. Candidates are drawn
    as SHAKE-256 words modulo n (bias < n / 2^64) and the first k distinct ones kept;
    for k > n/2 the n − k *excluded* coordinates are drawn instead. Portable across
    numpy versions (no numpy RNG stream involved).

    Parameters
    ----------
    seed : bytes
        Public seed of the instance (e.g. from job, round and aggregator).
    n : int
        Coordinates in the model, ``>= 0``.
    k : int
        Coordinates kept, in [0, n].

    Returns
    -------
    np.ndarray
        int64, shape (k,), sorted, distinct, in [0, n).

    Raises
    ------
    ConfigError
        If ``k`` is outside [0, n] or ``seed`` is not bytes.

    """
    if not isinstance(seed, (bytes, bytearray)):
        raise ConfigError(f"index seed must be bytes, got {type(seed).__name__}")
    if not 0 <= k <= n:
        raise ConfigError(f"random-k needs 0 <= k <= n, got k={k}, n={n}")
    if k == n:
        return np.arange(n, dtype=np.int64)
    complement = k > n // 2
    draw = n - k if complement else k
    chosen = np.zeros(0, dtype=np.int64)
    words = draw + draw // 2 + 16
    source = _INDEX_DOMAIN + bytes(seed)
    while draw:
        candidates = (prg_words(source, words, 64) % np.uint64(n)).astype(np.int64)
        unique, first = np.unique(candidates, return_index=True)
        if unique.size >= draw:
            chosen = np.sort(unique[np.argsort(first, kind="stable")[:draw]])
            break
        words *= 2
    if not complement:
        return chosen
    keep = np.ones(n, dtype=bool)
    keep[chosen] = False
    return np.flatnonzero(keep).astype(np.int64)


def pack_words(v: np.ndarray, modulus_bits: int) -> bytes:
    """Pack values < 2^b tightly, b bits each, least significant bit first.

    Word ``i`` occupies bits [i·b, (i+1)·b) of the stream, which is cut into bytes LSB
    first (the layout of :mod:`meshfl.codecs.bitpack`, extended to 64-bit words); the
    last byte is zero-padded.

    Returns
    -------
    bytes
        ``ceil(n·b / 8)`` bytes.

    Raises
    ------
    CodecError
        If a value is ``>= 2^b``.
    ConfigError
        If b is outside [1, 64].

    """
    _check_bits(modulus_bits)
    words = np.asarray(v, dtype=np.uint64).reshape(-1)
    if modulus_bits < 64 and np.any(words >> np.uint64(modulus_bits)):
        raise CodecError(f"a value does not fit {modulus_bits} bits")
    out = []
    for start in range(0, words.size, _CHUNK_WORDS):  # chunks of 8·m words: m·b whole bytes
        chunk = words[start : start + _CHUNK_WORDS].astype("<u8").view(np.uint8)
        bits = np.unpackbits(chunk, bitorder="little").reshape(-1, 64)[:, :modulus_bits]
        out.append(np.packbits(bits.reshape(-1), bitorder="little").tobytes())
    return b"".join(out)


def unpack_words(data: bytes, n: int, modulus_bits: int) -> np.ndarray:
    """Unpack ``n`` words of b bits from exactly ``ceil(n·b / 8)`` bytes.

    Returns
    -------
    np.ndarray
        uint64, shape (n,).

    Raises
    ------
    WireError
        If ``data`` has the wrong length or a padding bit is set.
    ConfigError
        If b is outside [1, 64] or ``n < 0``.

    """
    _check_bits(modulus_bits)
    if n < 0:
        raise ConfigError(f"word count must be >= 0, got {n}")
    expected = (n * modulus_bits + 7) // 8
    if len(data) != expected:
        raise WireError(
            f"packed words are {len(data)} bytes, expected {expected} ({n} × {modulus_bits} bits)"
        )
    tail = (n * modulus_bits) % 8
    if tail and data[-1] >> tail:
        raise WireError("packed words have padding bits set")
    raw = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(n, dtype=np.uint64)
    chunk_bytes = _CHUNK_WORDS * modulus_bits // 8
    for index, start in enumerate(range(0, n, _CHUNK_WORDS)):
        count = min(_CHUNK_WORDS, n - start)
        piece = raw[index * chunk_bytes : (index + 1) * chunk_bytes]
        bits = np.unpackbits(piece, count=count * modulus_bits, bitorder="little")
        full = np.zeros((count, 64), dtype=np.uint8)
        full[:, :modulus_bits] = bits.reshape(count, modulus_bits)
        out[start : start + count] = np.packbits(full.reshape(-1), bitorder="little").view("<u8")
    return out
