"""The delivery ledger's balance under random drops and reorders, on the in-memory bus.

Every message a receiver had to repair is accounted for once (docs/reliability.md)::

    missing + awaiting_keyframe = delivered_late + recovered_by_keyframe + lost + unrepaired

and every replica that holds all of its sender's messages equals the sender's own x̂.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import numpy as np
import pytest
from gossip_scenarios import run_engines

from edge_agent.engine import GossipEngine
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.aggregation import ChocoGossip
from meshfl.contract import RoundLedger
from meshfl.wire import parse_topic

History = dict[tuple[str, int], list[np.ndarray]]


class FaultyTransport(MemoryTransport):
    """Drops or holds back (reorders) each chunk a device publishes, at random.

    A held chunk goes out after the next one that is sent, or at :meth:`flush`.
    """

    def __init__(self, bus: MemoryBroker, seed: str, drop: float, reorder: float) -> None:
        super().__init__(bus)
        self.rng = random.Random(seed)
        self.drop, self.reorder = drop, reorder
        self.held: list[tuple[str, bytes]] = []
        self.dropped = self.reordered = 0

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        if retain or parse_topic(topic).kind != "delta":
            super().publish(topic, payload, qos=qos, retain=retain)
            return
        draw = self.rng.random()
        if draw < self.drop:
            self.dropped += 1
        elif draw < self.drop + self.reorder:
            self.reordered += 1
            self.held.append((topic, payload))
        else:
            super().publish(topic, payload, qos=qos)
            self._release()

    def _release(self) -> None:
        held, self.held = self.held, []
        for topic, payload in held:
            super().publish(topic, payload, qos=1)

    def flush(self, timeout_s: float) -> bool:
        self._release()
        return super().flush(timeout_s)


def balance(ledger: RoundLedger) -> tuple[int, int]:
    """Both sides of the ledger's identity."""
    needed = ledger["missing"] + ledger["awaiting_keyframe"]
    settled = ledger.get("delivered_late", 0) + ledger["recovered_by_keyframe"]
    return needed, settled + ledger["lost"] + ledger["unrepaired"]


def replicas_match(engines: list[GossipEngine], history: History) -> int:
    """Check every replica against its sender's x̂ when it sent the replica's last message.

    Returns how many replicas were checked.
    """
    checked = 0
    for engine in engines:
        algorithm = engine.algorithm
        assert isinstance(algorithm, ChocoGossip)
        for peer, replica in algorithm._replicas.items():
            sequence = engine._last_seq[peer]  # 0: nothing yet, x̂ is still its start, 0
            own = history[peer, sequence] if sequence else [np.zeros_like(r) for r in replica]
            for a, b in zip(replica, own, strict=True):
                np.testing.assert_array_equal(a, b)
            checked += 1
    return checked


@pytest.mark.parametrize("seed", [1, 2, 5])  # seeds that drop and reorder
def test_every_repair_is_accounted_for_under_drops_and_reorders(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    history: History = {}  # (sender, sequence) -> the sender's x̂ once it sent it
    publish = GossipEngine._publish

    def recorded(engine: GossipEngine, round_: int, x: Mapping[str, np.ndarray]) -> None:
        publish(engine, round_, x)
        own = engine.algorithm._own  # type: ignore[attr-defined]
        history[engine.device_id, engine.sequence] = [t.copy() for t in own]

    monkeypatch.setattr(GossipEngine, "_publish", recorded)
    bus = MemoryBroker()
    transports: list[FaultyTransport] = []

    def factory(device: str) -> FaultyTransport:
        transports.append(FaultyTransport(bus, f"{seed}:{device}", drop=0.08, reorder=0.15))
        return transports[-1]

    _, _, engines = run_engines(factory, 4, 12, codec="identity", deadline_s=0.3)

    for engine in engines:
        run = engine.take_ledger()  # the first call: the whole run, with what is pending
        needed, settled = balance(run)
        assert needed == settled, run
        assert run["applied_twice"] == 0
        engine.take_ledger(final=True)  # the job ends: what is pending becomes lost
        c = engine.ledger.counts
        assert c.missing + c.awaiting_keyframe == (
            c.delivered_late + c.recovered_by_keyframe + c.lost
        )
        assert engine.ledger.unrepaired == 0
    assert sum(t.dropped for t in transports) > 0 and sum(t.reordered for t in transports) > 0
    assert sum(e.ledger.counts.missing for e in engines) > 0
    # Late deliveries and keyframes both repair (which ones, depends on the threads'
    # timing: test_ledger.py pins each way down).
    repaired = sum(e.ledger.counts.delivered_late + e.ledger.counts.recovered_by_keyframe
                   for e in engines)  # fmt: skip
    assert repaired > 0
    assert replicas_match(engines, history) == 8  # ring of 4: every replica is whole
