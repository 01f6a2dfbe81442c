"""The agent's liveness file, for container health checks and supervisors.

A running agent rewrites ``<out>/<name>.health.json`` every ``interval_s`` seconds from a
daemon thread (several agents may share one ``--out``, as ``meshfl local``'s do)::

    {"device_id": "dev-…", "name": "agent-0", "connected": true,
     "job_id": null, "pid": 7, "updated_at": 1764490000.0}

``meshfl agent health --out DIR --name NAME`` (:func:`check_health`) exits 0 when that
file is younger than ``max_age_s`` and the agent is connected to its broker, 1 otherwise:
a hung process stops rewriting the file, a dead one leaves it to age, and an agent that
lost its broker says so. The file is written atomically (temporary name, then rename),
so a reader never sees half of it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from meshfl.files import atomic_write

__all__ = ["HealthWriter", "check_health", "health_path"]

log = logging.getLogger(__name__)
_CLOCK_SLACK_S = 5.0  # a record this far in the future still counts (clock adjustments)


def health_path(out: Path, name: str) -> Path:
    """The health file of agent ``name`` writing into ``out``: ``out/<name>.health.json``."""
    return Path(out) / f"{name}.health.json"


class HealthWriter:
    """Rewrite the health file every ``interval_s`` seconds until :meth:`stop`.

    Parameters
    ----------
    out
        The agent's output directory (``--out``); created if missing.
    device_id, name
        Who this agent is (written into every record).
    connected
        Returns whether the broker connection is up now (``Transport.connected``).
    interval_s
        Seconds between writes (default 10).

    """

    def __init__(
        self,
        out: Path,
        device_id: str,
        name: str,
        connected: Callable[[], bool],
        interval_s: float = 10.0,
    ) -> None:
        self.path = health_path(out, name)
        self.device_id, self.name = device_id, name
        self.job_id: str | None = None
        self._connected = connected
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._failing = False  # the last write failed (its warning was said)
        self._thread = threading.Thread(target=self._loop, name="health", daemon=True)

    def start(self) -> None:
        """Write the file now, then keep rewriting it from a daemon thread."""
        self.write()
        self._thread.start()

    def stop(self) -> None:
        """Stop rewriting and remove the file: a stopped agent is not healthy."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self._interval_s)
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:  # a read-only folder: the stale file ages out (check_health)
            log.debug("cannot remove %s: %s", self.path, exc)

    def write(self) -> None:
        """Write one record atomically; an I/O error is logged, never raised."""
        record = {
            "device_id": self.device_id,
            "name": self.name,
            "connected": bool(self._connected()),
            "job_id": self.job_id,
            "pid": os.getpid(),
            "updated_at": time.time(),
        }
        try:
            atomic_write(self.path, lambda handle: handle.write(json.dumps(record).encode()))
        except OSError as exc:  # said once, not every interval; again after a success
            if not self._failing:
                log.warning(
                    "cannot write %s (%s): health checks will see no agent",
                    self.path,
                    exc.strerror or exc,
                )
            self._failing = True
        else:
            self._failing = False

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.write()


def check_health(
    out: Path, name: str, max_age_s: float = 60.0, now: float | None = None
) -> str | None:
    """Return why agent ``name`` writing into ``out`` is unhealthy, or ``None`` when healthy.

    Unhealthy: no health file (not started, or stopped), an unreadable one, one older
    than ``max_age_s`` seconds (the process hung or died), or ``connected`` false.
    """
    path = health_path(out, name)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return f"{path} does not exist: no agent {name!r} is running with --out {out}"
    except (OSError, ValueError) as exc:
        return f"{path} is unreadable ({type(exc).__name__})"
    updated = record.get("updated_at") if isinstance(record, dict) else None
    connected = record.get("connected") if isinstance(record, dict) else None
    if not isinstance(updated, (int, float)) or isinstance(updated, bool):
        return f"{path} has no numeric updated_at: it was not written by a meshfl agent"
    if not isinstance(connected, bool):
        return f"{path} has no true/false connected: it was not written by a meshfl agent"
    age = (time.time() if now is None else now) - updated
    if not math.isfinite(age) or age < -_CLOCK_SLACK_S:
        return f"{path} has an invalid or future updated_at ({updated}): check the clock"
    if age > max_age_s:
        return f"{path} is {age:.0f} s old (limit {max_age_s:.0f} s): the agent is hung or dead"
    if not connected:
        return f"agent {record.get('name')} is not connected to its broker"
    return None
