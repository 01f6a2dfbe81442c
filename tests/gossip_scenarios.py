"""Gossip-engine scenarios shared by the in-memory and the real-broker test suites.

Each scenario runs N :class:`GossipEngine` instances in threads, one per device, over
transports made by a factory, and compares the result with the same algorithm objects
stepped in lockstep without any transport (the reference): the engine must deliver
every message exactly once, so the results agree bit for bit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from edge_agent.engine import GossipEngine
from edge_agent.transport.base import Message, Transport
from meshfl.aggregation import ChocoGossip, DPSGDGossip
from meshfl.codecs import parse_codec
from meshfl.topology import build_graph, metropolis_hastings
from meshfl.wire import status_topic

TransportFactory = Callable[[str], Transport]
FLEET, JOB = "test", "job-1"


def models(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "w": rng.normal(size=(6, 5)).astype(np.float32),
            "b": rng.normal(size=(5,)).astype(np.float32),
        }
        for _ in range(n)
    ]


def make_algorithms(n: int, algorithm: str, codec: str, topology: str = "ring"):
    graph = build_graph(topology, n)
    w = metropolis_hastings(graph)
    ids = [f"dev-{i}" for i in range(n)]
    x0 = models(n)
    algos = []
    for i in range(n):
        nbrs = {ids[j]: float(w[i, j]) for j in graph.neighbours(i)}
        if algorithm == "dpsgd":
            algos.append(DPSGDGossip(x0[i], nbrs, float(w[i, i])))
        else:
            algos.append(
                ChocoGossip(
                    x0[i], nbrs, float(w[i, i]), consensus_step=0.5, codec=parse_codec(codec)
                )
            )
    return ids, graph, x0, algos


def drift(x: dict[str, np.ndarray], round_: int, i: int) -> dict[str, np.ndarray]:
    """A deterministic stand-in for local training."""
    return {k: (v * np.float32(0.9) + np.float32(0.01 * (i + 1) * round_)) for k, v in x.items()}


def reference(n: int, rounds: int, algorithm: str, codec: str) -> list[dict[str, np.ndarray]]:
    ids, graph, xs, algos = make_algorithms(n, algorithm, codec)
    xs = [dict(x) for x in xs]
    for r in range(1, rounds + 1):
        xs = [drift(x, r, i) for i, x in enumerate(xs)]
        outgoing = [algos[i].outgoing(xs[i]) for i in range(n)]
        for i in range(n):
            for j in graph.neighbours(i):
                algos[i].incoming(ids[j], outgoing[j])
        xs = [algos[i].mix(xs[i], {ids[j] for j in graph.neighbours(i)}) for i in range(n)]
    return xs


def run_engines(
    factory: TransportFactory,
    n: int,
    rounds: int,
    algorithm: str = "choco",
    codec: str = "topk:0.3",
    deadline_s: float = 20.0,
    absent: frozenset[int] = frozenset(),
    max_payload: int = 1024,
    offline_grace_s: float = 1.0,
) -> tuple[list[dict[str, np.ndarray] | None], list[list[list[str]]], list[GossipEngine]]:
    """Run the engines; devices in ``absent`` never start. Returns models, missing lists."""
    ids, graph, xs, algos = make_algorithms(n, algorithm, codec)
    transports: list[Transport | None] = [None] * n
    engines: list[GossipEngine] = []
    for i in range(n):
        if i in absent:
            engines.append(None)  # type: ignore[arg-type]
            continue
        t = factory(ids[i])
        will = Message(status_topic(FLEET, ids[i]), b'{"state": "offline"}', retain=True)
        t.connect(ids[i], will=will)
        transports[i] = t
        engine = GossipEngine(
            transport=t,
            fleet=FLEET,
            job_id=JOB,
            device_id=ids[i],
            neighbours=[ids[j] for j in graph.neighbours(i)],
            algorithm=algos[i],
            deadline_s=deadline_s,
            max_payload=max_payload,
            offline_grace_s=offline_grace_s,
        )
        engine.start()
        engines.append(engine)
    for engine in engines:
        if engine is not None:
            engine.wait_ready(deadline_s)
    results: list[dict[str, np.ndarray] | None] = [None] * n
    missing: list[list[list[str]]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def device(i: int) -> None:
        try:
            x = dict(xs[i])
            for r in range(1, rounds + 1):
                x, miss = engines[i].exchange(r, drift(x, r, i))
                missing[i].append(miss)
            engines[i].linger(deadline_s)  # as the agent does: its last message may be lost
            results[i] = x
        except BaseException as exc:  # surfaced by the caller
            errors.append(exc)

    threads = [threading.Thread(target=device, args=(i,)) for i in range(n) if i not in absent]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    for t in transports:
        if t is not None:
            t.flush(5.0)
            t.close()
    if errors:
        raise errors[0]
    return results, missing, engines
