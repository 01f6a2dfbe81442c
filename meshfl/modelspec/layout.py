"""Zoo layouts from a spec alone, their hash, and the shape rules shared with torch.

:func:`layout` gives the ``state_dict`` (names, shapes, dtypes, in order) that
``models.zoo.build_model`` builds for a zoo spec; :func:`layout_hash` is the one definition
of the spec hash (``models.arrays.spec_hash`` calls it). The shape rules
(:func:`cnn1d_lengths`, :func:`image_shape`, :func:`lenet_sizes`, :func:`group_count`) are
used by both sides, so there is one definition of each.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Any

from meshfl.contract import ModelSpec
from meshfl.errors import ConfigError

__all__ = [
    "DEFAULT_HIDDEN",
    "ZOO_MODELS",
    "Layout",
    "cnn1d_lengths",
    "group_count",
    "hidden",
    "image_shape",
    "is_custom",
    "layout",
    "layout_hash",
    "lenet_sizes",
    "parameter_count",
    "positive_int",
]

Layout = list[tuple[str, tuple[int, ...], str]]
"""``(state_dict name, shape, dtype name)`` per tensor, in ``state_dict`` order."""

ZOO_MODELS: tuple[str, ...] = ("mlp", "cnn1d", "logreg", "lenet", "resnet")
"""Model names the agents' zoo builds (``models.zoo.MODELS`` is this tuple)."""

DEFAULT_HIDDEN: dict[str, list[int]] = {
    "mlp": [64],
    "cnn1d": [25, 25, 25],
    "logreg": [],
    "lenet": [6, 16, 120, 84],
    "resnet": [8, 16, 32],
    "custom": [],
}
"""The ``hidden`` the CLIs use for a model when none is given (W1: mlp [64]; W2: cnn1d)."""

_CNN1D_STRIDE, _CNN1D_PADDING = 2, 1
_LENET_KERNEL = 5


def positive_int(spec: Mapping[str, Any], key: str) -> int:
    """``spec[key]`` as a positive ``int``; ConfigError naming the field otherwise."""
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"model spec field {key!r} must be a positive integer, got {value!r}; "
            f"fix the job's model spec"
        )
    return value


def hidden(spec: Mapping[str, Any]) -> list[int]:
    """``spec["hidden"]`` (default ``[]``) as a list of positive ints; ConfigError otherwise."""
    value = spec.get("hidden", [])
    if not isinstance(value, list | tuple) or any(
        isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in value
    ):
        raise ConfigError(
            f"model spec field 'hidden' must be a list of positive integers, got {value!r}; "
            f"fix the job's model spec (e.g. [64])"
        )
    return list(value)


def is_custom(spec: Mapping[str, Any]) -> bool:
    """Whether the spec names a user model (``name == "custom"`` or a ``factory``)."""
    return spec.get("name") == "custom" or "factory" in spec


def cnn1d_lengths(input_dim: int, layers: int) -> list[int]:
    """Sequence lengths after each of the ``"cnn1d"`` model's ``layers`` convolutions.

    Kernel 5 for the first layer and 3 for the others, stride 2, padding 1:
    ``L' = (L + 2 − k) // 2 + 1``. W2 (``input_dim`` 40, 3 layers): ``[19, 10, 5]``.
    """
    lengths, length = [], input_dim
    for layer in range(layers):
        kernel = 5 if layer == 0 else 3
        length = (length + 2 * _CNN1D_PADDING - kernel) // _CNN1D_STRIDE + 1
        lengths.append(length)
    return lengths


