"""What a round engine does for the job runner: the one interface of every kind of round.

The :class:`~edge_agent.job.JobRunner` trains, evaluates and reports; everything that
crosses the network in between is a :class:`RoundEngine`'s. One job's life through it::

    engine.start()                       # subscribe, announce this device
    round_ = engine.prepare(first, trainer)
    while round_ <= rounds:
        topology = engine.switch(round_, topology, known)   # a newer version in force
        params, missing = engine.exchange(round_, trained, no_wait)
        if round_ == rounds:
            engine.linger()
        ledger = engine.take_ledger(final=round_ == rounds)
        engine.checkpoint(round_, trainer, epsilon, report)
        round_ = engine.next_round(round_)
    engine.leave()

Two kinds implement it today: gossip rounds — plain or compressed, CHOCO-SGD or D-PSGD
(:class:`~edge_agent.gossip_rounds.GossipRounds` over an
:class:`~edge_agent.engine.GossipEngine`) — and secure-aggregation rounds
(:class:`~edge_agent.secure_engine.SecureEngine`). The hooks a kind does not have
(topology switches, the delivery ledger, checkpoints, lingering, the async frontier)
keep the defaults of :class:`RoundHooks`, which do nothing; :mod:`edge_agent.engines`
builds the engine a job asks for.

**Parameters** (``params``) are the model's named tensors: ``name → np.ndarray``,
float32, each of its layer's shape, the same names and shapes on every device of a job
(the trainer's ``params()``). An engine never keeps a reference to the arrays it is given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np

from meshfl.contract import RoundLedger, RoundMetrics

if TYPE_CHECKING:
    from edge_agent.trainer import Trainer
    from edge_agent.versions import TopologyVersion

__all__ = ["EngineCounters", "Params", "RoundEngine", "RoundHooks", "wait_at_start_barrier"]

log = logging.getLogger("meshfl.agent.job")

Params = Mapping[str, np.ndarray]
"""A model's named tensors: name → float32 array of the layer's shape."""


class EngineCounters(Protocol):
    """The counters every engine's ``stats`` has (cumulative over the job)."""

    rejected: int  # malformed or unverifiable messages
    unsigned: int  # signed job: envelopes without a signature
    bad_signature: int  # signed job: signature invalid, or the sender has no key
    replayed: int  # signed job: a (sender, sequence) or round already used up


class RoundEngine(Protocol):
    """One device's rounds of one job, as the job runner drives them.

    An engine without some of the optional hooks (:meth:`switch`, :meth:`linger`,
    :meth:`take_ledger`, :meth:`checkpoint`, :meth:`next_round`) inherits
    :class:`RoundHooks`' defaults.
    """

    @property
    def stats(self) -> EngineCounters:
        """The engine's counters (the observer reads more by name: ``engine_counts``)."""
        ...

    def queue_depth(self) -> int:
        """Received messages waiting to be handled (approximate)."""
        ...

    def start(self) -> None:
        """Subscribe to what the engine listens to and announce this device in the job."""
        ...

    def prepare(self, start_round: int, trainer: Trainer) -> int:
        """Get ready to run from ``start_round`` (1-based); return the first round to run.

        The engine decides what getting ready means for it: the start barrier (wait
        for the neighbours to announce the job), a joiner's catch-up (adopt its
        neighbours' models: ``trainer.set_params``), a resumed device's first round
        after its checkpoint. Returns ``start_round`` or a later round.
        """
        ...

    def exchange(
        self, round_: int, params: Params, no_wait: Collection[str] = ()
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        """Send this round's message, gather the neighbours', mix.

        Parameters
        ----------
        round_
            The round number (1-based).
        params
            This device's model after local training (see the module docstring).
        no_wait
            Neighbours the round should not wait for (the planner's ``no_wait``: slow
            links); an engine that must hear every neighbour ignores it.

        Returns
        -------
        (params, missing)
            The model after mixing (the same names, shapes and dtype), and the sorted
            ids of the neighbours not mixed this round.

        """
        ...

    def switch(
        self, round_: int, topology: TopologyVersion, known: Mapping[int, TopologyVersion]
    ) -> TopologyVersion:
        """The topology version in force at ``round_`` (:meth:`RoundHooks.switch`)."""
        ...

    def linger(self) -> None:
        """After this device's last exchange: stay for the neighbours."""
        ...

    def take_ledger(self, *, final: bool) -> RoundLedger | None:
        """The delivery ledger of the round for its report (None: none kept)."""
        ...

    def checkpoint(
        self, round_: int, trainer: Trainer, epsilon: float | None, report: RoundMetrics
    ) -> None:
        """Save what a restart resumes from after ``round_`` (:meth:`RoundHooks.checkpoint`)."""
        ...

    def next_round(self, round_: int) -> int:
        """The round to run after ``round_``."""
        ...

    def leave(self) -> None:
        """Announce that this device left the job (finished, stopped or failed)."""
        ...


class RoundHooks:
    """The optional hooks of a :class:`RoundEngine`, doing nothing: inherit what you lack."""

    def switch(
        self, round_: int, topology: TopologyVersion, known: Mapping[int, TopologyVersion]
    ) -> TopologyVersion:
        """The topology version in force at ``round_``, given ``topology`` in use so far.

        ``known`` maps version numbers to the versions the coordinator announced.
        Default: ``topology`` (an engine that does not follow topology changes).
        """
        return topology

    def linger(self) -> None:
        """After this device's last exchange: stay for the neighbours. Default: nothing."""
        return

    def take_ledger(self, *, final: bool) -> RoundLedger | None:
        """The delivery ledger of the round for its report; None (default): none kept.

        ``final``: this device's last round of the job.
        """
        return None

    def checkpoint(
        self, round_: int, trainer: Trainer, epsilon: float | None, report: RoundMetrics
    ) -> None:
        """Save what a restart resumes from after ``round_``, with its ``report``.

        ``epsilon``: the DP budget spent so far (None: not a DP job). Called before the
        report is posted. Default: nothing (an engine that cannot resume).
        """
        return

    def next_round(self, round_: int) -> int:
        """The round to run after ``round_``. Default: ``round_ + 1``."""
        return round_ + 1


def wait_at_start_barrier(wait_ready: Callable[[float], list[str]], deadline_s: float) -> None:
    """Run an engine's start barrier: ``wait_ready(timeout_s)`` → the ids still absent.

    Waits ``max(60, deadline_s)`` seconds at most and warns of those absent; the job
    starts without them.
    """
    absent = wait_ready(max(60.0, deadline_s))
    if absent:
        log.warning("starting without neighbours %s (not ready)", ", ".join(absent))
