"""Quasi-global momentum in the agents' trainer (issue 22): the rule by hand, the buffer's
update from the mixed model, a restart, and the job option."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import TypeAdapter, ValidationError
from torch import nn

from coordinator.validation import validate_spec
from edge_agent.local_step import LocalStep
from edge_agent.trainer import Trainer
from meshfl.app.local.config import LocalConfig
from meshfl.app.local.jobspec import job_spec
from meshfl.contract import JobSpec
from meshfl.errors import ConfigError

W1 = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}
LR, BETA = 0.1, 0.9


def _linear(weight: list[float], grad: list[float]) -> nn.Linear:
    layer = nn.Linear(len(weight), 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weight]))
    layer.weight.grad = torch.tensor([grad])
    return layer


def test_two_rounds_follow_qg_dsgdm_by_hand() -> None:
    # Lin et al. 2021, Algorithm 1: x ← x − η(g + β m̂); m̂ ← β m̂ + (1 − β)(x_start − x_mixed)/(ητ)
    layer = _linear([1.0, 2.0], [0.5, -1.0])
    step = LocalStep(layer, LR, BETA, "quasi-global")
    step.begin_round()
    step.step()  # m̂ = 0: plain SGD
    np.testing.assert_allclose(layer.weight.detach().numpy(), [[0.95, 2.1]], rtol=1e-6)
    step.step()  # τ = 2 steps this round, the same gradient
    np.testing.assert_allclose(layer.weight.detach().numpy(), [[0.9, 2.2]], rtol=1e-6)
    mixed = {"weight": np.array([[0.8, 2.0]], dtype=np.float32)}  # the neighbours pulled it
    step.end_round(mixed)
    # d̂ = ([1, 2] − [0.8, 2.0]) / (0.1 · 2) = [1, 0];  m̂ = 0.1 · d̂
    np.testing.assert_allclose(step.state()["weight"], [[0.1, 0.0]], atol=1e-7)

    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(mixed["weight"]))
    step.begin_round()
    step.step()  # x ← x − η(g + β m̂) = [0.8, 2] − 0.1([0.5, −1] + 0.9 [0.1, 0])
    np.testing.assert_allclose(layer.weight.detach().numpy(), [[0.741, 2.1]], rtol=1e-6)
    step.end_round({"weight": np.array([[0.7, 2.1]], dtype=np.float32)})
    # d̂ = ([0.8, 2] − [0.7, 2.1]) / 0.1 = [1, −1];  m̂ = 0.9 [0.1, 0] + 0.1 [1, −1]
    np.testing.assert_allclose(step.state()["weight"], [[0.19, -0.1]], atol=1e-6)


def test_heavy_ball_and_plain_sgd_ignore_the_round_and_no_round_means_no_update() -> None:
    plain = _linear([1.0, 2.0], [0.5, -1.0])
    step = LocalStep(plain, LR, 0.0, "quasi-global")  # β 0: plain SGD, whichever kind
    step.begin_round()
    step.step()
    step.end_round({"weight": np.zeros((1, 2), dtype=np.float32)})
    np.testing.assert_allclose(plain.weight.detach().numpy(), [[0.95, 2.1]], rtol=1e-6)
    assert step.state() == {}
    qgm = LocalStep(_linear([1.0, 2.0], [0.5, -1.0]), LR, BETA, "quasi-global")
    qgm.end_round({"weight": np.zeros((1, 2), dtype=np.float32)})  # a joiner's catch-up
    assert qgm.state() == {}
    with pytest.raises(ConfigError, match="heavy-ball or quasi-global"):
        LocalStep(plain, LR, BETA, "nesterov")


def _data(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 64)).astype(np.float32), np.arange(n) % 10


def test_a_trainer_restarted_from_its_buffer_continues_the_same_trajectory() -> None:
    x, y = _data()

    def trainer() -> Trainer:
        return Trainer(W1, seed=0, learning_rate=LR, batch_size=8, local_epochs=1,
                       momentum=BETA, momentum_kind="quasi-global")  # fmt: skip

    straight = trainer()
    straight.train(x, y)
    straight.finish_round({k: v * 0.5 for k, v in straight.params().items()})
    buffer = straight.momentum_state()
    assert set(buffer) == set(straight.params()) and any(np.any(b) for b in buffer.values())
    params, shuffle = straight.params(), straight.shuffle_state()
    straight.train(x, y)

    resumed, reset = trainer(), trainer()
    for t in (resumed, reset):
        t.set_params(params)
        t.set_shuffle_state(shuffle)
    resumed.set_momentum_state(buffer)
    resumed.train(x, y)
    reset.train(x, y)  # m̂ rebuilt from zero: another trajectory
    for name, value in straight.params().items():
        np.testing.assert_array_equal(resumed.params()[name], value)
    assert any(not np.array_equal(reset.params()[k], v) for k, v in straight.params().items())


def test_the_job_option_travels_in_the_spec_and_the_coordinator_checks_it(
    tmp_path: Path,
) -> None:
    from models.builtin import load_split
    from models.datasets import dirichlet_partition, write_partition

    split = load_split("digits", 0)
    _, test = write_partition(tmp_path, split, dirichlet_partition(split.y_train, 2, 0.5, 0))
    spec = job_spec(LocalConfig(agents=2, momentum_kind="quasi-global"), test)
    assert (spec["momentum_kind"], spec["local_momentum"]) == ("quasi-global", 0.9)
    validate_spec(spec)
    # The REST body is checked by pydantic against JobSpec (FastAPI: a 422 naming the field)
    body = TypeAdapter(JobSpec)
    assert body.validate_python(spec)["momentum_kind"] == "quasi-global"
    with pytest.raises(ValidationError, match="momentum_kind"):
        body.validate_python({**spec, "momentum_kind": "nesterov"})


def test_quasi_global_without_a_beta_is_refused_on_both_paths(tmp_path: Path) -> None:
    from meshfl.app.local.validation import validate
    from models.builtin import load_split
    from models.datasets import dirichlet_partition, write_partition

    with pytest.raises(ConfigError, match=r"--momentum-kind quasi-global needs --local-mom"):
        validate(LocalConfig(momentum_kind="quasi-global", local_momentum=0.0))
    split = load_split("digits", 0)
    _, test = write_partition(tmp_path, split, dirichlet_partition(split.y_train, 2, 0.5, 0))
    spec = job_spec(LocalConfig(agents=2, momentum_kind="quasi-global"), test)
    with pytest.raises(ConfigError, match=r"quasi-global needs spec\.local_momentum > 0"):
        validate_spec({**spec, "local_momentum": 0.0})


def test_record_dp_zeroes_a_default_heavy_ball_but_keeps_a_chosen_quasi_global_beta() -> None:
    from meshfl.app.cli.options import privacy_defaults

    base = {"secure_aggregation": 0, "dp_noise_multiplier": 1.0, "dp_unit": "record",
            "codec": "sign", "local_momentum": 0.9, "keyframe_growth": 1.5}  # fmt: skip
    heavy = {**base, "momentum_kind": "heavy-ball"}
    quasi = {**base, "momentum_kind": "quasi-global"}
    privacy_defaults(heavy)
    privacy_defaults(quasi)
    assert (heavy["local_momentum"], quasi["local_momentum"]) == (0.0, 0.9)
