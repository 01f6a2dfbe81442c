"""The synchronous gossip round engine of one device in one job.

Each round the device publishes its message (CHOCO-SGD's compressed difference or
D-PSGD's model) once on its own delta topic — the broker fans it out to every
neighbour — then collects its neighbours' messages for the same round until each has
answered, been reported offline by its status topic (Last Will), or the round
deadline passed. It then takes the consensus step with the neighbours that answered
and records who was missing. A neighbour that missed the previous round is *suspected*:
the next round takes its message if it is already there but does not wait for it, so
one hung device costs its neighbours one deadline, not one per round; any message from
it clears the suspicion.

Delivery is at least once (MQTT QoS 1, persistent sessions); the engine applies each
message exactly once by ``(sender, sequence)``. Messages for a future round are held
until the device reaches that round; a CHOCO difference that arrives after its round's
deadline is still applied (replica updates are additive), a D-PSGD model older than the
one already held is dropped as stale. Malformed bytes are counted and dropped: nothing
a neighbour sends can stop the engine.

The engine runs on the agent's main thread; the transport's network thread only puts
``(topic, payload)`` pairs on a queue.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from edge_agent.transport.base import Transport
from meshfl.aggregation import GossipAlgorithm
from meshfl.errors import MeshflError
from meshfl.wire import (
    DEFAULT_MAX_PAYLOAD,
    Envelope,
    MessageKind,
    Reassembler,
    delta_topic,
    new_message_id,
    pack_message,
    parse_topic,
    status_topic,
)
from meshfl.wire.serde import decode_envelope

__all__ = ["EngineStats", "GossipEngine", "status_payload"]

log = logging.getLogger("meshfl.agent.engine")

Params = Mapping[str, np.ndarray]


def status_payload(state: str, job: str | None = None, round_: int | None = None) -> bytes:
    """The JSON body of a device's retained status message (``online``/``offline``)."""
    return json.dumps({"state": state, "job": job, "round": round_}).encode()


@dataclass
class EngineStats:
    """Counters of what the engine did with incoming messages."""

    applied: int = 0
    duplicates: int = 0
    stale: int = 0
    rejected: int = 0
    late: int = 0
    foreign: int = 0
    rejected_reasons: list[str] = field(default_factory=list)


