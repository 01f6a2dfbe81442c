"""One set of port helpers (broker/ports.py); meshfl local's supervisor waits through it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker import ports
from meshfl.app.local import processes
from meshfl.app.local.processes import Child
from meshfl.errors import MeshflError


def test_the_launcher_uses_the_broker_port_helpers() -> None:
    assert processes.free_port is ports.free_port


def test_wait_for_port_gives_up_when_told_to_stop() -> None:
    port = ports.free_port()  # nothing listens there
    start = time.monotonic()
    assert not ports.wait_for_port("127.0.0.1", port, 30.0, stop=lambda: True)
    assert time.monotonic() - start < 5.0


def test_a_child_that_exits_is_named_not_waited_for(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("meshfl: error: bad config\n")
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    child = Child("coordinator", process, log)
    start = time.monotonic()
    with pytest.raises(MeshflError, match="coordinator exited during start-up: bad config"):
        processes.wait_for_port("127.0.0.1", ports.free_port(), 30.0, alive=child)
    assert time.monotonic() - start < 5.0


def test_a_port_that_never_opens_is_a_meshfl_error() -> None:
    with pytest.raises(MeshflError, match=r"nothing answered on 127\.0\.0\.1"):
        processes.wait_for_port("127.0.0.1", ports.free_port(), 0.1)
