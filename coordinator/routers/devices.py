"""``/devices``: enrolment, the fleet list, capability profiles, assignments."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status

from coordinator import lifecycle, reports, secagg, store, validation
from coordinator.deps import AdminDep, ControlDep, NowDep, OwnDeviceDep, SessionDep, SettingsDep
from meshfl.contract import (
    Assignment,
    CapabilityProfile,
    DevicePublic,
    EnrolRequest,
    EnrolResponse,
    ProfileSample,
)

__all__ = ["router"]

router = APIRouter(prefix="/devices", tags=["devices"])


@router.post("/enrol", response_model=EnrolResponse)
def enrol(
    body: EnrolRequest, session: SessionDep, settings: SettingsDep, now: NowDep
) -> EnrolResponse:
    """Give a device presenting the fleet's enrolment token a new identity and token.

    ``identity_key`` (optional) is the device's Ed25519 public key, base64 of 32 raw
    bytes (422 otherwise); secure-aggregation jobs need it to verify the device's keys.
    """
    expected = settings.enrol_token or ""
    if not hmac.compare_digest(body["token"].encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "enrolment token rejected; use the enrol token printed at coordinator start "
            "(MESHFL_COORDINATOR_ENROL_TOKEN)",
        )
    validation.validate_name(body["name"])
    validation.validate_profile(body.get("profile", CapabilityProfile()))
    identity_key = body.get("identity_key")
    if identity_key is not None:
        secagg.parse_identity_key(identity_key)
    device, token = store.enrol_device(
        session,
        name=body["name"],
        fleet=settings.fleet,
        profile=body.get("profile", CapabilityProfile()),
        now=now,
        identity_key=identity_key,
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


Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many items (1..1000)")]
Offset = Annotated[int, Query(ge=0, le=2**31, description="skip this many items first")]


def _minimum(what: str) -> object:
    return Query(ge=0, allow_inf_nan=False, description=f"only devices reporting {what} >= this")


@router.get("/profiles", response_model=list[DevicePublic])
def fleet_profiles(
    _: AdminDep,
    session: SessionDep,
    limit: Limit = 100,
    offset: Offset = 0,
    min_cores: Annotated[float | None, _minimum("cores")] = None,
    min_train_samples_per_s: Annotated[float | None, _minimum("train_samples_per_s")] = None,
    min_uplink_bytes_per_s: Annotated[float | None, _minimum("uplink_bytes_per_s")] = None,
) -> list[DevicePublic]:
    """The fleet's latest profiles, in enrolment order, optionally only capable devices.

    A device whose profile lacks a filtered field does not match that filter.
    """
    given = {
        "cores": min_cores,
        "train_samples_per_s": min_train_samples_per_s,
        "uplink_bytes_per_s": min_uplink_bytes_per_s,
    }
    minimums = {field: least for field, least in given.items() if least is not None}
    found = store.devices_meeting(session, minimums, limit=limit, offset=offset)
    return [reports.device_public(d) for d in found]


@router.get("/{device_id}", response_model=DevicePublic)
def get_device(device_id: str, _: AdminDep, session: SessionDep) -> DevicePublic:
    """One device."""
    return reports.device_public(store.get_device(session, device_id))


@router.put("/{device_id}/profile", response_model=DevicePublic)
def put_profile(
    body: CapabilityProfile,
    device: OwnDeviceDep,
    session: SessionDep,
    control: ControlDep,
    now: NowDep,
) -> DevicePublic:
    """Replace the device's capability profile and append it to its history (own token only).

    A participant of a running job whose ``min_battery_percent`` it is now below (and not
    charging) leaves that job: a new topology version without it.
    """
    validation.validate_profile(body)
    store.update_profile(session, device, body, now)
    lifecycle.leave_on_battery(session, device, now, control)
    return reports.device_public(device)


@router.get("/{device_id}/profiles", response_model=list[ProfileSample])
def get_profiles(
    device_id: str,
    _: AdminDep,
    session: SessionDep,
    limit: Limit = 100,
    offset: Offset = 0,
    since: Annotated[
        float | None,
        Query(allow_inf_nan=False, description="only samples received at or after (unix s)"),
    ] = None,
) -> list[ProfileSample]:
    """The device's profile history, newest first (the latest 1000 are kept)."""
    device = store.get_device(session, device_id)
    rows = store.profile_history(session, device, limit=limit, offset=offset, since=since)
    return [reports.profile_sample(r) for r in rows]


@router.get(
    "/{device_id}/assignment",
    response_model=Assignment,
    responses={204: {"description": "No job for this device now"}},
)
def get_assignment(
    device: OwnDeviceDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
) -> Assignment | Response:
    """Return the device's current job: its row of the current W, version and plan.

    An idle device with no job joins the latest running ``elastic`` job that can take
    it (a new topology version; it starts at ``start_round``).
    """
    store.touch(session, device, now)
    found = lifecycle.current_assignment(session, device, now, settings, control)
    if found is None:
        found = lifecycle.admit(session, device, now, control)
    if found is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    job, row = found
    return reports.assignment(job, row, settings.fleet)
