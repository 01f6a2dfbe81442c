"""Issue 7's broker-limit scenarios as whole jobs: ``run_local`` against a tuned Mosquitto.

Each scenario runs one job twice with the same seed: on a Mosquitto with meshfl's default
limits (the baseline: 4 MiB packets, 20 in flight) and on one with the scenario's limit
(:class:`~broker.tuning.MosquittoTuning`). An observer client subscribed to every delta and
inbox topic records each chunk's size and header, so the tests see what crossed the broker:

- a 1 MiB Maximum Packet Size against ~2.7 MB identity-coded deltas (MLP hidden 9000 on
  digits: 675,010 float32 parameters) with ``max_payload_bytes`` 4 MiB, so only the
  broker's CONNACK makes the agents chunk (Mosquitto disconnects a client whose packet is
  larger: "disconnected due to oversize packet", and paho re-sends it forever);
- a Receive Maximum of 5 (``max_inflight_messages 5``) against 77 kB deltas (MLP hidden
  256) in 1 KiB chunks, 79 a delta, all published at once. Mosquitto 2.0.11 does not
  disconnect a client that exceeds it, so the agents' logged in-flight window (the
  transport logs each CONNACK's limits) is what shows the cap.

Both end like the other acceptance scenarios: the job completed with every round
reported, final mean accuracy within 1 point of the baseline, and a ledger with nothing
applied twice or corrupted and every loss recovered or reported.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from broker.mosquitto import MosquittoProcess
from broker.tuning import MosquittoTuning
from edge_agent.transport.limits import PUBLISH_OVERHEAD
from edge_agent.transport.mqtt import MqttTransport
from meshfl.app.local.run import LocalConfig, LocalRun, run_local
from meshfl.errors import MeshflError
from meshfl.wire.serde import decode_chunk

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MIB = 1024 * 1024
AGENTS = 4
ROUNDS = 8
BIG_JOB = LocalConfig(
    agents=AGENTS,
    rounds=ROUNDS,
    dataset="digits",
    seed=0,
    codec="identity",
    hidden=(9000,),  # 64*9000 + 9000 + 9000*10 + 10 = 675,010 float32: 2.7 MB a delta
    max_payload_bytes=4 * MIB,  # more than the broker allows: its CONNACK must bind
    round_deadline_s=20.0,
)
MANY_CHUNKS_JOB = replace(
    BIG_JOB,
    hidden=(256,),  # 19,210 float32: 76.9 kB a delta
    max_payload_bytes=1024,  # 986 body bytes a chunk: 79 chunks a 77,072-byte delta
)


@dataclass
class Message:
    """What the observer saw of one message id: its chunk count, size and chunks."""

    count: int
    total: int
    indices: set[int] = field(default_factory=set)
    largest_chunk: int = 0
    largest_packet: int = 0
    """Bytes of the largest chunk's QoS 1 PUBLISH packet, at most (payload, topic, header)."""


class Observer:
    """A client on the job's broker recording the header of every chunk that crosses it."""

    def __init__(self, url: str) -> None:
        self.messages: dict[bytes, Message] = {}
        self.chunks = 0
        self.undecodable = 0
        self._lock = threading.Lock()
        self.transport = MqttTransport(url, keepalive_s=10)
        self.transport.set_handler(self._record)
        self.transport.subscribe("meshfl/v1/+/node/+/delta")
        self.transport.subscribe("meshfl/v1/+/node/+/inbox/+")
        self.transport.connect("limits-observer")

    def _record(self, topic: str, payload: bytes) -> None:
        try:
            chunk = decode_chunk(payload)
        except MeshflError:
            with self._lock:
                self.undecodable += 1
            return
        with self._lock:
            self.chunks += 1
            seen = self.messages.setdefault(chunk.message_id, Message(chunk.count, chunk.total))
            seen.indices.add(chunk.index)
            seen.largest_chunk = max(seen.largest_chunk, len(payload))
            packet = PUBLISH_OVERHEAD + len(topic.encode()) + len(payload)
            seen.largest_packet = max(seen.largest_packet, packet)

    def complete(self) -> bool:
        """True when every message seen so far arrived whole."""
        with self._lock:
            return all(len(m.indices) == m.count for m in self.messages.values())

    def deltas(self, at_least: int) -> list[Message]:
        """The messages of ``at_least`` bytes or more (deltas and keyframes of the job)."""
        with self._lock:
            return [m for m in self.messages.values() if m.total >= at_least]


@dataclass
class ObservedRun:
    """One job on one Mosquitto: its result, what the observer saw, and the logs."""

    run: LocalRun
    observer: Observer
    broker_log: str
    agent_logs: list[str]
    seconds: float

    @property
    def report(self) -> dict[str, Any]:
        return self.run.report


def run_observed(job: LocalConfig, tuning: MosquittoTuning, out: Path) -> ObservedRun:
    """Run ``job`` on its own Mosquitto with ``tuning``, observed; keep ``chunks.json``."""
    workdir = out / "mosquitto"
    workdir.mkdir(parents=True)
    with MosquittoProcess(workdir=workdir, tuning=tuning) as broker:
        observer = Observer(broker.url)
        started = time.monotonic()
        try:
            run = run_local(replace(job, broker=broker.url, out=out / "run"))
            seconds = time.monotonic() - started
            deadline = time.monotonic() + 10.0  # the observer may trail the agents a little
            while not observer.complete() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            observer.transport.close()
    summary = {
        "seconds": seconds,
        "chunks": observer.chunks,
        "messages": [
            {"count": m.count, "total": m.total, "seen": len(m.indices), "largest": m.largest_chunk}
            for m in observer.messages.values()
        ],
    }
    (out / "chunks.json").write_text(json.dumps(summary, indent=1))
    logs = sorted((out / "run" / "logs").glob("device-*.log"))
    return ObservedRun(
        run, observer, broker.log_path.read_text(), [p.read_text() for p in logs], seconds
    )


