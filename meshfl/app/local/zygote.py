"""A fork server for a local fleet's agents: torch is imported once, every agent is forked.

Starting ``meshfl agent run`` from scratch costs about 3.4 s of CPU, nearly all of it
importing torch; eight agents on two cores spent most of ``meshfl local``'s wall time
there (issue 24, item 1). ``meshfl local`` therefore starts one *zygote*
(``python -m meshfl.app.local.zygote_server SOCKET``) first thing, so its imports overlap the data
partition and the broker's and the coordinator's start. The zygote imports torch and the
agent's modules (:data:`meshfl.app.local.zygote_server.PRELOAD`), then listens on a Unix
socket; each request forks one child that runs ``meshfl ARGS`` as ``python -m meshfl
ARGS`` would.

A forked agent is still a process of its own: its own pid and session (``setsid``), its
log file as stdout and stderr, its environment and working directory, its identity,
enrolment and MQTT session. SIGKILL, ``--kill``, ``--chaos restart=...`` and the
supervisor's restarts act on it as on a process started from scratch, and its exit status
(negative: the signal that ended it, as :class:`subprocess.Popen` reports it) comes back
to the launcher over the request's connection (:class:`ForkedProcess`).

**Fork safety.** The zygote starts no thread and runs no torch operation, so torch's
intra-op thread pool does not exist when it forks; numpy's OpenBLAS stops its worker
thread across ``fork`` with its own ``pthread_atfork`` handlers. In the child, Python's
``random`` reseeds itself at fork; numpy's legacy global generator is reseeded from the
OS, and so is torch's default generator, as in a fresh process (training draws from
its own seeded generators), so the W1 default run gives the same result bit for bit
(``tests/unit/test_zygote.py``, BENCHMARKS.md).

Protocol (one connection per child, JSON lines): the launcher sends
``{"args", "env", "cwd", "log", "append"}``; the zygote answers ``{"pid": N}`` (or
``{"error": why}``), later ``{"returncode": R}`` when the child ends. The zygote exits
when its stdin closes (the launcher stopped it or died); its children live on until the
launcher stops them, as children started with ``subprocess`` would.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from meshfl.errors import MeshflError

__all__ = ["ForkedProcess", "Zygote", "zygote_enabled"]

ENV_SWITCH = "MESHFL_LOCAL_ZYGOTE"
"""``MESHFL_LOCAL_ZYGOTE=0`` starts every agent as a fresh ``python -m meshfl`` process."""

START_TIMEOUT_S = 120.0
"""How long the launcher waits for the zygote's imports (seconds)."""


