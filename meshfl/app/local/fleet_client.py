"""The fleet-management calls of the coordinator's REST API, for ``meshfl fleet``.

:class:`FleetClient` extends :class:`~meshfl.app.local.admin.AdminClient` (jobs) with the
issue-6 resources: devices (list with filters, patch, drain, revoke, delete), enrolment
tokens, API tokens and the fleet topology. It returns the API's JSON as it came (plain
dicts and lists), so ``--json`` can print exactly what the coordinator said.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import httpx

from meshfl.app.local.admin import AdminClient, path_segment
from meshfl.contract import (
    ApiTokenPublic,
    DevicePatch,
    DevicePublic,
    EnrolmentTokenCreated,
    EnrolmentTokenPublic,
    FleetEnrolmentPublic,
    FleetEnrolmentRotated,
    FleetTopology,
    PrivacyStatus,
    TopologySetting,
)
from meshfl.errors import CoordinatorError, CoordinatorUnreachable

__all__ = ["DeviceFilter", "FleetClient", "Page"]

DeviceAction = Literal["drain", "undrain", "revoke"]


@dataclass(frozen=True)
class DeviceFilter:
    """Query of ``GET /devices``; ``None`` (or empty ``tags``) leaves a filter off.

    Attributes
    ----------
    tags : tuple of str
        The device has every one of these tags.
    state : str or None
        ``active``, ``draining`` or ``revoked``.
    status : str or None
        ``online`` (heard from recently) or ``offline``.
    min_cores : int or None
        At least this many CPU cores in the device's latest profile.
    limit, offset : int or None
        Page size (the coordinator's default when ``None``) and items skipped first.

    """

    tags: tuple[str, ...] = ()
    state: str | None = None
    status: str | None = None
    min_cores: int | None = None
    limit: int | None = None
    offset: int | None = None

    def params(self) -> list[tuple[str, str | int]]:
        """The query parameters, ``tag`` repeated once per tag."""
        pairs: list[tuple[str, str | int]] = [("tag", t) for t in self.tags]
        for name in ("state", "status", "min_cores", "limit", "offset"):
            value = getattr(self, name)
            if value is not None:
                pairs.append((name, value))
        return pairs


@dataclass(frozen=True)
class Page:
    """One page of devices and the ``X-Total-Count`` of all pages (``None``: not sent)."""

    items: list[DevicePublic]
    total: int | None


class FleetClient(AdminClient):
    """Operator calls on devices, tokens and the fleet topology (an API or admin token).

    Parameters
    ----------
    url : str
        The coordinator's base URL, e.g. ``http://127.0.0.1:8080``.
    token : str
        An API token (admin, operator or read-only role) or the coordinator's admin token.
    timeout_s : float
        Seconds per request. Default 10.

    Every method raises :class:`~meshfl.errors.CoordinatorError` with the coordinator's
    one-line ``detail`` when it refuses, and :class:`~meshfl.errors.CoordinatorUnreachable`
    (naming the URL and how to point at the right one) when nothing answers.

    """

    def __init__(self, url: str, token: str, timeout_s: float = 10.0) -> None:
        super().__init__(url, token, timeout_s)

    # Devices.

    def list_devices(self, query: DeviceFilter | None = None) -> Page:
        """One page of devices matching ``query``, in enrolment order."""
        response = self._send("GET", "/devices", params=(query or DeviceFilter()).params())
        total = response.headers.get("X-Total-Count")
        return Page(items=response.json(), total=int(total) if total is not None else None)

    def device(self, device_id: str) -> DevicePublic:
        """One device (404 → :class:`CoordinatorError`)."""
        return cast(DevicePublic, self._call("GET", f"/devices/{path_segment(device_id)}"))

    def device_privacy(self, device_id: str) -> PrivacyStatus:
        """ε the device spent over all its jobs (``GET /devices/{id}/privacy``)."""
        return cast(PrivacyStatus, self._call("GET", f"/devices/{path_segment(device_id)}/privacy"))

    def patch_device(
        self,
        device_id: str,
        tags: Sequence[str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> DevicePublic:
        """Replace the device's tags and/or labels (``None``: leave that field as it is)."""
        body = DevicePatch()
        if tags is not None:
            body["tags"] = list(tags)
        if labels is not None:
            body["labels"] = dict(labels)
        return cast(
            DevicePublic, self._call("PATCH", f"/devices/{path_segment(device_id)}", json=body)
        )

    def device_action(self, device_id: str, action: DeviceAction) -> DevicePublic | None:
        """Drain, undrain or revoke a device; the device as it is now (``None`` on 204)."""
        return cast(
            DevicePublic | None, self._call("POST", f"/devices/{path_segment(device_id)}/{action}")
        )

    def delete_device(self, device_id: str) -> None:
        """Remove the device from the fleet for good."""
        self._call("DELETE", f"/devices/{path_segment(device_id)}")

    # Enrolment tokens.

    def enrolment_tokens(self) -> list[EnrolmentTokenPublic]:
        """Every enrolment token (no secrets): uses left, expiry, status."""
        return cast(list[EnrolmentTokenPublic], self._call("GET", "/enrolment-tokens"))

    def create_enrolment_token(
        self,
        uses: int | None = None,
        ttl_s: float | None = None,
        tags: Sequence[str] = (),
        name: str | None = None,
    ) -> EnrolmentTokenCreated:
        """Create an enrolment token; the answer carries its secret, shown only this once.

        ``None`` leaves a field to the coordinator's default (1 use, 3600 s).
        """
        body: dict[str, Any] = {"tags": list(tags)} if tags else {}
        for key, value in (("uses", uses), ("ttl_s", ttl_s), ("name", name)):
            if value is not None:
                body[key] = value
        return cast(EnrolmentTokenCreated, self._call("POST", "/enrolment-tokens", json=body))

    def revoke_enrolment_token(self, token_id: str) -> None:
        """Revoke an enrolment token (no device can enrol with it any more)."""
        self._call("DELETE", f"/enrolment-tokens/{path_segment(token_id)}")

    def fleet_token(self) -> FleetEnrolmentPublic:
        """The fleet's shared enrolment token: status, uses left, expiry (no secret)."""
        return cast(FleetEnrolmentPublic, self._call("GET", "/enrolment-tokens/fleet"))

    def rotate_fleet_token(
        self, uses: int | None = None, ttl_s: float | None = None
    ) -> FleetEnrolmentRotated:
        """A new fleet token (the old secret is refused); its secret is shown only here.

        ``None``: unlimited uses, no expiry.
        """
        body = {k: v for k, v in (("uses", uses), ("ttl_s", ttl_s)) if v is not None}
        reply = self._call("POST", "/enrolment-tokens/fleet/rotate", json=body)
        return cast(FleetEnrolmentRotated, reply)

    def disable_fleet_token(self) -> FleetEnrolmentPublic:
        """Refuse the fleet token from now on (until the next rotation)."""
        return cast(FleetEnrolmentPublic, self._call("POST", "/enrolment-tokens/fleet/disable"))

    # API tokens (admin role).

    def api_tokens(self) -> list[ApiTokenPublic]:
        """Every API token (no secrets): role, name, expiry, status."""
        return cast(list[ApiTokenPublic], self._call("GET", "/tokens"))

    def revoke_api_token(self, token_id: str) -> None:
        """Revoke an API token (its next request is refused with 401)."""
        self._call("DELETE", f"/tokens/{path_segment(token_id)}")

    # Fleet topology.

    def fleet_topology(self) -> FleetTopology:
        """The fleet's default topology and the graph it yields over the live devices."""
        return cast(FleetTopology, self._call("GET", "/topology"))

    def set_fleet_topology(self, setting: TopologySetting) -> FleetTopology:
        """Set the fleet's default topology (kind and parameters, or a custom graph)."""
        return cast(FleetTopology, self._call("PUT", "/topology", json=setting))

    def _send(self, method: str, path: str, json: Any = None, params: Any = None) -> httpx.Response:
        try:
            return super()._send(method, path, json, params)
        except CoordinatorUnreachable as exc:
            raise CoordinatorUnreachable(
                f"{exc}; start it with `meshfl coordinator serve` or point at it with"
                " --coordinator URL (or MESHFL_COORDINATOR_URL)"
            ) from None
        except CoordinatorError as exc:
            if exc.status == 401:
                raise CoordinatorError(
                    f"{exc} (pass a valid API token with --token or MESHFL_API_TOKEN)",
                    status=exc.status,
                ) from None
            raise
