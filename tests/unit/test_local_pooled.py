"""The pooled reference of a local run: the agents' trainer on all the devices' data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.trainer import Trainer
from meshfl.app.local import pooled
from meshfl.app.local.pooled import pooled_reference, start_pooled_reference

MODEL = {"name": "mlp", "input_dim": 4, "num_classes": 3, "hidden": [8]}


def _files(tmp_path: Path) -> tuple[list[str], str, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)
    paths = []
    for i, part in enumerate((slice(0, 50), slice(50, 80))):
        path = tmp_path / f"device-{i}.npz"
        np.savez(path, x=x[part], y=y[part])
        paths.append(str(path))
    np.savez(tmp_path / "test.npz", x=x[80:], y=y[80:])
    return paths, str(tmp_path / "test.npz"), x, y


def test_the_reference_is_the_agents_trainer_on_the_union_of_the_devices_data(
    tmp_path: Path,
) -> None:
    files, test, x, y = _files(tmp_path)
    got = pooled_reference(MODEL, files, test, seed=3, learning_rate=0.1, batch_size=8,
                           epochs=4, momentum=0.9)  # fmt: skip
    trainer = Trainer(MODEL, seed=3, learning_rate=0.1, batch_size=8, local_epochs=4, momentum=0.9)
    trainer.train(x[:80], y[:80])
    expected = round(float(trainer.evaluate(x[80:], y[80:])[0]), 4)
    assert got == {"accuracy": expected, "epochs": 4, "samples": 80, "learning_rate": 0.1,
                   "batch_size": 8, "momentum": 0.9, "momentum_kind": "heavy-ball"}  # fmt: skip


def test_a_reference_too_costly_for_a_local_run_is_skipped_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, test, _, _ = _files(tmp_path)
    monkeypatch.setattr(pooled, "MAX_SAMPLE_EPOCHS", 80 * 4 - 1)
    got = pooled_reference(MODEL, files, test, 0, 0.1, 8, epochs=4, momentum=0.0)
    assert got == {
        "skipped": "80 samples × 4 epochs is more than a local run trains for its reference (319)"
    }


def test_in_the_background_it_gives_the_result_or_why_not_and_never_raises(
    tmp_path: Path,
) -> None:
    files, test, _, _ = _files(tmp_path)
    spec = {"model": MODEL, "seed": 1, "learning_rate": 0.1, "batch_size": 8, "rounds": 2,
            "local_epochs": 1, "local_momentum": 0.0}  # fmt: skip
    wait = start_pooled_reference(spec, [Path(f) for f in files], Path(test), None, tmp_path)
    result = wait()
    assert set(result) == {"accuracy", "epochs", "samples", "learning_rate", "batch_size",
                           "momentum", "momentum_kind"}  # fmt: skip
    assert result["epochs"] == 2 and 0.0 <= result["accuracy"] <= 1.0
    missing = start_pooled_reference(spec, [tmp_path / "gone.npz"], Path(test), None, tmp_path)
    why = missing()["skipped"]
    assert why.startswith("failed: ") and "gone.npz" in why
