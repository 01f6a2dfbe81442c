"""``meshfl predict`` end to end: the CLI, its accuracy against torch, an install without it."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from packaging.requirements import Requirement

from edge_agent.trainer import Trainer
from models.datasets import load_digits_split
from models.onnx import torch_logits

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
W1_SPEC = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}


def meshfl(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([python, "-m", "meshfl", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)  # fmt: skip


@pytest.fixture(scope="module")
def w1_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    """A briefly trained W1 model as ONNX, W1's test set as .npz, torch's predictions."""
    out = tmp_path_factory.mktemp("w1")
    split = load_digits_split(0)
    trainer = Trainer(W1_SPEC, seed=0, learning_rate=0.1, batch_size=32, local_epochs=2)  # type: ignore[arg-type]
    trainer.train(split.x_train, split.y_train)
    assert trainer.export_onnx(out / "model.onnx", split.x_test) is not None
    np.savez(out / "test.npz", x=split.x_test, y=split.y_test)
    torch_labels = torch_logits(trainer._model, split.x_test).argmax(axis=1)
    return out / "model.onnx", out / "test.npz", torch_labels


def test_predict_matches_torch_on_w1s_test_set(
    w1_model: tuple[Path, Path, np.ndarray], tmp_path: Path
) -> None:
    model, test, torch_labels = w1_model
    y = np.load(test)["y"]

    proc = meshfl("predict", "--model", str(model), "--input", str(test), "--json")
    text = meshfl("predict", "--model", str(model), "--input", str(test),
                  "--output", str(tmp_path / "p.npz"))  # fmt: skip

    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    np.testing.assert_array_equal(summary["predictions"], torch_labels)
    assert summary["accuracy"] == float(np.mean(torch_labels == y))
    assert summary["accuracy"] > 0.8  # trained: far above chance (0.1)
    assert (summary["samples"], summary["input_dim"], summary["num_classes"]) == (360, 64, 10)
    assert text.returncode == 0, text.stderr
    assert f"accuracy {summary['accuracy']:.4f}" in text.stdout
    with np.load(tmp_path / "p.npz") as archive:
        np.testing.assert_array_equal(archive["predictions"], torch_labels)


def test_a_bad_model_or_input_is_one_line_and_exit_2(
    w1_model: tuple[Path, Path, np.ndarray], tmp_path: Path
) -> None:
    model, test, _ = w1_model
    np.savez(tmp_path / "narrow.npz", x=np.zeros((3, 40)))
    fixed = tmp_path / "fixedbatch.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.nn.Linear(64, 10), (torch.zeros(1, 64),), str(fixed),
                          input_names=["input"], output_names=["logits"], dynamo=False)  # fmt: skip

    cases = [
        meshfl("predict", "--model", str(tmp_path / "none.onnx"), "--input", str(test)),
        meshfl("predict", "--model", str(test), "--input", str(test)),
        meshfl("predict", "--model", str(model), "--input", str(tmp_path / "narrow.npz")),
        meshfl("predict", "--model", str(fixed), "--input", str(test)),
    ]
    expected = ["no such model file", "not a valid ONNX", "takes 64", "batch axis is fixed at 1"]

    for proc, what in zip(cases, expected, strict=True):
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and what in proc.stderr
        assert "Traceback" not in proc.stderr


def _closure(requirements: list[str]) -> set[str]:
    """Installed distributions needed by ``requirements`` (markers evaluated, no extras)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        dist = metadata.distribution(req.name)
        name = dist.metadata["Name"].lower()
        if name in seen:
            continue
        seen.add(name)
        todo += [Requirement(r) for r in dist.requires or []]
    return seen


def _venv_without_torch(where: Path) -> str:
    """A virtual environment with meshfl's core and ``infer`` dependencies, and no torch.

    The distributions are the ones installed here (no download), linked into a folder
    the new environment reads through a ``.pth`` file, as is the repository.
    """
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dists = _closure(project["dependencies"] + project["optional-dependencies"]["infer"])
    assert "torch" not in dists
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where / "venv")],
                   check=True, timeout=120)  # fmt: skip
    python = where / "venv" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    staged = where / "staged"
    staged.mkdir()
    for dist in dists:
        for file in metadata.distribution(dist).files or []:
            top = file.parts[0]
            source = Path(str(file.locate())).parents[len(file.parts) - 1]
            target = staged / top
            if top != ".." and not target.exists() and (source / top).exists():
                target.symlink_to(source / top)
    (Path(site) / "meshfl-test.pth").write_text(f"{staged}\n{ROOT}\n")
    return str(python)


def test_predict_runs_where_torch_is_not_installed(
    w1_model: tuple[Path, Path, np.ndarray], tmp_path: Path
) -> None:
    model, test, torch_labels = w1_model
    python = _venv_without_torch(tmp_path)

    no_torch = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    has_ort = subprocess.run([python, "-c", "import onnxruntime, numpy"], capture_output=True)
    proc = meshfl("predict", "--model", str(model), "--input", str(test), "--json",
                  python=python)  # fmt: skip

    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    assert has_ort.returncode == 0
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(json.loads(proc.stdout)["predictions"], torch_labels)
