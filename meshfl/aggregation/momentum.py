"""Momentum for gossip: heavy-ball local momentum, quasi-global momentum, update momentum.

Three explicit state objects (numpy only; tensors keyed by name, updated in place so a
trainer can hand in views of its parameters):

- :class:`LocalMomentum` — Polyak's heavy ball on every local step (Polyak 1964; the
  form of ``torch.optim.SGD(momentum=β)``), the buffer kept across rounds::

      v ← β v + g,     x ← x − η v                                   (HB)

- :class:`QuasiGlobalMomentum` — Lin, Karimireddy, Stich, Jaggi, "Quasi-Global
  Momentum: Accelerating Decentralized Deep Learning on Heterogeneous Data", ICML 2021,
  Algorithm 1 (QG-DSGDm). The local step uses a buffer m̂ built from the change of the
  *mixed* model, not from local gradients, so it follows the network's direction rather
  than the device's skewed one::

      x ← x − η (g + β m̂)                       (every local step; m̂ fixed in a round)
      d̂ = (x_start − x_mixed) / (η τ)           (τ local steps this round)
      m̂ ← μ m̂ + (1 − μ) d̂                                          (QGM, Eq. 3)

  The paper has one local step per gossip round (τ = 1); dividing by τ keeps d̂ at the
  scale of one gradient when a round runs a local epoch.

- :class:`UpdateMomentum` — momentum on the round's *mixed* update, the decentralized
  form of server momentum (FedAvgM: Hsu, Qi, Brown, arXiv:1909.06335, 2019; SlowMo:
  Wang, Tantia, Ballas, Rabbat, ICLR 2020, Algorithm 1 with base algorithm gossip)::

      u ← β u + (x_start − x_mixed),     x ← x_start − α u              (SlowMo, Eq. 2)

  On the complete graph with exact averaging every device holds the same x_mixed, so
  every device's u is identical and this is FedAvgM exactly.

All three are local to a device: nothing extra goes on the wire, and they combine with
every codec, secure aggregation and asynchronous rounds (see ``docs/algorithms.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from meshfl.errors import ConfigError

__all__ = ["LocalMomentum", "QuasiGlobalMomentum", "UpdateMomentum", "heavy_ball_step"]


def _coefficient(name: str, value: float, upper_open: bool = True) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not (ok and math.isfinite(value) and value >= 0.0 and (value < 1.0 or not upper_open)):
        raise ConfigError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def _rate(name: str, value: float) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not (ok and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def heavy_ball_step(
    x: np.ndarray, grad: np.ndarray, buffer: np.ndarray, lr: float, beta: float
) -> None:
    """One heavy-ball step in place: ``buffer ← β·buffer + grad``, ``x ← x − lr·buffer``.

    Parameters
    ----------
    x, grad, buffer : np.ndarray
        Same shape, float32; ``x`` and ``buffer`` are modified in place.
    lr : float
        Step size η > 0.
    beta : float
        Momentum β in [0, 1); 0 is plain SGD.

    """
    buffer *= np.float32(beta)
    buffer += grad
    x -= np.float32(lr) * buffer


class _Buffers:
    """Zero-initialised float32 buffers keyed by tensor name, created on first use."""

    __slots__ = ("_buffers",)

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, like: np.ndarray) -> np.ndarray:
        buf = self._buffers.get(name)
        if buf is None or buf.shape != like.shape:
            buf = self._buffers[name] = np.zeros(like.shape, dtype=np.float32)
        return buf

    def norm(self) -> float:
        return math.sqrt(
            math.fsum(float(np.sum(b.astype(np.float64) ** 2)) for b in self._buffers.values())
        )

    def copies(self) -> dict[str, np.ndarray]:
        return {name: b.copy() for name, b in self._buffers.items()}

    def replace(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._buffers = {name: np.array(a, dtype=np.float32) for name, a in arrays.items()}


class LocalMomentum:
    """Heavy-ball local momentum (HB above) with its buffers kept across rounds.

    Parameters
    ----------
    beta : float
        Momentum β in [0, 1); 0 is plain SGD.

    Raises
    ------
    ConfigError
        If β is outside [0, 1).

    """

    __slots__ = ("_buffers", "beta")

    def __init__(self, beta: float) -> None:
        self.beta = _coefficient("local momentum β", beta)
        self._buffers = _Buffers()

    def step(
        self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray], lr: float
    ) -> None:
        """Apply (HB) to every tensor of ``params`` in place (float32 arrays or views)."""
        for name, x in params.items():
            heavy_ball_step(x, grads[name], self._buffers.get(name, x), lr, self.beta)

    def buffer_norm(self) -> float:
        """‖v‖ over all tensors (float64 sum), 0 before the first step."""
        return self._buffers.norm()


class QuasiGlobalMomentum:
    """Quasi-global momentum (QG-DSGDm, Lin et al. ICML 2021, Algorithm 1).

    Per round: :meth:`begin_round` with the model before local training, :meth:`step`
    for every local step, the algorithm's mixing, then :meth:`end_round` with the mixed
    model.

    Parameters
    ----------
    beta : float
        β in [0, 1), weight of m̂ in the local step (the paper uses 0.9).
    mu : float, optional
        μ in [0, 1), the averaging of d̂ into m̂; default ``beta`` (the paper's choice).

    Raises
    ------
    ConfigError
        If β or μ is outside [0, 1).

    """

    __slots__ = ("_buffers", "_start", "beta", "mu")

    def __init__(self, beta: float, mu: float | None = None) -> None:
        self.beta = _coefficient("quasi-global momentum β", beta)
        self.mu = self.beta if mu is None else _coefficient("quasi-global momentum μ", mu)
        self._buffers = _Buffers()
        self._start: dict[str, np.ndarray] = {}

    def begin_round(self, x: Mapping[str, np.ndarray]) -> None:
        """Remember x_start, the model before this round's local steps (copied)."""
        self._start = {name: np.array(a, dtype=np.float32) for name, a in x.items()}

    def step(
        self, params: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray], lr: float
    ) -> None:
        """``x ← x − η (g + β m̂)`` for every tensor, in place."""
        for name, x in params.items():
            m = self._buffers.get(name, x)
            x -= np.float32(lr) * (grads[name] + np.float32(self.beta) * m)

    def end_round(self, x_mixed: Mapping[str, np.ndarray], lr: float, steps: int) -> None:
        """``m̂ ← μ m̂ + (1 − μ)(x_start − x_mixed)/(η τ)`` (QGM), τ = ``steps``.

        Raises
        ------
        ConfigError
            If :meth:`begin_round` was not called, the tensors differ from it, η is
            not > 0 or τ is not a positive int.

        """
        _rate("learning rate", lr)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"steps must be a positive int, got {steps!r}")
        if list(x_mixed) != list(self._start):
            raise ConfigError("end_round needs the tensors given to begin_round")
        scale = np.float32(1.0 / (lr * steps))
        for name, mixed in x_mixed.items():
            m = self._buffers.get(name, self._start[name])
            d = (self._start[name] - np.asarray(mixed, dtype=np.float32)) * scale
            m *= np.float32(self.mu)
            m += np.float32(1.0 - self.mu) * d
        self._start = {}

    def buffer_norm(self) -> float:
        """‖m̂‖ over all tensors (float64 sum), 0 before the first round."""
        return self._buffers.norm()

    @property
    def round_open(self) -> bool:
        """Whether :meth:`begin_round` was called and :meth:`end_round` not yet."""
        return bool(self._start)

    def state(self) -> dict[str, np.ndarray]:
        """Copies of m̂ (float32, keyed by tensor name); empty before the first step."""
        return self._buffers.copies()

    def load_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Replace m̂ with copies of ``arrays`` (from :meth:`state`; a resumed job)."""
        self._buffers.replace(arrays)


class UpdateMomentum:
    """Momentum on the mixed update (SlowMo / FedAvgM above).

    Parameters
    ----------
    beta : float
        β in [0, 1); 0 with α = 1 returns the mixed model unchanged.
    alpha : float, default 1.0
        Outer step α > 0 (SlowMo's slow learning rate).

    Raises
    ------
    ConfigError
        If β is outside [0, 1) or α is not > 0.

    """

    __slots__ = ("_buffers", "alpha", "beta")

    def __init__(self, beta: float, alpha: float = 1.0) -> None:
        self.beta = _coefficient("update momentum β", beta)
        self.alpha = _rate("update momentum α", alpha)
        self._buffers = _Buffers()

    def apply(
        self, x_start: Mapping[str, np.ndarray], x_mixed: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Return ``x_start − α u`` after ``u ← β u + (x_start − x_mixed)`` (float32).

        Raises
        ------
        ConfigError
            If the two models have different tensor names.

        """
        if list(x_start) != list(x_mixed):
            raise ConfigError("x_start and x_mixed must have the same tensors in order")
        out: dict[str, np.ndarray] = {}
        for name, start in x_start.items():
            s = np.asarray(start, dtype=np.float32)
            u = self._buffers.get(name, s)
            u *= np.float32(self.beta)
            u += s - np.asarray(x_mixed[name], dtype=np.float32)
            out[name] = s - np.float32(self.alpha) * u
        return out

    def buffer_norm(self) -> float:
        """‖u‖ over all tensors (float64 sum), 0 before the first round."""
        return self._buffers.norm()
