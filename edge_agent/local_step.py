"""The update of a local minibatch step: plain SGD, heavy-ball or quasi-global momentum.

The trainer (:class:`edge_agent.trainer.Trainer`) computes each step's gradient (plain
or DP-SGD's privatized one) into ``p.grad``; :class:`LocalStep` turns it into the
update, and keeps the momentum state across rounds:

- ``heavy-ball`` (Polyak 1964), ``torch.optim.SGD(momentum=β)`` (dampening 0, not
  Nesterov): ``v ← β v + g``, ``x ← x − η v``, with ``v ← g`` at the first step; the buffer
  v follows the device's own gradients.
- ``quasi-global`` (Lin, Karimireddy, Stich, Jaggi, ICML 2021, Algorithm 1, QG-DSGDm):
  ``x ← x − η (g + β m̂)`` with m̂ fixed within a round, then, once the round's mixing
  is known, ``m̂ ← β m̂ + (1 − β)(x_start − x_mixed)/(η τ)`` (Eq. 3; τ local steps this
  round): the buffer follows the *network's* direction, which corrects the client drift
  of heavy ball under label skew. The buffer arithmetic is the kernel's
  :class:`meshfl.aggregation.momentum.QuasiGlobalMomentum`, the object the lockstep
  benchmarks run.

β = 0 is plain SGD, ``x ← x − η g``, whichever kind. Nothing here goes on the wire.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from meshfl.aggregation.momentum import QuasiGlobalMomentum
from meshfl.errors import ConfigError

__all__ = ["MOMENTUM_KINDS", "LocalStep", "check_momentum"]

MOMENTUM_KINDS = ("heavy-ball", "quasi-global")
"""The job spec's ``momentum_kind`` values: how ``local_momentum`` β is applied."""


def check_momentum(momentum: float) -> float:
    """Return ``momentum`` as a float; ConfigError unless it is a number in [0, 1)."""
    ok = not isinstance(momentum, bool) and isinstance(momentum, (int, float))
    if not (ok and math.isfinite(momentum) and 0 <= momentum < 1):
        raise ConfigError(f"local momentum must be a number in [0, 1) (got {momentum!r})")
    return float(momentum)


class LocalStep:
    """One model's local update rule and its momentum state.

    Parameters
    ----------
    model : torch.nn.Module
        The model whose parameters are updated in place (float32, CPU).
    learning_rate : float
        Step size η > 0.
    momentum : float
        β in [0, 1); 0: plain SGD.
    kind : str, default "heavy-ball"
        One of :data:`MOMENTUM_KINDS`.

    Raises
    ------
    ConfigError
        β outside [0, 1) or an unknown kind.

    """

    def __init__(
        self, model: nn.Module, learning_rate: float, momentum: float, kind: str = "heavy-ball"
    ) -> None:
        if kind not in MOMENTUM_KINDS:
            raise ConfigError(f"momentum kind must be heavy-ball or quasi-global (got {kind!r})")
        self.kind = kind
        self.momentum = check_momentum(momentum)
        self.learning_rate = float(learning_rate)
        self._model = model
        on = self.momentum > 0
        self._heavy_ball = (
            torch.optim.SGD(model.parameters(), lr=self.learning_rate, momentum=self.momentum)
            if on and kind == "heavy-ball" else None
        )  # fmt: skip
        self._quasi_global = (
            QuasiGlobalMomentum(self.momentum) if on and kind == "quasi-global" else None
        )
        self._steps = 0

    def begin_round(self) -> None:
        """A round's local steps start from the model as it is now (x_start)."""
        self._steps = 0
        if self._quasi_global is not None:
            self._quasi_global.begin_round(self._views())

    def step(self) -> None:
        """Apply this step's update from ``p.grad`` (parameters without a gradient stay)."""
        self._steps += 1
        if self._heavy_ball is not None:
            self._heavy_ball.step()
            return
        with torch.no_grad():
            if self._quasi_global is not None:
                named = [(n, p) for n, p in self._model.named_parameters() if p.grad is not None]
                views = {n: p.detach().numpy() for n, p in named}
                grads = {n: p.grad.detach().numpy() for n, p in named}  # type: ignore[union-attr]
                self._quasi_global.step(views, grads, self.learning_rate)
                return
            for p in self._model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-self.learning_rate)

    def end_round(self, mixed: Mapping[str, np.ndarray]) -> None:
        """The round's mixed model is known: quasi-global momentum updates m̂ (Eq. 3).

        Nothing for the other kinds, or when no round was begun (a joiner's catch-up).
        """
        qgm = self._quasi_global
        if qgm is not None and qgm.round_open:
            qgm.end_round(dict(mixed), self.learning_rate, max(1, self._steps))

    def state(self) -> dict[str, np.ndarray]:
        """Copies of the momentum buffers (float32, by parameter name); empty without any."""
        if self._quasi_global is not None:
            return self._quasi_global.state()
        if self._heavy_ball is None:
            return {}
        out = {}
        for name, p in self._model.named_parameters():
            buffer = self._heavy_ball.state.get(p, {}).get("momentum_buffer")
            if buffer is not None:
                out[name] = buffer.detach().numpy().astype(np.float32, copy=True)
        return out

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Replace the momentum buffers with ``arrays`` (from :meth:`state`; empty: none).

        Raises
        ------
        ConfigError
            Buffers given without momentum, or a missing, extra or mis-shaped buffer.

        """
        if arrays and self._heavy_ball is None and self._quasi_global is None:
            raise ConfigError("momentum buffers given, but this trainer has momentum 0")
        named = dict(self._model.named_parameters())
        if arrays and set(arrays) != set(named):
            raise ConfigError(f"momentum buffers for {sorted(arrays)}, expected {sorted(named)}")
        values = {name: np.asarray(a, dtype=np.float32) for name, a in arrays.items()}
        for name, value in values.items():
            if value.shape != tuple(named[name].shape):
                raise ConfigError(
                    f"momentum buffer {name!r} has shape {value.shape},"
                    f" expected {tuple(named[name].shape)}"
                )
        if self._quasi_global is not None:
            self._quasi_global.load_state(values)
        elif self._heavy_ball is not None:
            self._heavy_ball.state.clear()
            for name, value in values.items():
                buffer = torch.from_numpy(value.copy())
                self._heavy_ball.state[named[name]]["momentum_buffer"] = buffer

    def _views(self) -> dict[str, np.ndarray]:
        return {n: p.detach().numpy() for n, p in self._model.named_parameters()}
