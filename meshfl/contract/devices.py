"""Devices: enrolment, the fleet view, capability profiles (``/devices``)."""

from __future__ import annotations

from typing import Literal

from typing_extensions import NotRequired, TypedDict

from meshfl.contract._schema import strict, strict_request

__all__ = [
    "CapabilityProfile",
    "DevicePatch",
    "DevicePublic",
    "DeviceState",
    "EnrolRequest",
    "EnrolResponse",
    "ProfileSample",
    "enrol_proof_message",
]


@strict
class CapabilityProfile(TypedDict, total=False):
    """What a device measured about itself (all fields optional).

    The coordinator refuses (422) a number that is not finite or is negative, and a
    ``battery_percent`` outside [0, 100]; ``None`` battery/charging: the device has none.
    """

    cores: int
    memory_bytes: int
    accelerator: str | None
    platform: str
    train_samples_per_s: float  # measured on the job's model and batch size
    train_samples: int  # local training samples (one epoch) for the job measured on
    model_hash: str
    uplink_bytes_per_s: float  # measured through the broker
    downlink_bytes_per_s: float  # measured through the broker
    broker_rtt_s: float  # round trip to the broker, measured through the broker
    battery_percent: float | None  # 0..100; None: no battery
    charging: bool | None  # None: no battery
    measured_at: float  # unix seconds, device clock
    role: Literal["train", "inference"]  # "inference": serve-only agent, never in a job


@strict
class ProfileSample(TypedDict):
    """One stored capability profile of a device (``GET /devices/{device_id}/profiles``)."""

    profile: CapabilityProfile
    received_at: float  # unix seconds, coordinator clock


@strict_request
class EnrolRequest(TypedDict):
    """Body of ``POST /devices/enrol``: the fleet's enrolment token and a device name."""

    token: str
    name: str
    profile: NotRequired[CapabilityProfile]
    # Secure aggregation (issue 5): the device's Ed25519 identity public key, raw 32 bytes
    # in standard base64; the coordinator checks per-job key bundles against it.
    identity_key: NotRequired[str]
    # Issue 23: the identity key's signature (base64) of enrol_proof_message(token, name,
    # identity_key). Needed to enrol again under a key an active device holds: the old
    # device is then revoked (its token and broker login), not left beside the new one.
    identity_proof: NotRequired[str]


@strict
class EnrolResponse(TypedDict):
    """The identity a device receives at enrolment."""

    device_id: str
    device_token: str
    fleet: str
    broker_url: str | None
    # Broker credentials (issue 6), present when the coordinator manages broker accounts:
    # the MQTT username (the device id, also its client id) and a password shown only here.
    broker_username: NotRequired[str]
    broker_password: NotRequired[str]
    # PEM of the CA that signed the broker's TLS certificate, when the coordinator has one.
    broker_ca: NotRequired[str]


DeviceState = Literal["active", "draining", "revoked"]
"""``active``: takes work; ``draining``: finishes the round it is in, then takes no new
work; ``revoked``: its device token and broker login no longer work (issue 6)."""


@strict
class DevicePublic(TypedDict):
    """A device as operators see it.

    ``online``: its latest MQTT status (``online``, or ``offline`` from a clean shutdown
    or its Last Will) when that came at or after ``last_seen``, else heard from within
    the coordinator's ``live_within_s`` seconds; ``online_source`` says which decided
    (``"last_will"`` or ``"heartbeat"``). See docs/fleet.md, "Online".
    """

    device_id: str
    name: str
    fleet: str
    profile: CapabilityProfile
    enrolled_at: float  # unix seconds
    last_seen: float  # unix seconds
    # Fleet management (issue 6).
    tags: list[str]
    labels: dict[str, str]
    state: DeviceState
    online: bool
    revoked_at: float | None  # unix seconds; None: not revoked
    online_source: NotRequired[Literal["last_will", "heartbeat"]]


@strict_request
class DevicePatch(TypedDict, total=False):
    """Body of ``PATCH /devices/{device_id}``: what is given replaces the stored value.

    Tags and label keys match ``[A-Za-z0-9_.:-]{1,64}``; at most 32 tags and 32 labels;
    a label value is at most 256 printable characters.
    """

    tags: list[str]
    labels: dict[str, str]


def enrol_proof_message(token: str, name: str, identity_key: str) -> bytes:
    """The bytes a device signs with its identity key to prove it holds it at enrolment.

    The context ``meshfl-enrol-v1`` and a NUL, the SHA-256 digest of ``token`` (32 raw
    bytes), ``name``, a NUL and ``identity_key`` (base64 text), UTF-8:
    bound to the enrolment token presented and the name, so a proof seen once does not
    enrol under another token (``EnrolRequest.identity_proof``).
    """
    import hashlib

    digest = hashlib.sha256(token.encode()).digest()
    return b"meshfl-enrol-v1\0" + digest + name.encode() + b"\0" + identity_key.encode()
