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

__all__ = ["MODELS", "build_model"]

MODELS: tuple[str, ...] = ("mlp",)


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


def build_model(spec: ModelSpec, seed: int) -> nn.Module:
    """Build the model a job's spec names, initialised deterministically from ``seed``.

    Parameters
    ----------
    spec : ModelSpec
        ``name`` (one of :data:`MODELS`), ``input_dim``, ``num_classes``, ``hidden``.
        ``"mlp"``: ``input_dim → hidden[0] → … → num_classes`` fully connected layers with
        ReLU between them, float32. W1's spec (64, [64], 10) has 4,810 parameters.
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
        Unknown model name (the message lists :data:`MODELS`) or an invalid size field.

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
    return _mlp(spec, generator)
