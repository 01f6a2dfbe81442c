"""DP-SGD: record-level differential privacy in the trainer (``dp_unit`` ``record``).

Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Algorithm 1. Each
step of :class:`DPSGD`

1. draws a **Poisson** sample of the local data: every example is in the batch
   independently with probability q = B / n (B: the job's ``batch_size``, n: the
   device's examples), so the batch size varies around B;
2. computes every sampled example's gradient g_i with ``torch.func`` (``vmap`` over
   ``grad`` of a ``functional_call``, one example at a time);
3. clips each to L2 norm C: ḡ_i = g_i · min(1, C / (‖g_i‖₂ + 10⁻⁶)) (the norm over all of
   the model's parameters together, as in Opacus' flat clipping);
4. returns g̃ = (Σ_i ḡ_i + N(0, σ²C² I)) / B — divided by the *expected* batch size B,
   which does not depend on the data (Opacus does the same for Poisson sampling).

The optimizer then applies g̃ (heavy-ball momentum, if the job has it, to g̃: momentum
is post-processing). Adding or removing one example changes Σ_i ḡ_i by at most C, so a
step is the Poisson-subsampled Gaussian mechanism of noise multiplier σ, and the
coordinator composes ``steps`` of them at rate q (:mod:`coordinator.privacy`).

The sampling and the noise draw from a generator seeded from the OS (``seed`` None):
privacy amplification by sampling holds only if nobody can predict the batches, so the
job's public seed is not used. Models with BatchNorm are refused (its batch statistics
mix examples, so a per-example gradient is not defined); the zoo's ResNet uses GroupNorm.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from meshfl.errors import ConfigError

__all__ = ["DPSGD", "RecordDP", "check_per_sample_model", "clip_per_sample"]

_NORM_EPS = 1e-6  # added to ‖g_i‖ before C / ‖g_i‖, as Opacus does


@dataclass(frozen=True)
class RecordDP:
    """DP-SGD's noise multiplier σ (> 0) and per-sample clipping norm C (> 0)."""

    noise_multiplier: float
    clip: float

    def __post_init__(self) -> None:
        for name, value in (("noise multiplier", self.noise_multiplier), ("clip", self.clip)):
            ok = not isinstance(value, bool) and isinstance(value, (int, float))
            if not (ok and math.isfinite(value) and value > 0):
                raise ConfigError(f"DP-SGD {name} must be a finite number > 0, got {value!r}")

    @staticmethod
    def sampling_rate(n: int, batch_size: int) -> float:
        """Poisson sampling rate q = min(1, B / n) of a device with ``n`` examples."""
        return min(1.0, batch_size / max(1, n))


def check_per_sample_model(model: nn.Module) -> None:
    """Refuse a model whose per-example gradient is not defined (BatchNorm); ConfigError."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ConfigError(
                f"dp_unit record needs per-example gradients, but layer {name!r} is"
                f" {type(module).__name__}, whose batch statistics mix examples; use"
                " GroupNorm or LayerNorm, or dp_unit device"
            )


def clip_per_sample(
    grads: dict[str, torch.Tensor], clip: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Clip each example's gradient to L2 norm ``clip``; return the clipped and the norms.

    ``grads`` maps parameter name → per-example gradients of shape ``(b, *param.shape)``;
    the norm of example i is over all parameters together. Returns the clipped gradients
    (same shapes) and the (b,) norms before clipping.
    """
    flat = [g.reshape(g.shape[0], -1) for g in grads.values()]
    norms = torch.cat(flat, dim=1).norm(dim=1)
    factor = (clip / (norms + _NORM_EPS)).clamp(max=1.0)
    clipped = {k: g * factor.view(-1, *([1] * (g.dim() - 1))) for k, g in grads.items()}
    return clipped, norms


class DPSGD:
    """Privatized minibatch gradients of ``model`` (the module docstring).

    Parameters
    ----------
    model : torch.nn.Module
        The trained model (its parameters are read at each call; BatchNorm refused).
    loss : callable
        ``loss(logits, labels)`` → mean loss of a batch (cross-entropy).
    config : RecordDP
        σ and C.
    batch_size : int
        The expected batch size B: q = B / n, and g̃ is divided by B.
    seed : int, optional
        Seed of the sampling-and-noise generator (tests); None: 128 bits from the OS.

    """

    def __init__(
        self,
        model: nn.Module,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        config: RecordDP,
        batch_size: int,
        seed: int | None = None,
    ) -> None:
        check_per_sample_model(model)
        self.model, self.loss, self.config, self.batch_size = model, loss, config, batch_size
        self.generator = torch.Generator().manual_seed(
            secrets.randbits(63) if seed is None else seed
        )

    def sample(self, n: int) -> torch.Tensor:
        """Indices of one Poisson sample of ``n`` examples at rate q (maybe empty)."""
        q = RecordDP.sampling_rate(n, self.batch_size)
        return torch.nonzero(torch.rand(n, generator=self.generator) < q).flatten()

    def per_sample_grads(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Each example's gradient ``(b, *shape)`` per parameter, and its (b,) loss."""
        params = {k: p.detach() for k, p in self.model.named_parameters()}
        buffers = {k: b.detach() for k, b in self.model.named_buffers()}

        def one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
            logits = functional_call(self.model, (p, buffers), (xi.unsqueeze(0),))
            return self.loss(logits, yi.unsqueeze(0))

        grads, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0))(params, x, y)
        return grads, losses

    def noised_gradient(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], float]:
        """g̃ = (Σ clipped per-example gradients + N(0, σ²C²)) / B of a sampled batch.

        Returns g̃ per parameter name and the batch's mean loss (NaN for an empty batch:
        then g̃ is noise only, as the mechanism requires).
        """
        sigma, clip = self.config.noise_multiplier, self.config.clip
        named = dict(self.model.named_parameters())
        if len(y):
            grads, losses = self.per_sample_grads(x, y)
            clipped, _ = clip_per_sample(grads, clip)
            summed = {k: g.sum(dim=0) for k, g in clipped.items()}
            loss = float(losses.mean())
        else:
            summed = {k: torch.zeros_like(p) for k, p in named.items()}
            loss = math.nan
        out = {}
        for k, total in summed.items():
            noise = torch.normal(0.0, sigma * clip, total.shape, generator=self.generator)
            out[k] = (total + noise) / self.batch_size
        return out, loss
