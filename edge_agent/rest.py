"""The agent's REST client for the coordinator (API v1 of :mod:`meshfl.contract`).

The one place where the agent talks HTTP: httpx's transport errors become
:class:`~meshfl.errors.CoordinatorUnreachable`, a refusal (4xx) becomes
:class:`~meshfl.errors.CoordinatorError` carrying the coordinator's one-line reason.
Transient failures (connection errors, 5xx) are retried with jittered exponential
backoff (0.2 s doubling to :data:`MAX_RETRY_DELAY_S`, each ×0.5–1.5) up to ``retry_s``
seconds; a 429 (rate limit) is retried after its ``Retry-After`` while that fits in
``retry_s``; any other refusal is never retried. A 401 whose ``WWW-Authenticate`` says
``device revoked`` (RFC 6750 ``invalid_token``) becomes :class:`DeviceRevoked`: the
operator revoked this device, and the agent stops.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx

from meshfl.contract import (
    API_PREFIX,
    Assignment,
    CapabilityProfile,
    Declaration,
    DeviceDecline,
    DeviceDone,
    EnrolRequest,
    EnrolResponse,
    KeyBundle,
    ModelArtifact,
    PrivacySpend,
    PrivacyStatus,
    RoundMetrics,
    SecAggDirectory,
    SignedDeclaration,
    enrol_proof_message,
)
from meshfl.errors import CoordinatorError, CoordinatorUnreachable

__all__ = ["Consensus", "CoordinatorClient", "DeviceRevoked"]

log = logging.getLogger("meshfl.agent.rest")

MAX_RETRY_DELAY_S = 1.0
"""The longest pause between two tries, before jitter (seconds). Short: a round report
waits on it, and a device that comes back seconds after a restarted coordinator is
missed by its neighbours (``meshfl local --chaos coordinator=...``)."""


class DeviceRevoked(CoordinatorError):
    """The coordinator revoked this device: its token no longer works (exit code 3).

    Retrying cannot help; the device needs a new identity (enrol again with a new
    enrolment token). The distinct exit code lets a supervisor stop restarting it
    (systemd ``RestartPreventExitStatus=3``).
    """

    exit_code = 3


@dataclass(frozen=True)
class Consensus:
    """A downloaded consensus model: its job, the sha256 the coordinator announced, bytes."""

    job_id: str
    sha256: str
    data: bytes


class CoordinatorClient:
    """A device's client of the coordinator.

    Parameters
    ----------
    url
        Base URL of the coordinator, e.g. ``https://10.0.0.5:8443``; ``http://`` only to
        a loopback host unless ``insecure_http`` (:func:`meshfl.coordinator_url.http_verify`).
    retry_s
        How long (seconds, default 30) transient failures are retried before
        :class:`~meshfl.errors.CoordinatorUnreachable` is raised.
    transport
        An httpx transport for tests (``httpx.MockTransport`` or an ASGI transport); the
        caller then owns the connection, and the URL policy is not applied.
    ca_file
        PEM file of the CA that signed the coordinator's certificate (``--coordinator-ca``);
        ``None``: the system's CA store.
    insecure_http
        Allow plain ``http://`` to a host that is not loopback (``--insecure-http``).

    Raises
    ------
    meshfl.errors.ConfigError
        A URL the policy refuses, an invalid URL, or an unusable CA file.

    """

    def __init__(
        self,
        url: str,
        *,
        retry_s: float = 30.0,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        ca_file: Path | None = None,
        insecure_http: bool = False,
    ) -> None:
        from meshfl.coordinator_url import http_verify
        from meshfl.errors import ConfigError

        # An injected transport (tests) is the caller's connection: httpx ignores verify.
        verify = (
            http_verify(url, ca_file=ca_file, insecure_http=insecure_http)
            if transport is None
            else True
        )
        self.url = url.rstrip("/")
        self.retry_s = retry_s
        self.device_token: str | None = None
        try:
            self._http = httpx.Client(
                base_url=self.url + API_PREFIX, timeout=timeout_s, transport=transport,
                verify=verify,
            )  # fmt: skip
        except httpx.InvalidURL as exc:
            raise ConfigError(f"coordinator URL {url!r} is invalid ({exc})") from None

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    # -- requests ---------------------------------------------------------------------

    def enrol(
        self,
        token: str,
        name: str,
        profile: CapabilityProfile,
        identity_key: str | None = None,
        sign: Callable[[bytes], bytes] | None = None,
    ) -> EnrolResponse:
        """Enrol with the fleet's enrolment token; keeps the device token for later calls.

        ``identity_key`` is the device's Ed25519 public key (raw 32 bytes, base64) that
        the coordinator checks its secure-aggregation key bundles against. ``sign`` (the
        identity key's signer) proves the device holds it
        (:func:`meshfl.contract.enrol_proof_message`): the coordinator needs that proof
        to let a device that enrolled before enrol again, and retires its old identity.
        """
        body: EnrolRequest = {"token": token, "name": name, "profile": profile}
        if identity_key is not None:
            body["identity_key"] = identity_key
            if sign is not None:
                proof = sign(enrol_proof_message(token, name, identity_key))
                body["identity_proof"] = base64.b64encode(proof).decode()
        reply = cast(EnrolResponse, self._request("POST", "/devices/enrol", json=body))
        self.device_token = reply["device_token"]
        return reply

    def put_profile(self, device_id: str, profile: CapabilityProfile) -> None:
        """Report a (re)measured capability profile."""
        self._request("PUT", f"/devices/{device_id}/profile", json=profile)

    def assignment(self, device_id: str) -> Assignment | None:
        """The device's current job assignment, or ``None`` when there is none."""
        reply = self._request("GET", f"/devices/{device_id}/assignment")
        return None if reply is None else cast(Assignment, reply)

    def post_metrics(self, job_id: str, metrics: RoundMetrics) -> None:
        """Report one round's metrics (idempotent: a retried post is ignored)."""
        self._request("POST", f"/jobs/{job_id}/metrics", json=metrics)

    def post_metrics_batch(self, job_id: str, batch: Sequence[RoundMetrics]) -> None:
        """Report several rounds' metrics in order, one request (at most 64; idempotent)."""
        self._request("POST", f"/jobs/{job_id}/metrics/batch", json=list(batch))

    def post_decline(self, job_id: str, reason: str) -> None:
        """Tell the coordinator this device cannot take part in the job, and why."""
        body: DeviceDecline = {"reason": reason}
        self._request("POST", f"/jobs/{job_id}/decline", json=body)

    def post_done(self, job_id: str, done: DeviceDone) -> None:
        """Report that this device finished the job."""
        self._request("POST", f"/jobs/{job_id}/done", json=done)

    def put_model(self, job_id: str, device_id: str, data: bytes) -> ModelArtifact:
        """Upload this device's final ONNX model of a ``publish_model`` job.

        ``data`` is the ``.onnx`` file's bytes; its SHA-256 goes in ``X-Content-SHA256``
        so the coordinator refuses a corrupted upload.
        """
        response = self._send(
            "PUT",
            f"/jobs/{job_id}/devices/{device_id}/model",
            content=data,
            headers={
                "Content-Type": "application/octet-stream",
                "X-Content-SHA256": hashlib.sha256(data).hexdigest(),
            },
        )
        return cast(ModelArtifact, response.json())

    def get_consensus(self, job_id: str = "latest", etag: str | None = None) -> Consensus | None:
        """Download a job's consensus model (``"latest"``: the latest completed job's).

        ``etag`` (the sha256 of the model held) makes it a conditional request: ``None``
        comes back when the coordinator's consensus is still that one (HTTP 304).
        Raises :class:`~meshfl.errors.CoordinatorError` on a refusal (404: no consensus
        yet) and :class:`~meshfl.errors.CoordinatorUnreachable` after ``retry_s``.
        """
        headers = {} if etag is None else {"If-None-Match": f'"{etag}"'}
        response = self._send("GET", f"/jobs/{job_id}/artifacts/consensus.onnx", headers=headers)
        if response.status_code == 304:
            return None
        return Consensus(
            job_id=response.headers.get("x-meshfl-job-id", job_id),
            sha256=response.headers.get("x-content-sha256", "").lower(),
            data=response.content,
        )

    # -- privacy (issue 5) ----------------------------------------------------------------

    def put_key_bundle(self, job_id: str, device_id: str, bundle: KeyBundle) -> None:
        """Publish this device's signed per-job public keys in the coordinator's directory."""
        self._request("PUT", f"/jobs/{job_id}/secagg/keys/{device_id}", json=bundle)

    def get_directory(self, job_id: str) -> SecAggDirectory:
        """The job's key directory (``complete`` once every participant published)."""
        return cast(SecAggDirectory, self._request("GET", f"/jobs/{job_id}/secagg/directory"))

    def post_declaration(self, job_id: str, declaration: Declaration) -> SignedDeclaration:
        """Have the coordinator sign this aggregator's survivor set of one round."""
        return cast(
            SignedDeclaration,
            self._request("POST", f"/jobs/{job_id}/secagg/declarations", json=declaration),
        )

    def spend(self, job_id: str, device_id: str, spend: PrivacySpend) -> PrivacyStatus:
        """Record a round's DP releases before they happen.

        Raises :class:`~meshfl.errors.CoordinatorError` with status 409 when they would
        push the device past its ε budget (nothing is recorded then).
        """
        return cast(
            PrivacyStatus,
            self._request("POST", f"/jobs/{job_id}/privacy/{device_id}/spend", json=spend),
        )

    # -- plumbing ---------------------------------------------------------------------

    def _request(self, method: str, path: str, json: Any = None) -> Any:
        response = self._send(method, path, json=json)
        return None if response.status_code == 204 or not response.content else response.json()

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request, retrying transient failures; return a 2xx or 304 response."""
        headers = dict(headers or {})
        if self.device_token is not None:
            headers["Authorization"] = f"Bearer {self.device_token}"
        deadline = time.monotonic() + self.retry_s
        delay = 0.2
        while True:
            try:
                response = self._http.request(
                    method, path, json=json, content=content, headers=headers
                )
            except httpx.TransportError as exc:
                from meshfl.coordinator_url import certificate_problem, untrusted_message

                untrusted = certificate_problem(exc)
                if untrusted is not None:  # retrying cannot help, and must not be silent
                    from meshfl.errors import ConfigError

                    raise ConfigError(untrusted_message(self.url, untrusted)) from None
                problem = f"cannot reach the coordinator at {self.url} ({type(exc).__name__})"
            else:
                if response.is_success or response.status_code == 304:
                    return response
                if _revoked(response):
                    raise DeviceRevoked(
                        f"stopping: {_detail(response)}", status=response.status_code
                    )
                if response.status_code == 429:  # rate limited: wait as told, then retry
                    wait_s = _retry_after_s(response)
                    if time.monotonic() + wait_s < deadline:
                        log.warning("coordinator rate limit reached; retrying in %.0f s", wait_s)
                        time.sleep(wait_s)
                        continue
                if response.status_code < 500:
                    raise CoordinatorError(
                        f"coordinator refused {method} {path}: {_detail(response)}",
                        status=response.status_code,
                    )
                problem = f"coordinator error {response.status_code}: {_detail(response)}"
            if time.monotonic() >= deadline:
                raise CoordinatorUnreachable(
                    f"{problem}; check the URL given to --coordinator and that"
                    " `meshfl coordinator serve` is running"
                )
            log.warning("%s; retrying in %.1f s", problem, delay)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, MAX_RETRY_DELAY_S)


def _retry_after_s(response: httpx.Response) -> float:
    """Seconds to wait before retrying a 429 (``Retry-After`` in seconds; 1 s if absent)."""
    try:
        return min(max(float(response.headers.get("retry-after", "1")), 0.1), 60.0)
    except ValueError:
        return 1.0


def _revoked(response: httpx.Response) -> bool:
    """Whether the coordinator refused this device's token because it was revoked."""
    challenge = response.headers.get("www-authenticate", "")
    return response.status_code == 401 and "device revoked" in challenge


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        return detail if isinstance(detail, str) else str(detail)[:300]
    return str(body)[:200]
