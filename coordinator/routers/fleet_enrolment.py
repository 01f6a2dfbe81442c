"""``/enrolment-tokens/fleet``: the fleet's shared enrolment token: show, rotate, disable.

Off unless the coordinator was started with ``--enrol-token`` or an operator rotates
one in (:mod:`coordinator.enrolment`). Rotation returns the new secret once; the old
one is refused at once. Disabling refuses it until the next rotation.
"""

from __future__ import annotations

from fastapi import APIRouter

from coordinator import enrolment
from coordinator.deps import NowDep, OperateDep, SessionDep, SettingsDep
from meshfl.contract import FleetEnrolmentPublic, FleetEnrolmentRotate, FleetEnrolmentRotated

__all__ = ["router"]

router = APIRouter(prefix="/enrolment-tokens/fleet", tags=["enrolment-tokens"])


@router.get("", response_model=FleetEnrolmentPublic)
def get_fleet_token(
    _: OperateDep, session: SessionDep, settings: SettingsDep, now: NowDep
) -> FleetEnrolmentPublic:
    """The fleet token's status (``off``, ``active``, ``disabled``, ``expired``, ``used up``)."""
    return enrolment.public(session, settings.fleet, now)


@router.post("/rotate", response_model=FleetEnrolmentRotated)
def rotate_fleet_token(
    body: FleetEnrolmentRotate,
    _: OperateDep,
    session: SessionDep,
    settings: SettingsDep,
    now: NowDep,
) -> FleetEnrolmentRotated:
    """Make a new fleet token (enabled); ``token`` is the only copy of the secret.

    ``ttl_s`` (omitted: never expires, at most ten years) and ``uses`` (omitted:
    unlimited, at most 10,000,000). The previous secret is refused from now on; devices
    already enrolled are unaffected.
    """
    state, secret = enrolment.rotate(
        session, settings.fleet, now, ttl_s=body.get("ttl_s"), uses=body.get("uses")
    )
    return FleetEnrolmentRotated(**state, token=secret)


@router.post("/disable", response_model=FleetEnrolmentPublic)
def disable_fleet_token(
    _: OperateDep, session: SessionDep, settings: SettingsDep, now: NowDep
) -> FleetEnrolmentPublic:
    """Refuse the fleet token from now on (again: no change); 404 when it is off."""
    return enrolment.disable(session, settings.fleet, now)
