"""Operator API tokens (``/tokens``) and enrolment tokens (``/enrolment-tokens``)."""

from __future__ import annotations

from typing import Literal

from typing_extensions import NotRequired, TypedDict

from meshfl.contract._schema import strict, strict_request

__all__ = [
    "ApiRole",
    "ApiTokenCreate",
    "ApiTokenCreated",
    "ApiTokenPublic",
    "EnrolmentTokenCreate",
    "EnrolmentTokenCreated",
    "EnrolmentTokenPublic",
    "FleetEnrolmentPublic",
    "FleetEnrolmentRotate",
    "FleetEnrolmentRotated",
]

ApiRole = Literal["admin", "operator", "read-only"]
"""An API token's role: ``admin`` everything (token management included), ``operator``
reads and changes devices, jobs and topology, ``read-only`` only reads."""


@strict_request
class ApiTokenCreate(TypedDict):
    """Body of ``POST /tokens`` (admin).

    ``ttl_s``: seconds of life (at most ten years), absent or ``None``: never expires;
    ``name``: a label (at most 200 printable characters).
    """

    role: ApiRole
    name: NotRequired[str]
    ttl_s: NotRequired[float | None]


@strict
class ApiTokenPublic(TypedDict):
    """An API token as listed (never its secret)."""

    token_id: str
    name: str
    role: ApiRole
    status: Literal["active", "expired", "revoked"]
    created_at: float  # unix seconds, coordinator clock
    expires_at: float | None  # unix seconds; None: never
    revoked_at: float | None  # unix seconds; None: not revoked


@strict
class ApiTokenCreated(ApiTokenPublic):
    """``POST /tokens``' answer: the record and ``token``, the secret (shown only here)."""

    token: str


@strict_request
class EnrolmentTokenCreate(TypedDict, total=False):
    """Body of ``POST /enrolment-tokens`` (operator); every field is optional.

    ``ttl_s`` seconds it stays valid (default 3600, at most 30 days); ``uses`` how many
    devices it may enrol (default 1: one-time; at most 10,000); ``tags`` given to each
    device it enrols (``[A-Za-z0-9_.:-]{1,64}``, at most 32); ``name`` a label.
    """

    ttl_s: float
    uses: int
    tags: list[str]
    name: str


@strict
class EnrolmentTokenPublic(TypedDict):
    """An enrolment token as listed (never its secret)."""

    token_id: str
    name: str
    tags: list[str]
    uses: int  # the quota it was created with
    uses_left: int
    status: Literal["active", "expired", "used up", "revoked"]
    created_at: float  # unix seconds, coordinator clock
    expires_at: float  # unix seconds
    revoked_at: float | None  # unix seconds; None: not revoked


@strict
class EnrolmentTokenCreated(EnrolmentTokenPublic):
    """``POST /enrolment-tokens``' answer: the record and ``token``, shown only here."""

    token: str


@strict_request
class FleetEnrolmentRotate(TypedDict, total=False):
    """Body of ``POST /enrolment-tokens/fleet/rotate``; every field optional.

    ``ttl_s`` seconds the new secret stays valid (omitted: never expires); ``uses`` how
    many devices it may enrol (omitted: unlimited).
    """

    ttl_s: float
    uses: int


@strict
class FleetEnrolmentPublic(TypedDict):
    """The fleet's shared enrolment token (never its secret), ``GET /enrolment-tokens/fleet``.

    ``status`` ``off``: no fleet token (the coordinator was started without
    ``--enrol-token`` and none was rotated in); ``uses``/``uses_left`` ``None``:
    unlimited; ``expires_at`` ``None``: never. Times are unix seconds.
    """

    status: Literal["active", "disabled", "expired", "used up", "off"]
    uses: int | None
    uses_left: int | None
    created_at: float | None
    expires_at: float | None
    disabled_at: float | None


@strict
class FleetEnrolmentRotated(FleetEnrolmentPublic):
    """``POST /enrolment-tokens/fleet/rotate``'s answer: ``token``, shown only here."""

    token: str
