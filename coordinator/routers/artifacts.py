"""Model artifacts of a job: device uploads, the listing, and the consensus model.

``PUT /jobs/{job_id}/devices/{device_id}/model`` streams the body to a temporary file
(never into memory, never into the database), bounded by ``max_model_bytes`` and checked
against the ``X-Content-SHA256`` header. :mod:`coordinator.artifacts` keeps the files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Request, Response, status
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from coordinator import store
from coordinator.artifacts import CONSENSUS, TooLarge
from coordinator.consensus import ConsensusError
from coordinator.db import Device, Job, ModelArtifact
from coordinator.deps import (
    AdminOrFleetDeviceDep,
    ArtifactsDep,
    NowDep,
    OwnDeviceDep,
    ReadDep,
    SessionDep,
)
from coordinator.errors import Conflict, NotFound
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.contract import JobArtifacts
from meshfl.contract import ModelArtifact as ModelArtifactBody

__all__ = ["UPLOAD_PATH", "router"]

router = APIRouter(prefix="/jobs", tags=["artifacts"])

UPLOAD_PATH = re.compile(r"/api/v1/jobs/[^/]+/devices/[^/]+/model")
"""Paths whose body the app-wide 1 MiB limit skips (the route bounds it itself)."""

_SHA256 = re.compile(r"[0-9a-f]{64}")
_ONNX = "application/octet-stream"


def _check_upload(session: Session, job_id: str, device: Device, now: float) -> Job:
    job = store.get_job(session, job_id)
    row = store.participation(session, job, device)
    if PrivacyOptions.from_spec(job.spec).private:  # its models must not leave the devices
        raise Conflict(
            f"job {job_id!r} is private (DP or secure aggregation): a device's un-noised"
            " model must not leave it, so the coordinator takes no model upload"
        )
    if not job.spec.get("publish_model"):
        raise Conflict(
            f"job {job_id!r} was not created with publish_model; its models stay on the"
            " devices (create the job with `meshfl job start --publish-model`)"
        )
    if job.status == "created":
        raise Conflict(f"job {job_id!r} has not started; upload the model once training ends")
    row.last_activity, device.last_seen = now, now
    session.commit()
    return job


@router.put("/{job_id}/devices/{device_id}/model", response_model=ModelArtifactBody)
async def put_model(
    job_id: str,
    request: Request,
    device: OwnDeviceDep,
    session: SessionDep,
    artifacts: ArtifactsDep,
    now: NowDep,
    x_content_sha256: Annotated[str | None, Header()] = None,
) -> ModelArtifactBody:
    """Upload this device's final ONNX model of a ``publish_model`` job (replaces an earlier one).

    The body is the ``.onnx`` file (``application/octet-stream``); ``X-Content-SHA256`` its
    hex SHA-256. 400: header missing or the digest does not match the body; 413: over
    ``max_model_bytes``; 422: not a self-contained ONNX model; 409: the job did not opt
    in or has not started; 403: another device's path, or a device not in the job.
    """
    expected = (x_content_sha256 or "").strip().lower()
    if not _SHA256.fullmatch(expected):
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            "send the model's hex SHA-256 in the X-Content-SHA256 header",
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > artifacts.max_bytes:
        raise HTTPException(413, str(TooLarge(artifacts.max_bytes)))
    job = await run_in_threadpool(_check_upload, session, job_id, device, now)
    upload = artifacts.begin(job.id)
    try:
        async for chunk in request.stream():
            upload.write(chunk)
    except TooLarge as exc:
        upload.discard()
        raise HTTPException(413, str(exc)) from None
    except BaseException:
        upload.discard()
        raise
    if upload.sha256 != expected:
        upload.discard()
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            f"the body's SHA-256 is {upload.sha256}, not the X-Content-SHA256 {expected};"
            " the upload was corrupted, send it again",
        )
    try:
        return await run_in_threadpool(
            artifacts.store_device_model, session, job, device.id, upload, now
        )
    except ConsensusError as exc:
        raise HTTPException(422, str(exc)) from None


@router.get("/{job_id}/artifacts", response_model=JobArtifacts)
def list_artifacts(
    job_id: str, _: ReadDep, session: SessionDep, artifacts: ArtifactsDep, now: NowDep
) -> JobArtifacts:
    """The job's uploaded device models and its consensus model (built on first request).

    A consensus that cannot be built (models of different graphs) has ``sha256`` null and
    its ``error`` says why.
    """
    return artifacts.listing(session, store.get_job(session, job_id), now)


@router.get(
    "/{job_id}/artifacts/consensus.onnx",
    response_class=Response,
    responses={200: {"content": {_ONNX: {}}}, 304: {"description": "unchanged (ETag)"}},
)
def get_consensus(
    job_id: str,
    _: AdminOrFleetDeviceDep,
    session: SessionDep,
    artifacts: ArtifactsDep,
    now: NowDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The consensus model of a job, or of the latest completed one (``job_id`` ``latest``).

    ``ETag`` is the quoted sha256 (also in ``X-Content-SHA256``); a matching
    ``If-None-Match`` gets 304. ``X-Meshfl-Job-Id`` names the job. 404: no uploads (or, for
    ``latest``, no completed job with a consensus); 409: the models cannot be averaged.
    """
    if job_id == "latest":
        job, row = artifacts.latest_consensus(session, store.list_jobs(session), now)
    else:
        job = store.get_job(session, job_id)
        row = artifacts.require_consensus(session, job, now)
    return _file(artifacts.path(job.id, CONSENSUS), job, row, if_none_match)


@router.get(
    "/{job_id}/artifacts/{device_id}.onnx",
    response_class=Response,
    responses={200: {"content": {_ONNX: {}}}, 304: {"description": "unchanged (ETag)"}},
)
def get_device_model(
    job_id: str,
    device_id: str,
    _: ReadDep,
    session: SessionDep,
    artifacts: ArtifactsDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """One device's uploaded model (ETag and 304 as for the consensus)."""
    job = store.get_job(session, job_id)
    row = session.get(ModelArtifact, (job.id, device_id))
    if row is None or row.name == CONSENSUS or row.sha256 is None:
        raise NotFound(
            f"device {device_id!r} uploaded no model for job {job_id!r}; list them with"
            f" GET /api/v1/jobs/{job_id}/artifacts"
        )
    return _file(artifacts.path(job.id, row.name), job, row, if_none_match)


def _file(path: Path, job: Job, row: ModelArtifact, if_none_match: str | None) -> Response:
    etag = f'"{row.sha256}"'
    headers = {"ETag": etag, "X-Content-SHA256": str(row.sha256), "X-Meshfl-Job-Id": job.id}
    tags = {t.strip().removeprefix("W/") for t in (if_none_match or "").split(",")}
    if etag in tags or "*" in tags:
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(
            f"the file of {row.name}.onnx of job {job.id!r} is missing from the artifacts"
            " directory; upload it again"
        ) from None
    return Response(content=data, media_type=_ONNX, headers=headers)