class GossipEngine:
    """Exchange messages with neighbours, round by round, for one job.

    Parameters
    ----------
    transport
        A connected :class:`~edge_agent.transport.base.Transport`.
    fleet, job_id, device_id
        Identify this device's messages; messages of other fleets or jobs are ignored.
    neighbours
        Device ids of this device's neighbours (the nonzero off-diagonal entries of its
        row of the mixing matrix).
    algorithm
        The gossip algorithm holding the replicas (:class:`~meshfl.aggregation.ChocoGossip`
        or :class:`~meshfl.aggregation.DPSGDGossip`).
    deadline_s
        Seconds a round waits for neighbours after this device published (default 30).
    max_payload
        Maximum MQTT payload in bytes; messages are chunked under it (default 128 KiB).

    """

    def __init__(
        self,
        *,
        transport: Transport,
        fleet: str,
        job_id: str,
        device_id: str,
        neighbours: list[str],
        algorithm: GossipAlgorithm,
        deadline_s: float = 30.0,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.fleet = fleet
        self.job_id = job_id
        self.device_id = device_id
        self.neighbours = list(neighbours)
        self.algorithm = algorithm
        self.deadline_s = deadline_s
        self.max_payload = max_payload
        self.clock = clock
        self.stats = EngineStats()
        self._inbox: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self._reassembler = Reassembler(timeout_s=max(60.0, 4 * deadline_s))
        self._applied: dict[str, set[int]] = {n: set() for n in self.neighbours}
        self._answered: dict[int, set[str]] = {}
        self._held: dict[int, list[Envelope]] = {}
        self._latest_round: dict[str, int] = {}
        self._offline: set[str] = set()
        self._suspected: set[str] = set()
        self._ready: set[str] = set()
        self._sequence = 0
        self._round = 0

    @property
    def duplicates(self) -> int:
        """Duplicates dropped: repeated chunks and repeated ``(sender, sequence)`` messages."""
        return self.stats.duplicates + self._reassembler.stats.duplicates

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe to the neighbours' delta and status topics, then announce readiness.

        The retained status ``{"state": "online", "job": JOB}`` is published only after
        the broker acknowledged every subscription, so a neighbour that waits for it
        (:meth:`wait_ready`) before its first round cannot publish into the void.
        """
        self.transport.set_handler(self._on_message)
        for n in self.neighbours:
            self.transport.subscribe(delta_topic(self.fleet, n), qos=1)
            self.transport.subscribe(status_topic(self.fleet, n), qos=1)
        self.transport.publish(
            status_topic(self.fleet, self.device_id),
            status_payload("online", self.job_id, 0),
            qos=1,
            retain=True,
        )

    def leave(self) -> None:
        """Announce that this device left the job (finished, stopped or failed)."""
        self.transport.publish(
            status_topic(self.fleet, self.device_id), status_payload("online"), qos=1, retain=True
        )

    def wait_ready(self, timeout_s: float) -> list[str]:
        """Wait until every neighbour announced this job or is offline (the start barrier).

        Returns the sorted ids of neighbours that were not ready after ``timeout_s``
        seconds; the job proceeds without waiting for them.
        """
        deadline = self.clock() + timeout_s
        while not all(n in self._ready or n in self._offline for n in self.neighbours):
            remaining = deadline - self.clock()
            if remaining <= 0:
                break
            try:
                topic, payload = self._inbox.get(timeout=min(remaining, 0.25))
            except queue.Empty:
                continue
            self._handle(topic, payload)
        return sorted(set(self.neighbours) - self._ready - self._offline)

    def _on_message(self, topic: str, payload: bytes) -> None:
        # Runs on the transport's network thread: do nothing but hand over.
        self._inbox.put((topic, payload))

    # -- one round --------------------------------------------------------------------

    def exchange(self, round_: int, x: Params) -> tuple[dict[str, np.ndarray], list[str]]:
        """Publish this round's message, gather the neighbours', take the consensus step.

        Parameters
        ----------
        round_
            The round number (1-based).
        x
            This device's model after local training (name → float32 array).

        Returns
        -------
        (params, missing)
            The model after the consensus step, and the sorted ids of neighbours whose
            round message did not arrive before the deadline.

        """
        self._round = round_
        self._publish(round_, x)
        for env in self._held.pop(round_, []):
            self._apply(env)
        deadline = self.clock() + self.deadline_s
        while not self._round_complete(round_):
            remaining = deadline - self.clock()
            if remaining <= 0:
                break
            try:
                topic, payload = self._inbox.get(timeout=min(remaining, 0.25))
            except queue.Empty:
                continue
            self._handle(topic, payload)
        self._drain()
        answered = self._answered.pop(round_, set())
        missing = sorted(set(self.neighbours) - answered)
        self._suspected = set(missing)
        if missing:
            log.info("round %d: proceeding without %s", round_, ", ".join(missing))
        return self.algorithm.mix(x, answered), missing

    def _publish(self, round_: int, x: Params) -> None:
        self._sequence += 1
        env = Envelope(
            kind=MessageKind(self.algorithm.message_kind),
            fleet=self.fleet,
            job=self.job_id,
            round=round_,
            sender=self.device_id,
            message_id=new_message_id(),
            sequence=self._sequence,
            tensors=self.algorithm.outgoing(x),
        )
        topic = delta_topic(self.fleet, self.device_id)
        for chunk in pack_message(env, self.max_payload):
            self.transport.publish(topic, chunk, qos=1)

    def _round_complete(self, round_: int) -> bool:
        answered = self._answered.get(round_, set())
        skip = self._offline | self._suspected
        return all(n in answered or n in skip for n in self.neighbours)

    def _drain(self) -> None:
        """Handle whatever already arrived without waiting (late messages, statuses)."""
        while True:
            try:
                topic, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(topic, payload)

    # -- incoming ---------------------------------------------------------------------

    def _handle(self, topic: str, payload: bytes) -> None:
        try:
            info = parse_topic(topic)
            if info.kind == "status":
                self._on_status(info.device, payload)
            elif info.kind == "delta":
                message = self._reassembler.feed(payload)
                if message is not None:
                    self._on_envelope(info.device, decode_envelope(message))
        except MeshflError as exc:
            self.stats.rejected += 1
            if len(self.stats.rejected_reasons) < 20:
                self.stats.rejected_reasons.append(str(exc))
            log.warning("dropped a message on %s: %s", topic, exc)

    def _on_status(self, device: str | None, payload: bytes) -> None:
        if device is None or device not in self._applied:
            return
        # An empty payload only deletes a retained status: it says nothing about liveness.
        # Anything that is not a status object is ignored too (and counted).
        try:
            status = json.loads(payload)
            state, job = status.get("state"), status.get("job")
        except (ValueError, AttributeError):
            if payload:
                self.stats.rejected += 1
            return
        if state == "offline" or (state == "declined" and job == self.job_id):
            self._offline.add(device)
        elif state == "online" and job == self.job_id:
            self._offline.discard(device)
            self._ready.add(device)
        elif state == "online" and device in self._ready:
            self._offline.add(device)  # it was in this job and has left it (done or stopped)

    def _on_envelope(self, topic_device: str | None, env: Envelope) -> None:
        if env.fleet != self.fleet or env.job != self.job_id:
            self.stats.foreign += 1
            return
        if env.sender != topic_device or env.sender not in self._applied:
            self.stats.rejected += 1
            log.warning("dropped a message from %r on %r's topic", env.sender, topic_device)
            return
        seen = self._applied[env.sender]
        if env.sequence in seen:
            self.stats.duplicates += 1
            return
        seen.add(env.sequence)
        if env.round > self._round:
            self._held.setdefault(env.round, []).append(env)
        else:
            self._apply(env)

    def _apply(self, env: Envelope) -> None:
        sender = env.sender
        if env.kind == MessageKind.MODEL and env.round < self._latest_round.get(sender, 0):
            self.stats.stale += 1
            return
        try:
            self.algorithm.incoming(sender, env.tensors)
        except MeshflError as exc:
            self.stats.rejected += 1
            log.warning("dropped %s's round %d message: %s", sender, env.round, exc)
            return
        self._latest_round[sender] = max(env.round, self._latest_round.get(sender, 0))
        self._suspected.discard(sender)
        self.stats.applied += 1
        if env.round < self._round:
            self.stats.late += 1
        else:
            self._answered.setdefault(env.round, set()).add(sender)
