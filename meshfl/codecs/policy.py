"""Per-tensor codec choice: small tensors dense, the rest compressed, density from a budget.

Biases and normalization parameters are a tiny share of the bytes but are hurt most by
sparsification, so they go dense; the big matrices carry the compression. This mirrors
hivemind's ``compression/adaptive.py`` (``SizeAdaptiveCompression``). A policy is built
in code; it has no spec string.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshfl.codecs.base import Codec
from meshfl.codecs.identity import Identity
from meshfl.codecs.randk import RandK
from meshfl.codecs.topk import TopK
from meshfl.errors import ConfigError

__all__ = ["DEFAULT_DENSE_BELOW", "CodecPolicy", "ModelLayout", "budget_density"]

DEFAULT_DENSE_BELOW = 256
ModelLayout = Sequence[tuple[str, tuple[int, ...]]]
"""Ordered (tensor name, shape) pairs of a model."""


def _check_count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{what} must be an int >= 0, got {value!r}")
    return value


class CodecPolicy:
    """Choose a codec per tensor by its element count.

    Parameters
    ----------
    codec : Codec
        Codec for tensors of at least ``dense_below`` elements.
    dense_below : int, default 256
        Tensors with fewer elements (biases, norms, scalars) use ``dense_codec``.
    dense_codec : Codec or None, default None
        Codec for small tensors; ``None`` means :class:`Identity` (lossless).

    Raises
    ------
    ConfigError
        If a codec is not a :class:`Codec` or ``dense_below`` is not an int ``>= 0``.

    """

    __slots__ = ("codec", "dense_below", "dense_codec")

    def __init__(
        self, codec: Codec, dense_below: int = DEFAULT_DENSE_BELOW, dense_codec: Codec | None = None
    ) -> None:
        dense = Identity() if dense_codec is None else dense_codec
        if not isinstance(codec, Codec) or not isinstance(dense, Codec):
            raise ConfigError("a codec policy needs meshfl Codec instances")
        self.codec = codec
        self.dense_below = _check_count(dense_below, "dense_below")
        self.dense_codec = dense

    def codec_for(self, name: str, shape: tuple[int, ...]) -> Codec:
        """Return the codec for tensor ``name`` of ``shape``: dense below the threshold.

        ``name`` is accepted so that role-based policies can share the signature; this
        policy looks at the size only.
        """
        return self.dense_codec if math.prod(shape) < self.dense_below else self.codec

    def estimate_bytes(self, layout: ModelLayout) -> float:
        """Return the estimated payload bytes of one message for ``layout`` (from the ratios)."""
        total = 0.0
        for name, shape in layout:
            numel = math.prod(shape)
            ratio = self.codec_for(name, shape).estimate_ratio(numel)
            total += 4.0 * numel / ratio if ratio else 0.0
        return total

    @classmethod
    def from_options(
        cls, codec: Codec, layout: ModelLayout, dense_below: int = 0, byte_budget: int = 0
    ) -> CodecPolicy:
        """Return the policy of a job: ``codec``, small tensors dense, density from a budget.

        Parameters
        ----------
        codec : Codec
            The job's codec (its spec string parsed).
        layout : sequence of (str, tuple of int)
            The model's (name, shape) pairs.
        dense_below : int, default 0
            Tensors with fewer elements go uncompressed (0: none).
        byte_budget : int, default 0
            Payload bytes per message; when > 0 the codec must be top-k or random-k and
            its density is replaced by the largest that fits (0: keep the codec's).

        Raises
        ------
        ConfigError
            A budget with a codec that has no density, or a budget too small.

        """
        if byte_budget <= 0:
            return cls(codec, dense_below)
        if codec.name not in ("topk", "randk"):
            raise ConfigError(
                f"a byte budget sets a sparsifier's density; codec {codec.spec!r} has none"
                " (use topk:D or randk:D)"
            )
        return cls.for_budget(byte_budget, layout, codec.name, dense_below)

    @classmethod
    def for_budget(
        cls,
        budget_bytes: int,
        layout: ModelLayout,
        sparsifier: str = "topk",
        dense_below: int = DEFAULT_DENSE_BELOW,
    ) -> CodecPolicy:
        """Return a policy whose top-k or random-k density meets ``budget_bytes`` per message.

        Raises
        ------
        ConfigError
            If ``sparsifier`` is not ``"topk"``/``"randk"`` or the budget is too small.

        """
        if sparsifier not in ("topk", "randk"):
            raise ConfigError(f"sparsifier must be 'topk' or 'randk', got {sparsifier!r}")
        bits = 16.0 if sparsifier == "topk" else 0.0
        density = budget_density(budget_bytes, layout, index_bits=bits, dense_below=dense_below)
        codec: Codec = TopK(density) if sparsifier == "topk" else RandK(density)
        return cls(codec, dense_below)


def budget_density(
    budget_bytes: int,
    layout: ModelLayout,
    index_bits: float = 16.0,
    dense_below: int = DEFAULT_DENSE_BELOW,
    header_bytes: int = 12,
) -> float:
    """Return the largest sparsifier density whose message fits ``budget_bytes``.

    Cost model (bytes): a dense tensor of ``n < dense_below`` elements costs ``4n``; a
    sparse one costs ``header_bytes + k (4 + index_bits/8)`` with
    ``k = ceil(d n) <= d n + 1``. Solving ``Σ cost <= budget`` for ``d`` and rounding
    down to 6 significant digits gives the result.

    Parameters
    ----------
    budget_bytes : int
        Payload bytes allowed per message (all tensors, codec payloads only).
    layout : sequence of (str, tuple of int)
        The model's (name, shape) pairs.
    index_bits : float, default 16
        Index cost per kept element: 0 for random-k; 16 for top-k bounds its varint
        gaps (< 16 384) or its bitmap (density >= 1/16), the common case.
    dense_below : int, default 256
        As in :class:`CodecPolicy`.
    header_bytes : int, default 12
        Per-tensor header of the sparsifier (top-k 5, random-k 12).

    Returns
    -------
    float
        Density in ``(0, 1]``; 1.0 when no tensor is sparse or the budget allows all.

    Raises
    ------
    ConfigError
        If an argument is out of range or the budget does not cover the dense tensors,
        the headers and one kept element per sparse tensor.

    """
    _check_count(budget_bytes, "budget_bytes")
    _check_count(dense_below, "dense_below")
    _check_count(header_bytes, "header_bytes")
    if not (math.isfinite(index_bits) and index_bits >= 0):
        raise ConfigError(f"index_bits must be finite and >= 0, got {index_bits!r}")
    per_kept = 4.0 + index_bits / 8.0
    dense_bytes = 0
    sparse_numel = 0
    sparse_tensors = 0
    for _, shape in layout:
        numel = math.prod(shape)
        if numel < dense_below:
            dense_bytes += 4 * numel
        else:
            sparse_numel += numel
            sparse_tensors += 1
    if sparse_numel == 0:
        return 1.0
    spare = budget_bytes - dense_bytes - sparse_tensors * (header_bytes + per_kept)
    if spare <= 0:
        raise ConfigError(
            f"a budget of {budget_bytes} bytes does not cover the dense tensors "
            f"({dense_bytes} bytes) and the sparse headers"
        )
    density = spare / (sparse_numel * per_kept)
    if density >= 1.0:
        return 1.0
    step = 10.0 ** (math.floor(math.log10(density)) - 5)
    return max(float(f"{step:.1g}"), float(f"{math.floor(density / step) * step:.6g}"))
