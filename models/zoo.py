"""The model zoo: build a ``torch.nn.Module`` from a :class:`meshfl.contract.ModelSpec`.

Initialisation is drawn from a ``torch.Generator`` local to the call, so every device that
builds the same spec with the same seed starts from bit-identical weights, and building a
model does not touch torch's global RNG.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

from meshfl.contract import ModelSpec
from meshfl.errors import ConfigError

__all__ = ["MODELS", "build_model", "cnn1d_lengths"]

MODELS: tuple[str, ...] = ("mlp", "cnn1d")


def _positive_int(spec: ModelSpec, key: str) -> int:
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"model spec field {key!r} must be a positive integer, got {value!r}; "
            f"fix the job's model spec"
        )
    return value


def _hidden(spec: ModelSpec) -> list[int]:
    hidden = spec.get("hidden", [])
    if not isinstance(hidden, (list, tuple)) or any(
        isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hidden
    ):
        raise ConfigError(
            f"model spec field 'hidden' must be a list of positive integers, got {hidden!r}; "
            f"fix the job's model spec (e.g. [64])"
        )
    return list(hidden)


def _init_linear(layer: nn.Linear, generator: torch.Generator) -> None:
    # PyTorch's default nn.Linear initialisation (kaiming_uniform with a=sqrt(5) for the
    # weight, which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), same bound for the bias), drawn
    # from a local generator instead of the global RNG.
    bound = 1.0 / math.sqrt(layer.in_features)
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        if layer.bias is not None:
            layer.bias.uniform_(-bound, bound, generator=generator)


def _mlp(spec: ModelSpec, generator: torch.Generator) -> nn.Module:
    widths = [_positive_int(spec, "input_dim"), *_hidden(spec), _positive_int(spec, "num_classes")]
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        # Built on the meta device so construction consumes no global randomness.
        linear = nn.Linear(fan_in, fan_out, dtype=torch.float32, device="meta")
        linear = linear.to_empty(device="cpu")
        _init_linear(linear, generator)
        layers.append(linear)
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _init_conv(layer: nn.Conv1d, generator: torch.Generator) -> None:
    # PyTorch's default nn.Conv1d initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
    # weight and bias, fan_in = in_channels × kernel_size, from a local generator.
    bound = 1.0 / math.sqrt(layer.in_channels * layer.kernel_size[0])
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        if layer.bias is not None:
            layer.bias.uniform_(-bound, bound, generator=generator)


_CNN1D_STRIDE = 2
_CNN1D_PADDING = 1


def _cnn1d_kernel(layer: int) -> int:
    return 5 if layer == 0 else 3


def cnn1d_lengths(input_dim: int, layers: int) -> list[int]:
    """Sequence lengths after each of the ``"cnn1d"`` model's ``layers`` convolutions.

    Kernel 5 for the first layer and 3 for the others, stride 2, padding 1:
    ``L' = (L + 2 − k) // 2 + 1``. W2 (``input_dim`` 40, 3 layers): ``[19, 10, 5]``.
    """
    lengths, length = [], input_dim
    for layer in range(layers):
        length = (length + 2 * _CNN1D_PADDING - _cnn1d_kernel(layer)) // _CNN1D_STRIDE + 1
        lengths.append(length)
    return lengths


class _Cnn1d(nn.Module):
    """``(n, L)`` float32 → ``(n, 1, L)`` → [Conv1d → ReLU]* → flatten → Linear."""

    def __init__(self, convs: list[nn.Conv1d], head: nn.Linear) -> None:
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], 1, x.shape[-1])
        for conv in self.convs:
            h = torch.relu(conv(h))
        logits: torch.Tensor = self.head(h.flatten(1))
        return logits


def _cnn1d(spec: ModelSpec, generator: torch.Generator) -> nn.Module:
    input_dim = _positive_int(spec, "input_dim")
    classes = _positive_int(spec, "num_classes")
    channels = _hidden(spec)
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
    convs: list[nn.Conv1d] = []
    for layer, (c_in, c_out) in enumerate(itertools.pairwise([1, *channels])):
        conv = nn.Conv1d(c_in, c_out, _cnn1d_kernel(layer), stride=_CNN1D_STRIDE,
                         padding=_CNN1D_PADDING, dtype=torch.float32, device="meta")  # fmt: skip
        conv = conv.to_empty(device="cpu")
        _init_conv(conv, generator)
        convs.append(conv)
    head = nn.Linear(channels[-1] * lengths[-1], classes, dtype=torch.float32, device="meta")
    head = head.to_empty(device="cpu")
    _init_linear(head, generator)
    return _Cnn1d(convs, head)


def build_model(spec: ModelSpec, seed: int) -> nn.Module:
    """Build the model a job's spec names, initialised deterministically from ``seed``.

    Parameters
    ----------
    spec : ModelSpec
        ``name`` (one of :data:`MODELS`), ``input_dim``, ``num_classes``, ``hidden``.
        ``"mlp"``: ``input_dim → hidden[0] → … → num_classes`` fully connected layers with
        ReLU between them, float32. W1's spec (64, [64], 10) has 4,810 parameters.
        ``"cnn1d"``: the small 1-D ConvNet of the MNIST-1D paper (Greydanus & Kobak,
        ICML 2024, ``ConvBase``): the ``(n, input_dim)`` input is read as one channel of
        length ``input_dim``; ``hidden`` lists the output channels of the convolutions
        (kernel 5 for the first, 3 for the rest, stride 2, padding 1, ReLU after each);
        the flattened last feature map feeds one linear layer to ``num_classes``.
        W2's spec (40, [25, 25, 25], 10) has 5,210 parameters (lengths 40 → 19 → 10 → 5,
        see :func:`cnn1d_lengths`).
    seed : int
        Seed of the local ``torch.Generator`` that draws the initial weights (PyTorch's
        default ``nn.Linear`` distribution). Same spec and seed → identical weights.

    Returns
    -------
    torch.nn.Module
        A float32 module on the CPU, in training mode. It maps ``(n, input_dim)`` float32
        inputs to ``(n, num_classes)`` logits.

    Raises
    ------
    ConfigError
        Unknown model name (the message lists :data:`MODELS`) or an invalid size field
        (for ``"cnn1d"``: an empty ``hidden``, or an ``input_dim`` too short for its
        convolutions).

    """
    name = spec.get("name")
    if name not in MODELS:
        raise ConfigError(
            f"unknown model {name!r}; known models: {', '.join(MODELS)}; "
            f"set the job's model name to one of them"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"model seed must be an integer, got {seed!r}")
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    if name == "cnn1d":
        return _cnn1d(spec, generator)
    return _mlp(spec, generator)
