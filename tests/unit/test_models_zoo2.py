"""The issue-8 zoo (logreg, lenet, resnet next to mlp and cnn1d) and user models by factory."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from meshfl.app.cli import app
from meshfl.errors import ConfigError
from meshfl.modelspec import from_options, layout, layout_hash, parameter_count
from models.arrays import load_arrays, spec_hash, to_arrays
from models.zoo import MODELS, build_model

# Several specs per zoo model: W1/W2 sizes, other widths, non-square and colour images.
SPECS = [
    {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]},
    {"name": "mlp", "input_dim": 7, "num_classes": 3, "hidden": [5, 4, 3]},
    {"name": "logreg", "input_dim": 64, "num_classes": 10, "hidden": []},
    {"name": "logreg", "input_dim": 3, "num_classes": 2, "hidden": []},
    {"name": "cnn1d", "input_dim": 40, "num_classes": 10, "hidden": [25, 25, 25]},
    {"name": "cnn1d", "input_dim": 64, "num_classes": 4, "hidden": [8]},
    {"name": "lenet", "input_dim": 64, "num_classes": 10, "hidden": []},
    {"name": "lenet", "input_dim": 784, "num_classes": 10, "hidden": [4, 8, 32, 16]},
    {"name": "lenet", "input_dim": 150, "num_classes": 5, "hidden": [], "image_shape": [2, 5, 15]},
    {"name": "resnet", "input_dim": 64, "num_classes": 10, "hidden": []},
    {"name": "resnet", "input_dim": 64, "num_classes": 10, "hidden": [16, 32, 64]},
    {"name": "resnet", "input_dim": 3 * 9 * 7, "num_classes": 2, "hidden": [4, 8],
     "image_shape": [3, 9, 7]},
]  # fmt: skip
DIGITS = {name: from_options(name, 64, 10) for name in MODELS}


def _layout(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    return [(k, tuple(v.shape), v.dtype.name) for k, v in to_arrays(module).items()]


def test_the_zoo_modules_are_exported():
    import importlib

    import models

    assert {"custom", "layers", "vision", "zoo"} <= set(models.__all__)
    assert models.__all__ == sorted(models.__all__)
    for name in models.__all__:
        importlib.import_module(f"models.{name}")


def test_every_issue_8_model_is_in_the_zoo():
    assert MODELS == ("mlp", "cnn1d", "logreg", "lenet", "resnet")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s['name']}-{s['input_dim']}")
def test_layout_from_the_spec_alone_is_the_built_state_dict(spec):
    model = build_model(spec, seed=3)

    assert _layout(model) == layout(spec)
    assert spec_hash(model) == layout_hash(layout(spec))
    assert list(model.buffers()) == []  # nothing that gossip averaging would mix badly


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s['name']}-{s['input_dim']}")
def test_every_model_maps_flat_rows_to_logits(spec):
    model = build_model(spec, seed=0)
    x = torch.randn(5, spec["input_dim"], generator=torch.Generator().manual_seed(1))

    out = model(x)

    assert out.shape == (5, spec["num_classes"]) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert model(x[:1]).shape == (1, spec["num_classes"])  # batch size 1 too


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_same_weights_different_seed_different(name):
    a, b, c = (to_arrays(build_model(DIGITS[name], seed=s)) for s in (11, 11, 12))

    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert any(not np.array_equal(a[k], c[k]) for k in a if "norm" not in k)


@pytest.mark.parametrize("name", MODELS)
def test_building_leaves_the_global_rng_alone(name):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)

    build_model(DIGITS[name], seed=1)

    torch.testing.assert_close(torch.rand(3), expected)


def test_conv_init_follows_fan_in_bounds():
    arrays = to_arrays(build_model(DIGITS["lenet"], seed=0))
    he = np.sqrt(6 / (6 * 5 * 5))  # conv2 (followed by ReLU): in_channels 6, 5×5 kernel
    assert np.abs(arrays["conv2.weight"]).max() <= he
    assert arrays["conv2.weight"].std() > he / 3
    default = 1 / np.sqrt(84)  # fc3, the output layer: PyTorch's default
    assert np.abs(arrays["fc3.weight"]).max() <= default
    assert arrays["fc3.weight"].std() > default / 3
    resnet = to_arrays(build_model(DIGITS["resnet"], seed=0))
    np.testing.assert_array_equal(resnet["stem_norm.weight"], np.ones(8, np.float32))
    np.testing.assert_array_equal(resnet["stem_norm.bias"], np.zeros(8, np.float32))


def test_parameter_counts_on_digits_stay_small():
    counts = {name: parameter_count(layout(DIGITS[name])) for name in MODELS}
    assert counts == {"mlp": 4810, "cnn1d": 5960, "logreg": 650, "lenet": 21386, "resnet": 19810}
    w2 = from_options("cnn1d", 40, 10)
    assert parameter_count(layout(w2)) == 5210


def test_resnet_uses_group_norm_not_batch_norm():
    model = build_model(DIGITS["resnet"], seed=0)
    kinds = {type(m).__name__ for m in model.modules()}
    assert "GroupNorm" in kinds and not any("BatchNorm" in k for k in kinds)


def test_2d_models_read_rows_as_images_in_c_order():
    # A LeNet whose first conv is a centred delta copies pixel (r, c) of channel 0; with
    # image_shape (1, 4, 16) a row must be read as 4 rows of 16, not 16 rows of 4.
    spec = from_options("lenet", 64, 2, image_shape=[1, 4, 16])
    model = build_model(spec, seed=0)
    with torch.no_grad():
        model.conv1.weight.zero_()
        model.conv1.bias.zero_()
        model.conv1.weight[0, 0, 2, 2] = 1.0
    captured = []
    model.conv1.register_forward_hook(lambda _m, _i, out: captured.append(out))
    x = torch.arange(64, dtype=torch.float32).reshape(1, 64)

    model(x)

    torch.testing.assert_close(captured[0][0, 0], x.reshape(4, 16))


def test_bad_2d_specs_are_one_line_config_errors():
    with pytest.raises(ConfigError, match=r"not a perfect square.*--image-shape"):
        build_model({"name": "resnet", "input_dim": 40, "num_classes": 10, "hidden": []}, 0)
    with pytest.raises(ConfigError, match="4 widths"):
        build_model({"name": "lenet", "input_dim": 64, "num_classes": 10, "hidden": [6]}, 0)
    with pytest.raises(ConfigError, match="at least 4×4"):
        build_model({"name": "lenet", "input_dim": 9, "num_classes": 2, "hidden": []}, 0)
    with pytest.raises(ConfigError, match="no hidden layers"):
        build_model({"name": "logreg", "input_dim": 9, "num_classes": 2, "hidden": [3]}, 0)


# --- user models ------------------------------------------------------------------------

FACTORY_MODULE = """
import torch
from torch import nn

