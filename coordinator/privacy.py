"""The privacy accountant: ε of a device's differentially private releases (RDP).

Unit of privacy
---------------
One *device*, and two datasets are neighbours when they differ by the **replacement** of
everything one device holds (docs/privacy.md, "What ε means"). Each *release* is one
noised delta a device publishes — its CHOCO-SGD message with local DP, or its
contribution to one securely aggregated neighbourhood sum (so a device of degree d makes
d releases per round under secure aggregation, one per aggregator). A release is clipped
to L2 norm C and carries Gaussian noise of standard deviation σ·C. Replacing the device's
data can move a clipped delta anywhere in the ball of radius C, so two neighbouring
releases differ by up to **2C**: the L2 sensitivity is ``SENSITIVITY`` × C = 2C, and each
release is the Gaussian mechanism with effective noise multiplier σ·C / 2C = σ/2 and
sampling rate 1 (every release touches the whole dataset; no subsampling amplification
is claimed). Under add/remove adjacency the sensitivity would be C only if a device
without data released exactly zero, which a CHOCO-SGD device (whose released difference
also carries its neighbours' mixing) does not.

Accounting
----------
Rényi differential privacy (Mironov, "Rényi Differential Privacy", CSF 2017): the
Gaussian mechanism of noise multiplier σ is (α, α/(2σ²))-RDP for every order α > 1,
releases compose by adding RDP over the same α, and the total converts to (ε, δ)-DP
with the tightened bound of Balle et al. (AISTATS 2020), minimised over the orders.
The arithmetic is Google's maintained ``dp_accounting`` library
(:class:`dp_accounting.rdp.RdpAccountant`); the tests cross-check it against Opacus's
``RDPAccountant``. ``dp_accounting`` is imported on first use (it pulls in scipy).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["SENSITIVITY", "epsilon", "load_accountant", "sampled_gaussian_epsilon"]

SENSITIVITY = 2.0
"""L2 sensitivity of one release in units of the clipping norm C (replacement adjacency)."""


def load_accountant() -> None:
    """Import ``dp_accounting`` (and scipy) now: seconds on a busy machine, the first time.

    :mod:`coordinator.budget` calls it before it takes a device's lock, so that no lock
    is ever held across that import.
    """
    import dp_accounting  # noqa: F401


def _accountant() -> Any:
    from dp_accounting import rdp

    return rdp.RdpAccountant()


def epsilon(spends: Iterable[tuple[float, int]], delta: float) -> float:
    """ε of composing Gaussian releases, at ``delta`` (RDP, Mironov 2017).

    Parameters
    ----------
    spends : iterable of (float, int)
        ``(σ, releases)`` pairs: ``releases`` releases clipped to C with noise of standard
        deviation σ·C, each at sampling rate 1; accounted as Gaussian mechanisms of
        sensitivity :data:`SENSITIVITY` · C = 2C, i.e. noise multiplier σ/2.
    delta : float
        δ of the (ε, δ) guarantee, in (0, 1).

    Returns
    -------
    float
        ε ≥ 0; 0.0 when there is no release; ``math.inf`` when a release has σ = 0.

    Raises
    ------
    ValueError
        ``delta`` outside (0, 1), a negative σ or a negative count.

    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    pairs = [(float(s), int(n)) for s, n in spends]
    if any(s < 0 or n < 0 for s, n in pairs):
        raise ValueError("noise multipliers and release counts must be >= 0")
    pairs = [(s, n) for s, n in pairs if n > 0]
    if not pairs:
        return 0.0
    if any(s == 0 for s, _ in pairs):
        return math.inf
    import dp_accounting

    accountant = _accountant()
    for sigma, count in pairs:
        accountant.compose(dp_accounting.GaussianDpEvent(sigma / SENSITIVITY), count)
    return float(accountant.get_epsilon(delta))


def sampled_gaussian_epsilon(
    sampling_rate: float, noise_multiplier: float, steps: int, delta: float
) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian mechanisms (DP-SGD; Mironov et al. 2019).

    The reference computation Opacus's ``RDPAccountant`` makes, for a noise multiplier
    relative to the sensitivity (no :data:`SENSITIVITY` factor here); the coordinator
    itself accounts releases at sampling rate 1 (:func:`epsilon`). ``sampling_rate`` q in
    (0, 1]; ``noise_multiplier`` σ > 0; ``steps`` ≥ 0; ``delta`` in (0, 1).
    """
    if not 0 < sampling_rate <= 1 or noise_multiplier <= 0 or steps < 0 or not 0 < delta < 1:
        raise ValueError("need 0 < q <= 1, sigma > 0, steps >= 0 and 0 < delta < 1")
    import dp_accounting

    accountant = _accountant()
    event = dp_accounting.PoissonSampledDpEvent(
        sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
    )
    accountant.compose(event, steps)
    return float(accountant.get_epsilon(delta))
