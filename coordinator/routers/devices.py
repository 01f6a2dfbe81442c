"""``/devices``: enrolment, the fleet list, capability profiles, assignments."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, HTTPException, Response, status

from coordinator import lifecycle, reports, store, validation
from coordinator.deps import AdminDep, NowDep, OwnDeviceDep, SessionDep, SettingsDep
from meshfl.contract import (
    Assignment,
    CapabilityProfile,
    DevicePublic,
    EnrolRequest,
    EnrolResponse,
)

__all__ = ["router"]

router = APIRouter(prefix="/devices", tags=["devices"])


@router.post("/enrol", response_model=EnrolResponse)
def enrol(
    body: EnrolRequest, session: SessionDep, settings: SettingsDep, now: NowDep
) -> EnrolResponse:
    """Give a device presenting the fleet's enrolment token a new identity and token."""
    expected = settings.enrol_token or ""
    if not hmac.compare_digest(body["token"].encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "enrolment token rejected; use the enrol token printed at coordinator start "
            "(MESHFL_COORDINATOR_ENROL_TOKEN)",
        )
    validation.validate_name(body["name"])
    device, token = store.enrol_device(
        session,
        name=body["name"],
        fleet=settings.fleet,
        profile=body.get("profile", CapabilityProfile()),
        now=now,
    )
    return EnrolResponse(
        device_id=device.id,
        device_token=token,
        fleet=device.fleet,
        broker_url=settings.broker_url,
    )


@router.get("", response_model=list[DevicePublic])
def list_devices(_: AdminDep, session: SessionDep) -> list[DevicePublic]:
    """Every enrolled device, in enrolment order."""
    return [reports.device_public(d) for d in store.list_devices(session)]


@router.get("/{device_id}", response_model=DevicePublic)
def get_device(device_id: str, _: AdminDep, session: SessionDep) -> DevicePublic:
    """One device."""
    return reports.device_public(store.get_device(session, device_id))


@router.put("/{device_id}/profile", response_model=DevicePublic)
def put_profile(
    body: CapabilityProfile, device: OwnDeviceDep, session: SessionDep, now: NowDep
) -> DevicePublic:
    """Replace the device's capability profile (the device's own token only)."""
    return reports.device_public(store.update_profile(session, device, body, now))


@router.get(
    "/{device_id}/assignment",
    response_model=Assignment,
    responses={204: {"description": "No job for this device now"}},
)
def get_assignment(
    device: OwnDeviceDep, session: SessionDep, settings: SettingsDep, now: NowDep
) -> Assignment | Response:
    """Return the device's current job: index, self weight, neighbour weights (row of W)."""
    store.touch(session, device, now)
    found = lifecycle.current_assignment(session, device, now, settings.stale_after_s)
    if found is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    job, row = found
    return reports.assignment(job, row, settings.fleet)
