"""Process faults of ``meshfl local --chaos``: kill the broker, the coordinator or an agent.

Three keys of the ``--chaos`` SPEC (:mod:`meshfl.app.local.lab.chaos`) stop a process of the run
and start it again, as a crash or a reboot would::

    broker=ROUND:term[:SECONDS]     SIGTERM the broker (a clean stop: Mosquitto saves its
                                    database), start it again SECONDS later (default 2)
    broker=ROUND:kill[:SECONDS]     SIGKILL it (a crash: what changed since its last
                                    autosave, at most 2 s, is lost)
    coordinator=ROUND[:SECONDS]     SIGKILL the coordinator, start it again SECONDS later
                                    (default 2) on the same port and database
    restart=DEVICE@ROUND[:SECONDS]  SIGKILL that agent, start it again SECONDS later
                                    (default 1): same name, data and state directory

**When.** A fault of round ROUND strikes while the fleet works on ROUND: at the first
poll of the coordinator (every 0.3 s) that shows a report of round ROUND − 1 from any
device (for ROUND 1: the first poll after the job started). Rounds of a small job take
a fraction of a second, so the fleet may be a round further by then: each event records
the round it was meant for and the latest round reported when it struck.

**How.** The restart comes SECONDS after the signal, at the next poll, with the same
command line: the broker on the same port, configuration and persistence directory; the
coordinator on the same port and SQLite database (not wiped); the agent with the same
``--name``, ``--data`` and ``--out`` (its identity, enrolment and checkpoints). Broker
faults need a broker the run owns and that keeps its state on disk: ``meshfl local``
then starts its own Mosquitto in ``OUT/broker`` instead of the embedded amqtt broker
(which keeps no state across a restart), and refuses ``--broker URL``.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshfl.app.local.fleet import device_name
from meshfl.errors import ConfigError, MeshflError

if TYPE_CHECKING:
    from broker.mosquitto import MosquittoProcess
    from meshfl.app.local.processes import Supervisor

__all__ = [
    "DEFAULT_DOWN_S",
    "MAX_DOWN_S",
    "ProcessFault",
    "ProcessFaults",
    "broker_faults",
    "parse_process_fault",
    "process_fault_line",
]

PROCESS_KEYS = ("broker", "coordinator", "restart")
"""The ``--chaos`` keys of process faults (repeatable, as ``partition``)."""

DEFAULT_DOWN_S = {"broker": 2.0, "coordinator": 2.0, "restart": 1.0}
"""Seconds between the signal and the restart when SECONDS is not given."""

MAX_DOWN_S = 600.0
"""The longest down time, seconds."""

_FORMS = {
    "broker": "broker=ROUND:term|kill[:SECONDS], e.g. broker=5:kill",
    "coordinator": "coordinator=ROUND[:SECONDS], e.g. coordinator=5:3",
    "restart": "restart=DEVICE@ROUND[:SECONDS], e.g. restart=device-2@5:1",
}


@dataclass(frozen=True)
class ProcessFault:
    """Stop one process of the run during round ``round`` and restart it ``down_s`` later.

    ``target`` is ``"broker"``, ``"coordinator"`` or an agent's name (``"device-2"``);
    ``sig`` the signal sent (SIGTERM only for ``broker=ROUND:term``).
    """

    target: str
    round: int
    down_s: float
    sig: signal.Signals = signal.SIGKILL

    @property
    def key(self) -> str:
        """The SPEC key that gives this fault."""
        return self.target if self.target in ("broker", "coordinator") else "restart"

    def describe(self) -> str:
        """``"broker SIGTERM"``, ``"coordinator SIGKILL"``, ``"device-2 SIGKILL"``."""
        return f"{self.target} {self.sig.name}"


def parse_process_fault(key: str, value: str) -> ProcessFault:
    """Parse the VALUE of a ``broker=``, ``coordinator=`` or ``restart=`` SPEC item.

    Raises
    ------
    ConfigError
        A malformed value, a signal other than ``term`` / ``kill``, a round below 1 or a
        down time outside (0, MAX_DOWN_S]; one line quoting the item and its form.

    """
    usage = f"--chaos {key}={value}: use {_FORMS[key]}"
    text = value.strip()
    device = key
    if key == "restart":
        name, at, text = text.partition("@")
        if not at:
            raise ConfigError(usage)
        device = device_name(name, f"--chaos {key}")
    parts = [p.strip() for p in text.split(":")]
    round_, rest = parts[0], parts[1:]
    sig = signal.SIGKILL
    if key == "broker":
        if not rest or rest[0].lower() not in ("term", "kill"):
            raise ConfigError(usage)
        sig = signal.SIGTERM if rest.pop(0).lower() == "term" else signal.SIGKILL
    if not (round_.isascii() and round_.isdigit()) or int(round_) < 1 or len(rest) > 1:
        raise ConfigError(usage)
    down_s = DEFAULT_DOWN_S[key]
    if rest:
        try:
            down_s = float(rest[0])
        except ValueError:
            raise ConfigError(usage) from None
        if not (math.isfinite(down_s) and 0 < down_s <= MAX_DOWN_S):
            raise ConfigError(f"--chaos {key}={value}: SECONDS must be in (0, {MAX_DOWN_S:g}]")
    return ProcessFault(device, int(round_), down_s, sig)


def broker_faults(text: str) -> bool:
    """Whether a (valid) ``--chaos`` SPEC stops the broker: the run then owns a Mosquitto."""
    items = (item.partition("=")[0].strip().lower() for item in text.split(","))
    return "broker" in items


def process_fault_line(event: dict[str, Any]) -> str:
    """One line for the operator per process fault of the report's ``chaos.processes``."""
    line = f"{event['target']} {event['signal']} in round {event['round']}"
    if event.get("restarted_at_s") is None:
        return line + ", never restarted"
    down = event["restarted_at_s"] - event["at_s"]
    return line + f", back after {down:.1f} s"


