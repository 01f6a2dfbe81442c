"""Model zoo and the state_dict ⇄ arrays layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import models
from meshfl.errors import ConfigError
from models.arrays import load_arrays, spec_hash, to_arrays
from models.zoo import MODELS, build_model

W1 = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}


def test_package_exports():
    """Every public module of the package is listed, in order, and imports."""
    import importlib
    from pathlib import Path

    here = Path(models.__file__).parent
    public = sorted(p.stem for p in here.glob("*.py") if not p.stem.startswith("_"))
    assert models.__all__ == public
    for name in public:
        importlib.import_module(f"models.{name}")


def test_w1_mlp_has_4810_float32_parameters():
    model = build_model(W1, seed=0)
    arrays = to_arrays(model)
    assert sum(a.size for a in arrays.values()) == 64 * 64 + 64 + 64 * 10 + 10 == 4810
    assert all(a.dtype == np.float32 for a in arrays.values())
    assert model(torch.zeros(3, 64)).shape == (3, 10)


def test_same_seed_same_weights_different_seed_different():
    a, b, c = (to_arrays(build_model(W1, seed=s)) for s in (7, 7, 8))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert any(not np.array_equal(a[n], c[n]) for n in a)


def test_build_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    build_model(W1, seed=5)
    torch.testing.assert_close(torch.rand(4), expected)


def test_init_bounds_follow_fan_in():
    arrays = to_arrays(build_model(W1, seed=0))
    bound = 1 / np.sqrt(64)
    assert np.abs(arrays["0.weight"]).max() <= bound
    assert arrays["0.weight"].std() > bound / 3


def test_unknown_model_lists_known_models():
    with pytest.raises(ConfigError, match="known models: " + ", ".join(MODELS)):
        build_model({**W1, "name": "transformer"}, seed=0)


@pytest.mark.parametrize("field,value", [("input_dim", 0), ("num_classes", "10"), ("hidden", [0])])
def test_bad_sizes_raise_config_error(field, value):
    with pytest.raises(ConfigError, match=field):
        build_model({**W1, field: value}, seed=0)


def test_deeper_mlp_layout():
    model = build_model({**W1, "hidden": [32, 16]}, seed=0)
    shapes = [a.shape for a in to_arrays(model).values()]
    assert shapes == [(32, 64), (32,), (16, 32), (16,), (10, 16), (10,)]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), scale=st.floats(-10, 10))
def test_arrays_round_trip(seed, scale):
    source = to_arrays(build_model(W1, seed=seed))
    wanted = {k: (v * np.float32(scale)).astype(np.float32) for k, v in source.items()}
    target = build_model(W1, seed=0)
    load_arrays(target, wanted)
    got = to_arrays(target)
    assert list(got) == list(wanted)
    for name in wanted:
        np.testing.assert_array_equal(got[name], wanted[name])


def test_to_arrays_are_copies():
    model = build_model(W1, seed=0)
    arrays = to_arrays(model)
    arrays["0.bias"][:] = 99.0
    assert float(model.state_dict()["0.bias"].max()) < 1.0


def test_load_arrays_rejects_mismatch_and_leaves_model_unchanged():
    model = build_model(W1, seed=0)
    before = to_arrays(model)
    good = to_arrays(build_model(W1, seed=1))
    bad_shape = {**good, "2.weight": np.zeros((10, 65), np.float32)}
    with pytest.raises(ConfigError, match=r"'2.weight' has shape \(10, 65\)"):
        load_arrays(model, bad_shape)
    missing = {k: v for k, v in good.items() if k != "0.bias"}
    with pytest.raises(ConfigError, match=r"'0\.bias' is missing"):
        load_arrays(model, missing)
    with pytest.raises(ConfigError, match="'extra' is not a parameter"):
        load_arrays(model, {**good, "extra": np.zeros(1)})
    for name, value in to_arrays(model).items():
        np.testing.assert_array_equal(value, before[name])


def test_spec_hash_ignores_weights_and_sees_layout():
    a, b = build_model(W1, seed=0), build_model(W1, seed=1)
    h = spec_hash(a)
    assert len(h) == 64 and h == spec_hash(b) == spec_hash(to_arrays(a))
    assert h != spec_hash(build_model({**W1, "hidden": [32]}, seed=0))
    as_f64 = {k: v.astype(np.float64) for k, v in to_arrays(a).items()}
    assert spec_hash(as_f64) != h
    assert spec_hash(build_model(W1, seed=0)) == h  # stable across builds
