"""A small operator client of the coordinator's REST API (admin token)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import httpx
from typing_extensions import Self

from meshfl.contract import (
    API_PREFIX,
    ApiTokenCreated,
    DevicePublic,
    DeviceRoundMetrics,
    DeviceRoundReport,
    JobArtifacts,
    JobLedger,
    JobPublic,
    JobSpec,
    RoundSummary,
)
from meshfl.coordinator_url import certificate_problem, http_verify, untrusted_message
from meshfl.errors import ConfigError, CoordinatorError, CoordinatorUnreachable

__all__ = ["AdminClient", "settled_rounds"]

_PAGE = 1000
"""Items per page of a list the coordinator pages (its largest ``limit``)."""


def settled_rounds(
    rounds: list[RoundSummary], alive: int, lag: int | None = None
) -> list[RoundSummary]:
    """The leading rounds that every live device reported.

    A round shown before its last report arrives would understate its bytes and
    misstate its accuracy; ``alive`` is the number of devices still expected to report.
    With ``lag``, a round that ``lag`` later rounds have overtaken counts as settled
    too (for an operator who cannot tell a hung device from a slow one).
    """
    last = rounds[-1]["round"] if rounds else 0
    settled = []
    for r in rounds:
        overtaken = lag is not None and r["round"] <= last - lag
        if r["devices_reporting"] < alive and not overtaken:
            break
        settled.append(r)
    return settled


def path_segment(value: str) -> str:
    """``value`` as one URL path segment: a '/' or '..' in an id cannot reach another route."""
    return quote(value, safe="")


BUSY_RETRIES = 5
"""Times an operator request answered 503 (database busy) is sent again."""


def _retry_after_s(response: httpx.Response) -> float:
    """The 503's ``Retry-After`` in seconds, within 0.1..10 (1 s if absent or unreadable)."""
    try:
        return min(max(float(response.headers.get("retry-after", "1")), 0.1), 10.0)
    except ValueError:
        return 1.0


