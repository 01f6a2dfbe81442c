"""``/devices``: enrolment, the fleet view, management, profiles, assignments.

Management: tags and labels, drain/undrain, revoke, delete (:mod:`coordinator.fleet`).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Response, status
from sqlalchemy.orm import Session

from coordinator import enrolment, fleet, lifecycle, reports, secagg, store, tokens, validation
from coordinator.brokerauth import BrokerAccounts
from coordinator.control import Control
from coordinator.db import Device
from coordinator.deps import (
    BrokerAccountsDep,
    ControlDep,
    NowDep,
    OperateDep,
    OwnDeviceDep,
    PresenceDep,
    ReadDep,
    SessionDep,
    SettingsDep,
)
from coordinator.settings import CoordinatorSettings
from meshfl.contract import (
    Assignment,
    CapabilityProfile,
    DevicePatch,
    DevicePublic,
    DeviceState,
    EnrolRequest,
    EnrolResponse,
    ProfileSample,
)
from meshfl.errors import ConfigError

__all__ = ["router"]

log = logging.getLogger("coordinator.devices")

router = APIRouter(prefix="/devices", tags=["devices"])

Responses = dict[int | str, dict[str, Any]]
_BROKER_DOWN: Responses = {503: {"description": "The broker's login table could not be updated"}}


_ENROL_REFUSALS: Responses = {
    **_BROKER_DOWN,
    403: {"description": "A disabled/expired/used-up fleet token, or a revoked identity key"},
    409: {"description": "An active device holds the identity key and no proof was sent"},
}


@router.post("/enrol", response_model=EnrolResponse, responses=_ENROL_REFUSALS)
def enrol(
    body: EnrolRequest,
    session: SessionDep,
    settings: SettingsDep,
    now: NowDep,
    accounts: BrokerAccountsDep,
    control: ControlDep,
) -> EnrolResponse:
    """Give a device presenting an enrolment token a new identity and token.

    The token is an operator-made enrolment token (its tags become the device's) or the
    fleet's shared enrol token, when one is on (:mod:`coordinator.enrolment`: off unless
    the coordinator was started with one or an operator rotated one in; 403 once
    disabled, expired or used up). ``identity_key`` (optional) is the device's Ed25519
    public key, base64 of 32 raw bytes (422 otherwise): it registers the key that signs
    the device's deltas and secure-aggregation keys, so signed jobs need it. A key of a
    revoked device is refused (403); a key an active device holds needs
    ``identity_proof`` (409 without), and that device is then revoked — its token and
    broker login stop working. When the coordinator manages broker logins, the answer
    carries ``broker_username`` (the device id) and ``broker_password``, shown only here;
    ``broker_ca`` is the broker's CA (PEM) when one is configured. A 503 (the broker's
    logins cannot be updated) enrols nothing and spends no use of the token.
    """
    validation.validate_name(body["name"])
    profile = body.get("profile", CapabilityProfile())
    validation.validate_profile(profile)
    identity_key = body.get("identity_key")
    if identity_key is not None:
        secagg.parse_identity_key(identity_key)
    ca = _broker_ca(settings)
    replaced = enrolment.device_to_replace(
        session, identity_key, body.get("identity_proof"), body["token"], body["name"]
    )
    if enrolment.consume(session, settings.fleet, body["token"], now):
        grant = tokens.EnrolmentGrant(token_id=None, tags=[])
    else:
        grant = tokens.consume_enrolment_token(session, body["token"], now)
    device, token = store.enrol_device(
        session,
        name=body["name"],
        fleet=settings.fleet,
        profile=profile,
        now=now,
        identity_key=identity_key,
        tags=list(grant.tags),
        commit=False,
    )
    reply = EnrolResponse(
        device_id=device.id, device_token=token, fleet=device.fleet, broker_url=settings.broker_url
    )
    if accounts is not None:
        try:
            reply["broker_username"], reply["broker_password"] = fleet.enrol_broker_login(
                accounts, device
            )
        except ConfigError as exc:
            session.rollback()  # no device, and the token's use is not spent
            raise _unavailable(f"the device could not get a broker login ({exc})") from None
    if replaced is not None:  # the same device again: its old identity stops, atomically
        replaced.state, replaced.revoked_at, replaced.identity_key = "revoked", now, None
    session.commit()
    if replaced is not None:
        _retire(session, replaced, now, control, accounts)
    if ca is not None:
        reply["broker_ca"] = ca
    return reply


def _retire(
    session: Session,
    device: Device,
    now: float,
    control: Control,
    accounts: BrokerAccounts | None,
) -> None:
    """Take a replaced device out of its jobs and the broker (it is revoked already)."""
    try:
        fleet.revoke(session, device, now, control, accounts)
    except ConfigError as exc:  # the new device is enrolled; revoking the old one retries
        log.warning(
            "device %s enrolled again as a new device, but its old broker login remains"
            " (%s); revoke %s again to remove it",
            device.id,
            exc,
            device.id,
        )


def _broker_ca(settings: CoordinatorSettings) -> str | None:
    if settings.broker_ca_file is None:
        return None
    try:
        return settings.broker_ca_file.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise _unavailable(
            f"the broker CA file {str(settings.broker_ca_file)!r} cannot be read"
            f" ({type(exc).__name__}); fix MESHFL_COORDINATOR_BROKER_CA_FILE"
        ) from None


def _unavailable(problem: str) -> HTTPException:
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE, f"{problem}; check the broker and retry"
    )


Limit = Annotated[int, Query(ge=1, le=1000, description="at most this many items (1..1000)")]
Offset = Annotated[int, Query(ge=0, le=2**31, description="skip this many items first")]


def _bound(what: str, least: bool) -> Any:
    side = ">=" if least else "<="
    text = f"only devices reporting {what} {side} this"
    return Query(ge=0, allow_inf_nan=False, description=text)


_TOTAL: Responses = {
    200: {
        "description": "One page of matching devices",
        "headers": {
            "X-Total-Count": {
                "description": "How many devices match in all pages",
                "schema": {"type": "integer"},
            }
        },
    }
}


@router.get("", response_model=list[DevicePublic], responses=_TOTAL)
@router.get(
    "/profiles",
    response_model=list[DevicePublic],
    responses=_TOTAL,
    deprecated=True,
    summary="List Devices (older alias of GET /devices)",
)
def list_devices(
    _: ReadDep,
    session: SessionDep,
    settings: SettingsDep,
    now: NowDep,
    presence: PresenceDep,
    response: Response,
    limit: Limit = 100,
    offset: Offset = 0,
    tag: Annotated[list[str] | None, Query(description="only devices with every tag")] = None,
    state: Annotated[DeviceState | None, Query(description="only devices in this state")] = None,
    status_: Annotated[
        Literal["online", "offline"] | None,
        Query(alias="status", description="as each device's online (docs/fleet.md, Online)"),
    ] = None,
    min_cores: Annotated[float | None, _bound("cores", True)] = None,
    max_cores: Annotated[float | None, _bound("cores", False)] = None,
    min_memory_bytes: Annotated[float | None, _bound("memory_bytes", True)] = None,
    max_memory_bytes: Annotated[float | None, _bound("memory_bytes", False)] = None,
    min_train_samples_per_s: Annotated[float | None, _bound("train_samples_per_s", True)] = None,
    min_uplink_bytes_per_s: Annotated[float | None, _bound("uplink_bytes_per_s", True)] = None,
) -> list[DevicePublic]:
    """The fleet's devices with their latest profiles, in enrolment order, filtered.

    Every filter given must hold; a device whose profile lacks a filtered field does not
    match it. ``X-Total-Count`` counts the matches on all pages.
    """
    minimums = {
        "cores": min_cores,
        "memory_bytes": min_memory_bytes,
        "train_samples_per_s": min_train_samples_per_s,
        "uplink_bytes_per_s": min_uplink_bytes_per_s,
    }
    maximums = {"cores": max_cores, "memory_bytes": max_memory_bytes}
    for name, most in maximums.items():
        least = minimums[name]
        if least is not None and most is not None and least > most:
            raise ConfigError(f"min_{name} {least:g} is above max_{name} {most:g}; swap them")
    where = fleet.DeviceFilter(
        tags=tuple(validation.validate_tags(tag or [], "tag")),
        state=state,
        online=None if status_ is None else status_ == "online",
        minimums={k: v for k, v in minimums.items() if v is not None},
        maximums={k: v for k, v in maximums.items() if v is not None},
    )
    found, total = fleet.list_devices(
        session,
        where,
        now=now,
        live_within_s=settings.live_within_s,
        limit=limit,
        offset=offset,
        presence=presence,
    )
    response.headers["X-Total-Count"] = str(total)
    return [reports.device_public(d, now, settings.live_within_s, presence) for d in found]


@router.get("/{device_id}", response_model=DevicePublic)
def get_device(
    device_id: str,
    _: ReadDep,
    session: SessionDep,
    settings: SettingsDep,
    now: NowDep,
    presence: PresenceDep,
) -> DevicePublic:
    """One device (404 once deleted)."""
    device = store.get_device(session, device_id)
    return reports.device_public(device, now, settings.live_within_s, presence)


@router.patch("/{device_id}", response_model=DevicePublic)
def patch_device(
    device_id: str,
    body: DevicePatch,
    _: OperateDep,
    session: SessionDep,
    settings: SettingsDep,
    now: NowDep,
    presence: PresenceDep,
) -> DevicePublic:
    """Replace the device's ``tags`` and/or ``labels`` (those omitted stay as they are).

    Tags and label keys match ``[A-Za-z0-9_.:-]{1,64}``; at most 32 tags and 32 labels;
    values at most 256 printable characters (422 otherwise). Repeated tags are kept once.
    """
    device = fleet.patch(session, store.get_device(session, device_id), body)
    return reports.device_public(device, now, settings.live_within_s, presence)


_REVOKED_CONFLICT: Responses = {409: {"description": "The device is revoked"}}


@router.post("/{device_id}/drain", response_model=DevicePublic, responses=_REVOKED_CONFLICT)
def drain_device(
    device_id: str,
    _: OperateDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
    presence: PresenceDep,
) -> DevicePublic:
    """Drain the device: it finishes the round it is in, then takes no new work.

    It leaves each running job from the next round boundary (a new topology version
    without it) and is neither started in nor admitted to a job until undrained.
    Idempotent; 409 for a revoked device.
    """
    device = fleet.drain(session, store.get_device(session, device_id), now, control)
    return reports.device_public(device, now, settings.live_within_s, presence)


@router.post("/{device_id}/undrain", response_model=DevicePublic, responses=_REVOKED_CONFLICT)
def undrain_device(
    device_id: str,
    _: OperateDep,
    session: SessionDep,
    settings: SettingsDep,
    now: NowDep,
    presence: PresenceDep,
) -> DevicePublic:
    """Make a draining device active again: it may take new jobs (idempotent; 409 if revoked)."""
    device = fleet.undrain(session, store.get_device(session, device_id))
    return reports.device_public(device, now, settings.live_within_s, presence)


@router.post("/{device_id}/revoke", response_model=DevicePublic, responses=_BROKER_DOWN)
def revoke_device(
    device_id: str,
    _: OperateDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    accounts: BrokerAccountsDep,
    now: NowDep,
    presence: PresenceDep,
) -> DevicePublic:
    """Revoke the device: its token gets 401, its broker login is removed, it leaves its jobs.

    Idempotent (``revoked_at`` keeps the first time). A 503 means the broker login could
    not be removed although the device is revoked here: revoke again to retry.
    """
    device = store.get_device(session, device_id)
    try:
        fleet.revoke(session, device, now, control, accounts)
    except ConfigError as exc:
        raise _unavailable(f"device revoked, but its broker login remains ({exc})") from None
    return reports.device_public(device, now, settings.live_within_s, presence)


@router.delete(
    "/{device_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=_BROKER_DOWN,
)
def delete_device(
    device_id: str,
    _: OperateDep,
    session: SessionDep,
    control: ControlDep,
    accounts: BrokerAccountsDep,
    now: NowDep,
) -> Response:
    """Revoke the device, then remove it from every listing for good (404 afterwards).

    A device that never took part in a job is deleted with its profile history; one with
    job history is kept as an anonymous tombstone so that the jobs' records stay whole
    (docs/fleet.md, "Devices").
    """
    device = store.get_device(session, device_id)
    try:
        fleet.delete_device(session, device, now, control, accounts)
    except ConfigError as exc:
        raise _unavailable(f"device revoked, but its broker login remains ({exc})") from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.put("/{device_id}/profile", response_model=DevicePublic)
def put_profile(
    body: CapabilityProfile,
    device: OwnDeviceDep,
    session: SessionDep,
    settings: SettingsDep,
    control: ControlDep,
    now: NowDep,
    presence: PresenceDep,
) -> DevicePublic:
    """Replace the device's capability profile and append it to its history (own token only).

    A participant of a running job whose ``min_battery_percent`` it is now below (and not
    charging) leaves that job: a new topology version without it.
    """
    validation.validate_profile(body)
    store.update_profile(session, device, body, now)
    lifecycle.leave_on_battery(session, device, now, control)
    return reports.device_public(device, now, settings.live_within_s, presence)


@router.get("/{device_id}/profiles", response_model=list[ProfileSample])
def get_profiles(
    device_id: str,
    _: ReadDep,
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

    An idle, active device with no job joins the latest running ``elastic`` job that can
    take it (a new topology version; it starts at ``start_round``).
    """
    store.touch(session, device, now)
    found = lifecycle.current_assignment(session, device, now, settings, control)
    if found is None:
        found = lifecycle.admit(session, device, now, control)
    if found is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    job, row = found
    return reports.assignment(job, row, settings.fleet, lifecycle.peer_keys(session, job))
