"""ONNX export (models.onnx), torch-free inference (edge_agent.onnx_infer), agent export."""

from __future__ import annotations

import hashlib
import io
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edge_agent.onnx_infer import OnnxModel
from edge_agent.trainer import Trainer
from meshfl.errors import ConfigError, DataError
from meshfl.modelspec import DEFAULT_HIDDEN
from models.arrays import to_arrays
from models.datasets import load_digits_split
from models.onnx import INPUT_NAME, OUTPUT_NAME, export_onnx, parity, torch_logits
from models.zoo import MODELS, build_model

_IMAGE_MODELS = {"lenet", "resnet"}


def w1_like(name: str) -> dict[str, Any]:
    """W1's sizes (64 features, 10 classes) for any zoo model; 2-D models read 8×8."""
    spec: dict[str, Any] = {
        "name": name, "input_dim": 64, "num_classes": 10, "hidden": DEFAULT_HIDDEN[name],
    }  # fmt: skip
    if name in _IMAGE_MODELS:
        spec["image_shape"] = [1, 8, 8]
    return spec


@pytest.fixture(scope="module")
def w1_test() -> tuple[np.ndarray, np.ndarray]:
    split = load_digits_split(0)
    return split.x_test, split.y_test


@pytest.mark.parametrize("name", MODELS)
def test_every_zoo_model_exports_with_parity(
    name: str, tmp_path: Path, w1_test: tuple[np.ndarray, np.ndarray]
) -> None:
    model = build_model(w1_like(name), seed=3)  # type: ignore[arg-type]
    random = np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32)

    path = export_onnx(model, tmp_path / f"{name}.onnx", 64)

    assert parity(model, path, random) <= 1e-5
    assert parity(model, path, w1_test[0]) <= 1e-5
    loaded = OnnxModel(path)
    assert (loaded.input_dim, loaded.num_classes) == (64, 10)


def test_the_graph_has_the_meshfl_signature_and_a_dynamic_batch(tmp_path: Path) -> None:
    model = build_model(w1_like("mlp"), seed=0)  # type: ignore[arg-type]
    path = export_onnx(model, tmp_path / "sub" / "m.onnx", 64)
    loaded = OnnxModel(path)
    session = loaded._session

    assert [i.name for i in session.get_inputs()] == [INPUT_NAME]
    assert [o.name for o in session.get_outputs()] == [OUTPUT_NAME]
    for n in (1, 3, 257):  # neither 2 (the export example) nor a fixed size
        x = np.random.default_rng(n).normal(size=(n, 64)).astype(np.float32)
        np.testing.assert_allclose(loaded.logits(x), torch_logits(model, x), atol=1e-5)
    assert loaded.logits(np.zeros((0, 64), np.float32)).shape == (0, 10)


def test_export_is_deterministic_and_leaves_the_module_alone(tmp_path: Path) -> None:
    model = build_model(w1_like("cnn1d") | {"input_dim": 40}, seed=1)  # type: ignore[arg-type]
    before = to_arrays(model)

    a = export_onnx(model, tmp_path / "a.onnx", 40).read_bytes()
    b = export_onnx(model, tmp_path / "b.onnx", 40).read_bytes()

    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    assert model.training  # back in the mode it was in
    for name, array in to_arrays(model).items():
        np.testing.assert_array_equal(array, before[name])
    assert OnnxModel(tmp_path / "a.onnx").sha256 == hashlib.sha256(a).hexdigest()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_the_torch_export_based_exporter_also_gives_parity(tmp_path: Path) -> None:
    import onnxscript  # noqa: F401  (a dependency: its absence is a broken install)

    model = build_model(w1_like("mlp"), seed=0)  # type: ignore[arg-type]
    x = np.random.default_rng(1).normal(size=(16, 64)).astype(np.float32)

    path = export_onnx(model, tmp_path / "d.onnx", 64, exporter="dynamo")

    assert parity(model, path, x) <= 1e-5


def test_predict_gives_torchs_argmax_and_probabilities(
    tmp_path: Path, w1_test: tuple[np.ndarray, np.ndarray]
) -> None:
    model = build_model(w1_like("lenet"), seed=5)  # type: ignore[arg-type]
    path = export_onnx(model, tmp_path / "m.onnx", 64)
    x = w1_test[0]

    labels, probabilities = OnnxModel(path).predict(x)

    expected = torch.softmax(torch.from_numpy(torch_logits(model, x)), dim=1).numpy()
    assert labels.dtype == np.int64 and labels.shape == (len(x),)
    assert probabilities.dtype == np.float32 and probabilities.shape == (len(x), 10)
    np.testing.assert_allclose(probabilities, expected, atol=1e-6)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(labels, torch_logits(model, x).argmax(axis=1))


def test_a_missing_or_corrupt_model_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"not a protobuf at all")

    with pytest.raises(ConfigError, match="no such model file") as missing:
        OnnxModel(tmp_path / "nope.onnx")
    with pytest.raises(ConfigError, match="not a valid ONNX model") as corrupt:
        OnnxModel(tmp_path / "bad.onnx")

    for error in (missing.value, corrupt.value):
        assert "\n" not in str(error) and str(tmp_path) in str(error)