def zygote_enabled() -> bool:
    """Whether ``meshfl local`` forks its agents from a zygote (``MESHFL_LOCAL_ZYGOTE``)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


# --- the launcher's side -------------------------------------------------------------


class ForkedProcess:
    """A child forked by the zygote, with the part of :class:`subprocess.Popen` in use.

    ``pid``, ``returncode``, :meth:`poll` and :meth:`wait` behave as Popen's (a negative
    return code names the signal that ended it). Signals go to ``pid`` directly.
    """

    def __init__(self, pid: int, conn: socket.socket, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._buffer = b""

    def poll(self) -> int | None:
        """The exit code, or None while it runs (never blocks)."""
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            self._read(max(0.0, min(left, 1.0)))
            if self.returncode is None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def _read(self, timeout: float) -> None:
        if self._conn is None:  # the zygote is gone: its child was re-parented
            if not _alive(self.pid):
                self.returncode = 1  # its status went to its new parent
            elif timeout:
                time.sleep(min(timeout, 0.1))
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        data = self._conn.recv(4096)
        if not data:
            self._conn.close()
            self._conn = None
            return
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "returncode" in message:
                self.returncode = int(message["returncode"])
                self._conn.close()
                self._conn = None
                return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Zygote:
    """The launcher's handle on one zygote process (see the module's docstring).

    Parameters
    ----------
    log_dir : Path
        Where :meth:`stop` leaves the zygote's own output, ``LOG_DIR/zygote.log``, if that
        folder exists by then (until then it is in the zygote's temporary folder: a run
        refused before it started anything leaves no ``logs`` folder).
    env : dict, optional
        The zygote's environment (default: this process's, unbuffered output).

    """

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self._log_dir = log_dir
        # A short path: a Unix socket's path is limited to 107 bytes.
        self._dir = Path(tempfile.mkdtemp(prefix="meshfl-zygote-"))
        self.log_path = self._dir / "zygote.log"
        self.socket_path = self._dir / "zygote.sock"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "meshfl.app.local.zygote_server", str(self.socket_path)],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env or {**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def spawn(
        self,
        args: list[str],
        log_path: Path,
        env: dict[str, str],
        append: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> ForkedProcess:
        """Fork ``meshfl ARGS`` with ``env`` (the whole environment), output to ``log_path``.

        Waits for the zygote's imports (at most :data:`START_TIMEOUT_S`).

        Raises
        ------
        meshfl.errors.MeshflError
            The zygote exited or did not answer in time; the message quotes its log.

        """
        conn = self._connect()
        request = {
            "args": list(args), "env": env, "cwd": os.getcwd(),
            "log": str(Path(log_path).resolve()), "append": append, **(extra or {}),
        }  # fmt: skip
        try:
            conn.sendall(json.dumps(request).encode() + b"\n")
            conn.settimeout(30.0)
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                answer += chunk
            conn.settimeout(None)
        except OSError as exc:
            conn.close()
            raise MeshflError(f"the agents' fork server failed: {exc}; {self._why()}") from None
        line, _, rest = answer.partition(b"\n")
        message = json.loads(line) if line else {"error": self._why()}
        if "pid" not in message:
            conn.close()
            raise MeshflError(f"the agents' fork server could not start an agent: {message}")
        child = ForkedProcess(int(message["pid"]), conn, ["meshfl", *args])
        child._buffer = rest
        return child

    def call(self, target: str, kwargs: dict[str, Any], log_path: Path, timeout_s: float) -> Any:
        """Run ``module:function(**kwargs)`` in a forked child and return its JSON result.

        For work that needs the zygote's imports (torch) where the launcher has none:
        ``kwargs`` and the result must be JSON. The child's output goes to ``log_path``.

        Raises
        ------
        meshfl.errors.MeshflError
            The child failed or ran past ``timeout_s`` (it is then killed); the message
            quotes the last line of its log.

        """
        result = Path(tempfile.mkdtemp(prefix="call-", dir=self._dir)) / "result.json"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        extra = {"call": target, "kwargs": kwargs, "result": str(result)}
        child = self.spawn([], log_path, env, extra=extra)
        try:
            code = child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
            child.wait()
            raise MeshflError(f"{target} did not finish within {timeout_s:.0f} s") from None
        if code != 0 or not result.is_file():
            try:
                lines = log_path.read_text(errors="replace").strip().splitlines()
            except OSError as exc:  # e.g. the run's logs folder became unwritable
                lines = [f"(its log {log_path} is unreadable: {exc.strerror})"]
            raise MeshflError(
                f"{target} failed (exit code {code}): {(lines or ['(no output)'])[-1]}"
            )
        return json.loads(result.read_text())

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise MeshflError(f"the agents' fork server exited: {self._why()}")
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(str(self.socket_path))
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
            if time.monotonic() > deadline:
                raise MeshflError(
                    f"the agents' fork server did not start within {START_TIMEOUT_S:.0f} s;"
                    f" see {self.log_path}"
                )
            time.sleep(0.05)

    def _why(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return lines[-1] if lines else f"see {self.log_path}"

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the zygote (its children are the supervisor's to stop) and remove its socket."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()  # EOF: the zygote exits
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log_dir.is_dir():
            with contextlib.suppress(OSError):
                shutil.copyfile(self.log_path, self._log_dir / "zygote.log")
                self.log_path = self._log_dir / "zygote.log"
        shutil.rmtree(self._dir, ignore_errors=True)
