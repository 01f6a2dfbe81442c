"""meshfl.modelspec: layouts and hashes without torch, spec fields, the coordinator's view."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator import CoordinatorSettings, create_app
from meshfl.errors import ConfigError
from meshfl.modelspec import (
    MAX_WIDTH,
    ZOO_MODELS,
    check_hash,
    check_sizes,
    cnn1d_lengths,
    describe,
    from_options,
    image_shape,
    layout,
    layout_hash,
    validate_model_spec,
    with_hash,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

W1 = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}
CUSTOM = {"name": "custom", "factory": "mypkg.nets:make_net", "input_dim": 64,
          "num_classes": 10, "hidden": [], "kwargs": {"width": 32}}  # fmt: skip


def test_layout_hash_is_sha256_of_one_line_per_tensor():
    entries = [("0.weight", (64, 64), "float32"), ("0.bias", (64,), "float32")]
    expected = hashlib.sha256(b"0.weight|64,64|float32\n0.bias|64|float32\n").hexdigest()
    assert layout_hash(entries) == expected


def test_w1_layout_names_shapes_and_order():
    assert layout(W1) == [
        ("0.weight", (64, 64), "float32"), ("0.bias", (64,), "float32"),
        ("2.weight", (10, 64), "float32"), ("2.bias", (10,), "float32"),
    ]  # fmt: skip


def test_cnn1d_lengths_are_w2s():
    assert cnn1d_lengths(40, 3) == [19, 10, 5]


@pytest.mark.parametrize(
    ("fields", "shape"),
    [({"input_dim": 64}, (1, 8, 8)), ({"input_dim": 12, "image_shape": [3, 2, 2]}, (3, 2, 2))],
)
def test_image_shape_default_and_explicit(fields, shape):
    assert image_shape({"name": "lenet", **fields}) == shape


def test_hash_is_stable_across_processes():
    specs = [from_options(name, 64, 10) for name in ZOO_MODELS]
    here = [layout_hash(layout(s)) for s in specs]
    code = (
        "import json, sys; from meshfl.modelspec import layout, layout_hash;"
        "from models.arrays import spec_hash; from models.zoo import build_model;"
        "specs = json.loads(sys.stdin.read());"
        "print(json.dumps([[layout_hash(layout(s)), spec_hash(build_model(s, 7))] for s in specs]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # set/dict ordering must not matter
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(specs), env=env,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    there = json.loads(done.stdout)
    assert [pair[0] for pair in there] == here  # the coordinator's hash, another process
    assert [pair[1] for pair in there] == here  # the agent's hash of the built module


def test_the_kernel_module_needs_no_torch():
    code = (
        "import sys, meshfl.modelspec as m;"
        "m.layout_hash(m.layout(m.from_options('resnet', 64, 10)));"
        "print(sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'models')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({**W1, "image_shape": [1, 8, 4]}, "holds 32 values but input_dim is 64"),
        ({**W1, "image_shape": [8, 8]}, "three positive integers"),
        ({**CUSTOM, "factory": "mypkg/nets.py:make"}, "must be 'package.module:callable'"),
        ({**CUSTOM, "factory": "mypkg.nets"}, "must be 'package.module:callable'"),
        ({**W1, "factory": "mypkg.nets:make_net"}, "must be named 'custom'"),
        ({**W1, "name": "custom"}, "needs a factory"),
        ({**W1, "kwargs": {"a": 1}}, "without a factory"),
        ({**CUSTOM, "kwargs": [1, 2]}, "must be a JSON object"),
        ({**CUSTOM, "kwargs": {"x": float("nan")}}, "JSON values only"),
        ({**CUSTOM, "kwargs": {"x": "y" * 20_000}}, "keep it under"),
        ({**W1, "hash": "ABC"}, "64 lowercase hex"),
    ],
)
def test_bad_spec_fields_are_one_line_errors(spec, message):
    with pytest.raises(ConfigError) as caught:
        validate_model_spec(spec)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_with_hash_fills_zoo_hashes_and_requires_custom_ones():
    assert with_hash(W1)["hash"] == layout_hash(layout(W1))
    assert "hash" not in W1  # a copy
    with pytest.raises(ConfigError, match="'hash' is required for custom model"):
        with_hash(CUSTOM)
    assert with_hash({**CUSTOM, "hash": "0" * 64})["hash"] == "0" * 64
    with pytest.raises(ConfigError, match="does not match mlp"):
        with_hash({**W1, "hash": "0" * 64})


def test_check_hash_passes_equal_and_absent_and_names_a_mismatch():
    built = layout_hash(layout(W1))
    check_hash(W1, "f" * 64)  # no hash in the job: nothing to compare
    check_hash({**W1, "hash": built}, built)
    with pytest.raises(ConfigError) as caught:
        check_hash({**CUSTOM, "hash": "1" * 64}, built)
    assert str(caught.value) == (
        f"model spec hash mismatch: job expects {'1' * 12}…, this device built {built[:12]}…"
        ' from custom mypkg.nets:make_net kwargs {"width": 32} (64→10); install the same'
        " model code (package version) on every device"
    )


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ((0, 10, None), "input_dim = 0 is out of range; it must be an integer in [1, 65536]"),
        ((65_537, 10, None), "input_dim = 65537"),
        ((64, 1, None), "num_classes = 1 is out of range; it must be an integer in [2, 100000]"),
        ((64, 100_001, None), "num_classes = 100001"),
        ((64, 10, [100_000_000]), "hidden width 100000000 is out of range"),
        ((64, 10, [8] * 65), "at most 64 widths"),
    ],
)
def test_sizes_share_one_bound_in_the_kernel(sizes, message):
    input_dim, classes, hidden = sizes
    with pytest.raises(ConfigError) as caught:
        from_options("mlp", input_dim, classes, hidden=hidden)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    check_sizes({"input_dim": MAX_WIDTH, "num_classes": 2, "hidden": [MAX_WIDTH] * 64})


def test_from_options_defaults():
    assert from_options("mlp", 64, 10) == W1
    assert from_options("lenet", 64, 10)["image_shape"] == [1, 8, 8]
    assert from_options("resnet", 64, 10, hidden=[4])["hidden"] == [4]
    custom = from_options("mypkg.nets:make_net", 64, 10, kwargs={"width": 32})
    assert custom == CUSTOM
    with pytest.raises(ConfigError, match="unknown model 'vit'"):
        from_options("vit", 64, 10)
    assert describe(from_options("lenet", 64, 10)) == (
        "lenet (64→10, hidden [6, 16, 120, 84], image_shape [1, 8, 8])"
    )


# --- the coordinator fills and checks model.hash at job creation --------------------------

ADMIN_H = {"Authorization": "Bearer admin-secret"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}", fleet="lab", enrol_token="enrol-secret",
        admin_token="admin-secret", broker_url="mqtt://127.0.0.1:1883",
    )  # fmt: skip
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _job(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "zoo", "model": model, "algorithm": "choco", "codec": "topk:0.1",
        "topology": "ring", "rounds": 2, "learning_rate": 0.05, "batch_size": 32,
        "local_epochs": 1, "consensus_step": 0.5, "round_deadline_s": 30.0,
        "max_payload_bytes": 131072, "seed": 0, "devices": 0, "test_data": None,
        "sketch_dim": 0,
    }  # fmt: skip


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_job_creation_stores_the_zoo_hash(client: TestClient, name: str) -> None:
    model = from_options(name, 64, 10)
    r = client.post("/api/v1/jobs", json=_job(dict(model)), headers=ADMIN_H)
    assert r.status_code == 201, r.text
    stored = client.get(f"/api/v1/jobs/{r.json()['job_id']}", headers=ADMIN_H).json()
    assert stored["spec"]["model"] == {**model, "hash": layout_hash(layout(model))}


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (CUSTOM, "'hash' is required"),
        ({**W1, "name": "lenet", "hidden": [6, 16]}, "4 widths"),
        ({**W1, "name": "resnet", "input_dim": 40}, "not a perfect square"),
        ({**W1, "hash": "0" * 64}, "does not match"),
        ({**W1, "image_shape": [2, 2, 2]}, "holds 8 values"),
        ({**W1, "name": "vit"}, "spec.model.name = 'vit' is unknown"),
        ({**W1, "hidden": [100_000]}, "spec.model is invalid: model hidden width 100000"),
        ({**W1, "num_classes": 1}, "num_classes = 1 is out of range"),
    ],
)
def test_job_creation_refuses_bad_model_specs(client: TestClient, model, message) -> None:
    r = client.post("/api/v1/jobs", json=_job(model), headers=ADMIN_H)
    assert r.status_code == 422
    assert message in r.json()["detail"] and "\n" not in r.json()["detail"]


def test_a_custom_job_with_its_hash_is_stored_as_given(client: TestClient) -> None:
    model = {**CUSTOM, "hash": "c" * 64}
    r = client.post("/api/v1/jobs", json=_job(model), headers=ADMIN_H)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["model"] == model