def image_shape(spec: Mapping[str, Any]) -> tuple[int, int, int]:
    """The ``(C, H, W)`` a 2-D model reads each flat ``(input_dim,)`` sample as.

    ``spec["image_shape"]`` when given (three positive ints whose product is
    ``input_dim``); otherwise one channel of a square image when ``input_dim`` is a perfect
    square (digits: 64 → ``(1, 8, 8)``). Samples are reshaped in C-order (row-major).

    Raises
    ------
    ConfigError
        A malformed ``image_shape``, a product other than ``input_dim``, or no
        ``image_shape`` with an ``input_dim`` that is not a perfect square.

    """
    input_dim = positive_int(spec, "input_dim")
    shape = spec.get("image_shape")
    if shape is None:
        side = math.isqrt(input_dim)
        if side * side != input_dim:
            raise ConfigError(
                f"model {spec.get('name')!r} reads each sample as an image but input_dim ="
                f" {input_dim} is not a perfect square; set the spec's image_shape [C, H, W]"
                f" (CLI: --image-shape C,H,W) with C·H·W = {input_dim}"
            )
        return (1, side, side)
    if (
        not isinstance(shape, list | tuple)
        or len(shape) != 3
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape)
    ):
        raise ConfigError(
            f"model spec field 'image_shape' must be three positive integers [C, H, W],"
            f" got {shape!r}; e.g. [1, 8, 8] for 8×8 grey images"
        )
    if math.prod(shape) != input_dim:
        raise ConfigError(
            f"model spec field 'image_shape' {list(shape)} holds {math.prod(shape)} values"
            f" but input_dim is {input_dim}; make C·H·W equal input_dim"
        )
    return (shape[0], shape[1], shape[2])


def lenet_sizes(spec: Mapping[str, Any]) -> tuple[tuple[int, int, int], list[int], int]:
    """``(C, H, W)``, the four widths ``[conv1, conv2, fc1, fc2]`` and the flattened size.

    Two 5×5 convolutions with padding 2 keep H×W; each 2×2 max-pool halves it (floor),
    so the flattened feature map is ``conv2 · (H // 4) · (W // 4)``.

    Raises
    ------
    ConfigError
        ``hidden`` not four widths (default ``[6, 16, 120, 84]``), or an image smaller
        than 4×4.

    """
    channels, height, width = image_shape(spec)
    widths = hidden(spec) or DEFAULT_HIDDEN["lenet"]
    if len(widths) != 4:
        raise ConfigError(
            f"model spec field 'hidden' of a lenet must be 4 widths [conv1, conv2, fc1, fc2],"
            f" got {widths!r}; e.g. [6, 16, 120, 84]"
        )
    if height < 4 or width < 4:
        raise ConfigError(
            f"a lenet needs images of at least 4×4 (two 2×2 poolings), got {height}×{width};"
            " use another model or a larger image_shape"
        )
    return (channels, height, width), widths, widths[1] * (height // 4) * (width // 4)


def group_count(channels: int) -> int:
    """GroupNorm groups for ``channels`` in the ``"resnet"`` model: ``gcd(channels, 4)``."""
    return math.gcd(channels, 4)


def _linear(prefix: str, fan_in: int, fan_out: int, bias: bool = True) -> Layout:
    out: Layout = [(f"{prefix}weight", (fan_out, fan_in), "float32")]
    return out + ([(f"{prefix}bias", (fan_out,), "float32")] if bias else [])


def _conv(prefix: str, c_in: int, c_out: int, kernel: tuple[int, ...], bias: bool) -> Layout:
    out: Layout = [(f"{prefix}weight", (c_out, c_in, *kernel), "float32")]
    return out + ([(f"{prefix}bias", (c_out,), "float32")] if bias else [])


def _norm(prefix: str, channels: int) -> Layout:
    return [(f"{prefix}weight", (channels,), "float32"), (f"{prefix}bias", (channels,), "float32")]


def _mlp(spec: Mapping[str, Any], widths: list[int]) -> Layout:
    sizes = [positive_int(spec, "input_dim"), *widths, positive_int(spec, "num_classes")]
    return [
        entry
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes))
        for entry in _linear(f"{2 * i}.", fan_in, fan_out)
    ]


def _cnn1d(spec: Mapping[str, Any]) -> Layout:
    input_dim, classes = positive_int(spec, "input_dim"), positive_int(spec, "num_classes")
    channels = hidden(spec)
    if not channels:
        raise ConfigError(
            "model spec field 'hidden' of a cnn1d must list the convolution channel widths, "
            "got []; fix the job's model spec (e.g. [25, 25, 25])"
        )
    lengths = cnn1d_lengths(input_dim, len(channels))
    if lengths[-1] < 1:
        raise ConfigError(
            f"model spec field 'input_dim' = {input_dim} is too short for {len(channels)} "
            f"stride-2 convolutions; use fewer 'hidden' layers or longer sequences"
        )
    out: Layout = []
    for layer, (c_in, c_out) in enumerate(itertools.pairwise([1, *channels])):
        out += _conv(f"convs.{layer}.", c_in, c_out, (5 if layer == 0 else 3,), bias=True)
    return out + _linear("head.", channels[-1] * lengths[-1], classes)


