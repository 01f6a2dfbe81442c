"""Privacy: the secure-aggregation key directory, signed declarations, DP budgets.

Secure aggregation (:mod:`coordinator.secagg`): participants upload signed key bundles,
read the directory, and aggregators post their round declarations for the coordinator to
sign. Differential privacy (:mod:`coordinator.budget`): a device records each round's
releases before making them and is refused (409) once its ε budget would be crossed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response, status

from coordinator import budget, secagg, store
from coordinator.deps import (
    AdminOrFleetDeviceDep,
    DeviceDep,
    NowDep,
    OwnDeviceDep,
    ReadDep,
    SessionDep,
    SigningKeyDep,
)
from meshfl.contract import (
    Declaration,
    KeyBundle,
    PrivacySpend,
    PrivacyStatus,
    SecAggDirectory,
    SignedDeclaration,
)

__all__ = ["router"]

router = APIRouter(tags=["privacy"])


@router.put(
    "/jobs/{job_id}/secagg/keys/{device_id}",
    status_code=status.HTTP_201_CREATED,
    responses={204: {"description": "The same bundle was already stored"}},
)
def put_keys(
    job_id: str, body: KeyBundle, device: OwnDeviceDep, session: SessionDep, now: NowDep
) -> Response:
    """Publish the device's signed key bundle for a running secure job (own token only).

    201: stored; 204: the same bundle was already stored; 409: a different one was, or the
    job is not a running secure job; 422: a malformed bundle or a signature that does not
    verify with the device's identity key.
    """
    job = store.get_job(session, job_id)
    created = secagg.put_bundle(session, job, device, body, now)
    return Response(status_code=status.HTTP_201_CREATED if created else status.HTTP_204_NO_CONTENT)


@router.get("/jobs/{job_id}/secagg/directory", response_model=SecAggDirectory)
def get_directory(
    job_id: str, _: AdminOrFleetDeviceDep, session: SessionDep, key: SigningKeyDep
) -> SecAggDirectory:
    """The job's key directory: bundles, identity keys, neighbourhoods, the coordinator key."""
    job = store.get_job(session, job_id)
    return secagg.directory(session, job, secagg.public_key_b64(key))


@router.post("/jobs/{job_id}/secagg/declarations", response_model=SignedDeclaration)
def post_declaration(
    job_id: str,
    body: Declaration,
    device: DeviceDep,
    session: SessionDep,
    key: SigningKeyDep,
    now: NowDep,
) -> SignedDeclaration:
    """Sign an aggregator's survivors and dropouts of a round; the first one stands.

    The caller must be the aggregator. The same declaration again returns the same
    signed one; a different one is 409.
    """
    job = store.get_job(session, job_id)
    return secagg.declare(session, job, device, body, key, now)


@router.post("/jobs/{job_id}/privacy/{device_id}/spend", response_model=PrivacyStatus)
def post_spend(
    job_id: str, body: PrivacySpend, device: OwnDeviceDep, session: SessionDep, now: NowDep
) -> PrivacyStatus:
    """Record a round's DP releases before the device makes them (own token only).

    Returns the device's ε over all its jobs at this job's δ. 409 "privacy budget
    exhausted" when the releases would cross the job's ``dp_epsilon_budget`` (nothing is
    recorded: the device must stop); the same round again is a no-op.
    """
    job = store.get_job(session, job_id)
    return budget.record_spend(session, job, device, body, now)


@router.get("/devices/{device_id}/privacy", response_model=PrivacyStatus)
def get_privacy(
    device_id: str,
    _: ReadDep,
    session: SessionDep,
    delta: Annotated[
        float | None,
        Query(gt=0, lt=1, description="δ to report ε at (default: its jobs' smallest dp_delta)"),
    ] = None,
    unit: Annotated[
        Literal["device", "record"],
        Query(description="the unit of privacy: the device's data, or each of its records"),
    ] = "device",
) -> PrivacyStatus:
    """ε the device spent over all its jobs, for the unit asked (RDP accountant)."""
    device = store.get_device(session, device_id)
    return budget.device_status(session, device, delta, unit)
