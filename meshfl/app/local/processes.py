"""Supervise the processes of a local fleet: broker, coordinator and agents.

Every child runs in its own session (so a Ctrl-C reaches only the launcher, which
then stops the children in order) and writes its output to ``DIR/logs/NAME.log``. With a
:class:`~meshfl.app.local.zygote.Zygote`, agents (``agent run`` and ``agent fleet``) are
forked from it instead of started from scratch: still processes of their own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from broker import ports
from broker.ports import free_port
from meshfl.errors import MeshflError

if TYPE_CHECKING:
    from meshfl.app.local.zygote import ForkedProcess, Zygote

__all__ = ["Child", "Supervisor", "free_port", "uninterrupted", "wait_for_port"]


def wait_for_port(host: str, port: int, timeout_s: float, alive: Child | None = None) -> None:
    """Wait until ``host:port`` accepts TCP connections (:func:`broker.ports.wait_for_port`).

    Raises
    ------
    MeshflError
        The port did not open within ``timeout_s`` seconds, or ``alive`` exited first.

    """
    exited = None if alive is None else (lambda: alive.returncode is not None)
    if ports.wait_for_port(host, port, timeout_s, stop=exited):
        return
    if alive is not None and alive.returncode is not None:
        raise MeshflError(f"{alive.name} exited during start-up: {alive.last_line()}")
    raise MeshflError(f"nothing answered on {host}:{port} after {timeout_s:.0f} s")


@dataclass
class Child:
    """One supervised child process and its log file."""

    name: str
    process: subprocess.Popen[bytes] | ForkedProcess
    log_path: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None

    @property
    def returncode(self) -> int | None:
        """Exit code, or ``None`` while it runs."""
        return self.process.poll()

    def last_line(self) -> str:
        """The last non-empty line of its log (the error a failed child printed)."""
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        if not lines:
            return f"exit code {self.returncode}, empty log"
        return lines[-1].strip().removeprefix("meshfl: error: ")

    def describe_exit(self) -> str:
        """How it ended: the signal that killed it, or its exit code and last log line."""
        code = self.returncode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        return f"exit code {code}: {self.last_line()}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` if it still runs."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)


@dataclass
class Supervisor:
    """Starts ``python -m meshfl ...`` children and stops them all in reverse order.

    ``zygote``: agents are forked from it (:mod:`meshfl.app.local.zygote`); :meth:`stop_all`
    stops it last.
    """

    log_dir: Path
    children: list[Child] = field(default_factory=list)
    zygote: Zygote | None = None

    _FORKED = (["agent", "run"], ["agent", "fleet"])

    def start(
        self, name: str, args: list[str], env: dict[str, str] | None = None, append: bool = False
    ) -> Child:
        """Start ``python -m meshfl ARGS`` as child ``name`` (``append``: keep its old log)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        process: subprocess.Popen[bytes] | ForkedProcess
        if self.zygote is not None and args[:2] in self._FORKED:
            process = self.zygote.spawn(args, log_path, full_env, append)
        else:
            with open(log_path, "ab" if append else "wb") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "meshfl", *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=full_env,
                )
        child = Child(name, process, log_path, list(args), env)
        self.children.append(child)
        return child

    def child(self, name: str) -> Child | None:
        """The latest child started as ``name``, or None."""
        return next((c for c in reversed(self.children) if c.name == name), None)

    def restart(self, name: str) -> Child:
        """Start child ``name`` again with the same arguments, in its place in the order.

        Its log goes on in the same file. The old process must have exited.

        Raises
        ------
        ValueError
            No child ``name``, or it still runs.

        """
        old = self.child(name)
        if old is None or old.returncode is None:
            raise ValueError(f"{name} is {'unknown' if old is None else 'still running'}")
        new = self.start(name, old.args, old.env, append=True)
        self.children.remove(new)
        self.children[self.children.index(old)] = new
        return new

    def stop_all(self, grace_s: float = 5.0) -> None:
        """SIGTERM every child (agents first), SIGKILL the rest after ``grace_s``; zygote last."""
        for child in reversed(self.children):
            child.stop(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.stop(signal.SIGKILL)
                child.process.wait()
        if self.zygote is not None:
            self.zygote.stop()


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Run a block that Ctrl-C, SIGTERM and SIGHUP cannot cut short, then raise for them.

    For the cleanup that stops a run's processes: interrupted halfway, it would leave a
    coordinator or a broker running with no parent. A signal that comes meanwhile is held
    and raised as :class:`KeyboardInterrupt` once the block has finished. Handlers can
    only be set in the main thread; elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    kinds = [k for k in signals if signal.getsignal(k) is not signal.SIG_IGN]  # nohup stays
    previous = {kind: signal.signal(kind, lambda got, _frame: held.append(got)) for kind in kinds}
    try:
        yield
    finally:
        for kind, handler in previous.items():
            signal.signal(kind, handler)
    if held:
        raise KeyboardInterrupt