@dataclass
class Pair:
    baseline: ObservedRun
    limited: ObservedRun


@pytest.fixture(scope="module")
def small_packets(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    """``BIG_JOB`` on default limits and on a 1 MiB Maximum Packet Size."""
    out = tmp_path_factory.mktemp("packet-size")
    return Pair(
        run_observed(BIG_JOB, MosquittoTuning(), out / "baseline"),
        run_observed(BIG_JOB, MosquittoTuning(max_packet_bytes=MIB), out / "limited"),
    )


@pytest.fixture(scope="module")
def five_in_flight(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    """``MANY_CHUNKS_JOB`` on default limits and on a Receive Maximum of 5."""
    out = tmp_path_factory.mktemp("receive-maximum")
    return Pair(
        run_observed(MANY_CHUNKS_JOB, MosquittoTuning(), out / "baseline"),
        run_observed(MANY_CHUNKS_JOB, MosquittoTuning(max_inflight_messages=5), out / "limited"),
    )


def assert_job_finished_like_its_baseline(pair: Pair) -> None:
    """The issue's ending: completed, every round, within 1 point, a clean ledger."""
    for observed in (pair.baseline, pair.limited):
        report = observed.report
        assert report["status"] == "completed"
        assert not observed.run.failed_agents
        assert [r["round"] for r in report["rounds"]] == list(range(1, ROUNDS + 1))
        ledger = report["ledger"]["totals"]
        assert ledger["devices_reporting"] == AGENTS and ledger["rounds_reported"] == ROUNDS
        assert ledger["applied_twice"] == 0 and ledger["corrupted_applied"] == 0
        assert ledger["missing"] + ledger["awaiting_keyframe"] == (
            ledger["delivered_late"]
            + ledger["recovered_by_keyframe"]
            + ledger["unrecovered_losses"]
        )
        assert ledger["applied"] > 0 and ledger["sent"] >= AGENTS * ROUNDS
        assert report["final"]["mean_accuracy"] > 0.5  # it learns (chance: 0.1)
    limited = pair.limited.report["final"]["mean_accuracy"]
    baseline = pair.baseline.report["final"]["mean_accuracy"]
    assert abs(limited - baseline) <= 0.01


def assert_no_connection_was_dropped(observed: ObservedRun) -> None:
    """Neither the broker nor an agent saw a connection die (an over-limit publish kills one)."""
    assert "oversize packet" not in observed.broker_log
    assert "protocol error" not in observed.broker_log
    for log in observed.agent_logs:
        assert "lost connection" not in log and "reconnected to" not in log


def test_a_2_7_mb_delta_against_a_1_mib_broker_job_finishes_like_its_baseline(
    small_packets: Pair,
) -> None:
    assert_job_finished_like_its_baseline(small_packets)


def test_a_1_mib_broker_makes_the_agents_chunk_what_the_baseline_sends_whole(
    small_packets: Pair,
) -> None:
    baseline, limited = small_packets.baseline, small_packets.limited
    for log in limited.agent_logs:  # every agent learned the limit from CONNACK
        assert f"MaximumPacketSize={MIB}" in log
    assert_no_connection_was_dropped(limited)
    assert limited.observer.undecodable == 0 and limited.observer.complete()

    deltas = limited.observer.deltas(at_least=2_500_000)
    whole = baseline.observer.deltas(at_least=2_500_000)

    assert len(deltas) >= AGENTS * ROUNDS and len(whole) >= AGENTS * ROUNDS
    # Under the limit: at least three chunks, each in a PUBLISH of at most 1 MiB.
    assert all(m.count >= 3 and m.largest_packet <= MIB for m in deltas)
    assert max(m.largest_packet for m in deltas) > MIB - 1024  # chunks fill the limit
    # The same job without the limit sends each delta as one chunk over 1 MiB.
    assert all(m.count == 1 and m.largest_chunk > 2_500_000 for m in whole)


def test_fifty_chunks_at_once_against_5_in_flight_job_finishes_like_its_baseline(
    five_in_flight: Pair,
) -> None:
    assert_job_finished_like_its_baseline(five_in_flight)


def test_a_receive_maximum_of_5_caps_the_agents_window_and_every_chunk_arrives(
    five_in_flight: Pair,
) -> None:
    baseline, limited = five_in_flight.baseline, five_in_flight.limited
    for log in limited.agent_logs:
        assert "ReceiveMaximum=5" in log and "in-flight window 5)" in log
    for log in baseline.agent_logs:
        assert "ReceiveMaximum=20" in log and "in-flight window 20)" in log
    assert_no_connection_was_dropped(limited)
    assert limited.observer.undecodable == 0 and limited.observer.complete()

    deltas = limited.observer.deltas(at_least=50 * 986)

    assert len(deltas) >= AGENTS * ROUNDS
    assert all(m.count >= 50 and m.largest_chunk <= 1024 for m in deltas)
