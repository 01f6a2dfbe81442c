"""The gossip engine over the in-memory bus (the same scenarios run on real brokers)."""

from __future__ import annotations

import numpy as np
import pytest
from gossip_scenarios import reference, run_engines

from edge_agent.transport.base import Transport
from edge_agent.transport.memory import MemoryBroker, MemoryTransport


class DuplicatingTransport(MemoryTransport):
    """Publishes every QoS-1 message twice, as a broker may deliver after a reconnect."""

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        super().publish(topic, payload, qos=qos, retain=retain)
        if not retain:
            super().publish(topic, payload, qos=qos, retain=retain)


@pytest.fixture
def bus() -> MemoryBroker:
    return MemoryBroker()


@pytest.mark.parametrize(
    ("algorithm", "codec"), [("choco", "topk:0.3"), ("choco", "identity"), ("dpsgd", "identity")]
)
def test_engine_matches_lockstep_reference(bus: MemoryBroker, algorithm: str, codec: str) -> None:
    expected = reference(5, 4, algorithm, codec)

    got, missing, _ = run_engines(lambda _id: MemoryTransport(bus), 5, 4, algorithm, codec)

    for g, e in zip(got, expected, strict=True):
        assert g is not None
        for name in e:
            np.testing.assert_array_equal(g[name], e[name])
    assert all(m == [] for per_device in missing for m in per_device)


def test_duplicates_are_applied_exactly_once(bus: MemoryBroker) -> None:
    expected = reference(4, 3, "choco", "topk:0.3")

    got, _, engines = run_engines(lambda _id: DuplicatingTransport(bus), 4, 3)

    for g, e in zip(got, expected, strict=True):
        assert g is not None
        np.testing.assert_array_equal(g["w"], e["w"])
    assert sum(e.duplicates for e in engines) > 0
    assert sum(e.stats.rejected for e in engines) == 0


def test_absent_neighbour_is_reported_missing_after_the_deadline(bus: MemoryBroker) -> None:
    got, missing, _ = run_engines(
        lambda _id: MemoryTransport(bus), 4, 2, deadline_s=0.5, absent=frozenset({2})
    )

    # dev-2's ring neighbours are dev-1 and dev-3: they proceed without it every round.
    assert missing[1] == [["dev-2"], ["dev-2"]]
    assert missing[3] == [["dev-2"], ["dev-2"]]
    # dev-0 may see its neighbours late while they wait out the deadline, never dev-2.
    assert all(set(m) <= {"dev-1", "dev-3"} for m in missing[0])
    assert all(np.isfinite(g["w"]).all() for g in got if g is not None)


def _kill_dev_2(bus: MemoryBroker) -> None:
    """dev-2 connects with its Last Will ("offline", retained) and dies: the Will is out."""
    from gossip_scenarios import FLEET

    from edge_agent.transport.base import Message
    from meshfl.wire import status_topic

    dead: Transport = MemoryTransport(bus)
    dead.connect(
        "dev-2", will=Message(status_topic(FLEET, "dev-2"), b'{"state": "offline"}', retain=True)
    )
    dead.kill()  # type: ignore[attr-defined]


def test_offline_status_ends_the_wait_early(bus: MemoryBroker) -> None:
    import time

    _kill_dev_2(bus)
    started = time.monotonic()

    _, missing, _ = run_engines(
        lambda _id: MemoryTransport(bus), 4, 2, deadline_s=30.0, absent=frozenset({2})
    )

    assert time.monotonic() - started < 10.0
    assert missing[1] == [["dev-2"], ["dev-2"]]


