"""Shared checks for the gossip state objects: weights, model layout, incoming messages."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from meshfl.codecs import Identity, decode_tensor
from meshfl.errors import ConfigError, WireError
from meshfl.wire import DType, TensorEntry

__all__ = [
    "Layout",
    "check_answered",
    "check_weights",
    "decode_entries",
    "identity_entries",
    "layout_of",
    "mean_of_states",
    "tracked_peers",
]

Layout = tuple[tuple[str, tuple[int, ...]], ...]
"""Ordered (tensor name, shape) pairs of a model."""

WEIGHT_ATOL = 1e-6


def layout_of(params: Mapping[str, np.ndarray]) -> Layout:
    """Return the ordered (name, shape) layout of a model, refusing non-floating tensors.

    Raises
    ------
    ConfigError
        If a tensor is not a floating numpy array or a name is empty.

    """
    layout = []
    for name, value in params.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"tensor names must be non-empty strings, got {name!r}")
        arr = np.asarray(value)
        if not np.issubdtype(arr.dtype, np.floating):
            raise ConfigError(f"tensor {name!r} has dtype {arr.dtype}; models are float32")
        layout.append((name, tuple(int(d) for d in arr.shape)))
    return tuple(layout)


def check_model(x: Mapping[str, np.ndarray], layout: Layout) -> list[np.ndarray]:
    """Return the tensors of ``x`` as float32 arrays in layout order.

    Raises
    ------
    ConfigError
        If the names (in order) or shapes of ``x`` differ from ``layout``.

    """
    if tuple(x) != tuple(name for name, _ in layout):
        raise ConfigError(
            f"model tensors {list(x)} do not match the gossip state {[n for n, _ in layout]}"
        )
    out = []
    for name, shape in layout:
        arr = np.asarray(x[name], dtype=np.float32)
        if arr.shape != shape:
            raise ConfigError(f"tensor {name!r} has shape {arr.shape}, expected {shape}")
        out.append(arr)
    return out


def check_weights(neighbours: Mapping[str, float], self_weight: float) -> dict[str, float]:
    """Check a row of the mixing matrix: weights finite, ``>= 0``, summing to 1 (±1e-6).

    Returns
    -------
    dict of str to float
        The neighbour weights w_ij, as floats.

    Raises
    ------
    ConfigError
        Naming the offending weight or the sum.

    """
    weights: dict[str, float] = {}
    for peer, weight in {**neighbours, "<self>": self_weight}.items():
        if not isinstance(peer, str) or not peer:
            raise ConfigError(f"neighbour ids must be non-empty strings, got {peer!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.floating)):
            raise ConfigError(f"weight of {peer!r} must be a number, got {weight!r}")
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ConfigError(f"weight of {peer!r} must be finite and >= 0, got {weight!r}")
        weights[peer] = float(weight)
    total = math.fsum(weights.values())
    if abs(total - 1.0) > WEIGHT_ATOL:
        raise ConfigError(f"self weight plus neighbour weights sum to {total!r}, not 1")
    del weights["<self>"]
    return weights


def check_answered(answered: Collection[str], weights: Mapping[str, float]) -> frozenset[str]:
    """Return ``answered`` as a set, refusing ids that are not neighbours.

    Raises
    ------
    ConfigError
        If an id in ``answered`` is not a neighbour.

    """
    unknown = [peer for peer in answered if peer not in weights]
    if unknown:
        raise ConfigError(f"answered holds non-neighbours {sorted(unknown)!r}")
    return frozenset(answered)


def decode_entries(
    sender: str, tensors: Sequence[TensorEntry], layout: Layout, weights: Collection[str]
) -> list[np.ndarray]:
    """Check a neighbour's message against the model layout and decode every tensor.

    Nothing is mutated; callers apply the result only when this returns.

    Raises
    ------
    WireError
        If ``sender`` is not in ``weights`` (the tracked peers), or the tensor names (in
        order), shapes or dtypes differ from the model.
    CodecError
        If a payload does not decode (unknown codec tag, malformed bytes, NaN/inf).

    """
    if sender not in weights:
        raise WireError(f"message from {sender!r}, which is not a neighbour")
    names = [entry.name for entry in tensors]
    if names != [name for name, _ in layout]:
        raise WireError(
            f"message from {sender!r} carries tensors {names}, "
            f"expected {[name for name, _ in layout]}"
        )
    decoded = []
    for entry, (name, shape) in zip(tensors, layout, strict=True):
        if tuple(entry.shape) != shape:
            raise WireError(
                f"tensor {name!r} from {sender!r} has shape {tuple(entry.shape)}, expected {shape}"
            )
        if entry.dtype != DType.FLOAT32:
            raise WireError(f"tensor {name!r} from {sender!r} is {entry.dtype!r}, not FLOAT32")
        decoded.append(decode_tensor(entry.codec, entry.payload, shape))
    return decoded


def identity_entries(tensors: Sequence[np.ndarray], layout: Layout) -> tuple[TensorEntry, ...]:
    """Pack float32 tensors losslessly (identity codec): the entries of a keyframe."""
    codec = Identity()
    return tuple(
        TensorEntry(name, shape, DType.FLOAT32, codec.tag, codec.encode(t))
        for (name, shape), t in zip(layout, tensors, strict=True)
    )


def tracked_peers(weights: Mapping[str, float], listen: Collection[str]) -> frozenset[str]:
    """The peers whose messages a device accepts: its neighbours plus ``listen``.

    Raises
    ------
    ConfigError
        If an id in ``listen`` is not a non-empty string.

    """
    for peer in listen:
        if not isinstance(peer, str) or not peer:
            raise ConfigError(f"peer ids must be non-empty strings, got {peer!r}")
    return frozenset(weights) | frozenset(listen)


def mean_of_states(
    held: Mapping[str, Sequence[np.ndarray]], peers: Collection[str], layout: Layout
) -> dict[str, np.ndarray]:
    """Return the float32 mean (float64 sums) of the states ``held`` of ``peers``.

    Raises
    ------
    ConfigError
        If ``peers`` is empty or one of them has no state in ``held``.

    """
    wanted = sorted(set(peers))
    if not wanted or any(p not in held for p in wanted):
        raise ConfigError(f"no state held for every one of {wanted!r}")
    return {
        name: np.mean([held[p][t].astype(np.float64) for p in wanted], axis=0).astype(np.float32)
        for t, (name, _) in enumerate(layout)
    }
