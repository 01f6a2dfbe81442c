"""Gossip rounds as a :class:`~edge_agent.round_engine.RoundEngine`: plain or compressed.

:class:`GossipRounds` drives a :class:`~edge_agent.engine.GossipEngine` (CHOCO-SGD or
D-PSGD) for the job runner and keeps what the gossip engine does not: the topology
versions this device knows of (switched at their first round, their new peers
subscribed early) and the job's checkpoints (:class:`~edge_agent.resume.Resumer`: a
resumed device's first round, the ``no_wait`` of its catch-up, a checkpoint per round).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.engine import GossipEngine
from edge_agent.resume import Resumer
from edge_agent.round_engine import EngineCounters, Params, wait_at_start_barrier
from edge_agent.versions import TopologyVersion
from meshfl.contract import RoundLedger, RoundMetrics

if TYPE_CHECKING:
    from edge_agent.trainer import Trainer

__all__ = ["GossipRounds"]

log = logging.getLogger("meshfl.agent.job")


class GossipRounds:
    """The rounds of a gossip job (see the module docstring).

    Parameters
    ----------
    engine
        The job's gossip engine, not started yet.
    topology
        The topology version of the assignment (its peers are the engine's).
    resume
        The job's checkpoints; its ``checkpoint`` (if any) was restored into ``engine``.

    """

    def __init__(self, engine: GossipEngine, topology: TopologyVersion, resume: Resumer) -> None:
        self.engine = engine
        self.stats: EngineCounters = engine.stats
        self.topology = topology
        self.resume = resume
        self.versions = {topology.version: topology}
        self._prepared = {topology.version}  # versions whose peers are tracked already

    def queue_depth(self) -> int:
        """Received messages waiting to be handled (approximate)."""
        return self.engine.queue_depth()

    def start(self) -> None:
        """Subscribe to the peers' and control topics, announce readiness."""
        self.engine.start()

    def prepare(self, start_round: int, trainer: Trainer) -> int:
        """A resumed device's first round, a joiner's catch-up, or the start barrier.

        Resumed (a checkpoint): the round after it, no start barrier (the neighbours are
        mid-job). A joiner (``start_round`` > 1): its neighbours' models (their keyframes'
        mean) replace its own, and it starts after their latest round. Otherwise: wait
        for the neighbours to announce the job.
        """
        timeout_s = max(60.0, self.engine.deadline_s)
        if self.resume.checkpoint is not None:
            return self.resume.first_round(self.engine, start_round, self.topology)
        if start_round <= 1:
            wait_at_start_barrier(self.engine.wait_ready, self.engine.deadline_s)
            return start_round
        caught = self.engine.catch_up(timeout_s)
        if caught is None:
            log.warning("joined without a neighbour's keyframe: starting from x0")
            return start_round
        round_ = max(start_round, caught[0] + 1)
        trainer.set_params(caught[1])
        log.info(
            "joined at round %d from %d neighbours' keyframes", round_, len(self.topology.peers())
        )
        return round_

    def switch(
        self, round_: int, topology: TopologyVersion, known: Mapping[int, TopologyVersion]
    ) -> TopologyVersion:
        """Track every known version's peers early; switch to the newest one in force.

        ``known`` and the versions pushed on the control topic since are kept; a version
        newer than ``topology`` has its peers subscribed (and asked for keyframes) as
        soon as it is known, and is used from its ``from_round`` on.
        """
        engine = self.engine
        for version in known.values():
            self.versions.setdefault(version.version, version)
        for message in engine.control:
            pushed = TopologyVersion.from_control(message, engine.device_id, topology.mixing)
            if pushed is not None:
                self.versions.setdefault(pushed.version, pushed)
        engine.control.clear()
        newer = sorted(
            (v for v in self.versions.values() if v.version > topology.version),
            key=lambda v: v.version,
        )
        for version in newer:
            if version.version not in self._prepared:  # subscribe and ask for keyframes early
                self._prepared.add(version.version)
                engine.set_peers(
                    engine.peers | version.peers(), need=version.peers() - topology.peers()
                )
        in_force = [v for v in newer if v.from_round <= round_]
        if in_force:
            current = max(in_force, key=lambda v: v.version)
            log.info(
                "round %d: topology v%d (%d devices)", round_, current.version, len(current.devices)
            )
            engine.set_peers(current.peers() | newer[-1].peers())
            topology = current
        self.topology = topology
        return topology

    def exchange(
        self, round_: int, params: Params, no_wait: Collection[str] = ()
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        """Mix with this round's row of W; a resumed device behind waits for nobody."""
        weights, self_weight = self.topology.row(round_)
        skip = set(no_wait) | self.resume.no_wait(round_, weights)
        return self.engine.exchange(round_, params, weights, self_weight, no_wait=skip)

    def linger(self) -> None:
        """Answer repair requests of the last message for up to a round deadline."""
        self.engine.linger(self.engine.deadline_s)

    def take_ledger(self, *, final: bool) -> RoundLedger:
        """The delivery ledger since the previous round (``docs/reliability.md``)."""
        return self.engine.take_ledger(final=final)

    def checkpoint(
        self, round_: int, trainer: Trainer, epsilon: float | None, report: RoundMetrics
    ) -> None:
        """Write the job's checkpoint after ``round_`` (a failure is logged, not raised)."""
        self.resume.save(self.engine, trainer, round_, epsilon, report)

    def next_round(self, round_: int) -> int:
        """Async (Hop-style): a device that fell behind skips to stay within τ rounds."""
        if self.engine.mode != "async":
            return round_ + 1
        return max(round_ + 1, self.engine.frontier() - self.engine.staleness + 1)

    def leave(self) -> None:
        """Announce that this device left the job."""
        self.engine.leave()
