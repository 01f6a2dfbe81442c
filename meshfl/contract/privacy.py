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
    """

    round: int
    releases: int
    new_run: NotRequired[bool]


@strict
class PrivacyStatus(TypedDict):
    """A device's privacy spend: ε over all its jobs' releases at ``delta`` (RDP accountant).

    ``epsilon_budget``: the ε_max that applies (``None``: not capped); ``releases``: the
    releases accounted so far, over all its jobs.
    """

    device_id: str
    epsilon_spent: float
    delta: float
    epsilon_budget: float | None
    releases: int
