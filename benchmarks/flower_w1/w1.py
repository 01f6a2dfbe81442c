"""Workload W1 (docs/workloads.md) with numpy, scikit-learn and torch only.

Data: ``load_digits`` / 16, stratified 80/20 split (``random_state=0``); partition:
Dirichlet(0.5) label skew over 8 devices, ``np.random.default_rng(0)``; model: MLP
64 → 64 (ReLU) → 10 float32 (4,810 parameters); training: plain SGD, lr 0.1, batch 32,
one local epoch. Also the trivial model of the per-round overhead measurement: a
10-parameter linear model (4 features → 2 classes) on a small synthetic table.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

LR, BATCH, EPOCHS, ALPHA, SEED = 0.1, 32, 1, 0.5, 0

torch.set_num_threads(1)  # 8 client processes share 2 cores


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """W1's split, features divided by 16.

    Returns ``(x_train (1437, 64) float32, y_train (1437,) int64, x_test (360, 64),
    y_test (360,))``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x / 16.0, y, test_size=0.2, stratify=y, random_state=0
    )
    f32 = np.float32
    return (
        x_tr.astype(f32),
        y_tr.astype(np.int64),
        x_te.astype(f32),
        y_te.astype(np.int64),
    )


def dirichlet_partition(
    y: np.ndarray, n: int, alpha: float = ALPHA, seed: int = SEED
) -> list[np.ndarray]:
    """W1's partition: per class (in order) shuffle, draw Dirichlet(α·1ₙ), split at cumsum."""
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(n)]
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        p = rng.dirichlet(alpha * np.ones(n))
        for i, chunk in enumerate(np.split(idx, (np.cumsum(p) * len(idx)).astype(int)[:-1])):
            parts[i].extend(chunk.tolist())
    return [np.array(sorted(p), dtype=np.int64) for p in parts]


def check_partition(parts: list[np.ndarray], path: str | os.PathLike[str]) -> None:
    """Raise ``ValueError`` unless ``parts`` equal the devices' indices in ``path``."""
    devices = json.loads(Path(path).read_text())["devices"]
    ref = [sorted(d["indices"] if isinstance(d, dict) else d) for d in devices]
    if len(ref) != len(parts) or any(
        sorted(p.tolist()) != r for p, r in zip(parts, ref, strict=True)
    ):
        raise ValueError(f"the W1 partition differs from {path}")


def client_data(cid: int, n: int, trivial: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Client ``cid``'s training data: W1's Dirichlet part, or the trivial table's share.

    With 8 clients the W1 partition is checked against ``W1_PARTITION`` (env) if set.
    """
    if trivial:
        x, y = load_table(trivial)
        return x[cid::n], y[cid::n]
    x_tr, y_tr, _, _ = load_split()
    parts = dirichlet_partition(y_tr, n)
    ref = os.environ.get("W1_PARTITION")
    if ref and n == 8:
        check_partition(parts, ref)
    return x_tr[parts[cid]], y_tr[parts[cid]]


def test_data(trivial: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The central test set: W1's 360 test samples, or the trivial table itself."""
    if trivial:
        return load_table(trivial)
    _, _, x_te, y_te = load_split()
    return x_te, y_te


def load_table(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The trivial workload's CSV (header, 4 float features then ``label``)."""
    data = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64)
    return data[:, :-1].astype(np.float32), data[:, -1].astype(np.int64)


def build_model(trivial: bool = False) -> nn.Module:
    """W1's MLP (4,810 parameters), or the 10-parameter ``Linear(4, 2)``; seed 0."""
    torch.manual_seed(SEED)
    if trivial:
        return nn.Linear(4, 2)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """The model's parameters as float32 arrays, in ``state_dict`` order."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    """Load float32 arrays (``state_dict`` order) into ``model``."""
    keys = list(model.state_dict())
    model.load_state_dict(
        {k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights, strict=True)}
    )


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, seed: int) -> float:
    """One local epoch of plain SGD (lr 0.1, batch 32, shuffled); returns seconds spent."""
    start = time.perf_counter()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    order = torch.randperm(len(xt), generator=torch.Generator().manual_seed(seed))
    model.train()
    for _ in range(EPOCHS):
        for i in range(0, len(xt), BATCH):
            b = order[i : i + BATCH]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xt[b]), yt[b])
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
    return time.perf_counter() - start


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Test accuracy of ``model`` on ``(x, y)`` (fraction in [0, 1])."""
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(1).numpy()
    return float((pred == y).mean())
