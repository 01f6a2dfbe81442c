"""A whole fleet stepped in lockstep inside one process: no broker, no coordinator.

It runs the very classes the agents run — :class:`edge_agent.trainer.Trainer` and the
gossip algorithms of :mod:`meshfl.aggregation` over the wire encoding of their messages
— with every message delivered, in device order, each round. A run of ``meshfl local``
whose messages all arrive in time computes the same numbers (a test checks it), so this
is how the defaults were chosen and how sweeps over seeds and settings stay cheap: a
30-round W1 run takes about two seconds.

Besides the agents' algorithms (``gossip="choco"`` and ``"dpsgd"``) it runs compressed
*model* gossip, :class:`meshfl.aggregation.CompressedDPSGD`: each device sends C(x_i) and
mixes ``x_i ← w_ii x_i + Σ_j w_ij D(C(x_j))``. ``gossip="model"`` is the naive scheme of
Tang et al. (NeurIPS 2018, "Communication Compression for Decentralized Training",
Sec. 3), which does not converge for compressors with large error; ``"model-ef"`` adds
error feedback (C(x_i + e_i), residual e_i kept in an explicit
:class:`meshfl.aggregation.ErrorFeedback`). Both are here to measure (``tests``), not to use.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from meshfl.app.local.config import LocalConfig
from meshfl.errors import ConfigError

if TYPE_CHECKING:
    from meshfl.contract import ModelSpec
    from models.datasets import Split

__all__ = ["GOSSIPS", "LockstepResult", "load_split", "run_lockstep"]

GOSSIPS: tuple[str, ...] = ("choco", "dpsgd", "model", "model-ef")
"""Gossip schemes :func:`run_lockstep` runs (``None`` there means ``config.algorithm``)."""


@dataclass
class LockstepResult:
    """Per round: mean and minimum test accuracy, payload bytes sent, seconds since start.

    ``payload_bytes[r]`` sums the tensor payloads of every device's message of round
    ``r`` (no envelope); ``elapsed_s[r]`` is wall-clock seconds from the start of the
    run to the end of round ``r`` (evaluation included). ``keyframes`` counts CHOCO's
    lossless keyframes over the run.
    """

    mean_accuracy: list[float] = field(default_factory=list)
    min_accuracy: list[float] = field(default_factory=list)
    payload_bytes: list[int] = field(default_factory=list)
    elapsed_s: list[float] = field(default_factory=list)
    keyframes: int = 0

    @property
    def final(self) -> float:
        """Mean test accuracy after the last round."""
        return self.mean_accuracy[-1]


@functools.cache
def load_split(dataset: str, seed: int = 0) -> Split:
    """A built-in dataset by name (``models.builtin.BUILTIN_DATASETS``), cached.

    ``"digits"`` is W1, ``"mnist1d"`` W2. Callers must not modify the returned arrays.
    Raises ConfigError for another name.
    """
    from models.builtin import load_builtin

    return load_builtin(dataset, seed)


def run_lockstep(
    config: LocalConfig,
    model_seed: int | None = None,
    *,
    model: ModelSpec | None = None,
    gossip: str | None = None,
) -> LockstepResult:
    """Run ``config``'s job (dataset, partition, model, algorithm, codec, topology) in lockstep.

    Parameters
    ----------
    config : LocalConfig
        ``dataset`` is a built-in name (``"digits"`` W1, ``"mnist1d"`` W2, ``"iris"``,
        ``"wine"``, ``"breast_cancer"``), a ``.npz``/``.csv`` file or an image folder;
        ``agents``, ``alpha`` and ``seed`` give the Dirichlet partition; ``codec``,
        ``consensus_step`` (γ), ``keyframe_growth``, ``dense_below``, ``byte_budget``
        (the per-tensor :class:`meshfl.codecs.CodecPolicy`, as the agents build it) and
        ``topology`` the gossip;
        ``learning_rate``, ``local_momentum``, ``batch_size``, ``local_epochs`` and
        ``rounds`` the training.
    model_seed : int, optional
        Overrides the model and shuffling seed (and the codecs' random seeds) while
        keeping the data partition of ``config.seed`` (to measure the spread over
        initialisations); default ``config.model_seed``, else ``config.seed``.
    model : ModelSpec, optional
        The model; default the MLP ``input_dim → 64 → classes`` of ``meshfl local``.
    gossip : {"choco", "dpsgd", "model", "model-ef"}, optional
        Default ``config.algorithm``. ``"dpsgd"`` sends identity-coded models;
        ``"model"`` is Tang et al.'s naive compressed-model gossip with ``config.codec``
        and ``"model-ef"`` the same with error feedback (both
        :class:`meshfl.aggregation.CompressedDPSGD`).

    Returns
    -------
    LockstepResult
        Per-round accuracies, payload bytes (tensor payloads of every message, no
        envelope) and elapsed seconds.

    Raises
    ------
    ConfigError
        Unknown gossip, a bad codec spec, topology or model spec.

    """
    from edge_agent.trainer import Trainer
    from meshfl.aggregation import ChocoGossip, CompressedDPSGD, DPSGDGossip, GossipAlgorithm
    from meshfl.codecs import CodecPolicy, parse_codec
    from meshfl.topology import build_graph, exponential, metropolis_hastings
    from models.builtin import BUILTIN_DATASETS, num_classes
    from models.datasets import dirichlet_partition, split_dataset_file

    scheme = config.algorithm if gossip is None else gossip
    if scheme not in GOSSIPS:
        raise ConfigError(f"gossip must be one of {', '.join(GOSSIPS)} (got {scheme!r})")
    if config.dataset in BUILTIN_DATASETS:
        split = load_split(config.dataset, config.seed)
    else:
        split = split_dataset_file(
            config.dataset, config.agents, config.alpha, config.seed,
            label_column=config.label_column,
        )  # fmt: skip
    parts = dirichlet_partition(split.y_train, config.agents, config.alpha, config.seed)
    classes = num_classes(split)
    spec = model or {"name": "mlp", "input_dim": int(split.x_train.shape[1]),
                     "num_classes": classes, "hidden": [64]}  # fmt: skip
    if model_seed is None:
        model_seed = config.seed if config.model_seed is None else config.model_seed
    seed = model_seed
    n = config.agents
    trainers = [
        Trainer(
            spec,
            seed=seed,
            data_seed=seed + 1 + i,
            learning_rate=config.learning_rate,
            batch_size=config.batch_size,
            local_epochs=config.local_epochs,
            momentum=config.local_momentum,
            momentum_kind=config.momentum_kind,
        )
        for i in range(n)
    ]
    time_varying = config.topology == "one-peer-exponential"
    # A time-varying graph: every device hears the union (the exponential graph) and
    # mixes with round r's matching, as the agents do (edge_agent/versions.py).
    graph = exponential(n) if time_varying else build_graph(config.topology, n)
    w = metropolis_hastings(graph)
    ids = [f"device-{i}" for i in range(n)]
    x0 = trainers[0].params()
    layout = [(name, tuple(a.shape)) for name, a in x0.items()]
    algorithms: list[GossipAlgorithm] = []
    for i in range(n):
        weights = {ids[j]: float(w[i, j]) for j in graph.neighbours(i)}
        policy = CodecPolicy.from_options(
            parse_codec(config.codec, seed=1000 * seed + i), layout,
            dense_below=config.dense_below, byte_budget=config.byte_budget,
        )  # fmt: skip
        if scheme == "dpsgd":
            algorithms.append(DPSGDGossip(x0, weights, float(w[i, i])))
        elif scheme in ("model", "model-ef"):
            algorithms.append(
                CompressedDPSGD(x0, weights, float(w[i, i]), policy,
                                error_feedback=scheme == "model-ef")
            )  # fmt: skip
        else:
            algorithms.append(
                ChocoGossip(x0, weights, float(w[i, i]), consensus_step=config.consensus_step,
                            codec=policy, shared_start=True,
                            keyframe_growth=config.keyframe_growth)
            )  # fmt: skip
    result = LockstepResult()
    start = time.perf_counter()
    for round_ in range(1, config.rounds + 1):
        mixing = graph
        if time_varying:
            mixing = build_graph(config.topology, n, round_=round_)
            w_r = metropolis_hastings(mixing)
            for i in range(n):
                row = {ids[j]: float(w_r[i, j]) for j in mixing.neighbours(i)}
                listen = [ids[j] for j in graph.neighbours(i)]
                algorithms[i].set_neighbours(row, float(w_r[i, i]), listen=listen)
        params = []
        for i, trainer in enumerate(trainers):
            trainer.train(split.x_train[parts[i]], split.y_train[parts[i]])
            params.append(trainer.params())
        messages = [algorithms[i].outgoing(params[i]) for i in range(n)]
        for i in range(n):
            for j in graph.neighbours(i):
                algorithms[i].incoming(ids[j], messages[j])
        for i, trainer in enumerate(trainers):
            answered = {ids[j] for j in mixing.neighbours(i)}
            trainer.finish_round(algorithms[i].mix(params[i], answered))
        accuracy = [t.evaluate(split.x_test, split.y_test)[0] for t in trainers]
        result.mean_accuracy.append(float(np.mean(accuracy)))
        result.min_accuracy.append(float(np.min(accuracy)))
        result.payload_bytes.append(sum(len(e.payload) for m in messages for e in m))
        result.elapsed_s.append(time.perf_counter() - start)
    result.keyframes = sum(int(getattr(a, "keyframes_sent", 0)) for a in algorithms)
    return result
