"""A whole fleet stepped in lockstep inside one process: no broker, no coordinator.

It runs the very classes the agents run — :class:`edge_agent.trainer.Trainer` and the
gossip algorithms of :mod:`meshfl.aggregation` over the wire encoding of their messages
— with every message delivered, in device order, each round. A run of ``meshfl local``
whose messages all arrive in time computes the same numbers (a test checks it), so this
is how the defaults were chosen and how sweeps over seeds and settings stay cheap: a
30-round W1 run takes about two seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from meshfl.local.run import LocalConfig

__all__ = ["LockstepResult", "run_lockstep"]


@dataclass
class LockstepResult:
    """Per-round mean and minimum test accuracy, and payload bytes sent per round."""

    mean_accuracy: list[float] = field(default_factory=list)
    min_accuracy: list[float] = field(default_factory=list)
    payload_bytes: list[int] = field(default_factory=list)

    @property
    def final(self) -> float:
        """Mean test accuracy after the last round."""
        return self.mean_accuracy[-1]


def run_lockstep(config: LocalConfig, model_seed: int | None = None) -> LockstepResult:
    """Run ``config``'s job (dataset, partition, model, algorithm, codec, topology) in lockstep.

    ``model_seed`` overrides the model and shuffling seed while keeping the data
    partition of ``config.seed`` (to measure the spread over initialisations).
    Payload bytes count the tensor payloads of every message (no envelope).
    """
    from edge_agent.trainer import Trainer
    from meshfl.aggregation import ChocoGossip, DPSGDGossip, GossipAlgorithm
    from meshfl.codecs import parse_codec
    from meshfl.topology import build_graph, metropolis_hastings
    from models.datasets import dirichlet_partition, load_digits_split, split_dataset_file

    if config.dataset == "digits":
        split = load_digits_split(config.seed)
    else:
        split = split_dataset_file(
            config.dataset, config.agents, config.alpha, config.seed,
            label_column=config.label_column,
        )  # fmt: skip
    parts = dirichlet_partition(split.y_train, config.agents, config.alpha, config.seed)
    classes = 10 if config.dataset == "digits" else int(split.y_test.max()) + 1
    spec = {"name": "mlp", "input_dim": int(split.x_train.shape[1]), "num_classes": classes,
            "hidden": [64]}  # fmt: skip
    seed = config.seed if model_seed is None else model_seed
    n = config.agents
    trainers = [
        Trainer(
            spec,  # type: ignore[arg-type]
            seed=seed,
            data_seed=seed + 1 + i,
            learning_rate=config.learning_rate,
            batch_size=config.batch_size,
            local_epochs=config.local_epochs,
        )
        for i in range(n)
    ]
    graph = build_graph(config.topology, n)
    w = metropolis_hastings(graph)
    ids = [f"device-{i}" for i in range(n)]
    x0 = trainers[0].params()
    algorithms: list[GossipAlgorithm] = []
    for i in range(n):
        weights = {ids[j]: float(w[i, j]) for j in graph.neighbours(i)}
        if config.algorithm == "dpsgd":
            algorithms.append(DPSGDGossip(x0, weights, float(w[i, i])))
        else:
            algorithms.append(
                ChocoGossip(x0, weights, float(w[i, i]), consensus_step=config.consensus_step,
                            codec=parse_codec(config.codec), shared_start=True,
                            keyframe_threshold=config.keyframe_threshold)
            )  # fmt: skip
    result = LockstepResult()
    for _ in range(config.rounds):
        params = []
        for i, trainer in enumerate(trainers):
            trainer.train(split.x_train[parts[i]], split.y_train[parts[i]])
            params.append(trainer.params())
        messages = [algorithms[i].outgoing(params[i]) for i in range(n)]
        for i in range(n):
            for j in graph.neighbours(i):
                algorithms[i].incoming(ids[j], messages[j])
        for i, trainer in enumerate(trainers):
            answered = {ids[j] for j in graph.neighbours(i)}
            trainer.set_params(algorithms[i].mix(params[i], answered))
        accuracy = [t.evaluate(split.x_test, split.y_test)[0] for t in trainers]
        result.mean_accuracy.append(float(np.mean(accuracy)))
        result.min_accuracy.append(float(np.min(accuracy)))
        result.payload_bytes.append(sum(len(e.payload) for m in messages for e in m))
    return result
