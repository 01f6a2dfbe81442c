"""The agents' zygote (issue 24, item 1): agents forked from one process that imported
torch once are still processes of their own, with a fresh process's random state."""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from broker.ports import free_port
from meshfl.app.local.processes import Supervisor, wait_for_port
from meshfl.app.local.zygote import ForkedProcess, Zygote
from meshfl.app.local.zygote_server import PRELOAD


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    handle = Zygote(tmp_path_factory.mktemp("zygote"))
    yield handle
    handle.stop()
    assert handle.process.returncode == 0, handle.log_path.read_text()


def test_a_forked_child_has_its_own_pid_session_and_log_and_a_sigkill_ends_it(
    zygote: Zygote, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "broker.log"
    child = zygote.spawn(["broker", "serve", "--port", str(port)], log, dict(os.environ))
    try:
        wait_for_port("127.0.0.1", port, 60.0)
        process = psutil.Process(child.pid)
        assert child.pid != zygote.process.pid
        assert process.ppid() == zygote.process.pid  # forked, not started from scratch
        assert os.getsid(child.pid) == child.pid  # its own session, as start_new_session
        # ps and pkill -f see its command, not the zygote's
        title = " ".join(process.cmdline()).split()  # one string, padded with empty ones
        assert title == ["meshfl", "broker", "serve", "--port", str(port)]
        assert process.num_threads() >= 1 and child.poll() is None
    finally:
        os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL  # as subprocess.Popen reports it
    assert child.poll() == -signal.SIGKILL
    assert log.is_file()  # its stdout and stderr (what it wrote: the next test reads it)


def test_the_supervisor_forks_agents_and_restarts_them_with_the_same_arguments(
    zygote: Zygote, tmp_path: Path
) -> None:
    supervisor = Supervisor(tmp_path / "logs", zygote=zygote)
    args = ["agent", "run", "--coordinator", "http://127.0.0.1:9", "--token", "t",
            "--data", str(tmp_path / "none.npz"), "--slowdown", "0.5"]  # fmt: skip
    child = supervisor.start("device-1", args)
    assert isinstance(child.process, ForkedProcess)
    assert child.process.wait(timeout=60) == 2
    assert "--slowdown must be a finite number >= 1" in child.last_line()
    again = supervisor.restart("device-1")
    assert isinstance(again.process, ForkedProcess)
    assert again.process.pid != child.process.pid
    assert again.process.wait(timeout=60) == 2
    assert (tmp_path / "logs" / "device-1.log").read_text().count("--slowdown must") == 2
    supervisor.zygote = None  # the module's zygote outlives this supervisor
    supervisor.stop_all()


def test_each_child_starts_with_a_fresh_process_random_state(
    zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = "meshfl.app.local.zygote_server:first_draws"
    first = zygote.call(target, {}, tmp_path / "a.log", timeout_s=60)
    second = zygote.call(target, {}, tmp_path / "b.log", timeout_s=60)
    assert first["random"] != second["random"]  # Python's random reseeds at fork
    assert first["numpy"] != second["numpy"]  # numpy's global generator: fresh entropy
    assert first["torch"] != second["torch"]  # torch's default generator: seeded from the OS
    monkeypatch.setenv("MESHFL_ZYGOTE_TEST", "from the launcher")
    assert zygote.call("os:getenv", {"key": "MESHFL_ZYGOTE_TEST"}, tmp_path / "c.log", 60) == (
        "from the launcher"
    )
    assert zygote.call("os:getpid", {}, tmp_path / "d.log", 60) != zygote.process.pid


def test_a_failed_call_names_its_error(zygote: Zygote, tmp_path: Path) -> None:
    from meshfl.errors import MeshflError

    with pytest.raises(MeshflError, match="ModuleNotFoundError"):
        zygote.call("no_such_module:f", {}, tmp_path / "e.log", timeout_s=60)


def test_a_call_whose_log_cannot_be_written_fails_as_a_meshfl_error(
    zygote: Zygote, tmp_path: Path
) -> None:
    # A run's logs folder that became unwritable: the child cannot open its log, and the
    # launcher then reads no log either; meshfl local must go on (report_section falls
    # back), so this is a MeshflError, never an OSError.
    from meshfl.errors import MeshflError

    with pytest.raises(MeshflError, match=r"json:loads failed .* is unreadable"):
        zygote.call("json:loads", {"s": "1"}, tmp_path / "gone" / "x.log", timeout_s=60)


def test_every_preloaded_module_exists() -> None:
    # The zygote skips a module that does not import (an extra not installed) with one
    # line in its log; a renamed module would silently cost every forked agent its import.
    missing = [name for name in PRELOAD if importlib.util.find_spec(name) is None]
    assert missing == []


def test_a_forked_child_exits_with_its_code_and_its_output_in_its_log(
    zygote: Zygote, tmp_path: Path
) -> None:
    # A child ends without the interpreter's module teardown (zygote_server._leave): its
    # exit code and everything it printed (here without a newline) still come out.
    log = tmp_path / "print.log"
    assert zygote.call("builtins:print", {"end": "left in the buffer"}, log, 60) is None
    assert log.read_text() == "left in the buffer"
    bad = zygote.spawn(["no-such-command"], tmp_path / "bad.log", dict(os.environ))
    assert bad.wait(timeout=60) == 2  # Click's usage error
    assert "no-such-command" in (tmp_path / "bad.log").read_text()


_EXIT_PROBE = """
from concurrent.futures import ThreadPoolExecutor

POOL = ThreadPoolExecutor(max_workers=1)
KEPT = []


def leave_open(path):
    POOL.submit(int).result()  # an idle worker thread, its pool never shut down
    KEPT.append(open(path, "w"))  # noqa: SIM115
    KEPT[0].write("x" * 100)  # buffered, never flushed nor closed
"""


def test_a_child_with_a_live_thread_pool_and_an_open_file_exits_and_keeps_what_it_wrote(
    tmp_path: Path,
) -> None:
    # The interpreter's exit stops idle concurrent.futures pools and flushes open files;
    # a forked child's shorter exit (zygote_server._leave) must too, or it hangs.
    module = tmp_path / "mod"
    module.mkdir()
    (module / "exit_probe.py").write_text(_EXIT_PROBE)
    env = {**os.environ, "PYTHONPATH": str(module), "PYTHONUNBUFFERED": "1"}
    zygote = Zygote(tmp_path / "zygote", env=env)
    try:
        kept = tmp_path / "kept.txt"
        zygote.call("exit_probe:leave_open", {"path": str(kept)}, tmp_path / "c.log", 60)
    finally:
        zygote.stop()
    assert kept.read_text() == "x" * 100


def test_a_signal_during_cleanup_is_held_until_the_cleanup_is_done() -> None:
    from meshfl.app.local.processes import uninterrupted

    # Python's own Ctrl-C handler (a pytest-xdist worker ignores SIGINT, which the block
    # would leave ignored, as under nohup).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        done = []
        with pytest.raises(KeyboardInterrupt), uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the cleanup
            time.sleep(0.05)
            done.append("every process stopped")
        assert done == ["every process stopped"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_child_s_process_title_hides_the_values_of_secret_options() -> None:
    from meshfl.app.local.zygote_server import _Request, _title

    args = ["agent", "run", "--token", "T0", "--keepalive", "5", "--admin-token=T1",
            "--tls-key", "k.pem", "--name", "device-0"]  # fmt: skip
    request = _Request(args=args, env={}, cwd="/", log="x.log", append=False)

    assert _title(request) == (
        "meshfl agent run --token *** --keepalive 5 --admin-token=*** --tls-key *** --name device-0"
    )
