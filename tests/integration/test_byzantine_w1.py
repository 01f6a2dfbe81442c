"""Byzantine robustness on W1 (issue 5): one neighbour sends sign-flipped, 20× scaled deltas.

W1 exactly (digits, 8 devices, Dirichlet(0.5) partition with seed 0, MLP 64-64-10, SGD
lr 0.1, batch 32, one local epoch per round), in process with no broker: each device is
a :class:`ChocoGossip` with the identity codec and γ = 1 (exact D-PSGD), on the
exponential graph (degree 5, Metropolis–Hastings weights 1/6), messages handed over in a
loop. Device 0 is Byzantine: :class:`SignFlip` (20) around its honest state, so every
receiver's replica of it is x⁰ − 20·(x₀ − x⁰). Accuracy is the mean test accuracy of the
seven honest devices (1–7).

Measured on this 2-core machine (round 30 / round 120)::

    honest run, plain mixing, no attacker    0.906 / 0.953
    attacked, plain mixing                   0.476 / diverges (non-finite models, ~round 60)
    attacked, ClippedGossip (adaptive τ)     0.815 / 0.943
    attacked, trimmed mean β = 0.2           0.770 / 0.939

The robust rules bound the attacker's pull (w·τ, or one trimmed value) but do not
remove it: it slows training (ClippedGossip converges to a neighbourhood whose size
grows with the Byzantine weight and the heterogeneity, He et al. 2022), so the
"within 2 points" claim of the issue holds once training has converged (~105–120
rounds), not at round 30. The test asserts both.
"""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.trainer import Trainer
from meshfl.aggregation import ChocoGossip
from meshfl.aggregation.privacy import parse_robust
from meshfl.app.local.lab.attack import SignFlip
from meshfl.codecs import Identity
from meshfl.errors import CodecError
from meshfl.topology import exponential, metropolis_hastings
from models.datasets import load_digits_split
from models.partition import dirichlet_partition

pytestmark = pytest.mark.slow

SPEC = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}
N, ATTACKER, SCALE = 8, 0, 20.0
EARLY, ROUNDS = 30, 120
IDS = [f"dev-{i}" for i in range(N)]


def run(robust: str | None, attack: bool) -> tuple[float, float]:
    """Honest mean test accuracy after EARLY and ROUNDS rounds (nan once diverged)."""
    split = load_digits_split(0)
    parts = dirichlet_partition(split.y_train, N, 0.5, seed=0)
    graph = exponential(N)
    w = metropolis_hastings(graph)
    trainers = [
        Trainer(SPEC, seed=0, learning_rate=0.1, batch_size=32, local_epochs=1, data_seed=i)  # type: ignore[arg-type]
        for i in range(N)
    ]
    rule = None if robust is None else parse_robust(robust)
    algos: list[ChocoGossip | SignFlip] = []
    for i in range(N):
        neighbours = {IDS[j]: float(w[i, j]) for j in graph.neighbours(i)}
        algo = ChocoGossip(
            trainers[i].params(),
            neighbours,
            float(w[i, i]),
            consensus_step=1.0,
            codec=Identity(),
            shared_start=True,  # every trainer starts from the same seed: x̂⁰ = x⁰ is exact
            robust=rule,
        )
        algos.append(SignFlip(algo, SCALE) if attack and i == ATTACKER else algo)
    honest = [i for i in range(N) if i != ATTACKER]  # the same seven devices in every run

    def accuracy() -> float:
        return float(np.mean([trainers[i].evaluate(split.x_test, split.y_test)[0] for i in honest]))

    early = float("nan")
    for round_ in range(1, ROUNDS + 1):
        xs = []
        for i in range(N):
            trainers[i].train(split.x_train[parts[i]], split.y_train[parts[i]])
            xs.append(trainers[i].params())
        try:
            messages = [algos[i].outgoing(xs[i]) for i in range(N)]
        except CodecError:  # a model went non-finite: the run diverged
            return early, float("nan")
        for i in range(N):
            for j in graph.neighbours(i):
                algos[i].incoming(IDS[j], messages[j])
        mixed = [algos[i].mix(xs[i], {IDS[j] for j in graph.neighbours(i)}) for i in range(N)]
        if not all(np.all(np.isfinite(t)) for m in mixed for t in m.values()):
            return early, float("nan")
        for i in range(N):
            trainers[i].set_params(mixed[i])
        if round_ == EARLY:
            early = accuracy()
    return early, accuracy()


@pytest.fixture(scope="module")
def honest() -> tuple[float, float]:
    return run(None, attack=False)


@pytest.fixture(scope="module")
def plain_attacked() -> tuple[float, float]:
    return run(None, attack=True)


def test_plain_mixing_is_broken_by_one_sign_flipping_neighbour(
    honest: tuple[float, float], plain_attacked: tuple[float, float]
) -> None:
    assert honest[1] > 0.93  # the W1 reference run trains (0.953 measured)
    early, final = plain_attacked
    assert early < honest[0] - 0.30  # 0.476 against 0.906 at round 30
    assert not final >= honest[1] - 0.10  # diverged (nan) or clearly worse


@pytest.mark.parametrize("robust", ["clipped-gossip", "trimmed:0.2"])
def test_robust_mixing_ends_within_two_points_of_the_honest_run(
    robust: str, honest: tuple[float, float], plain_attacked: tuple[float, float]
) -> None:
    early, final = run(robust, attack=True)
    assert early > plain_attacked[0] + 0.25  # already far better than plain at round 30
    assert final >= honest[1] - 0.02
