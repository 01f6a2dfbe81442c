"""What a broker's MQTT 5 reason codes mean to a device: the transport's refusal messages.

No paho here: a reason is anything with an int ``value`` (paho's ``ReasonCode``; MQTT
3.1.1 CONNACK return codes 4 and 5 arrive as 0x86 and 0x87). Refusals that retrying
cannot fix are :class:`~meshfl.errors.ConfigError`, the rest
:class:`~meshfl.errors.TransportError` (see ``docs/security.md`` for the table).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any

from meshfl.errors import ConfigError, MeshflError, TransportError

__all__ = [
    "BAD_LOGIN",
    "Reason",
    "SessionTakenOver",
    "acl_error",
    "code_of",
    "connack_error",
    "suback_error",
    "taken_over_error",
]


class Reason(IntEnum):
    """The MQTT 5 reason codes the transport acts on."""

    CLIENT_ID_NOT_VALID = 0x85
    BAD_USERNAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SESSION_TAKEN_OVER = 0x8E  # DISCONNECT: a client connected with the same client id


BAD_LOGIN = (Reason.BAD_USERNAME_OR_PASSWORD, Reason.NOT_AUTHORIZED)


class SessionTakenOver(TransportError):
    """Another process connected with this client id: this one stops (it would fight back)."""


def taken_over_error(where: str, client_id: str) -> SessionTakenOver:
    """The error of a DISCONNECT 0x8E from the broker at ``where``."""
    return SessionTakenOver(
        f"another client connected to {where} as {client_id!r} and took over this one's"
        " session: two processes run with one identity; stop one"
    )


def code_of(reason: Any) -> int | None:
    """The numeric value of a reason code, or None."""
    value = getattr(reason, "value", None)
    return value if isinstance(value, int) else None


def acl_error(what: str, topic: str, client_id: str) -> ConfigError:
    """The error for a SUBACK or PUBACK 0x87: ``what`` is "subscribe to" or "publishing to"."""
    return ConfigError(
        f"the broker's ACL denies {what} {topic} to this device ({client_id}, 0x87 not"
        " authorized): the broker's ACL and the agent's fleet disagree"
    )


def connack_error(reason: Any, where: str, client_id: str, has_login: bool) -> MeshflError:
    """The error for a refused CONNACK from the broker at ``where``."""
    code = code_of(reason)
    if code in BAD_LOGIN and not has_login:
        return ConfigError(
            f"the broker at {where} requires a login ({reason}) and this device has none:"
            " the coordinator hands one out at enrolment with --broker-password-file"
        )
    if code in BAD_LOGIN:
        return ConfigError(
            f"the broker at {where} refused this device's login ({reason}): revoked or wrong"
            " password — re-enrol"
        )
    if code == Reason.CLIENT_ID_NOT_VALID:
        return ConfigError(
            f"the broker at {where} refused the client id {client_id!r} ({reason}); use the"
            " device id the coordinator gave at enrolment"
        )
    return TransportError(
        f"MQTT broker at {where} refused the connection: {reason}; "
        "check the client id, credentials and broker ACLs"
    )


def suback_error(
    topic_filter: str, failed: Sequence[Any], where: str, client_id: str
) -> MeshflError | None:
    """The error for a SUBACK whose ``failed`` reasons are not empty (None when empty)."""
    if not failed:
        return None
    if any(code_of(r) == Reason.NOT_AUTHORIZED for r in failed):
        return acl_error("subscribe to", topic_filter, client_id)
    reasons = ", ".join(str(r) for r in failed)
    return TransportError(
        f"the broker at {where} refused the subscription to {topic_filter} ({reasons});"
        " check the broker's ACL for this client"
    )
