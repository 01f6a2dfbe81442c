"""Error feedback (residual memory) as an explicit state object, outside the codecs.

Seide et al., "1-Bit Stochastic Gradient Descent ...", Interspeech 2014; Karimireddy,
Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and other Gradient Compression
Schemes", ICML 2019, Algorithm 2 (EF-SGD); Stich & Karimireddy, "The Error-Feedback
Framework", 2019. Per tensor, with residual ``e`` (starting at zero)::

    p = x + e                 (what should have been sent, including past losses)
    payload = C(p)
    e ← p − D(payload)        (what the codec dropped this time)

so ``Σ_t D(payload_t) + e_T = Σ_t x_t``: nothing is lost, only delayed. Use it where an
algorithm sends a biased codec's output of *fresh* quantities (gradients, compressed
D-PSGD); CHOCO-SGD's replica difference ``x − x̂`` already plays this role and needs none.
The residuals live here, not in the codec (torch's PowerSGD hook keeps the same split).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from meshfl.codecs import Codec
from meshfl.errors import ConfigError

__all__ = ["ErrorFeedback"]


class ErrorFeedback:
    """Residuals ``e`` (float32, one per tensor) for error-feedback compression.

    Parameters
    ----------
    layout : iterable of (str, tuple of int)
        Ordered (tensor name, shape) pairs; names unique and non-empty.

    Raises
    ------
    ConfigError
        If a name is empty or repeated, or a shape is not a tuple of ints ``>= 0``.

    """

    __slots__ = ("_residuals",)

    def __init__(self, layout: Iterable[tuple[str, tuple[int, ...]]]) -> None:
        residuals: dict[str, np.ndarray] = {}
        for name, shape in layout:
            if not isinstance(name, str) or not name or name in residuals:
                raise ConfigError(f"tensor names must be unique non-empty strings, got {name!r}")
            if not isinstance(shape, tuple) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
            ):
                raise ConfigError(f"tensor {name!r} has an invalid shape {shape!r}")
            residuals[name] = np.zeros(shape, dtype=np.float32)
        self._residuals = residuals

    def compress(self, codec: Codec, name: str, x: np.ndarray) -> tuple[bytes, np.ndarray]:
        """Compress ``x + e`` for tensor ``name`` and keep what the codec dropped.

        Parameters
        ----------
        codec : Codec
            Any codec (lossless ones leave ``e`` at zero up to rounding).
        name : str
            A tensor of the layout.
        x : np.ndarray
            float32 (floating dtypes are cast), the tensor's shape.

        Returns
        -------
        tuple of (bytes, np.ndarray)
            The payload to send (tag ``codec.tag``) and its decoded float32 value
            ``D(payload)``, exactly what receivers will see.

        Raises
        ------
        ConfigError
            If ``name`` is unknown or ``x`` has another shape.
        CodecError
            If ``x + e`` holds NaN/inf; the residual is then unchanged.

        """
        residual = self._residual(name)
        values = np.asarray(x, dtype=np.float32)
        if values.shape != residual.shape:
            raise ConfigError(
                f"tensor {name!r} has shape {values.shape}, expected {residual.shape}"
            )
        with np.errstate(over="ignore"):
            target = values + residual
        payload = codec.encode(target)
        decoded = codec.decode(payload, residual.shape)
        np.subtract(target, decoded, out=residual)
        return payload, decoded

    def residual(self, name: str) -> np.ndarray:
        """Return a copy of the residual ``e`` of tensor ``name`` (float32).

        Raises
        ------
        ConfigError
            If ``name`` is unknown.

        """
        return self._residual(name).copy()

    def reset(self) -> None:
        """Set every residual to zero (e.g. after a keyframe resynchronises the model)."""
        for residual in self._residuals.values():
            residual.fill(0.0)

    def residual_norm(self) -> float:
        """Return ``sqrt(Σ_tensors ‖e‖²)``, accumulated in float64."""
        return math.sqrt(
            math.fsum(
                float(np.dot(r.ravel().astype(np.float64), r.ravel().astype(np.float64)))
                for r in self._residuals.values()
            )
        )

    def _residual(self, name: str) -> np.ndarray:
        try:
            return self._residuals[name]
        except KeyError:
            raise ConfigError(
                f"no tensor {name!r} in the error-feedback state {list(self._residuals)}"
            ) from None
