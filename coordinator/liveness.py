"""Device liveness kept in memory: heartbeats are answered without touching the database.

A heartbeat (``POST /devices/{id}/heartbeat``) does two things a naive route would do in
the database: find the device by its token's SHA-256 digest, and write
``devices.last_seen``. At 1,000 heartbeats a second (W5: 10,000 devices, one every 10 s)
that is a query and a commit per request; measured on a 2-core VM the naive route
served about 80 a second (BENCHMARKS.md, "W5 coordinator: heartbeats"). So:

- **Token cache**: digest → device id of the devices that may send heartbeats (state
  not ``revoked``/``deleted``), filled on first use from the database, bounded in size.
- **Last-seen buffer**: device id → latest heartbeat time (unix seconds), written to
  ``devices.last_seen`` by :meth:`Liveness.flush` in one executemany ``UPDATE`` (every
  ``heartbeat_flush_s``, 1 s by default, and at shutdown). The update only moves
  ``last_seen`` forward, so a value written meanwhile by another route (an assignment
  poll, a round report) is never rolled back.

Readers see the fresher of the database and the buffer without asking: every
:class:`~coordinator.db.Device` an app's session loads gets the buffered time if it is
newer (a ``loaded_as_persistent`` listener on that app's sessionmaker, committed value,
so nothing is written back). A filter on ``last_seen`` inside SQL sees the database
only, at most one flush interval behind.

Revocation stops heartbeats at once: whenever one of the app's sessions commits a
device whose ``state`` or ``token_hash`` changed, or deletes one, that device is
forgotten (:meth:`Liveness.forget`), so its next heartbeat goes to the database and is
refused there. A lookup that raced such a commit does not re-cache the old row.

Everything lives in one process: the coordinator runs as one uvicorn worker.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, cast

import anyio
from sqlalchemy import Table, bindparam, event, inspect, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value

from coordinator.db import Device
from coordinator.store import hash_token

__all__ = ["CLOSED_STATES", "Liveness"]

log = logging.getLogger(__name__)

CLOSED_STATES = frozenset({"revoked", "deleted"})
"""Device states whose token no longer works (never cached)."""

_FORGET = "meshfl_liveness_forget"  # session.info key: device ids to forget at commit
_IDENTITY = ("state", "token_hash")  # a change of either forgets the cached token


class Liveness:
    """Heartbeat times and token look-ups of one coordinator app, kept in memory.

    Parameters
    ----------
    sessions : sessionmaker
        The app's session factory; listeners are attached to it (to this factory only,
        so apps in one process do not see each other's buffers).
    max_tokens : int, optional
        Most token digests cached (default 100,000); the oldest entry is dropped first.

    Notes
    -----
    Heartbeats are recorded from the event loop (:meth:`seen`, :meth:`device_for`);
    database work (:meth:`lookup`, :meth:`flush`) runs in worker threads. A lock guards
    every compound update of the dictionaries.

    """

    def __init__(self, sessions: sessionmaker[Session], *, max_tokens: int = 100_000) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self._sessions = sessions
        self._max_tokens = max_tokens
        self._lock = threading.Lock()
        self._pending: dict[str, float] = {}  # device id -> heard at, not yet written
        self._writing: dict[str, float] = {}  # the batch a flush is writing now
        self._device_by_digest: dict[str, str] = {}
        self._digest_by_device: dict[str, str] = {}
        self._forgets = 0  # bumped by forget(): a racing lookup must not re-cache
        event.listen(sessions, "loaded_as_persistent", self._overlay)
        event.listen(sessions, "after_flush", self._note_changes)
        event.listen(sessions, "after_commit", self._forget_noted)

    # -- heartbeats ------------------------------------------------------------------

    def seen(self, device_id: str, now: float) -> None:
        """Record that ``device_id`` was heard from at ``now`` (unix seconds)."""
        with self._lock:
            if now > self._pending.get(device_id, float("-inf")):
                self._pending[device_id] = now

    def last_seen(self, device_id: str) -> float | None:
        """The latest buffered heartbeat of ``device_id`` not yet in the DB, or ``None``."""
        with self._lock:
            pending, writing = self._pending.get(device_id), self._writing.get(device_id)
        if pending is None or writing is None:
            return writing if pending is None else pending
        return max(pending, writing)

    def flush(self) -> int:
        """Write the buffered heartbeat times to ``devices.last_seen``; return how many.

        One executemany ``UPDATE devices SET last_seen = t WHERE id = d AND last_seen <
        t`` in one transaction. On a database error the batch goes back to the buffer
        (to be retried by the next flush) and the error is raised.
        """
        with self._lock:
            if not self._pending:
                return 0
            batch, self._pending, self._writing = self._pending, {}, self._pending
        table = cast(Table, Device.__table__)
        statement = (
            update(table)
            .where(table.c.id == bindparam("b_id"), table.c.last_seen < bindparam("b_seen"))
            .values(last_seen=bindparam("b_seen"))
        )
        rows = [{"b_id": device_id, "b_seen": at} for device_id, at in batch.items()]
        try:
            with self._sessions() as session:
                session.connection().execute(statement, rows)
                session.commit()
        except Exception:
            with self._lock:
                for device_id, at in batch.items():
                    if at > self._pending.get(device_id, float("-inf")):
                        self._pending[device_id] = at
                self._writing = {}
            raise
        with self._lock:
            self._writing = {}
        return len(rows)

    async def flush_every(self, interval_s: float) -> None:
        """Flush every ``interval_s`` seconds until cancelled (a database error is logged).

        The flush runs in a worker thread; cancelling waits for a flush in progress.
        """
        while True:
            await anyio.sleep(interval_s)
            try:
                await anyio.to_thread.run_sync(self.flush)
            except SQLAlchemyError as exc:
                reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
                log.warning("heartbeat flush failed (kept for the next one): %s", reason)

    # -- tokens ----------------------------------------------------------------------

    def device_for(self, token: str) -> str | None:
        """The cached device id of ``token``, or ``None`` (not cached: call :meth:`lookup`)."""
        return self._device_by_digest.get(hash_token(token))

    def lookup(self, token: str) -> Device | None:
        """Find ``token``'s device in the database (blocking); cache it if its token works.

        Returns the device whatever its state (the caller refuses a revoked one), or
        ``None`` for an unknown token.
        """
        digest = hash_token(token)
        with self._lock:
            forgets = self._forgets
        with self._sessions() as session:
            device = session.scalars(select(Device).where(Device.token_hash == digest)).first()
        if device is None or device.state in CLOSED_STATES:
            return device
        with self._lock:
            if forgets == self._forgets:  # no revocation committed since the read
                if len(self._device_by_digest) >= self._max_tokens:
                    oldest = next(iter(self._device_by_digest))
                    self._digest_by_device.pop(self._device_by_digest.pop(oldest), None)
                self._device_by_digest[digest] = device.id
                self._digest_by_device[device.id] = digest
        return device

    def forget(self, device_id: str) -> None:
        """Drop ``device_id``'s cached token (its buffered heartbeat time is kept).

        Called automatically when a session of this app commits a change of the
        device's ``state`` or ``token_hash`` or deletes it; its next heartbeat is checked
        against the database.
        """
        with self._lock:
            self._forgets += 1
            digest = self._digest_by_device.pop(device_id, None)
            if digest is not None:
                self._device_by_digest.pop(digest, None)

    # -- session listeners -----------------------------------------------------------

    def _overlay(self, _session: Session, instance: Any) -> None:
        stored = instance.__dict__.get("last_seen") if isinstance(instance, Device) else None
        if stored is not None:
            buffered = self.last_seen(instance.id)
            if buffered is not None and buffered > stored:
                set_committed_value(instance, "last_seen", buffered)

    def _note_changes(self, session: Session, _context: Any) -> None:
        changed = {
            obj.id
            for obj in session.dirty
            if isinstance(obj, Device)
            and any(inspect(obj).attrs[key].history.has_changes() for key in _IDENTITY)
        }
        changed |= {obj.id for obj in session.deleted if isinstance(obj, Device)}
        if changed:
            session.info.setdefault(_FORGET, set()).update(changed)

    def _forget_noted(self, session: Session) -> None:
        for device_id in session.info.pop(_FORGET, ()):
            self.forget(device_id)
