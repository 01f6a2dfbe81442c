"""The lockstep fleet of ``meshfl bench quality``: data, devices, wire byte counting.

Devices train torch models in one process with the batch order of
:class:`edge_agent.trainer.Trainer` (``torch.randperm`` from a per-device generator
seeded ``model_seed + 1 + i``, minibatches of ``batch_size`` in that order, one epoch a
round), so a plain-SGD device here takes the same steps as an agent. The local step is
the kernel's (plain SGD, :class:`meshfl.aggregation.momentum.LocalMomentum` or
:class:`meshfl.aggregation.momentum.QuasiGlobalMomentum`), applied in place on numpy views of
the torch parameters.

Bytes are counted as an agent uploads them: every message is a real
:class:`meshfl.wire.Envelope` (fleet ``default``, job and device ids of the
coordinator's length), Ed25519-signed (64 bytes; the signature itself is a placeholder
of the right length, the bytes counted are the same), encoded by
:func:`meshfl.wire.serde.encode_envelope` and chunked by
:func:`meshfl.wire.chunking.split_message`; the count is the sum of the chunk lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from meshfl.errors import ConfigError
from meshfl.wire import DType, Envelope, MessageKind, TensorEntry
from meshfl.wire.chunking import split_message
from meshfl.wire.serde import encode_envelope
from models.builtin import load_builtin
from models.partition import dirichlet_partition
from models.zoo import build_model

__all__ = ["Device", "Workload", "load_workload", "message_bytes", "pooled_accuracy"]

FLEET, JOB = "default", "job-0123456789ab"  # coordinator ids: "job-" / "dev-" + 12 hex
_SIGNATURE = bytes(64)


def device_id(i: int) -> str:
    """A device id of the coordinator's length (``dev-`` and 12 hex digits)."""
    return f"dev-{i:012x}"


@dataclass(frozen=True)
class Workload:
    """One of WORKLOADS.md's learning workloads, loaded."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    parts: tuple[np.ndarray, ...]
    spec: Mapping[str, Any]
    lr: float
    batch_size: int
    rounds: int

    @property
    def n(self) -> int:
        """Number of devices."""
        return len(self.parts)


def load_workload(name: str) -> Workload:
    """W1 (digits, 8 devices, MLP 64-64-10) or W2 (mnist1d, 16 devices, cnn1d 25-25-25).

    W1's partition is ``benchmarks/data/w1_partition.json`` index for index
    (``tests/unit/test_data_partition.py``).

    Raises
    ------
    ConfigError
        If ``name`` is neither ``W1`` nor ``W2``.

    """
    if name == "W1":
        split = load_builtin("digits", 0)
        parts = dirichlet_partition(split.y_train, 8, 0.5, 0)
        spec: dict[str, Any] = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}
        rounds = 30
    elif name == "W2":
        split = load_builtin("mnist1d", 0)
        parts = dirichlet_partition(split.y_train, 16, 0.3, 0)
        spec = {"name": "cnn1d", "input_dim": 40, "num_classes": 10, "hidden": [25, 25, 25]}
        rounds = 60
    else:
        raise ConfigError(f"unknown workload {name!r}; use W1 or W2")
    return Workload(
        name,
        split.x_train.astype(np.float32),
        split.y_train.astype(np.int64),
        split.x_test.astype(np.float32),
        split.y_test.astype(np.int64),
        tuple(parts),
        spec,
        0.1,
        32,
        rounds,
    )


LocalStep = Callable[[dict[str, np.ndarray], dict[str, np.ndarray], float], None]
"""``step(params, grads, lr)``: update the parameter views in place."""


def sgd_step(params: dict[str, np.ndarray], grads: dict[str, np.ndarray], lr: float) -> None:
    """Plain SGD in place: x ← x − η g (the agents' trainer)."""
    for name, x in params.items():
        x -= np.float32(lr) * grads[name]


class Device:
    """One device: its model, its data and its shuffling generator."""

    def __init__(self, workload: Workload, index: int, model_seed: int) -> None:
        self.model: nn.Module = build_model(dict(workload.spec), model_seed)  # type: ignore[arg-type]
        part = workload.parts[index]
        self.x = torch.from_numpy(workload.x_train[part])
        self.y = torch.from_numpy(workload.y_train[part])
        self.samples = len(part)
        self.generator = torch.Generator().manual_seed(model_seed + 1 + index)
        self.batch_size = workload.batch_size
        self.loss = nn.CrossEntropyLoss()
        self.views = {n: p.data.numpy() for n, p in self.model.named_parameters()}

    def params(self) -> dict[str, np.ndarray]:
        """Copies of the parameters (float32), in state_dict order."""
        return {n: v.copy() for n, v in self.views.items()}

    def set_params(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Overwrite the parameters in place."""
        for n, v in self.views.items():
            v[...] = arrays[n]

    def epoch(self, lr: float, step: LocalStep = sgd_step) -> int:
        """One shuffled epoch of minibatch steps; returns the number of steps."""
        order = torch.randperm(len(self.y), generator=self.generator)
        batches = torch.split(order, self.batch_size)
        grads_views = None
        for batch in batches:
            self.model.zero_grad(set_to_none=False)
            self.loss(self.model(self.x[batch]), self.y[batch]).backward()
            if grads_views is None:
                grads_views = {
                    n: p.grad.numpy()  # type: ignore[union-attr]
                    for n, p in self.model.named_parameters()
                }
            with torch.no_grad():
                step(self.views, grads_views, lr)
        return len(batches)

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Test accuracy of the current model."""
        with torch.no_grad():
            return float((self.model(x).argmax(1) == y).float().mean())


def message_bytes(
    tensors: Sequence[TensorEntry], sender: int, kind: MessageKind = MessageKind.DELTA
) -> int:
    """Bytes an agent uploads for one message: signed envelope, chunked (128 KiB)."""
    env = Envelope(kind, FLEET, JOB, 1, device_id(sender), bytes(16), 1, tuple(tensors))
    message = encode_envelope(env, lambda _body: _SIGNATURE)
    return sum(len(c) for c in split_message(message, env.message_id))


def identity_message_bytes(params: Mapping[str, np.ndarray], sender: int) -> int:
    """Bytes of one lossless (identity-coded) full-model message."""
    entries = [
        TensorEntry(n, a.shape, DType.FLOAT32, 1, np.asarray(a, "<f4").tobytes())
        for n, a in params.items()
    ]
    return message_bytes(entries, sender, MessageKind.MODEL)


def pooled_accuracy(workload: Workload, model_seed: int) -> list[float]:
    """Accuracy after each epoch of the same model and SGD on all training data."""
    model = build_model(dict(workload.spec), model_seed)  # type: ignore[arg-type]
    x, y = torch.from_numpy(workload.x_train), torch.from_numpy(workload.y_train)
    xt, yt = torch.from_numpy(workload.x_test), torch.from_numpy(workload.y_test)
    generator = torch.Generator().manual_seed(model_seed + 1)
    opt = torch.optim.SGD(model.parameters(), lr=workload.lr)
    loss = nn.CrossEntropyLoss()
    out = []
    for _ in range(workload.rounds):
        for batch in torch.split(torch.randperm(len(y), generator=generator), workload.batch_size):
            opt.zero_grad()
            loss(model(x[batch]), y[batch]).backward()
            opt.step()
        with torch.no_grad():
            out.append(float((model(xt).argmax(1) == yt).float().mean()))
    return out