def test_an_offline_neighbour_is_waited_for_through_the_offline_grace(bus: MemoryBroker) -> None:
    import time

    _kill_dev_2(bus)
    started = time.monotonic()

    _, missing, engines = run_engines(
        lambda _id: MemoryTransport(bus),
        4,
        2,
        deadline_s=30.0,
        absent=frozenset({2}),
        offline_grace_s=3.0,
    )

    # The Will came before round 1: round 1 waits until it is 3 s old, round 2 not at all.
    assert 3.0 <= time.monotonic() - started < 10.0
    assert missing[1] == [["dev-2"], ["dev-2"]]
    assert engines[1].offline_grace_s == 3.0


@pytest.mark.parametrize("grace", [0.5, float("nan"), True])
def test_an_offline_grace_under_one_second_is_refused(grace: float) -> None:
    from gossip_scenarios import FLEET, JOB, make_algorithms

    from edge_agent.engine import GossipEngine
    from meshfl.errors import ConfigError

    _, _, _, algos = make_algorithms(2, "choco", "topk:0.3")
    with pytest.raises(ConfigError, match=r"offline_grace_s must be >= 1\.0"):
        GossipEngine(
            transport=MemoryTransport(MemoryBroker()),
            fleet=FLEET,
            job_id=JOB,
            device_id="dev-0",
            neighbours=["dev-1"],
            algorithm=algos[0],
            offline_grace_s=grace,
        )


class VandalTransport(MemoryTransport):
    """Sends garbage, a truncated chunk and a flipped byte before every real message."""

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        if not retain:
            super().publish(topic, b"\x00garbage" * 10, qos=qos)
            super().publish(topic, payload[: len(payload) // 2], qos=qos)
            flipped = bytearray(payload)
            flipped[len(flipped) // 2] ^= 0xFF
            super().publish(topic, bytes(flipped), qos=qos)
        super().publish(topic, payload, qos=qos, retain=retain)


def test_garbage_on_a_delta_topic_is_counted_and_dropped(bus: MemoryBroker) -> None:
    expected = reference(3, 2, "choco", "topk:0.3")

    got, _, engines = run_engines(lambda _id: VandalTransport(bus), 3, 2)

    for g, e in zip(got, expected, strict=True):
        assert g is not None
        np.testing.assert_array_equal(g["w"], e["w"])
    # each device receives 3 bad copies of each of its 2 neighbours' messages, 2 rounds
    assert [e.stats.rejected for e in engines] == [12, 12, 12]


class EmptyStatusTransport(MemoryTransport):
    """Before every delta, sends an empty (non-retained) message on every status topic."""

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        from gossip_scenarios import FLEET

        from meshfl.wire import status_topic

        if topic.endswith("/delta"):
            for k in range(4):
                super().publish(status_topic(FLEET, f"dev-{k}"), b"", qos=1)
        super().publish(topic, payload, qos=qos, retain=retain)


def test_empty_status_messages_do_not_mark_neighbours_offline(bus: MemoryBroker) -> None:
    expected = reference(4, 3, "choco", "topk:0.3")

    got, missing, _ = run_engines(lambda _id: EmptyStatusTransport(bus), 4, 3, deadline_s=20.0)

    assert all(m == [] for per_device in missing for m in per_device)
    for g, e in zip(got, expected, strict=True):
        assert g is not None
        np.testing.assert_array_equal(g["w"], e["w"])


def test_a_declined_status_for_this_job_ends_the_wait_early(bus: MemoryBroker) -> None:
    import time

    from gossip_scenarios import FLEET, JOB

    from meshfl.wire import status_topic
    from meshfl.wire.status import encode_status

    decliner = MemoryTransport(bus)
    decliner.connect("dev-2")
    decliner.publish(status_topic(FLEET, "dev-2"), encode_status("declined", JOB), retain=True)
    started = time.monotonic()

    _, missing, _ = run_engines(
        lambda _id: MemoryTransport(bus), 4, 2, deadline_s=30.0, absent=frozenset({2})
    )

    assert time.monotonic() - started < 10.0  # neither the start barrier nor a deadline
    assert missing[1] == [["dev-2"], ["dev-2"]] and missing[3] == [["dev-2"], ["dev-2"]]
