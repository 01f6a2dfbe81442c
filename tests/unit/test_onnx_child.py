"""The agent's end-of-job ONNX export runs in a short child (issue 24, item 5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from meshfl.errors import ConfigError
from models.onnx import PARITY_TOLERANCE, export_checked
from models.zoo import build_model

SPEC = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}

CALLER = """
import json, resource, sys
from pathlib import Path
import numpy as np, torch
torch.set_num_threads(1)
from models.onnx import export_checked
from models.zoo import build_model
model = build_model({spec!r}, 0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
diff = export_checked(model, Path({path!r}), 64, np.random.default_rng(0).random((50, 64)))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"diff": diff, "ort": "onnxruntime" in sys.modules,
                  "grew_kib": after - before}}))
"""


def test_the_export_and_parity_check_leave_nothing_resident_in_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    code = CALLER.format(spec=SPEC, path=str(path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert path.is_file() and result["diff"] <= PARITY_TOLERANCE
    assert result["ort"] is False  # onnxruntime (and its threads) only in the child
    assert result["grew_kib"] < 8 * 1024  # in-process, export + parity add ~60 MiB


def test_an_isolated_export_equals_an_in_process_one(tmp_path: Path) -> None:
    model = build_model(SPEC, 0)
    x = np.random.default_rng(1).random((20, 64)).astype(np.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        forked = export_checked(model, tmp_path / "a.onnx", 64, x)
    finally:
        torch.set_num_threads(threads)
    here = export_checked(model, tmp_path / "b.onnx", 64, x, isolate=False)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert forked == here
    assert export_checked(model, tmp_path / "c.onnx", 64) is None  # no inputs: no parity


def test_an_error_in_the_child_is_raised_in_the_caller(tmp_path: Path) -> None:
    model = build_model(SPEC, 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(ConfigError, match="onnxruntime cannot run"):
            export_checked(model, tmp_path / "m.onnx", 64, np.zeros((3, 5), np.float32))
    finally:
        torch.set_num_threads(threads)


def test_an_agent_thread_of_a_fleet_exports_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import threading

    def no_fork() -> int:
        raise AssertionError("a fleet's agent thread must not fork")

    monkeypatch.setattr(os, "fork", no_fork)
    model = build_model(SPEC, 0)
    x = np.random.default_rng(2).random((10, 64)).astype(np.float32)
    result: dict[str, object] = {}

    def export() -> None:
        try:
            result["diff"] = export_checked(model, tmp_path / "t.onnx", 64, x)
        except AssertionError as error:
            result["error"] = str(error)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        worker = threading.Thread(target=export)
        worker.start()
        worker.join(120)
    finally:
        torch.set_num_threads(threads)
    assert "error" not in result and (tmp_path / "t.onnx").is_file()
    assert isinstance(result["diff"], float) and result["diff"] <= PARITY_TOLERANCE
