"""An exact delivery ledger through a crash (issue 25): counts survive the agent's restart.

A receiver SIGKILLed after it applied a round's messages but before that round's report
loses what it counted in memory; its checkpoint (written with the round's report) holds
the ledger as of its last report, and the restarted agent counts on from there. The
identity checked is the coordinator's: for every (sender, receiver), every sequence number
the sender used is heard of by the receiver and is exactly one of applied, recovered by
keyframe, lost, unrepaired or discarded.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest
from gossip_scenarios import FLEET, JOB, drift, make_algorithms

from edge_agent.engine import GossipEngine
from edge_agent.ledger import DeliveryLedger
from edge_agent.resume import delivery_state, restore_delivery
from edge_agent.transport.base import Message
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.aggregation import ChocoGossip
from meshfl.codecs import parse_codec
from meshfl.wire import status_topic

OUTCOMES = ("applied", "recovered", "lost", "unrepaired", "discarded")


def test_a_restored_ledger_counts_on_and_a_keyframe_recovers_what_came_after_the_checkpoint() -> (
    None
):
    ledger = DeliveryLedger(["s"])
    for sequence in (1, 2, 3):
        ledger.arrived("s", sequence)
        ledger.applied("s", sequence, full_state=False)
    engine = {"applied": 3, "stale": 0, "duplicates": 0, "unsigned": 0, "bad_signature": 0,
              "replayed": 0, "sequence": 3}  # fmt: skip
    first = ledger.take_round(engine)
    saved = json.loads(json.dumps(ledger.state()))  # what the checkpoint holds
    ledger.arrived("s", 4)  # applied after the checkpoint, then the process died
    ledger.applied("s", 4, full_state=False)

    restarted = DeliveryLedger(["s"])
    restarted.restore(saved)
    restarted.from_first_seen(["s"])  # a resumed device: "s" is known, not counted afresh
    restarted.arrived("s", 6)  # the keyframe it asked for; 4 and 5 are in it
    restarted.applied("s", 6, full_state=True)
    after = restarted.take_round({**engine, "applied": 1, "sequence": 5})

    assert first["applied"] == 3 and after["applied"] == 1  # the engine's count restarted at 0
    assert (after["missing"], after["recovered_by_keyframe"]) == (2, 2)
    peer = after["peers"]["s"]
    assert peer["high"] == 6 and peer["heard"] == 6
    assert (peer["applied"], peer["recovered"], peer["discarded"]) == (4, 2, 0)
    assert peer["heard"] == sum(peer[k] for k in OUTCOMES)


def test_restoring_a_damaged_ledger_state_raises_and_changes_nothing() -> None:
    ledger = DeliveryLedger(["s"])
    ledger.arrived("s", 1)
    with pytest.raises(ValueError):
        ledger.restore({"counts": {"sent": "many"}})
    with pytest.raises(ValueError):
        ledger.restore({**ledger.state(), "applied": {"s": [[5, 1]]}})
    assert ledger.peer_counts()["s"]["heard"] == 1


def _engine(
    bus: MemoryBroker, i: int, ids: list[str], algo: ChocoGossip, first_sequence: int = 0
) -> GossipEngine:
    transport = MemoryTransport(bus)
    will = Message(status_topic(FLEET, ids[i]), b'{"state": "offline"}', retain=True)
    transport.connect(ids[i], will=will)
    return GossipEngine(
        transport=transport, fleet=FLEET, job_id=JOB, device_id=ids[i],
        neighbours=[ids[1 - i]], algorithm=algo, deadline_s=10.0,
        first_sequence=first_sequence,
    )  # fmt: skip


def test_a_receiver_killed_before_its_report_accounts_for_every_message_exactly() -> None:
    bus = MemoryBroker()
    ids, _, xs, algos = make_algorithms(2, "choco", "topk:0.3")
    sender, receiver = _engine(bus, 0, ids, algos[0]), _engine(bus, 1, ids, algos[1])
    sender.start()
    receiver.start()
    reports: dict[str, list[Any]] = {ids[0]: [], ids[1]: []}
    checkpoint: dict[str, Any] = {}

    def sender_rounds() -> None:
        x = xs[0]
        for round_ in (1, 2, 3, 4):
            x, _ = sender.exchange(round_, drift(x, round_, 0))
            reports[ids[0]].append(sender.take_ledger(final=round_ == 4))
        sender.linger(10.0)

    def receiver_rounds() -> None:
        x = xs[1]
        for round_ in (1, 2):
            x, _ = receiver.exchange(round_, drift(x, round_, 1))
            reports[ids[1]].append(receiver.take_ledger())
            checkpoint.update(
                sequence=receiver.sequence, state=json.dumps(delivery_state(receiver))
            )
        receiver.exchange(3, drift(x, 3, 1))  # applied the sender's round 3 ...
        receiver.transport.kill()  # ... and was SIGKILLed before reporting it

    threads = [threading.Thread(target=sender_rounds), threading.Thread(target=receiver_rounds)]
    for t in threads:
        t.start()
    threads[1].join(timeout=30)
    # Restarted from its checkpoint of round 2 (as edge_agent.resume does it).
    fresh = ChocoGossip(
        xs[1], {ids[0]: 0.5}, 0.5, consensus_step=0.5, codec=parse_codec("topk:0.3")
    )
    restarted = _engine(bus, 1, ids, fresh, first_sequence=checkpoint["sequence"] + 1)
    restore_delivery(restarted, json.loads(checkpoint["state"]))
    restarted.ledger.counts.sent += restarted.sequence - checkpoint["sequence"]
    restarted.request_keyframes([ids[0]])
    restarted.start()
    assert restarted.catch_up(10.0) is not None
    x = xs[1]
    for round_ in (3, 4):
        x, _ = restarted.exchange(round_, drift(x, round_, 1), no_wait=[ids[0]] * (round_ == 3))
        reports[ids[1]].append(restarted.take_ledger(final=round_ == 4))
    restarted.linger(10.0)
    threads[0].join(timeout=30)
    assert not threads[0].is_alive()

    used = {ids[0]: sender.sequence, ids[1]: restarted.sequence}
    for device, peer in ((ids[0], ids[1]), (ids[1], ids[0])):
        sent = sum(r["sent"] for r in reports[device])
        assert sent == used[device]  # every number used is counted once, crash or not
        counts = reports[peer][-1]["peers"][device]
        assert counts["high"] == used[device] == counts["heard"]  # nothing unaccounted
        assert counts["heard"] == sum(counts[k] for k in OUTCOMES)
        assert counts["lost"] == counts["unrepaired"] == counts["discarded"] == 0, (
            device,
            counts,
            [r["peers"] for r in reports[peer]],
        )
    after_crash = reports[ids[1]][-1]["peers"][ids[0]]
    assert after_crash["recovered"] >= 1  # the round-3 message it had applied, then lost
    assert sum(r["applied_twice"] for rs in reports.values() for r in rs) == 0
    assert np.isfinite(x["w"]).all()


def test_a_former_peer_keeps_what_was_heard_of_it_and_is_marked_untracked() -> None:
    # A topology change (a device taken out) untracks a peer: its later numbers were not
    # for this device, so the coordinator must not count them unaccounted.
    ledger = DeliveryLedger(["s"])
    for sequence in (1, 2, 3):
        ledger.arrived("s", sequence)
        ledger.applied("s", sequence, full_state=False)
    ledger.untrack(["s"])
    counts = ledger.peer_counts()["s"]
    assert (counts["high"], counts["heard"], counts["tracked"]) == (3, 3, 0)
    assert counts["heard"] == sum(counts[k] for k in OUTCOMES)
