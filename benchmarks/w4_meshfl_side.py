"""W4's meshfl side: N gossip engines in one process, each over its own MQTT connection.

Each device is a :class:`~edge_agent.engine.GossipEngine` over an
:class:`~edge_agent.transport.mqtt.MqttTransport` (its own paho client and network
thread), running CHOCO-Gossip (:class:`~meshfl.aggregation.ChocoGossip`, γ = 1) with the
identity codec and Metropolis–Hastings weights, so every message carries the full
float32 difference x − x̂ (``delta_bytes / 4`` elements) in one envelope, chunked at the
default 128 KiB. There is no training: each round a device adds its own fixed random
vector (drawn once, numpy seed) to its model before :meth:`GossipEngine.exchange`.

Delivered bytes are the chunk payloads that arrive on the neighbours' delta topics,
counted by a wrapper around each engine's message handler; re-sent messages (inbox
topics, on repair requests) are counted apart and are not goodput.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from w4_rounds import SideResult, drive

from edge_agent.engine import GossipEngine
from edge_agent.transport.base import Handler
from edge_agent.transport.mqtt import MqttTransport
from meshfl.aggregation import ChocoGossip
from meshfl.codecs import parse_codec
from meshfl.topology import Graph, metropolis_hastings
from meshfl.wire import (
    DEFAULT_MAX_PAYLOAD,
    Envelope,
    MessageKind,
    encode_envelope,
    new_message_id,
    split_message,
)

TENSOR = "delta"
DEADLINE_S = 600.0  # rounds never end on the deadline here: every message is waited for


@dataclass
class Counter:
    """Counts MQTT payloads on delta and inbox topics, then hands them to the engine."""

    inner: Handler | None = None
    delta_bytes: int = 0
    delta_chunks: int = 0
    inbox_bytes: int = 0

    def __call__(self, topic: str, payload: bytes) -> None:
        """Count ``payload`` by its topic's kind, then pass it on."""
        if topic.endswith("/delta"):
            self.delta_bytes += len(payload)
            self.delta_chunks += 1
        elif "/inbox/" in topic:
            self.inbox_bytes += len(payload)
        if self.inner is not None:
            self.inner(topic, payload)


def device_ids(n: int) -> list[str]:
    return [f"dev-{i}" for i in range(n)]


def _algorithm(graph: Graph, w: np.ndarray, i: int, elements: int) -> ChocoGossip:
    ids = device_ids(graph.n)
    neighbours = {ids[j]: float(w[i, j]) for j in graph.neighbours(i)}
    params = {TENSOR: np.zeros(elements, dtype=np.float32)}
    return ChocoGossip(params, neighbours, float(w[i, i]), 1.0, parse_codec("identity"))


def chunk_sizes(
    delta_bytes: int, fleet: str, sender: str = "dev-0", max_payload: int = DEFAULT_MAX_PAYLOAD
) -> list[int]:
    """Sizes in bytes of the MQTT payloads of one meshfl message of ``delta_bytes`` float32.

    The envelope and chunking the engine uses for ``sender`` in ``fleet`` (job ``w4``),
    so the raw side can publish exactly these sizes.
    """
    algo = ChocoGossip(
        {TENSOR: np.ones(delta_bytes // 4, dtype=np.float32)}, {}, 1.0, 1.0,
        parse_codec("identity"),
    )  # fmt: skip
    x = {TENSOR: np.full(delta_bytes // 4, 2.0, dtype=np.float32)}
    env = Envelope(
        kind=MessageKind.DELTA, fleet=fleet, job="w4", round=1, sender=sender,
        message_id=new_message_id(), sequence=1, tensors=algo.outgoing(x),
    )  # fmt: skip
    return [len(c) for c in split_message(encode_envelope(env), env.message_id, max_payload)]


def run_meshfl(
    url: str,
    graph: Graph,
    *,
    fleet: str,
    rounds: int,
    warmup: int,
    delta_bytes: int,
    seed: int,
    timeout_s: float,
) -> SideResult:
    """Run ``warmup + rounds`` gossip rounds of ``graph.n`` engines; time the last ``rounds``.

    ``fleet`` must be new on this broker (fresh topics and sessions). Raises what an
    engine or the transport raises, or RuntimeError when a round exceeds ``timeout_s``.
    """
    n, elements = graph.n, delta_bytes // 4
    ids = device_ids(n)
    w = metropolis_hastings(graph)
    rng = np.random.default_rng(seed)
    xs = [{TENSOR: rng.normal(size=elements).astype(np.float32)} for _ in range(n)]
    drifts = [rng.normal(scale=0.01, size=elements).astype(np.float32) for _ in range(n)]
    transports: list[MqttTransport] = []
    engines: list[GossipEngine] = []
    counters = [Counter() for _ in range(n)]
    missing: list[list[str]] = [[] for _ in range(n)]
    try:
        for i in range(n):
            transport = MqttTransport(url)
            transport.connect(f"{fleet}-{ids[i]}")
            transports.append(transport)
            engine = GossipEngine(
                transport=transport, fleet=fleet, job_id="w4", device_id=ids[i],
                neighbours=[ids[j] for j in graph.neighbours(i)],
                algorithm=_algorithm(graph, w, i, elements), deadline_s=DEADLINE_S,
            )  # fmt: skip
            engine.start()
            counters[i].inner = transport.handler
            transport.set_handler(counters[i])
            engines.append(engine)
        for engine in engines:
            late = engine.wait_ready(timeout_s)
            if late:
                raise RuntimeError(f"{engine.device_id}: neighbours {late} not ready")

        def step(i: int, r: int) -> None:
            x = {TENSOR: xs[i][TENSOR] + drifts[i]}
            xs[i], miss = engines[i].exchange(r, x)
            missing[i] += miss

        def delivered() -> int:
            return sum(c.delta_bytes for c in counters)

        if warmup:
            drive(n, warmup, step, delivered, timeout_s)
        applied0 = sum(e.stats.applied for e in engines)
        chunks0 = sum(c.delta_chunks for c in counters)
        round_s, delivered_bytes, cpu_s = drive(
            n, rounds, _offset(step, warmup), delivered, timeout_s
        )
    finally:
        for transport in transports:
            transport.flush(5.0)
            transport.close()
    degree_sum = sum(len(graph.neighbours(i)) for i in range(n))
    return SideResult(
        side="meshfl",
        round_s=round_s,
        delivered_bytes=delivered_bytes,
        messages_sent=n * rounds,
        deliveries_expected=degree_sum * rounds,
        deliveries=sum(e.stats.applied for e in engines) - applied0,
        cpu_s=cpu_s,
        extra={
            "chunks_delivered": sum(c.delta_chunks for c in counters) - chunks0,
            "missing": sum(len(m) for m in missing),
            "duplicates": sum(e.duplicates for e in engines),
            "rejected": sum(e.stats.rejected for e in engines),
            "repairs_requested": sum(e.stats.repairs_requested for e in engines),
            "resent": sum(e.stats.resent for e in engines),
            "inbox_bytes": sum(c.inbox_bytes for c in counters),
            "model_finite": all(bool(np.isfinite(x[TENSOR]).all()) for x in xs),
        },
    )


def _offset(step: Callable[[int, int], None], by: int) -> Callable[[int, int], None]:
    """``step`` with rounds numbered after the ``by`` warm-up rounds."""
    return lambda i, r: step(i, r + by)