def _lenet(spec: Mapping[str, Any]) -> Layout:
    (channels, _, _), (c1, c2, f1, f2), flat = lenet_sizes(spec)
    k = (_LENET_KERNEL, _LENET_KERNEL)
    return [
        *_conv("conv1.", channels, c1, k, bias=True),
        *_conv("conv2.", c1, c2, k, bias=True),
        *_linear("fc1.", flat, f1),
        *_linear("fc2.", f1, f2),
        *_linear("fc3.", f2, positive_int(spec, "num_classes")),
    ]


def _resnet(spec: Mapping[str, Any]) -> Layout:
    channels = image_shape(spec)[0]
    widths = hidden(spec) or DEFAULT_HIDDEN["resnet"]
    out: Layout = [*_conv("stem.", channels, widths[0], (3, 3), bias=False)]
    out += _norm("stem_norm.", widths[0])
    for i, (c_in, c_out) in enumerate(zip([widths[0], *widths], widths, strict=False)):
        p = f"blocks.{i}."
        out += _conv(f"{p}conv1.", c_in, c_out, (3, 3), bias=False) + _norm(f"{p}norm1.", c_out)
        out += _conv(f"{p}conv2.", c_out, c_out, (3, 3), bias=False) + _norm(f"{p}norm2.", c_out)
        if i > 0:  # stride 2 (and a width change): a 1×1 projection shortcut
            out += _conv(f"{p}shortcut.0.", c_in, c_out, (1, 1), bias=False)
            out += _norm(f"{p}shortcut.1.", c_out)
    return out + _linear("head.", widths[-1], positive_int(spec, "num_classes"))


def layout(spec: ModelSpec | Mapping[str, Any]) -> Layout:
    """The ``state_dict`` layout ``models.zoo.build_model(spec, seed)`` builds, without torch.

    Parameters
    ----------
    spec : ModelSpec
        A zoo model's spec (``name`` in :data:`ZOO_MODELS`); see ``docs/models.md``.

    Returns
    -------
    Layout
        ``(name, shape, "float32")`` per tensor in ``state_dict`` order. Every zoo
        tensor is float32; no zoo model has buffers.

    Raises
    ------
    ConfigError
        A custom model (its layout needs torch: ``meshfl model spec``), an unknown name
        (listing :data:`ZOO_MODELS`) or an invalid size field.

    """
    name = spec.get("name")
    if is_custom(spec):
        raise ConfigError(
            "a custom model's layout is known only by building it; run `meshfl model spec"
            " FACTORY ...` where the model code is installed and put its hash in the spec"
        )
    if name == "mlp":
        return _mlp(spec, hidden(spec))
    if name == "logreg":
        if hidden(spec):
            raise ConfigError(
                f"a logreg has no hidden layers but the spec's hidden is {spec.get('hidden')!r};"
                " set hidden to [] (or use model 'mlp')"
            )
        return _mlp(spec, [])
    if name == "cnn1d":
        return _cnn1d(spec)
    if name == "lenet":
        return _lenet(spec)
    if name == "resnet":
        return _resnet(spec)
    raise ConfigError(
        f"unknown model {name!r}; known models: {', '.join(ZOO_MODELS)} (or 'custom' with a"
        " factory); set the job's model name to one of them"
    )


def layout_hash(entries: Iterable[tuple[str, Iterable[int], str]]) -> str:
    """sha256 over ``"name|d0,d1,...|dtype"`` plus a newline per tensor, in order: 64 lowercase hex.

    Weights do not enter it, so every device building the same spec has the same hash.
    It identifies a *layout*: two architectures with identical tensor names and shapes
    (e.g. ``mlp`` with ``hidden: []`` and ``logreg``) share a hash.
    """
    digest = hashlib.sha256()
    for name, shape, dtype in entries:
        digest.update(f"{name}|{','.join(map(str, shape))}|{dtype}\n".encode())
    return digest.hexdigest()


def parameter_count(entries: Iterable[tuple[str, Iterable[int], str]]) -> int:
    """Total number of elements (not bytes) of a layout."""
    return sum(math.prod(shape) for _, shape, _ in entries)
