"""Device management: the filtered fleet view, tags and labels, drain, revoke, delete.

A device's ``state`` is ``active`` (takes work), ``draining`` (finishes the round it is
in, then takes no new work), ``revoked`` (its device token and broker login no longer
work) or ``deleted`` (a tombstone: gone from every listing and look-up, kept only so
that the job history that names it stays whole). Every transition is idempotent.

Draining and revoking take the device out of each running job it is still working on
by the battery path's departure (:func:`coordinator.lifecycle.leave_jobs`): a new
topology version without it from the next round boundary. Functions here commit what
they write and raise meshfl errors, never HTTP exceptions.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, exists, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from coordinator import lifecycle
from coordinator.brokerauth import BrokerAccounts
from coordinator.control import Control
from coordinator.db import Device, DeviceProfile, JobDevice
from coordinator.errors import Conflict
from coordinator.presence import Presence, online_status
from coordinator.validation import validate_labels, validate_tags
from meshfl.contract import DevicePatch

__all__ = [
    "DRAINED",
    "REVOKED",
    "DeviceFilter",
    "delete_device",
    "drain",
    "enrol_broker_login",
    "list_devices",
    "patch",
    "revoke",
    "undrain",
]

DRAINED = "drained by an operator"
"""Reason recorded in the topology event when a draining device leaves a job."""
REVOKED = "revoked by an operator"
"""Reason recorded when a revoked (or deleted) device leaves a job."""


@dataclass(frozen=True)
class DeviceFilter:
    """Which devices a listing keeps; every condition given must hold.

    ``tags``: the device has every one; ``state``: its state; ``online``: as the
    device's ``online`` shows it (:func:`coordinator.presence.online_status`; ``None``:
    either); ``minimums`` /
    ``maximums`` map a numeric profile field (``cores``, ``memory_bytes``, ...) to its
    least / greatest value: a device whose profile lacks the field does not match.
    """

    tags: tuple[str, ...] = ()
    state: str | None = None
    online: bool | None = None
    minimums: dict[str, float] = field(default_factory=dict)
    maximums: dict[str, float] = field(default_factory=dict)

    def matches(
        self, device: Device, now: float, live_within_s: float, presence: Presence | None = None
    ) -> bool:
        """Whether ``device`` passes the liveness, tag and profile conditions (not state)."""
        if self.online is not None:
            shown = online_status(
                presence, device.id, device.last_seen, now=now, live_within_s=live_within_s
            )
            if shown.online != self.online:
                return False
        if not set(self.tags) <= set(device.tags or ()):
            return False
        profile: dict[str, Any] = device.profile or {}
        for name in {*self.minimums, *self.maximums}:
            value = profile.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return False
            if value < self.minimums.get(name, value) or value > self.maximums.get(name, value):
                return False
        return True


def list_devices(
    session: Session,
    where: DeviceFilter,
    *,
    now: float,
    live_within_s: float,
    limit: int,
    offset: int = 0,
    presence: Presence | None = None,
) -> tuple[list[Device], int]:
    """One page of the matching devices in enrolment order, and how many match in all.

    The state is filtered in SQL; tags and profile ranges here, since JSON operators
    differ between SQLite and PostgreSQL, and liveness here too, on the ``last_seen`` a
    loaded device shows (it includes heartbeats not yet flushed to the database,
    :mod:`coordinator.liveness`) and the MQTT statuses in ``presence``, so ``status``
    agrees with each device's ``online``. Deleted devices never appear.
    """
    query = select(Device).where(Device.state != "deleted")
    if where.state is not None:
        query = query.where(Device.state == where.state)
    query = query.order_by(Device.enrolled_at, Device.id)
    matching = [d for d in session.scalars(query) if where.matches(d, now, live_within_s, presence)]
    return matching[offset : offset + limit], len(matching)


def patch(session: Session, device: Device, body: DevicePatch) -> Device:
    """Replace the device's tags and/or labels with those given (validated first).

    Raises :class:`meshfl.errors.ConfigError` for a bad tag, label or too many of them,
    :class:`~coordinator.errors.Conflict` for a revoked device.
    """
    _refuse_revoked(device, "be changed")
    tags = validate_tags(body["tags"]) if "tags" in body else None
    if "labels" in body:
        validate_labels(body["labels"])
        device.labels = dict(body["labels"])
    if tags is not None:
        device.tags = tags
    session.commit()
    return device


def drain(session: Session, device: Device, now: float, control: Control | None) -> Device:
    """Mark ``device`` draining and take it out of its running jobs after this round.

    It is never started in or admitted to a job while draining. Raises
    :class:`Conflict` for a revoked device.
    """
    _refuse_revoked(device, "drain")
    device.state = "draining"
    session.commit()
    lifecycle.leave_jobs(session, device, DRAINED, now, control)
    return device


def undrain(session: Session, device: Device) -> Device:
    """Make a draining device ``active`` again (it may join new jobs; no rejoin).

    Raises :class:`Conflict` for a revoked device.
    """
    _refuse_revoked(device, "undrain")
    device.state = "active"
    session.commit()
    return device


def revoke(
    session: Session,
    device: Device,
    now: float,
    control: Control | None,
    accounts: BrokerAccounts | None,
) -> Device:
    """Revoke ``device``: its token stops working, it leaves its jobs, its broker login goes.

    The state change is committed first (the token is refused from then on, even if
    the broker cannot be reached); ``revoked_at`` keeps the first revocation's time.

    Raises
    ------
    meshfl.errors.ConfigError
        The broker login could not be removed (``accounts.remove``); revoking again
        retries it.

    """
    if device.state != "revoked":
        device.state, device.revoked_at = "revoked", now
        session.commit()
    lifecycle.leave_jobs(session, device, REVOKED, now, control)
    if accounts is not None:
        accounts.remove(device.id)
    return device


def delete_device(
    session: Session,
    device: Device,
    now: float,
    control: Control | None,
    accounts: BrokerAccounts | None,
) -> None:
    """Revoke ``device``, then remove it from every listing for good.

    A device that never took part in a job is deleted with its profile history. One
    with job history (participations, round reports, privacy spend, keys) becomes a
    tombstone instead: state ``deleted``, name ``(deleted)``, profile, tags, labels,
    identity key and profile history erased; its id stays in the job history, which
    other rows reference. Raises as :func:`revoke`.
    """
    revoke(session, device, now, control, accounts)
    took_part = session.scalar(select(exists().where(JobDevice.device_id == device.id)))
    if not took_part:
        try:
            with session.begin_nested():
                session.execute(delete(DeviceProfile).where(DeviceProfile.device_id == device.id))
                session.delete(device)
            session.commit()
            return
        except IntegrityError:  # referenced by a row this module does not know of
            pass  # the savepoint is rolled back; the device stays: make it a tombstone
    session.execute(delete(DeviceProfile).where(DeviceProfile.device_id == device.id))
    device.state, device.name, device.profile = "deleted", "(deleted)", {}
    device.tags, device.labels, device.identity_key = [], {}, None
    session.commit()


def enrol_broker_login(accounts: BrokerAccounts, device: Device) -> tuple[str, str]:
    """Create the broker login of a new device; returns ``(username, password)``.

    The username is the device id (also its MQTT client id); the password is
    :func:`secrets.token_urlsafe` of 24 bytes, to be shown once. Raises
    :class:`meshfl.errors.ConfigError` when the broker's login table cannot be updated.
    """
    password = secrets.token_urlsafe(24)
    accounts.add(device.id, password)
    return device.id, password


def _refuse_revoked(device: Device, action: str) -> None:
    if device.state == "revoked":
        raise Conflict(
            f"device {device.id!r} is revoked and cannot {action}; enrol the device again"
            " to give it a new identity"
        )