@dataclass
class _Pending:
    fault: ProcessFault
    event: dict[str, Any]
    due: float  # monotonic time of the restart


class ProcessFaults:
    """Strike the process faults of a run on schedule and restart what they stopped.

    Call :meth:`tick` at every poll of the coordinator with the latest round any device
    reported (or ``None`` when the coordinator could not be read); :attr:`down` names the
    processes stopped on purpose and not yet back, whose exit is not a failure.

    Parameters
    ----------
    faults : tuple of ProcessFault
        The schedule.
    supervisor : Supervisor
        The run's children: the coordinator and the agents (restarted by name).
    broker : MosquittoProcess or None
        The run's own Mosquitto; required when a fault targets the broker.
    coordinator_up : callable
        Called after the coordinator is started again: waits until it listens.

    Attributes
    ----------
    events : list of dict
        One per fault struck: ``{"target", "signal", "round", "reported_round", "at_s",
        "down_s", "restarted_at_s"}`` (``at_s`` and ``restarted_at_s``: seconds since
        the job started; ``restarted_at_s`` None until it is back; ``reported_round``:
        the latest round reported when it struck).

    """

    def __init__(
        self,
        faults: tuple[ProcessFault, ...],
        supervisor: Supervisor,
        broker: MosquittoProcess | None,
        coordinator_up: Callable[[], None],
    ) -> None:
        if any(f.target == "broker" for f in faults) and broker is None:
            raise ValueError("a broker fault needs the run's own Mosquitto")
        self._todo = sorted(faults, key=lambda f: f.round)
        self._supervisor, self._broker, self._coordinator_up = supervisor, broker, coordinator_up
        self._pending: list[_Pending] = []
        self._t0 = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self.down: set[str] = set()
        self.coordinator_back_at: float | None = None

    def start(self) -> None:
        """Start the clock of ``at_s`` (call when the job starts)."""
        self._t0 = time.monotonic()

    def tick(self, latest_round: int | None) -> list[str]:
        """Restart what is due, then strike the faults due; one line per action."""
        lines = [self._restart(p) for p in self._pending if time.monotonic() >= p.due]
        self._pending = [p for p in self._pending if p.event["restarted_at_s"] is None]
        if latest_round is not None:
            while self._todo and latest_round >= self._todo[0].round - 1:
                fault = self._todo.pop(0)
                if fault.target in self.down:
                    continue  # already down: this fault cannot strike
                lines.append(self._strike(fault, latest_round))
        return lines

    def coordinator_recovering(self, grace_s: float = 30.0) -> bool:
        """Whether the coordinator is down on purpose or came back under ``grace_s`` ago."""
        back = self.coordinator_back_at
        recent = back is not None and time.monotonic() - back < grace_s
        return "coordinator" in self.down or recent

    def check(self) -> None:
        """Raise MeshflError when the run's Mosquitto exited without a fault.

        Raises
        ------
        meshfl.errors.MeshflError
            The broker is not running and no fault stopped it.

        """
        if self._broker is not None and "broker" not in self.down and not self._broker.running:
            log = self._broker.log_path
            raise MeshflError(f"the Mosquitto broker exited unexpectedly; see {log}")

    def report(self) -> list[dict[str, Any]]:
        """The report's ``chaos.processes``: a copy of :attr:`events`."""
        return [dict(e) for e in self.events]

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _strike(self, fault: ProcessFault, latest_round: int) -> str:
        if fault.target == "broker":
            assert self._broker is not None  # checked in __init__
            if fault.sig == signal.SIGTERM:
                self._broker.stop()  # SIGTERM, wait: Mosquitto saves its database
            else:
                self._broker.kill()
        else:
            child = self._supervisor.child(fault.target)
            if child is None or child.returncode is not None:
                return f"round {fault.round}: {fault.target} is not running; not killed"
            child.stop(fault.sig)
            child.process.wait()
        event = {
            "target": fault.target,
            "signal": fault.sig.name,
            "round": fault.round,
            "reported_round": latest_round,
            "at_s": self._now(),
            "down_s": fault.down_s,
            "restarted_at_s": None,
        }
        self.events.append(event)
        self.down.add(fault.target)
        self._pending.append(_Pending(fault, event, time.monotonic() + fault.down_s))
        return f"round {fault.round}: {fault.describe()}; restarting it in {fault.down_s:g} s"

    def _restart(self, pending: _Pending) -> str:
        target = pending.fault.target
        try:
            if target == "broker":
                assert self._broker is not None
                self._broker.start()  # same port, config and persistence directory
            else:
                self._supervisor.restart(target)
                if target == "coordinator":
                    self._coordinator_up()
                    self.coordinator_back_at = time.monotonic()
        except MeshflError as exc:
            raise MeshflError(f"the {target} did not come back after its fault: {exc}") from None
        pending.event["restarted_at_s"] = self._now()
        self.down.discard(target)
        return f"{target} restarted"
