"""Differential privacy: a device's releases and its ε spend (``.../privacy``)."""

from __future__ import annotations

from typing_extensions import NotRequired, TypedDict

from meshfl.contract._schema import strict, strict_request

__all__ = ["PrivacySpend", "PrivacyStatus"]


@strict_request
class PrivacySpend(TypedDict):
    """Body of ``POST .../privacy/{device_id}/spend``: the DP releases of one round.

    ``releases`` noised releases clipped to C in round ``round`` (1 with local DP;
    under secure aggregation one per aggregator, i.e. the device's degree). ``new_run``
    (default false): the first spend of a run of the agent on this job (a start or a
    restart); if the round was already recorded, an earlier run may have released a
    differently noised delta for it, so the coordinator counts these releases again.

    In a ``dp_unit`` ``record`` job, ``releases`` counts the round's DP-SGD steps and
    ``sampling_rate`` (required there) is their Poisson sampling rate q = B / n_local
    (in (0, 1]); each step is accounted as a Poisson-subsampled Gaussian mechanism.
    """

    round: int
    releases: int
    new_run: NotRequired[bool]
    sampling_rate: NotRequired[float]


@strict
class PrivacyStatus(TypedDict):
    """A device's privacy spend: ε over all its jobs' releases at ``delta`` (RDP accountant).

    ``epsilon_budget``: the ε_max that applies (``None``: not capped); ``releases``: the
    releases accounted so far, over all its jobs. ``unit``: the unit of privacy ε is
    for, ``device`` or ``record`` (issue 22; absent in answers from before it: device).
    """

    device_id: str
    epsilon_spent: float
    delta: float
    epsilon_budget: float | None
    releases: int
    unit: NotRequired[str]
