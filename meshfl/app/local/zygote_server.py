"""The zygote's side of :mod:`meshfl.app.local.zygote`: preload, then fork a child per request.

Run as ``python -m meshfl.app.local.zygote_server SOCKET`` by
:class:`~meshfl.app.local.zygote.Zygote`.
The protocol, the fork-safety rules and what a child inherits are in that module's
docstring.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import io
import json
import os
import selectors
import socket
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from setproctitle import getproctitle, setproctitle

__all__ = ["PRELOAD", "first_draws", "main", "serve"]

PRELOAD = (
    "numpy",
    "torch",
    "torch._dynamo",  # the first torch.optim optimizer imports it: 1 s of CPU per agent
    "paho.mqtt.client",
    "meshfl.app.cli",
    "meshfl.app.cli.agent",
    "edge_agent.daemon",
    "edge_agent.job",
    "edge_agent.trainer",
    "edge_agent.capability_probe",
    "edge_agent.link_probe",
    "edge_agent.fleet",
    "edge_agent.transport.mqtt",
    "edge_agent.secagg.crypto",
    "models.zoo",
    "models.data",
    "models.onnx",
    "onnx",
    "torch.onnx",
    "typer._adapters",  # typer parses options through pydantic: seconds on a loaded machine
)
"""Modules the zygote imports once: what ``meshfl agent run`` imports over a job. The
end-of-job ONNX export runs in a short child of the agent (:func:`models.onnx.export_checked`)
that imports onnxruntime itself: onnxruntime starts a thread at import, which a zygote must
not have. ``onnx`` alone takes seconds to import (``ml_dtypes``)."""


@dataclass(frozen=True)
class _Request:
    args: list[str]
    env: dict[str, str]
    cwd: str
    log: str
    append: bool
    call: str | None = None  # "module:function", called with ``kwargs`` instead of the CLI
    kwargs: dict[str, Any] | None = None
    result: str | None = None  # where a call's JSON result is written


PRELOADED_COMMANDS = ("agent",)
"""CLI sub-commands built once in the zygote (:func:`meshfl.app.cli.load_command`)."""


def _preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # an extra not installed: the child imports what it needs
            print(f"zygote: not preloaded: {name} ({exc})", flush=True)
    from meshfl.app.cli import load_command

    for name in PRELOADED_COMMANDS:  # typer builds a command from its signature: once
        load_command(name)
    # What is loaded now is every child's: out of the collector's sight, so a child's
    # collections and its exit neither scan it nor dirty its shared pages.
    gc.collect()
    gc.freeze()


def _read_request(conn: socket.socket) -> _Request:
    conn.settimeout(10.0)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("the connection closed before a whole request")
        data += chunk
    conn.settimeout(None)
    raw: dict[str, Any] = json.loads(data)
    return _Request(
        [str(a) for a in raw["args"]],
        {str(k): str(v) for k, v in raw["env"].items()},
        str(raw["cwd"]),
        str(raw["log"]),
        bool(raw.get("append", False)),
        None if raw.get("call") is None else str(raw["call"]),
        raw.get("kwargs"),
        None if raw.get("result") is None else str(raw["result"]),
    )


def serve(path: str) -> _Request | None:
    """Preload, then fork one child per request until stdin closes.

    Returns None in the zygote when it is told to stop; in a forked child, the child's
    request (the caller runs it once the server's state is closed).
    """
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    print(f"zygote {os.getpid()}: preloaded {len(PRELOAD)} modules; listening", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):
                    return None  # the launcher closed our stdin, or died
            elif key.data == "accept":
                conn, _ = listener.accept()
                try:
                    request = _read_request(conn)
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    with contextlib.suppress(OSError):
                        conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
                    conn.close()
                    continue
                if threading.active_count() != 1:  # never fork a process with threads
                    with contextlib.suppress(OSError):
                        conn.sendall(b'{"error": "the zygote has threads; it cannot fork"}\n')
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:  # the child: drop the server's descriptors, run the request
                    sel.close()
                    listener.close()
                    for pidfd, (_, other) in waiting.items():
                        os.close(pidfd)
                        other.close()
                    conn.close()
                    return request
                pidfd = os.pidfd_open(pid)
                waiting[pidfd] = (pid, conn)
                sel.register(pidfd, selectors.EVENT_READ, "exit")
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            else:  # a child ended
                pidfd = key.fd
                sel.unregister(pidfd)
                os.close(pidfd)
                pid, conn = waiting.pop(pidfd)
                _, status = os.waitpid(pid, 0)
                code = os.waitstatus_to_exitcode(status)
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
                conn.close()


def _become(request: _Request) -> None:
    """Turn this forked child into the process ``python -m meshfl ARGS`` would be."""
    os.setsid()
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if request.append else os.O_TRUNC)
    log = os.open(request.log, flags, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    sys.argv = ["meshfl", *request.args]
    # ps, pkill -f and psutil's cmdline() show the agent's command, not the zygote's.
    setproctitle(_title(request))
    _reseed()


_SECRET_WORDS = frozenset({"token", "key", "secret", "password"})


def _title(request: _Request) -> str:
    """The child's process title: its command, with the values of secret options hidden.

    Any local user can read a process's title (``/proc/PID/cmdline``), so ``--token T``
    and ``--admin-token=T`` show as ``--token ***`` and ``--admin-token=***``: an option
    is secret when the last word of its name is token, key, secret or password.
    """
    if not request.args:
        return f"meshfl {request.call}"
    words, hide_next = ["meshfl"], False
    for arg in request.args:
        name, equals, _ = arg.partition("=")
        secret = name.startswith("--") and name.rsplit("-", 1)[-1] in _SECRET_WORDS
        if hide_next:
            arg = "***"
        elif secret and equals:
            arg = f"{name}=***"
        words.append(arg)
        hide_next = secret and not equals
    return " ".join(words)


def _reseed() -> None:
    """Give the child the random state a freshly started process has."""
    if "numpy" in sys.modules:
        import numpy as np

        np.random.seed()  # legacy global generator: fresh OS entropy, as at start-up
    if "torch" in sys.modules:
        import torch

        torch.seed()  # a fresh process seeds torch's default generator from the OS


def first_draws() -> dict[str, float]:
    """The first draw of Python's, numpy's and torch's global generators in this process.

    Called in forked children (:meth:`meshfl.app.local.zygote.Zygote.call`) to check that each
    starts with the random state a fresh process has.
    """
    import random

    import numpy as np
    import torch

    return {
        "random": random.random(),
        "numpy": float(np.random.random()),
        "torch": float(torch.rand(1).item()),
    }


def main(argv: list[str]) -> NoReturn:
    """``python -m meshfl.app.local.zygote SOCKET``: serve; in a child, run its command."""
    # setproctitle finds argv's memory through the environment it starts with: here,
    # before a child clears the environment for its own.
    setproctitle(getproctitle())
    request = serve(argv[0])
    if request is None:  # told to stop: nothing to finalise, and torch's teardown is slow
        sys.stdout.flush()
        os._exit(0)
    _become(request)
    code: int | None
    try:
        code = _run_call(request) if request.call is not None else _run_command(request)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int | None) else 1
        if code is not exc.code:  # sys.exit("message"): printed, as the interpreter does
            print(exc.code, file=sys.stderr)
    except BaseException:  # what the interpreter would print before exiting with 1
        traceback.print_exc()
        code = 1
    _leave(code or 0)


def _run_command(request: _Request) -> int:
    from meshfl.app.cli import main as meshfl_main

    meshfl_main(request.args)
    return 0


def _leave(code: int) -> NoReturn:
    """End a forked child as the interpreter's exit would, without tearing modules down.

    The interpreter's exit, step by step: ``threading._shutdown`` (the threading module's
    exit hooks — ``concurrent.futures`` stops its idle pools there — then every
    non-daemon thread joined), the ``atexit`` handlers (logging's final flush,
    ``weakref.finalize`` callbacks), stdio flushed. Then the interpreter would finalise
    every module, which with torch loaded took about a second of CPU per process (0.87 s
    against 0.05 s for this, measured on a forked child of the zygote): eight agents and
    the report's ONNX check at the end of every ``meshfl local`` run. The one effect of
    that teardown kept here: files the child opened and left open are flushed, as their
    finalizers would (objects the zygote made before forking are frozen out of
    ``gc.get_objects``, so the scan sees only the child's own).
    """
    getattr(threading, "_shutdown")()  # noqa: B009 (private: the interpreter's own step)
    atexit._run_exitfuncs()
    for obj in gc.get_objects():
        if isinstance(obj, io.BufferedWriter | io.BufferedRandom | io.TextIOWrapper):
            with contextlib.suppress(Exception):
                if not obj.closed:
                    obj.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _run_call(request: _Request) -> int:
    """Call ``module:function(**kwargs)``; write its JSON result to ``request.result``."""
    assert request.call is not None and request.result is not None
    module, _, name = request.call.partition(":")
    function = getattr(importlib.import_module(module), name)
    value = function(**(request.kwargs or {}))
    data = json.dumps(value, allow_nan=True).encode()
    partial = Path(request.result + ".partial")
    partial.write_bytes(data)
    partial.replace(request.result)
    return 0


if __name__ == "__main__":
    main(sys.argv[1:])
