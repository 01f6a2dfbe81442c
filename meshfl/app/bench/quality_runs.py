"""One lockstep run of a candidate (algorithm × topology × codec × momentum).

The runs behind ``meshfl bench quality``. Every algorithm object is the kernel's
(:mod:`meshfl.aggregation`), fed the very :class:`meshfl.wire.TensorEntry` tuples an agent
would publish; bytes are counted with the real encoders
(:func:`meshfl.app.bench.quality_sim.message_bytes`). Upload counts once per message,
however many neighbours hear it (a broadcast on the device's delta topic); per-edge
messages (randomized gossip) count once per edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from meshfl.aggregation import ChocoGossip
from meshfl.aggregation.ef_averaging import EFAveraging
from meshfl.aggregation.epidemic import EpidemicGossip
from meshfl.aggregation.momentum import LocalMomentum, QuasiGlobalMomentum, UpdateMomentum
from meshfl.aggregation.pga import pga_row
from meshfl.aggregation.tracking import GradientTracking
from meshfl.app.bench.quality_sim import (
    Device,
    Workload,
    device_id,
    identity_message_bytes,
    message_bytes,
)
from meshfl.codecs import parse_codec
from meshfl.errors import CodecError, ConfigError
from meshfl.topology import Graph, build_graph, metropolis_hastings

__all__ = ["Candidate", "Run", "run_candidate"]


@dataclass(frozen=True)
class Candidate:
    """A setting to measure.

    ``algorithm``: ``fedavg`` (exact averaging, a star: every device uploads its identity-coded
    model), ``choco`` (CHOCO-SGD, :class:`ChocoGossip`, shared start), ``epidemic``
    (:class:`EpidemicGossip`, ``peers`` random peers a round), ``tracking``
    (:class:`GradientTracking`, BEER) or ``pga`` (CHOCO with a complete-graph round every
    ``period`` rounds, :func:`pga_row`). ``local``: ``sgd``, ``hb`` (heavy ball β
    ``local_beta``) or ``qgm`` (quasi-global momentum β ``local_beta``). ``update_beta``:
    momentum on the mixed update (0: none). ``weights``: ``mh`` (Metropolis–Hastings) or
    ``samples`` (complete graph only: w_ij = n_j / Σ n).
    """

    algorithm: str = "choco"
    topology: str = "complete"
    codec: str = "sign"
    gamma: float = 1.0
    local: str = "sgd"
    local_beta: float = 0.0
    update_beta: float = 0.0
    update_alpha: float = 1.0
    peers: int = 2
    period: int = 4
    weights: str = "mh"
    keyframe_growth: float = 0.0

    @property
    def label(self) -> str:
        """A short human-readable name."""
        parts = [self.algorithm]
        if self.algorithm == "efavg":
            parts.append(self.codec)
        elif self.algorithm != "fedavg":
            parts += [
                self.topology if self.algorithm != "epidemic" else f"s={self.peers}",
                self.codec,
                f"γ{self.gamma:g}",
            ]
        if self.algorithm == "pga":
            parts.append(f"H={self.period}")
        if self.local != "sgd":
            parts.append(f"{self.local}{self.local_beta:g}")
        if self.update_beta:
            parts.append(
                f"um{self.update_beta:g}"
                + (f"α{self.update_alpha:g}" if self.update_alpha != 1 else "")
            )
        if self.weights != "mh":
            parts.append(self.weights)
        if self.keyframe_growth:
            parts.append(f"keyframes {self.keyframe_growth:g}")
        return " ".join(parts)


@dataclass
class Run:
    """Per-round mean / min accuracy, cumulative upload bytes (all devices), consensus distance."""

    mean: list[float] = field(default_factory=list)
    minimum: list[float] = field(default_factory=list)
    upload: list[int] = field(default_factory=list)
    consensus: list[float] = field(default_factory=list)
    keyframes: int = 0
    diverged_at: int | None = None


def _consensus(models: list[dict[str, np.ndarray]]) -> float:
    flat = np.stack([np.concatenate([a.ravel() for a in m.values()]) for m in models]).astype(
        np.float64
    )
    return float(np.mean(np.sum((flat - flat.mean(0)) ** 2, axis=1)))


def _rows(c: Candidate, w: Workload, round_: int) -> tuple[np.ndarray, Graph]:
    graph = build_graph(c.topology, w.n)
    if c.weights == "samples":
        sizes = np.array([len(p) for p in w.parts], dtype=np.float64)
        return np.tile(sizes / sizes.sum(), (w.n, 1)), graph
    matrix = metropolis_hastings(graph)
    if c.algorithm == "pga":
        matrix = pga_row(matrix, round_, c.period)
    return matrix, graph


def run_candidate(c: Candidate, w: Workload, seed: int) -> Run:
    """Run ``c`` on ``w`` for ``w.rounds`` rounds with model seed ``seed``."""
    torch.manual_seed(seed)
    devices = [Device(w, i, seed) for i in range(w.n)]
    xt, yt = torch.from_numpy(w.x_test), torch.from_numpy(w.y_test)
    x0 = devices[0].params()
    ids = [device_id(i) for i in range(w.n)]
    local: list[LocalMomentum | QuasiGlobalMomentum | None] = []
    for _ in devices:
        if c.local == "hb":
            local.append(LocalMomentum(c.local_beta))
        elif c.local == "qgm":
            local.append(QuasiGlobalMomentum(c.local_beta))
        else:
            local.append(None)
    update = [
        UpdateMomentum(c.update_beta, c.update_alpha)
        if c.update_beta or c.update_alpha != 1
        else None
        for _ in devices
    ]
    matrix, graph = _rows(c, w, 0)
    # The algorithms' interfaces differ (epidemic sends per edge, tracking sends two
    # tensors a round); _communicate drives each by its own.
    algos: list[Any] = []
    for i in range(w.n):
        codec = parse_codec(c.codec, seed=1000 * seed + i)
        if c.algorithm in ("choco", "pga"):
            nbrs = (
                [j for j in range(w.n) if j != i]
                if c.algorithm == "pga" or c.weights == "samples"
                else list(graph.neighbours(i))
            )
            row = {ids[j]: float(matrix[i, j]) for j in nbrs}
            algos.append(
                ChocoGossip(
                    x0,
                    row,
                    float(matrix[i, i]),
                    c.gamma,
                    codec,
                    shared_start=True,
                    keyframe_growth=c.keyframe_growth,
                )
            )
        elif c.algorithm == "efavg":
            sizes = np.array([len(p) for p in w.parts], dtype=np.float64)
            a = sizes / sizes.sum() if c.weights == "samples" else np.full(w.n, 1.0 / w.n)
            peers = {ids[j]: float(a[j]) for j in range(w.n) if j != i}
            algos.append(EFAveraging(x0, peers, float(a[i]), codec, self_id=ids[i]))
        elif c.algorithm == "epidemic":
            algos.append(EpidemicGossip(x0, ids[i], ids, c.peers, codec, c.gamma, seed=seed))
        elif c.algorithm == "tracking":
            row = {ids[j]: float(matrix[i, j]) for j in graph.neighbours(i)}
            algos.append(GradientTracking(x0, row, float(matrix[i, i]), c.gamma, codec))
        else:
            algos.append(None)
    run = Run()
    total = 0
    for round_ in range(1, w.rounds + 1):
        starts = [d.params() for d in devices]
        steps = []
        for d, opt, s in zip(devices, local, starts, strict=True):
            if isinstance(opt, QuasiGlobalMomentum):
                opt.begin_round(s)
            steps.append(d.epoch(w.lr, opt.step if opt is not None else _sgd))
        xs = [d.params() for d in devices]
        try:
            mixed, sent = _communicate(c, w, algos, xs, starts, ids, round_, seed)
        except CodecError:  # a model went to NaN/inf: the run diverged, its models are lost
            run.diverged_at = round_
            for _ in range(round_, w.rounds + 1):
                run.mean.append(0.0)
                run.minimum.append(0.0)
                run.upload.append(total)
                run.consensus.append(float("inf"))
            break
        total += sent
        for i, d in enumerate(devices):
            x = mixed[i]
            opt, um = local[i], update[i]
            if isinstance(opt, QuasiGlobalMomentum):
                opt.end_round(x, w.lr, steps[i])
            if um is not None:
                x = um.apply(starts[i], x)
            d.set_params(x)
        acc = [d.accuracy(xt, yt) for d in devices]
        run.mean.append(float(np.mean(acc)))
        run.minimum.append(float(np.min(acc)))
        run.upload.append(total)
        run.consensus.append(_consensus([d.params() for d in devices]))
    run.keyframes = sum(int(getattr(a, "keyframes_sent", 0)) for a in algos)
    return run


def _sgd(params: dict[str, np.ndarray], grads: dict[str, np.ndarray], lr: float) -> None:
    for name, x in params.items():
        x -= np.float32(lr) * grads[name]


def _communicate(
    c: Candidate,
    w: Workload,
    algos: list[Any],
    xs: list[dict[str, np.ndarray]],
    starts: list[dict[str, np.ndarray]],
    ids: list[str],
    round_: int,
    seed: int,
) -> tuple[list[dict[str, np.ndarray]], int]:
    n = w.n
    if c.algorithm == "fedavg":
        sizes = np.array([len(p) for p in w.parts], dtype=np.float64)
        weights = sizes / sizes.sum() if c.weights == "samples" else np.full(n, 1.0 / n)
        mean = {
            k: np.sum([weights[i] * xs[i][k].astype(np.float64) for i in range(n)], axis=0).astype(
                np.float32
            )
            for k in xs[0]
        }
        return [dict(mean) for _ in range(n)], sum(
            identity_message_bytes(xs[i], i) for i in range(n)
        )
    if c.algorithm in ("choco", "pga"):
        if c.algorithm == "pga":
            matrix = pga_row(metropolis_hastings(build_graph(c.topology, n)), round_, c.period)
            for i in range(n):
                row = {ids[j]: float(matrix[i, j]) for j in range(n) if j != i}
                algos[i].set_neighbours(row, float(matrix[i, i]))
        msgs = [algos[i].outgoing(xs[i]) for i in range(n)]
        sent = sum(message_bytes(m, i) for i, m in enumerate(msgs))
        heard = _heard(c, w)
        for i in range(n):
            for j in heard[i]:
                algos[i].incoming(ids[j], msgs[j])
        mixed = []
        for i in range(n):
            answered = {ids[j] for j in heard[i]}
            if c.algorithm == "pga" and round_ % c.period != 0:
                answered = {ids[j] for j in build_graph(c.topology, n).neighbours(i)}
            mixed.append(algos[i].mix(xs[i], answered))
        return mixed, sent
    if c.algorithm == "efavg":
        msgs = [algos[i].outgoing(xs[i]) for i in range(n)]
        sent = sum(message_bytes(m, i) for i, m in enumerate(msgs))
        for i in range(n):
            for j in range(n):
                if j != i:
                    algos[i].incoming(ids[j], msgs[j])
        return [algos[i].mix(xs[i]) for i in range(n)], sent
    if c.algorithm == "epidemic":
        sent = 0
        outboxes = [algos[i].outgoing(xs[i], round_) for i in range(n)]
        for i, box in enumerate(outboxes):
            for target, entries in box.items():
                sent += message_bytes(entries, i)
                algos[ids.index(target)].incoming(ids[i], entries)
        return [algos[i].mix(xs[i]) for i in range(n)], sent
    if c.algorithm == "tracking":
        msgs = [algos[i].outgoing(starts[i], xs[i], w.lr) for i in range(n)]
        sent = sum(message_bytes(m, i) for i, m in enumerate(msgs))
        for i in range(n):
            for peer in algos[i].neighbours:
                algos[i].incoming(peer, msgs[ids.index(peer)])
        return [algos[i].mix(starts[i]) for i in range(n)], sent
    raise ConfigError(f"unknown algorithm {c.algorithm!r}")


def _heard(c: Candidate, w: Workload) -> list[list[int]]:
    """Who hears whom: every device on the complete graph, PGA and sample weights."""
    if c.algorithm == "pga" or c.weights == "samples":
        return [[j for j in range(w.n) if j != i] for i in range(w.n)]
    graph = build_graph(c.topology, w.n)
    return [list(graph.neighbours(i)) for i in range(w.n)]
