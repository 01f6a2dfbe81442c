"""The zoo's 2-D ConvNets: ``lenet`` and ``resnet``.

Both take the zoo's flat ``(n, input_dim)`` float32 input and read each row as a
``(C, H, W)`` image (:func:`meshfl.modelspec.image_shape`), with ``reshape`` only and no
data-dependent control flow, so they export to ONNX as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from meshfl.modelspec import DEFAULT_HIDDEN, group_count, hidden, image_shape, lenet_sizes
from meshfl.modelspec import positive_int as _positive_int
from models.layers import conv2d, group_norm, linear

__all__ = ["build_lenet", "build_resnet"]


class LeNet(nn.Module):
    """LeNet-5-class ConvNet (LeCun et al., Proc. IEEE 1998), for small images.

    ``(n, C·H·W)`` → ``(n, C, H, W)`` → conv 5×5 (padding 2) → ReLU → max-pool 2 →
    conv 5×5 (padding 2) → ReLU → max-pool 2 → flatten → fc → ReLU → fc → ReLU → fc.
    The paddings keep 8×8 digits at 8×8 before the first pooling (LeNet-5 had 32×32
    inputs and no padding); ReLU and max-pooling replace its tanh and average sub-sampling.
    """

    def __init__(self, shape: tuple[int, int, int], layers: list[nn.Module]) -> None:
        super().__init__()
        self.shape = shape
        self.conv1, self.conv2, self.fc1, self.fc2, self.fc3 = layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, *self.shape)
        h = F.max_pool2d(torch.relu(self.conv1(h)), 2)
        h = F.max_pool2d(torch.relu(self.conv2(h)), 2)
        h = torch.relu(self.fc1(h.flatten(1)))
        h = torch.relu(self.fc2(h))
        logits: torch.Tensor = self.fc3(h)
        return logits


def build_lenet(spec: Mapping[str, Any], generator: torch.Generator) -> nn.Module:
    """``lenet``: ``hidden`` = ``[conv1, conv2, fc1, fc2]`` widths (default 6, 16, 120, 84).

    The four layers followed by ReLU get He initialisation (He et al., ICCV 2015), the
    output layer PyTorch's default.
    """
    shape, (c1, c2, f1, f2), flat = lenet_sizes(spec)
    classes = _positive_int(spec, "num_classes")
    layers: list[nn.Module] = [
        conv2d(shape[0], c1, 5, generator, padding=2, relu=True),
        conv2d(c1, c2, 5, generator, padding=2, relu=True),
        linear(flat, f1, generator, relu=True),
        linear(f1, f2, generator, relu=True),
        linear(f2, classes, generator),
    ]
    return LeNet(shape, layers)


class BasicBlock(nn.Module):
    """ResNet basic block (He et al., CVPR 2016, Fig. 2) with GroupNorm for BatchNorm.

    ``y = ReLU(GN(conv3×3(ReLU(GN(conv3×3_s(x))))) + shortcut(x))``; the shortcut is the
    identity, or a 1×1 stride-``s`` convolution + GroupNorm where the shape changes
    (option B of the paper).
    """

    def __init__(self, c_in: int, c_out: int, stride: int, generator: torch.Generator) -> None:
        super().__init__()
        self.conv1 = conv2d(c_in, c_out, 3, generator, stride=stride, padding=1, bias=False)
        self.norm1 = group_norm(group_count(c_out), c_out)
        self.conv2 = conv2d(c_out, c_out, 3, generator, padding=1, bias=False)
        self.norm2 = group_norm(group_count(c_out), c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                conv2d(c_in, c_out, 1, generator, stride=stride, bias=False),
                group_norm(group_count(c_out), c_out),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm1(self.conv1(x)))
        h = self.norm2(self.conv2(h))
        return torch.relu(h + self.shortcut(x))


class ResNet(nn.Module):
    """A small ResNet: 3×3 stem conv + GroupNorm + ReLU, basic blocks, global mean, linear.

    One :class:`BasicBlock` per ``hidden`` width; the first keeps the resolution, each
    later one halves it (stride 2). GroupNorm (Wu & He, ECCV 2018; ``gcd(C, 4)`` groups)
    instead of BatchNorm: BatchNorm's running mean/variance are buffers that gossip
    averaging mixes badly across devices with skewed labels (Hsieh et al., ICML 2020, "The
    non-IID data quagmire"); GroupNorm has only per-sample statistics and no buffers.
    """

    def __init__(
        self,
        shape: tuple[int, int, int],
        widths: list[int],
        classes: int,
        generator: torch.Generator,
    ) -> None:
        super().__init__()
        self.shape = shape
        self.stem = conv2d(shape[0], widths[0], 3, generator, padding=1, bias=False)
        self.stem_norm = group_norm(group_count(widths[0]), widths[0])
        ins = [widths[0], *widths[:-1]]
        self.blocks = nn.ModuleList(
            BasicBlock(c_in, c_out, 1 if i == 0 else 2, generator)
            for i, (c_in, c_out) in enumerate(zip(ins, widths, strict=True))
        )
        self.head = linear(widths[-1], classes, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem_norm(self.stem(x.reshape(-1, *self.shape))))
        for block in self.blocks:
            h = block(h)
        logits: torch.Tensor = self.head(h.mean(dim=(2, 3)))
        return logits


def build_resnet(spec: Mapping[str, Any], generator: torch.Generator) -> nn.Module:
    """``resnet``: ``hidden`` = one basic block per width (default ``[8, 16, 32]``)."""
    widths = hidden(spec) or DEFAULT_HIDDEN["resnet"]
    return ResNet(image_shape(spec), widths, _positive_int(spec, "num_classes"), generator)