class AdminClient:
    """Operator calls: list devices, create/start/stop jobs, read rounds."""

    def __init__(
        self,
        url: str,
        admin_token: str,
        timeout_s: float = 10.0,
        *,
        ca_file: Path | None = None,
        insecure_http: bool | None = None,
    ) -> None:
        """Connect to ``url`` (:func:`meshfl.coordinator_url.http_verify`'s policy).

        ``ca_file``/``insecure_http`` ``None``: from ``MESHFL_COORDINATOR_CA`` and
        ``MESHFL_INSECURE_HTTP`` (``1``/``true``), which ``meshfl fleet`` and ``meshfl
        job``'s ``--coordinator-ca``/``--insecure-http`` set.
        """
        self.url = url.rstrip("/")
        if ca_file is None and os.environ.get("MESHFL_COORDINATOR_CA"):
            ca_file = Path(os.environ["MESHFL_COORDINATOR_CA"])
        if insecure_http is None:
            insecure_http = os.environ.get("MESHFL_INSECURE_HTTP", "").lower() in ("1", "true")
        try:
            if not self.url.startswith(("http://", "https://")):
                raise httpx.InvalidURL("no http:// or https:// scheme")
            verify = http_verify(self.url, ca_file=ca_file, insecure_http=insecure_http)
            self._http = httpx.Client(
                base_url=self.url + API_PREFIX,
                timeout=timeout_s,
                headers={"Authorization": f"Bearer {admin_token}"},
                verify=verify,
            )
            self._http.build_request("GET", "/")  # a malformed host fails here, not later
        except httpx.InvalidURL as exc:
            raise ConfigError(
                f"coordinator URL {url!r} is not valid ({exc}); give e.g."
                " --coordinator http://127.0.0.1:8080"
            ) from None

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def devices(self) -> list[DevicePublic]:
        """Every enrolled device (``GET /devices`` page by page, 1,000 a page)."""
        found: list[DevicePublic] = []
        while True:
            params = {"limit": _PAGE, "offset": len(found)}
            page = cast(list[DevicePublic], self._call("GET", "/devices", params=params))
            found += page
            if len(page) < _PAGE:
                return found

    def create_job(self, spec: JobSpec) -> JobPublic:
        """Create a job (status ``created``)."""
        return cast(JobPublic, self._call("POST", "/jobs", json=spec))

    def start_job(self, job_id: str) -> JobPublic:
        """Start a job: pick devices, build the topology, assign work."""
        return cast(JobPublic, self._call("POST", f"/jobs/{path_segment(job_id)}/start"))

    def stop_job(self, job_id: str) -> JobPublic:
        """Stop a running job."""
        return cast(JobPublic, self._call("POST", f"/jobs/{path_segment(job_id)}/stop"))

    def pause_job(self, job_id: str) -> JobPublic:
        """Pause a running job: devices finish their round and wait."""
        return cast(JobPublic, self._call("POST", f"/jobs/{path_segment(job_id)}/pause"))

    def resume_job(self, job_id: str) -> JobPublic:
        """Resume a paused job from its next round."""
        return cast(JobPublic, self._call("POST", f"/jobs/{path_segment(job_id)}/resume"))

    def jobs(self) -> list[JobPublic]:
        """Every job, oldest first."""
        return cast(list[JobPublic], self._call("GET", "/jobs"))

    def job(self, job_id: str) -> JobPublic:
        """A job's status and per-device progress."""
        return cast(JobPublic, self._call("GET", f"/jobs/{path_segment(job_id)}"))

    def rounds(self, job_id: str, since: int = 1) -> list[RoundSummary]:
        """Per-round aggregates of a job, from round ``since`` on."""
        path = f"/jobs/{path_segment(job_id)}/rounds" + (f"?since={since}" if since > 1 else "")
        return cast(list[RoundSummary], self._call("GET", path))

    def reports(self, job_id: str) -> list[DeviceRoundReport]:
        """Every per-device round report of the job, in arrival order."""
        return cast(
            list[DeviceRoundReport], self._call("GET", f"/jobs/{path_segment(job_id)}/reports")
        )

    def device_metrics(self, job_id: str, device_id: str) -> list[DeviceRoundMetrics]:
        """Every round report of one participant, in round order (all pages)."""
        out: list[DeviceRoundMetrics] = []
        while True:
            page = cast(
                list[DeviceRoundMetrics],
                self._call(
                    "GET",
                    f"/jobs/{path_segment(job_id)}/devices/{path_segment(device_id)}/metrics",
                    params={"limit": 1000, "offset": len(out)},
                ),
            )
            out += page
            if len(page) < 1000:
                return out

    def ledger(self, job_id: str) -> JobLedger:
        """The job's delivery ledger (docs/reliability.md)."""
        return cast(JobLedger, self._call("GET", f"/jobs/{path_segment(job_id)}/ledger"))

    def topology(self, job_id: str) -> dict[str, Any]:
        """The job's graph, mixing matrix and spectral gap."""
        return cast(dict[str, Any], self._call("GET", f"/jobs/{path_segment(job_id)}/topology"))

    def artifacts(self, job_id: str) -> JobArtifacts:
        """The job's uploaded device models and consensus model."""
        return cast(JobArtifacts, self._call("GET", f"/jobs/{path_segment(job_id)}/artifacts"))

    def create_api_token(
        self, role: str, name: str | None = None, ttl_s: float | None = None
    ) -> ApiTokenCreated:
        """Create an API token of ``role``; the answer carries its secret, shown only once.

        Needs the admin role. ``ttl_s`` seconds of life; ``None``: it never expires.
        """
        body: dict[str, Any] = {"role": role}
        if name is not None:
            body["name"] = name
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return cast(ApiTokenCreated, self._call("POST", "/tokens", json=body))

    def download(self, path: str) -> bytes:
        """The bytes of a GET under the API prefix (a model file)."""
        response = self._send("GET", path)
        return response.content

    def _call(self, method: str, path: str, json: Any = None, params: Any = None) -> Any:
        response = self._send(method, path, json, params)
        return None if response.status_code == 204 else response.json()

    def _send(self, method: str, path: str, json: Any = None, params: Any = None) -> httpx.Response:
        """Send one request; raise on a refusal, the coordinator's one-line reason kept.

        A 503 (the coordinator's database was busy; nothing was written) is sent again
        after its ``Retry-After``, up to :data:`BUSY_RETRIES` times.
        """
        for attempt in range(BUSY_RETRIES + 1):
            try:
                response = self._http.request(method, path, json=json, params=params)
            except httpx.TransportError as exc:
                untrusted = certificate_problem(exc)
                if untrusted is not None:
                    raise ConfigError(untrusted_message(self.url, untrusted)) from None
                raise CoordinatorUnreachable(
                    f"cannot reach the coordinator at {self.url} ({type(exc).__name__});"
                    " check that it runs and that --coordinator names it"
                ) from None
            if response.status_code != 503 or attempt == BUSY_RETRIES:
                break
            time.sleep(_retry_after_s(response))
        if not response.is_success:
            try:
                body = response.json()
            except ValueError:
                body = None
            detail = body.get("detail", response.text) if isinstance(body, dict) else response.text
            detail = " ".join(str(detail).split()) or response.reason_phrase
            raise CoordinatorError(
                f"the coordinator refused ({response.status_code}): {detail}",
                status=response.status_code,
            )
        return response
