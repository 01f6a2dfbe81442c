"""Layers for the zoo, initialised from a local ``torch.Generator`` (never the global RNG).

Each layer is built on the meta device (construction draws nothing), moved to the CPU and
filled with PyTorch's default distribution for its type, so the same generator state gives
bit-identical weights on every device.
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch
from torch import nn

__all__ = ["conv1d", "conv2d", "group_norm", "linear"]

_Layer = TypeVar("_Layer", bound=nn.Module)


def _on_cpu(layer: _Layer) -> _Layer:
    """Give a meta-device layer uninitialised CPU parameters (filled by the caller).

    Not ``Module.to_empty``: its ``empty_like`` on meta tensors imports sympy through
    ``torch.fx`` — about 40 MB of resident memory in every agent for nothing.
    """
    for name, param in list(layer.named_parameters(recurse=False)):
        fresh = torch.empty(param.shape, dtype=param.dtype, device="cpu")
        setattr(layer, name, nn.Parameter(fresh, requires_grad=param.requires_grad))
    return layer


def _fill(
    weight: torch.Tensor, bias: torch.Tensor | None, generator: torch.Generator, relu: bool = False
) -> None:
    # PyTorch's default for nn.Linear and nn.ConvNd: kaiming_uniform_(a=sqrt(5)) on the
    # weight, which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias;
    # fan_in = weight[0].numel() (in_features, or in_channels/groups × kernel elements).
    # relu=True: He et al. (ICCV 2015, eq. 10) for a layer followed by ReLU, i.e.
    # kaiming_uniform_(a=0): U(-sqrt(6/fan_in), sqrt(6/fan_in)); a stack of default-init
    # ReLU layers shrinks its signal by ~sqrt(3) a layer and LeNet on digits then barely
    # learns in 5 epochs (0.29 test accuracy, against 0.93 with this init).
    bound = 1.0 / math.sqrt(weight[0].numel())
    gain = math.sqrt(6.0) if relu else 1.0
    with torch.no_grad():
        weight.uniform_(-gain * bound, gain * bound, generator=generator)
        if bias is not None:
            bias.uniform_(-bound, bound, generator=generator)


def linear(
    fan_in: int, fan_out: int, generator: torch.Generator, bias: bool = True, relu: bool = False
) -> nn.Linear:
    """A float32 ``nn.Linear(fan_in, fan_out)`` on the CPU with PyTorch's default init.

    ``relu=True``: He initialisation for a layer followed by ReLU (see ``_fill``).
    """
    layer = nn.Linear(fan_in, fan_out, bias=bias, dtype=torch.float32, device="meta")
    layer = _on_cpu(layer)
    _fill(layer.weight, layer.bias, generator, relu)
    return layer


def conv1d(
    c_in: int, c_out: int, kernel: int, generator: torch.Generator, *, stride: int, padding: int
) -> nn.Conv1d:
    """A float32 ``nn.Conv1d`` with bias on the CPU with PyTorch's default init."""
    layer = nn.Conv1d(c_in, c_out, kernel, stride=stride, padding=padding,
                      dtype=torch.float32, device="meta")  # fmt: skip
    layer = _on_cpu(layer)
    _fill(layer.weight, layer.bias, generator)
    return layer


def conv2d(
    c_in: int,
    c_out: int,
    kernel: int,
    generator: torch.Generator,
    *,
    stride: int = 1,
    padding: int = 0,
    bias: bool = True,
    relu: bool = False,
) -> nn.Conv2d:
    """A float32 square-kernel ``nn.Conv2d`` on the CPU with PyTorch's default init.

    ``relu=True``: He initialisation for a layer followed by ReLU (see ``_fill``).
    """
    layer = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, bias=bias,
                      dtype=torch.float32, device="meta")  # fmt: skip
    layer = _on_cpu(layer)
    _fill(layer.weight, layer.bias, generator, relu)
    return layer


def group_norm(groups: int, channels: int) -> nn.GroupNorm:
    """A float32 ``nn.GroupNorm`` with PyTorch's default affine init (weight 1, bias 0)."""
    layer = nn.GroupNorm(groups, channels, dtype=torch.float32, device="meta")
    layer = _on_cpu(layer)
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.bias.fill_(0.0)
    return layer