def test_a_model_without_the_meshfl_signature_is_refused(tmp_path: Path) -> None:
    class TwoOutputs(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, x + 1

    path = tmp_path / "other.onnx"
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(TwoOutputs(), (torch.zeros(2, 4),), buffer, dynamo=False,
                          input_names=["x"], output_names=["a", "b"])  # fmt: skip
    path.write_bytes(buffer.getvalue())

    with pytest.raises(ConfigError, match="not a meshfl classifier"):
        OnnxModel(path)


@pytest.mark.parametrize("name", MODELS)
def test_the_coordinator_checks_an_upload_against_the_jobs_zoo_model(
    name: str, tmp_path: Path
) -> None:
    import onnx

    from coordinator.artifacts import check_job_model
    from coordinator.consensus import ConsensusError
    from meshfl.modelspec import layout

    spec = w1_like(name)
    path = export_onnx(build_model(spec, seed=0), tmp_path / "m.onnx", 64)  # type: ignore[arg-type]
    exported = onnx.load(str(path))
    kept = {t.name for t in exported.graph.initializer} & {n for n, _, _ in layout(spec)}
    assert kept  # the exporter keeps state_dict names, so the shapes are compared

    check_job_model(exported, spec)
    wider = {**spec, "hidden": [h + 1 for h in spec["hidden"]] or spec["hidden"]}
    for other, words in (({**spec, "num_classes": 9}, "output shape"),
                         ({**spec, "input_dim": 49, "image_shape": [1, 7, 7]}, "input shape"),
                         (wider, "upload the model trained for this job")):  # fmt: skip
        if other == spec:
            continue
        with pytest.raises(ConsensusError, match=words):
            check_job_model(exported, other)


def test_a_model_with_a_fixed_batch_axis_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "fixedbatch.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.nn.Linear(64, 10), (torch.zeros(1, 64),), str(path),
                          input_names=["input"], output_names=["logits"], dynamo=False)  # fmt: skip

    with pytest.raises(ConfigError, match="batch axis is fixed at 1") as info:
        OnnxModel(path)

    assert "\n" not in str(info.value) and "export_onnx" in str(info.value)


def test_an_onnxruntime_failure_while_running_is_one_line(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    indices = numpy_helper.from_array(np.array([0, 1, 5], np.int64), "columns")
    graph = helper.make_graph(  # column 5 of 4: onnxruntime fails only when it runs
        [helper.make_node("Gather", ["input", "columns"], ["logits"], axis=1)],
        "out-of-bounds",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        [indices],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = OnnxModel(path)

    with pytest.raises(DataError, match=r"m.onnx failed on inputs of shape \(3, 4\)") as info:
        loaded.predict(np.zeros((3, 4)))

    assert "\n" not in str(info.value)


def test_inputs_of_the_wrong_width_are_a_data_error(tmp_path: Path) -> None:
    model = build_model(w1_like("logreg"), seed=0)  # type: ignore[arg-type]
    loaded = OnnxModel(export_onnx(model, tmp_path / "m.onnx", 64))

    with pytest.raises(DataError, match=r"40 features per sample .* takes 64"):
        loaded.predict(np.zeros((3, 40), np.float32))
    with pytest.raises(DataError, match="not numbers"):
        loaded.predict(np.array([["a"] * 64]))
    assert loaded.predict(np.zeros((2, 8, 8)))[0].shape == (2,)  # images are flattened


def test_the_trainer_exports_its_model_with_parity(
    tmp_path: Path, w1_test: tuple[np.ndarray, np.ndarray]
) -> None:
    split = load_digits_split(0)
    trainer = Trainer(w1_like("mlp"), seed=0, learning_rate=0.1, batch_size=32,  # type: ignore[arg-type]
                      local_epochs=1)  # fmt: skip
    trainer.train(split.x_train[:256], split.y_train[:256])

    diff = trainer.export_onnx(tmp_path / "model.onnx", w1_test[0])

    assert diff is not None and 0 <= diff <= 1e-5
    assert trainer.export_onnx(tmp_path / "again.onnx") is None  # no inputs: not measured
    ours = OnnxModel(tmp_path / "model.onnx").predict(w1_test[0])[0]
    torch_acc, _ = trainer.evaluate(*w1_test)
    assert float(np.mean(ours == w1_test[1])) == pytest.approx(torch_acc, abs=1e-12)


def test_a_failed_export_keeps_the_job_result(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from edge_agent.final_model import export_onnx

    trainer = Trainer(w1_like("mlp"), seed=0, learning_rate=0.1, batch_size=32,  # type: ignore[arg-type]
                      local_epochs=1)  # fmt: skip
    x = np.zeros((4, 64), np.float32)

    def broken(path: Path, x: np.ndarray | None = None) -> float | None:
        raise RuntimeError("exporter exploded")

    ok_path, ok_diff = export_onnx(trainer, tmp_path / "model.onnx", x)
    trainer.export_onnx = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="meshfl.agent.job"):
        bad = export_onnx(trainer, tmp_path / "other.onnx", x)

    assert ok_path == str((tmp_path / "model.onnx").resolve()) and ok_diff is not None
    assert ok_diff <= 1e-5
    assert bad == (None, None)
    assert "exporter exploded" in caplog.text
