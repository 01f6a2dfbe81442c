"""The ``onnx`` section of a local run's report: the consensus model and parity failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.onnx_infer import OnnxModel
from meshfl.app.local.onnx_report import consensus_line, mean_arrays, onnx_section
from meshfl.errors import ConfigError
from models.arrays import load_arrays, to_arrays
from models.onnx import torch_logits
from models.zoo import build_model

SPEC: Any = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [16]}


def device(name: str, **extra: Any) -> dict[str, Any]:
    entry = {"name": name, "done": True, "error": None, "left_round": None,
             "onnx_path": f"/x/{name}/model.onnx", "onnx_max_abs_diff": 1e-7}  # fmt: skip
    return entry | extra


def write_models(models_dir: Path, names: list[str]) -> list[dict[str, np.ndarray]]:
    params = []
    for seed, name in enumerate(names):
        arrays = to_arrays(build_model(SPEC, seed))
        (models_dir / "job-1" / name).mkdir(parents=True)
        np.savez(models_dir / "job-1" / name / "model.npz", **arrays)  # type: ignore[arg-type]
        params.append(arrays)
    return params


def test_the_tolerance_is_the_exporters() -> None:
    from meshfl.app.local import onnx_report
    from models import onnx

    assert onnx_report.PARITY_TOLERANCE == onnx.PARITY_TOLERANCE == 1e-5


def test_mean_arrays_is_the_elementwise_mean() -> None:
    a = {"w": np.array([1.0, 2.0], np.float32), "b": np.zeros(1, np.float32)}
    b = {"w": np.array([3.0, 6.0], np.float32), "b": np.ones(1, np.float32)}

    mean = mean_arrays([a, b])

    np.testing.assert_array_equal(mean["w"], [2.0, 4.0])
    np.testing.assert_array_equal(mean["b"], [0.5])
    assert mean["w"].dtype == np.float32
    with pytest.raises(ConfigError, match="'w'"):
        mean_arrays([a, {"w": np.zeros(3, np.float32), "b": b["b"]}])
    with pytest.raises(ConfigError, match="no final model"):
        mean_arrays([])


def test_the_consensus_averages_the_finishers_and_names_the_others(tmp_path: Path) -> None:
    params = write_models(tmp_path / "models", ["device-0", "device-1", "device-2"])
    job: Any = {"job_id": "job-1", "devices": [
        device("device-0"), device("device-1"),
        device("device-2", left_round=4, done=True),
        device("device-3", done=False, onnx_path=None, onnx_max_abs_diff=None),
    ]}  # fmt: skip
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 64)).astype(np.float32)
    y = rng.integers(0, 10, 50)

    section = onnx_section(job, SPEC, x, y, tmp_path / "models", tmp_path, {"device-3": "died"})

    c = section["consensus"]
    assert c["devices"] == ["device-0", "device-1"]
    assert c["excluded"] == [
        {"name": "device-2", "why": "left at round 4"},
        {"name": "device-3", "why": "died"},
    ]
    expected = build_model(SPEC, 0)
    load_arrays(expected, mean_arrays(params[:2]))
    labels = torch_logits(expected, x).argmax(axis=1)
    assert c["accuracy_torch"] == c["accuracy_onnx"] == pytest.approx(np.mean(labels == y))
    assert c["ok"] and c["max_abs_diff"] <= 1e-5
    np.testing.assert_array_equal(OnnxModel(Path(c["path"])).predict(x)[0], labels)
    assert section["failures"] == []  # device-3 is excluded, not a parity failure
    line = consensus_line(section)
    assert line.startswith(f"consensus model: {tmp_path / 'consensus.onnx'}, accuracy ")
    assert "ONNX parity" in line and "device-3 (died)" in line


def test_a_parity_violation_or_a_missing_export_is_a_failure(tmp_path: Path) -> None:
    write_models(tmp_path / "models", ["device-0", "device-1"])
    job: Any = {"job_id": "job-1", "devices": [
        device("device-0", onnx_max_abs_diff=3e-4),
        device("device-1", onnx_path=None, onnx_max_abs_diff=None),
    ]}  # fmt: skip
    x = np.zeros((4, 64), np.float32)

    section = onnx_section(job, SPEC, x, np.zeros(4, np.int64), tmp_path / "models", tmp_path, {})

    assert section["failures"] == [
        "device-0: ONNX parity 0.0003 > 1e-05",
        "device-1: no ONNX export reported",
    ]
    assert [d["ok"] for d in section["devices"]] == [False, False]
    assert section["consensus"]["ok"]  # the consensus itself exported fine


def test_a_consensus_that_cannot_be_built_is_reported_not_raised(tmp_path: Path) -> None:
    job: Any = {"job_id": "job-1", "devices": [device("device-0")]}  # no model.npz on disk

    section = onnx_section(job, SPEC, np.zeros((2, 64), np.float32), np.zeros(2, np.int64),
                           tmp_path / "models", tmp_path, {})  # fmt: skip

    assert "final model missing" in section["consensus"]["error"]
    assert section["failures"][-1].startswith("consensus: DataError")
    assert consensus_line(section).startswith("consensus model: not exported")
