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

Record-level DP (``dp_unit`` ``record``, issue 22)
-------------------------------------------------
The unit is one *example* of a device's data, under **add/remove** adjacency (one
record present or absent), as in Abadi et al., "Deep Learning with Differential
Privacy", CCS 2016. The trainer runs DP-SGD: each step samples every local example
independently with probability q = B / n_local (Poisson sampling), clips each
per-sample gradient to L2 norm C and adds N(0, σ²C²) to their sum. One record changes
the sum by at most C, so each step is the Poisson-subsampled Gaussian mechanism of noise
multiplier σ (no :data:`SENSITIVITY` factor), accounted with the RDP bound of Mironov,
Talwar & Zhang ("Rényi Differential Privacy of the Sampled Gaussian Mechanism", 2019) —
``dp_accounting.PoissonSampledDpEvent(q, GaussianDpEvent(σ))``, composed over every
step. Releases are post-processing of the trained model and cost nothing more. A
device-level release also protects every record in it (changing a record is a change of
the device's dataset), so ε at the record unit composes the device-level releases too;
ε at the device unit composes only device-level releases (a record-level job gives no
device-level guarantee, docs/privacy.md).

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
from typing import Any, NamedTuple

__all__ = [
    "SENSITIVITY",
    "UNITS",
    "Spend",
    "epsilon",
    "load_accountant",
    "sampled_gaussian_epsilon",
]

UNITS = ("device", "record")
"""The units of privacy ε is computed for (``JobSpec.dp_unit``)."""


class Spend(NamedTuple):
    """Recorded releases of one kind: ``releases`` mechanisms of noise multiplier ``sigma``.

    ``unit`` ``device``: releases clipped to C with noise σC, sampling rate 1,
    sensitivity 2C. ``unit`` ``record``: DP-SGD steps at Poisson sampling rate
    ``sampling_rate`` q, sensitivity C (the module docstring).
    """

    sigma: float
    releases: int
    sampling_rate: float = 1.0
    unit: str = "device"


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


def epsilon(
    spends: Iterable[tuple[float, int] | Spend], delta: float, unit: str = "device"
) -> float:
    """ε of composing Gaussian releases, at ``delta`` (RDP, Mironov 2017), for ``unit``.

    Parameters
    ----------
    spends : iterable of (float, int) or Spend
        ``(σ, releases)`` pairs (device-level releases) or :class:`Spend` rows. A
        device-level release is clipped to C with noise of standard deviation σ·C at
        sampling rate 1, accounted as a Gaussian mechanism of sensitivity
        :data:`SENSITIVITY` · C = 2C, i.e. noise multiplier σ/2. A record-level row is
        ``releases`` DP-SGD steps, each a Poisson-subsampled Gaussian mechanism of noise
        multiplier σ at rate q (sensitivity C, add/remove of one example).
    delta : float
        δ of the (ε, δ) guarantee, in (0, 1).
    unit : str, default "device"
        ``device``: only device-level rows count; ``record``: every row counts.

    Returns
    -------
    float
        ε ≥ 0; 0.0 when there is no release; ``math.inf`` when a release has σ = 0.

    Raises
    ------
    ValueError
        ``delta`` outside (0, 1), an unknown unit, a negative σ or count, or a sampling
        rate outside (0, 1].

    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    rows = [Spend(*row) for row in spends]
    rows = [Spend(float(r.sigma), int(r.releases), float(r.sampling_rate), r.unit) for r in rows]
    if any(r.sigma < 0 or r.releases < 0 or not 0 < r.sampling_rate <= 1 for r in rows):
        raise ValueError("noise multipliers, counts must be >= 0 and sampling rates in (0, 1]")
    rows = [r for r in rows if r.releases > 0 and (unit == "record" or r.unit == "device")]
    if not rows:
        return 0.0
    if any(r.sigma == 0 for r in rows):
        return math.inf
    import dp_accounting

    accountant = _accountant()
    for row in rows:
        if row.unit == "device":
            event = dp_accounting.GaussianDpEvent(row.sigma / SENSITIVITY)
        else:
            event = dp_accounting.PoissonSampledDpEvent(
                row.sampling_rate, dp_accounting.GaussianDpEvent(row.sigma)
            )
        accountant.compose(event, row.releases)
    return float(accountant.get_epsilon(delta))


def sampled_gaussian_epsilon(
    sampling_rate: float, noise_multiplier: float, steps: int, delta: float
) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian mechanisms (DP-SGD; Mironov et al. 2019).

    The reference computation Opacus's ``RDPAccountant`` makes, for a noise multiplier
    relative to the sensitivity (no :data:`SENSITIVITY` factor here): what
    :func:`epsilon` composes for one record-level row. ``sampling_rate`` q in
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
