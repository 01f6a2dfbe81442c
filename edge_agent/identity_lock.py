"""One process per device identity: an OS lock on ``<out>/<name>.lock`` (issue 25).

Two agents started with the same ``--out`` and ``--name`` would enrol as one device,
share its broker session and checkpoints, and disconnect each other from the broker
without end. :func:`lock_identity` takes an exclusive ``fcntl.flock`` on the identity's
lock file, held until the process exits (the kernel drops it even after SIGKILL, so a
crashed agent never blocks its restart); a second process is refused at start with one
line naming the first one's pid. The broker-level counterpart — the same identity run
from another folder or host — is the transport's session-takeover check
(:class:`edge_agent.transport.refusals.SessionTakenOver`).

A folder where the lock cannot be written (read-only, full) does not stop the agent: the
guard is skipped with one warning line.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import IO

from meshfl.errors import ConfigError

__all__ = ["IdentityLock", "lock_identity"]

log = logging.getLogger("meshfl.agent")


class IdentityLock:
    """A held identity lock; :meth:`close` releases it (the process's exit does too)."""

    def __init__(self, path: Path, handle: IO[str] | None) -> None:
        self.path = path
        self._handle = handle

    @property
    def held(self) -> bool:
        """False when the folder refused the lock file (no guard)."""
        return self._handle is not None

    def close(self) -> None:
        """Release the lock (idempotent)."""
        if self._handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def lock_identity(out: Path, name: str) -> IdentityLock:
    """Lock the identity ``name`` in ``out`` for this process.

    Parameters
    ----------
    out : Path
        The agent's output folder (``--out``); created if missing.
    name : str
        The device name (``--name``), already validated.

    Returns
    -------
    IdentityLock
        Held until :meth:`IdentityLock.close` or the process's exit.

    Raises
    ------
    ConfigError
        Another process holds the lock: it runs as this device already.

    """
    path = Path(out) / f"{name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115  # held for the process
    except OSError as exc:
        log.warning(
            "cannot write %s (%s): running without the one-process-per-device guard",
            path,
            exc.strerror or exc,
        )
        return IdentityLock(path, None)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise ConfigError(
            f"another agent already runs as {name!r} with --out {out} (pid {holder});"
            " stop it first, or give this one another --name or --out"
        ) from None
    with contextlib.suppress(OSError):  # who holds it, for the next one's message
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
    return IdentityLock(path, handle)