class Broken:
    pass

NOT_CALLABLE = 3

def make_net(input_dim, num_classes, width=16):
    return nn.Sequential(nn.Linear(input_dim, width), nn.Tanh(), nn.Linear(width, num_classes))

def make_wrong_output(input_dim, num_classes):
    return nn.Linear(input_dim, num_classes + 1)

def make_not_a_module():
    return Broken()

def make_with_batchnorm(input_dim, num_classes):
    return nn.Sequential(nn.Linear(input_dim, 8), nn.BatchNorm1d(8), nn.Linear(8, num_classes))

def make_no_params(input_dim, num_classes):
    return nn.Flatten()

def make_exit(input_dim, num_classes):
    raise SystemExit(0)

def make_interrupted(input_dim, num_classes):
    raise KeyboardInterrupt
"""


@pytest.fixture
def user_models(tmp_path: Path) -> Iterator[str]:
    package = tmp_path / "usernets_zoo2"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(textwrap.dedent(FACTORY_MODULE))
    sys.path.insert(0, str(tmp_path))
    try:
        yield "usernets_zoo2.nets"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("usernets_zoo2")]:
            del sys.modules[name]


def _custom(factory: str, **kwargs: object) -> dict:
    spec = from_options(factory, 64, 10, kwargs={"input_dim": 64, "num_classes": 10, **kwargs})
    return dict(spec)


def test_a_user_model_is_built_from_its_factory_deterministically(user_models):
    spec = _custom(f"{user_models}:make_net", width=12)
    torch.manual_seed(9)
    expected = torch.rand(2)
    torch.manual_seed(9)

    a, b, c = (build_model(spec, seed=s) for s in (4, 4, 5))

    torch.testing.assert_close(torch.rand(2), expected)  # the global RNG is untouched
    assert [v.shape for v in to_arrays(a).values()] == [(12, 64), (12,), (10, 12), (10,)]
    for (k, va), vb in zip(to_arrays(a).items(), to_arrays(b).values(), strict=True):
        np.testing.assert_array_equal(va, vb, err_msg=k)
    assert not np.array_equal(to_arrays(a)["0.weight"], to_arrays(c)["0.weight"])
    assert a.training  # handed back in training mode after the eval-mode check


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("usernets_missing.nets:make_net", "module 'usernets_missing' is not installed"),
        ("{m}:make_nothing", "has no attribute 'make_nothing'; check the name after ':'"),
        ("{m}:NOT_CALLABLE", "'NOT_CALLABLE' is not callable"),
        ("{m}:make_wrong_output", "maps (2, 64) to (2, 11), expected (2, 10)"),
        ("{m}:make_not_a_module", "returned a Broken, not a torch.nn.Module"),
        ("{m}:make_no_params", "returned a Flatten that has no parameters to train"),
        ("{m}:make_exit", "failed when called with kwargs"),
        ("{m}:make_net", "failed when called with kwargs"),  # an unknown keyword below
        ("{m}", "must be 'package.module:callable'"),
    ],
)
def test_bad_factories_are_one_line_errors_naming_the_factory(user_models, factory, message):
    factory = factory.format(m=user_models)
    kwargs = {"depth": 3} if factory.endswith("make_net") and "missing" not in factory else {}
    if factory.endswith("make_not_a_module") or ":" not in factory:
        spec = {"name": "custom", "factory": factory, "input_dim": 64, "num_classes": 10,
                "hidden": []}  # fmt: skip
    else:
        spec = _custom(factory, **kwargs)

    with pytest.raises(ConfigError) as caught:
        build_model(spec, seed=0)

    text = str(caught.value)
    assert message in text and "\n" not in text
    assert factory in text


def test_a_keyboard_interrupt_in_a_factory_still_propagates(user_models):
    with pytest.raises(KeyboardInterrupt):
        build_model(_custom(f"{user_models}:make_interrupted"), seed=0)


@pytest.mark.parametrize(
    ("model", "options", "message"),
    [
        ("{m}:make_no_params", [], "has no parameters to train"),
        ("{m}:make_exit", [], "SystemExit: 0"),
        ("mlp", ["--hidden", "100000000"], "hidden width 100000000 is out of range"),
        ("mlp", ["--num-classes", "1"], "num_classes = 1 is out of range"),
    ],
)
def test_model_spec_cli_refuses_in_one_line_with_exit_2(user_models, capsys, model, options,
                                                         message):  # fmt: skip
    from meshfl.app.cli import main

    sizes = {"--input-dim": "64", "--num-classes": "10", **dict([options] if options else [])}
    argv = ["model", "spec", model.format(m=user_models)]
    for option, value in sizes.items():
        argv += [option, value]

    with pytest.raises(SystemExit) as exited:
        main(argv)

    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_a_batchnorm_user_model_is_checked_without_touching_its_running_stats(user_models):
    model = build_model(_custom(f"{user_models}:make_with_batchnorm"), seed=0)
    stats = to_arrays(model)
    assert stats["1.running_mean"].tolist() == [0.0] * 8  # the dummy batch ran in eval mode
    assert int(stats["1.num_batches_tracked"]) == 0


def test_a_zero_dimensional_buffer_loads_back_with_its_shape(user_models):
    # np.ascontiguousarray makes a 0-d array 1-d: the agent's throughput probe restores
    # the model's state_dict, BatchNorm's num_batches_tracked included, and crashed on it.
    model = build_model(_custom(f"{user_models}:make_with_batchnorm"), seed=0)
    arrays = to_arrays(model)
    arrays["1.num_batches_tracked"] = np.array(7)
    load_arrays(model, arrays)
    assert (
        model.state_dict()["1.num_batches_tracked"].shape == ()
        and int(model.state_dict()["1.num_batches_tracked"]) == 7
    )


def test_meshfl_local_refuses_a_model_with_a_non_float_tensor_before_any_agent(
    user_models, tmp_path
):
    from meshfl.app.local.config import LocalConfig
    from meshfl.app.local.jobspec import model_spec
    from meshfl.errors import ConfigError

    config = LocalConfig(model=f"{user_models}:make_with_batchnorm", out=tmp_path)
    with pytest.raises(ConfigError, match=r"'1\.num_batches_tracked' has dtype int64; every"):
        model_spec(config, 64, 10)


def test_model_spec_cli_prints_the_hash_the_agent_computes(user_models):
    factory = f"{user_models}:make_net"
    kwargs = {"input_dim": 64, "num_classes": 10, "width": 20}
    runner = CliRunner()

    result = runner.invoke(
        app,
        ["model", "spec", factory, "--kwargs", json.dumps(kwargs), "--input-dim", "64",
         "--num-classes", "10", "--json"],
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    from edge_agent.trainer import Trainer

    trainer = Trainer(document["spec"], seed=0, learning_rate=0.1, batch_size=8, local_epochs=1)
    assert document["hash"] == document["spec"]["hash"] == trainer.spec_hash
    assert document["parameters"] == 64 * 20 + 20 + 20 * 10 + 10
    assert [e["name"] for e in document["layout"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]


@pytest.mark.parametrize("name", MODELS)
def test_model_spec_cli_for_zoo_models_matches_the_built_model(name):
    result = CliRunner().invoke(
        app, ["model", "spec", name, "--input-dim", "64", "--num-classes", "10"]
    )

    assert result.exit_code == 0, result.output
    built = spec_hash(build_model(DIGITS[name], seed=0))
    assert f"hash: {built}" in result.output
    assert f"parameters: {parameter_count(layout(DIGITS[name])):,}" in result.output


# --- the CLIs build the job's model spec --------------------------------------------------


def test_meshfl_local_builds_the_model_spec_from_its_options(user_models):
    from meshfl.app.local.jobspec import model_spec
    from meshfl.app.local.run import LocalConfig

    assert model_spec(LocalConfig(), 64, 10) == from_options("mlp", 64, 10)  # W1 unchanged
    lenet = model_spec(LocalConfig(model="lenet", hidden=(4, 8, 16, 16)), 64, 10)
    assert lenet["image_shape"] == [1, 8, 8] and lenet["hidden"] == [4, 8, 16, 16]
    kwargs = {"input_dim": 64, "num_classes": 10, "width": 6}
    custom = model_spec(
        LocalConfig(model=f"{user_models}:make_net", model_kwargs=kwargs, seed=3), 64, 10
    )
    assert custom["hash"] == spec_hash(build_model(custom, seed=0))  # filled for the coordinator


def test_meshfl_job_start_builds_the_model_spec_from_its_options(user_models):
    from meshfl.app.cli.job import _with_hash
    from meshfl.app.cli.model import parse_model_options

    def _model_spec(*options, model_hash=None):  # what `meshfl job start` sends
        return _with_hash(parse_model_options(*options), model_hash)

    assert _model_spec("mlp", 64, 10, None, None, None) == from_options("mlp", 64, 10)
    resnet = _model_spec("resnet", 48, 3, "4,8", "3,4,4", None)
    assert resnet["image_shape"] == [3, 4, 4] and resnet["hidden"] == [4, 8]
    factory = f"{user_models}:make_net"
    kwargs = '{"input_dim": 64, "num_classes": 10}'
    given = _model_spec(factory, 64, 10, None, None, kwargs, model_hash="d" * 64)
    assert given["hash"] == "d" * 64 and given["kwargs"] == json.loads(kwargs)
    built = _model_spec(factory, 64, 10, None, None, kwargs)
    assert built["hash"] == spec_hash(build_model(built, seed=0))
    with pytest.raises(ConfigError, match="--model-kwargs is not valid JSON"):
        _model_spec(factory, 64, 10, None, None, "{width: 3}")
    with pytest.raises(ConfigError, match="--image-shape"):
        _model_spec("lenet", 64, 10, None, "8,8", None)


def test_a_factory_that_takes_the_sizes_gets_them_from_the_spec(tmp_path, monkeypatch):
    """docs/models.md's factory, called with only its own kwargs, as the README shows."""
    package = tmp_path / "sizedpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(
        "from torch import nn\n"
        "def make_net(input_dim, num_classes, width=32):\n"
        "    return nn.Sequential(nn.Linear(input_dim, width), nn.Tanh(),"
        " nn.Linear(width, num_classes))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from models.custom import build_custom

    spec = {"name": "custom", "factory": "sizedpkg.nets:make_net", "kwargs": {"width": 8},
            "input_dim": 5, "num_classes": 3, "hidden": []}  # fmt: skip
    model = build_custom(spec, seed=0)

    assert [tuple(p.shape) for p in model.parameters()] == [(8, 5), (8,), (3, 8), (3,)]
