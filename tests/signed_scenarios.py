"""Signed-delta scenarios shared by the in-memory and the real-broker test suites.

:func:`signed_engines` builds the engines of ``gossip_scenarios`` with a signer (each
device's own Ed25519 identity key) and a verifier (every device's public key, as the
coordinator's ``Assignment.peer_keys``); :func:`run_round` runs one round on all of them
at once, so a test can act between rounds while every engine is idle.
"""

from __future__ import annotations

import threading

import numpy as np
from gossip_scenarios import FLEET, JOB, TransportFactory, drift, make_algorithms

from edge_agent.engine import GossipEngine
from edge_agent.secagg.crypto import IdentityKey
from edge_agent.signing import Signer, Verifier
from edge_agent.transport.base import Message, Transport
from meshfl.wire import status_topic


def signed_engines(
    factory: TransportFactory, n: int, codec: str = "topk:0.3", deadline_s: float = 20.0
) -> tuple[list[GossipEngine], list[Transport], list[dict[str, np.ndarray]], list[IdentityKey]]:
    """Started, ready engines of an ``n``-ring; returns engines, transports, x0, keys."""
    ids, graph, xs, algos = make_algorithms(n, "choco", codec)
    keys = [IdentityKey.generate() for _ in range(n)]
    peer_keys = {ids[i]: keys[i].public_b64 for i in range(n)}
    engines, transports = [], []
    for i in range(n):
        transport = factory(ids[i])
        will = Message(status_topic(FLEET, ids[i]), b'{"state": "offline"}', retain=True)
        transport.connect(ids[i], will=will)
        engine = GossipEngine(
            transport=transport,
            fleet=FLEET,
            job_id=JOB,
            device_id=ids[i],
            neighbours=[ids[j] for j in graph.neighbours(i)],
            algorithm=algos[i],
            deadline_s=deadline_s,
            max_payload=1024,
            signer=Signer(keys[i]),
            verifier=Verifier(peer_keys),
        )
        engine.start()
        engines.append(engine)
        transports.append(transport)
    for engine in engines:
        assert engine.wait_ready(deadline_s) == []
    return engines, transports, [dict(x) for x in xs], keys


def run_round(
    engines: list[GossipEngine], xs: list[dict[str, np.ndarray]], round_: int
) -> list[list[str]]:
    """Round ``round_`` on every engine in parallel (``xs`` updated); the missing lists."""
    missing: list[list[str]] = [[] for _ in engines]
    errors: list[BaseException] = []

    def device(i: int) -> None:
        try:
            xs[i], missing[i] = engines[i].exchange(round_, drift(xs[i], round_, i))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=device, args=(i,)) for i in range(len(engines))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    if errors:
        raise errors[0]
    return missing
