"""The model zoo: build a ``torch.nn.Module`` from a :class:`meshfl.contract.ModelSpec`.

Every model maps float32 ``(n, input_dim)`` rows to ``(n, num_classes)`` logits; 2-D
models read each row as a ``(C, H, W)`` image (``image_shape``). Initialisation is drawn
from a ``torch.Generator`` local to the call with PyTorch's default distributions, so every
device that builds the same spec with the same seed starts from bit-identical weights, and
building a model does not touch torch's global RNG. :func:`meshfl.modelspec.layout`
computes each zoo model's ``state_dict`` layout without torch (the coordinator's view).
See ``docs/models.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from meshfl.contract import ModelSpec
from meshfl.errors import ConfigError
from meshfl.modelspec import ZOO_MODELS, cnn1d_lengths, hidden, is_custom, positive_int
from meshfl.modelspec import layout as spec_layout
from models.layers import conv1d, linear

__all__ = ["MODELS", "build_model", "cnn1d_lengths"]

MODELS: tuple[str, ...] = ZOO_MODELS
"""Zoo model names: ``mlp``, ``cnn1d``, ``logreg``, ``lenet``, ``resnet``."""


def _mlp(spec: Mapping[str, Any], widths: list[int], generator: torch.Generator) -> nn.Module:
    sizes = [positive_int(spec, "input_dim"), *widths, positive_int(spec, "num_classes")]
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(linear(fan_in, fan_out, generator))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


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


def _cnn1d(spec: Mapping[str, Any], generator: torch.Generator) -> nn.Module:
    spec_layout(spec)  # refuses an empty hidden or too short an input, naming the fix
    channels = hidden(spec)
    lengths = cnn1d_lengths(positive_int(spec, "input_dim"), len(channels))
    convs = [
        conv1d(c_in, c_out, 5 if i == 0 else 3, generator, stride=2, padding=1)
        for i, (c_in, c_out) in enumerate(itertools.pairwise([1, *channels]))
    ]
    head = linear(channels[-1] * lengths[-1], positive_int(spec, "num_classes"), generator)
    return _Cnn1d(convs, head)


def build_model(spec: ModelSpec, seed: int) -> nn.Module:
    """Build the model a job's spec names, initialised deterministically from ``seed``.

    Parameters
    ----------
    spec : ModelSpec
        ``name`` (one of :data:`MODELS`, or ``"custom"``), ``input_dim``, ``num_classes``,
        ``hidden``, and ``image_shape`` for 2-D models. Per model (``docs/models.md``):

        - ``"mlp"``: ``input_dim → hidden[0] → … → num_classes`` fully connected layers
          with ReLU between them. W1's spec (64, [64], 10) has 4,810 parameters.
        - ``"logreg"``: multinomial logistic regression, one linear layer
          ``input_dim → num_classes``; ``hidden`` must be ``[]``. 650 parameters on digits.
        - ``"cnn1d"``: the small 1-D ConvNet of the MNIST-1D paper (Greydanus & Kobak,
          ICML 2024, ``ConvBase``): the row is one channel of length ``input_dim``;
          ``hidden`` lists the convolutions' output channels (kernel 5 for the first, 3
          for the rest, stride 2, padding 1, ReLU after each); the flattened last feature
          map feeds one linear layer. W2's spec (40, [25, 25, 25], 10) has 5,210
          parameters (lengths 40 → 19 → 10 → 5, see :func:`cnn1d_lengths`).
        - ``"lenet"``: LeNet-5 class (:class:`models.vision.LeNet`); ``hidden`` =
          ``[conv1, conv2, fc1, fc2]`` widths, default (``[]``) ``[6, 16, 120, 84]``:
          21,386 parameters on 8×8 digits.
        - ``"resnet"``: a small ResNet with GroupNorm (:class:`models.vision.ResNet`);
          ``hidden`` = one basic block per width, default (``[]``) ``[8, 16, 32]``: 19,810
          parameters on 8×8 digits.
        - ``"custom"``: ``factory`` ``"package.module:callable"`` called with ``kwargs``
          (:func:`models.custom.build_custom`).
    seed : int
        Seed of the local ``torch.Generator`` that draws the initial weights (PyTorch's
        default ``nn.Linear``/``nn.ConvNd`` distributions; GroupNorm starts at weight 1,
        bias 0). Same spec and seed → identical weights.

    Returns
    -------
    torch.nn.Module
        A float32 module on the CPU, in training mode, without buffers (zoo models). It
        maps ``(n, input_dim)`` float32 inputs to ``(n, num_classes)`` logits.

    Raises
    ------
    ConfigError
        Unknown model name (the message lists :data:`MODELS`), an invalid size field, an
        ``image_shape`` that does not fit ``input_dim``, or a custom factory that cannot
        be imported or built (:mod:`models.custom`).

    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"model seed must be an integer, got {seed!r}")
    if is_custom(spec):
        from models.custom import build_custom

        return build_custom(spec, seed)
    spec_layout(spec)  # refuses an unknown name or bad fields before any torch work
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    name = spec["name"]
    if name == "cnn1d":
        return _cnn1d(spec, generator)
    if name == "lenet":
        from models.vision import build_lenet

        return build_lenet(spec, generator)
    if name == "resnet":
        from models.vision import build_resnet

        return build_resnet(spec, generator)
    return _mlp(spec, hidden(spec) if name == "mlp" else [], generator)
