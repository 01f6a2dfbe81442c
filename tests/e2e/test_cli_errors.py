"""User errors end in one line naming the problem and the fix, a non-zero exit, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from broker.ports import free_port

pytestmark = pytest.mark.e2e


def meshfl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meshfl", *args], capture_output=True, text=True, timeout=timeout
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("meshfl: error:")]
    assert len(errors) == 1, proc.stderr
    for word in words:
        assert word in errors[0], errors[0]


def agent(data: Path, coordinator: str = "http://127.0.0.1:9", *extra: str):
    return meshfl("agent", "run", "--coordinator", coordinator, "--token", "t",
                  "--data", str(data), "--name", "dev-a", *extra)  # fmt: skip


def test_missing_data_file(tmp_path: Path) -> None:
    proc = agent(tmp_path / "nope.npz")
    assert_one_line_error(proc, "nope.npz")
    assert proc.returncode == 2


def test_empty_and_malformed_data_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file at all")
    no_label = tmp_path / "nolabel.csv"
    no_label.write_text("a,b\n1,2\n")

    for path in (empty, garbage, no_label):
        assert_one_line_error(agent(path), path.name)


def test_unreachable_coordinator(tmp_path: Path) -> None:
    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((4, 64), np.float32), y=np.zeros(4, np.int64))

    proc = agent(data, f"http://127.0.0.1:{free_port()}")

    assert_one_line_error(proc, "cannot reach the coordinator", "--coordinator")


def test_bad_options_of_meshfl_local(tmp_path: Path) -> None:
    assert_one_line_error(meshfl("local", "--codec", "topk:2", "--out", str(tmp_path)),
                          "topk:2", "valid forms")  # fmt: skip
    assert_one_line_error(meshfl("local", "--topology", "moebius", "--out", str(tmp_path)),
                          "moebius")  # fmt: skip
    assert_one_line_error(meshfl("local", "--dataset", str(tmp_path / "x.csv"),
                                 "--out", str(tmp_path)), "x.csv")  # fmt: skip
    assert_one_line_error(meshfl("local", "--broker", "http://nope", "--out", str(tmp_path),
                                 "--agents", "2", "--rounds", "1"), "broker")  # fmt: skip


def test_a_wrong_width_for_the_model_is_named(tmp_path: Path) -> None:
    data = tmp_path / "wide.csv"
    rows = ["label," + ",".join(f"f{i}" for i in range(40))]
    rows += [f"{i % 10}," + ",".join("0.5" for _ in range(40)) for i in range(60)]
    data.write_text("\n".join(rows) + "\n")

    proc = meshfl("local", "--dataset", str(data), "--agents", "2", "--rounds", "1",
                  "--out", str(tmp_path / "run"), timeout=180)  # fmt: skip

    # a user CSV defines its own model width: this run must simply work
    assert proc.returncode == 0, proc.stderr
