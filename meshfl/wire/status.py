"""A device's retained status on ``meshfl/v1/{fleet}/node/{device}/status``.

Agents publish it (retained, QoS 1) when they join, leave or decline a job, at each
change of the keyframes they need and when they are done; their Last Will is the
``offline`` status. Neighbours' agents and the coordinator's presence table read it.
The bytes are JSON with the default separators, keys in this order::

    {"state": "online", "job": "job-1", "round": 3, "need": ["dev-2"], "done": true}

``need`` (sorted device ids whose keyframe the device waits for) and ``done`` (it mixed
its last round) appear only when non-empty / true. An empty payload deletes a retained
status and says nothing about liveness (:func:`decode_status` returns ``None``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal, cast

from meshfl.errors import PayloadError
from meshfl.wire.jsonbody import dump, load_object, need_id, need_ids, need_int

__all__ = [
    "MAX_NEED",
    "MAX_STATUS_BYTES",
    "STATES",
    "DeviceStatus",
    "decode_status",
    "encode_status",
]

MAX_STATUS_BYTES = 64 * 1024
"""Largest status payload decoded, bytes."""
MAX_NEED = 512
"""Most device ids a status may list under ``need``."""
STATES = ("online", "offline", "declined")
"""The states a device announces: in a job or idle, gone (Last Will), refused a job."""

State = Literal["online", "offline", "declined"]
_KEYS = frozenset({"state", "job", "round", "need", "done"})


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """One decoded status.

    ``job`` is ``None`` when the device is in no job; ``round`` is ``None`` with it (or
    for a Last Will); ``need`` is sorted.
    """

    state: State
    job: str | None = None
    round: int | None = None
    need: tuple[str, ...] = ()
    done: bool = False


def encode_status(
    state: State,
    job: str | None = None,
    round_: int | None = None,
    need: Collection[str] = (),
    done: bool = False,
) -> bytes:
    """The JSON bytes of a status (see the module docstring for the layout).

    Parameters
    ----------
    state : {"online", "offline", "declined"}
        The device's state.
    job : str or None, default None
        The job it is in (or declined); ``None``: none.
    round_ : int or None, default None
        The round it is at in ``job``.
    need : collection of str, default ()
        Peers whose keyframe it waits for (written sorted).
    done : bool, default False
        It mixed its last round of the job and waits for nothing more.

    """
    body: dict[str, Any] = {"state": state, "job": job, "round": round_}
    if need:
        body["need"] = sorted(need)
    if done:
        body["done"] = True
    return dump(body, compact=False)


def decode_status(payload: bytes) -> DeviceStatus | None:
    """The status in ``payload``; ``None`` for an empty payload (a deleted retained one).

    Raises
    ------
    PayloadError
        Over :data:`MAX_STATUS_BYTES` or 8 levels deep, not a JSON object, an unknown or
        missing field, an unknown state, an invalid job or device id, a round outside
        [0, 2**32), more than :data:`MAX_NEED` ids under ``need``, ``done`` not a bool.

    """
    if isinstance(payload, bytes | bytearray) and not payload:
        return None
    body = load_object(payload, "status", max_bytes=MAX_STATUS_BYTES)
    unknown = set(body) - _KEYS
    if unknown or "state" not in body:
        raise PayloadError(f"a status has fields {sorted(body)}; expected 'state' and {_KEYS}")
    state = body["state"]
    if state not in STATES:
        raise PayloadError(f"status.state {str(state)[:32]!r} is not one of {STATES}")
    job = body.get("job")
    round_ = body.get("round")
    done = body.get("done", False)
    if not isinstance(done, bool):
        raise PayloadError("status.done must be true or false")
    return DeviceStatus(
        state=cast(State, state),
        job=None if job is None else need_id(job, "status.job"),
        round=None if round_ is None else need_int(body, "round", "status", 0, 2**32),
        need=tuple(sorted(need_ids(body.get("need", []), "status.need", MAX_NEED))),
        done=done,
    )
