"""A gossip job's checkpoints on the device: written every round, resumed after a restart.

:class:`Resumer` is the job runner's (:class:`~edge_agent.job.JobRunner`) one seam to
:mod:`edge_agent.checkpoint`. Its life in one run of a job:

1. :meth:`Resumer.load` — before the engine is built: the job's usable checkpoint, if
   any (its ``first_sequence`` is the engine's first sequence number);
2. :meth:`Resumer.restore` — the checkpoint's model, shuffling state, CHOCO's own
   replica x̂_i and ε put back; every neighbour is asked for a keyframe;
3. :meth:`Resumer.first_round` — after the engine started: the round to run next
   (the one after the checkpoint's; round 1 is never run again) and the catch-up;
4. :meth:`Resumer.no_wait` each round, :meth:`Resumer.save` after each round — with
   the round's report, before it is posted — and :meth:`Resumer.remove` when the job
   ends for this device; :attr:`Resumer.unposted` are the reports a resumed agent posts
   again (the coordinator keeps the first of each round).

**An exact ledger through a crash.** The checkpoint holds the delivery ledger's state
as of the round's report. :meth:`Resumer.restore` puts it back, so what this device
received and did before the crash is counted once, and what it received after the
checkpoint — lost with the process's memory, its replicas reset — is recovered by the
keyframes it asks for. The sequence numbers it skips (those it may have used after the
checkpoint: :attr:`edge_agent.outbox.Outbox.high`, at least ``SEQUENCE_MARGIN``) count as
sent in its next report: each neighbour applied them before the crash or recovers them by
the resumed device's first message, a keyframe.

**Catch-up.** The neighbours went on while this device was down, so their messages of
the rounds it now runs were sent long ago. It waits for their keyframes (their latest
state), then runs the rounds up to theirs without waiting for them — training, and
mixing with the replicas their keyframes set — and from then on waits as usual. A
device the coordinator took out while it was down and took back when it asked again
(``docs/reliability.md``, "Checkpoints and resume") has an assignment whose
``start_round`` is after its checkpoint: it catches up the same way, at least up to
that round, from which its neighbours mix it again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from edge_agent.checkpoint import (
    Checkpoint,
    CheckpointStore,
    algorithm_state,
    restore_algorithm,
    spec_digest,
)
from edge_agent.ledger import from_ranges, to_ranges
from meshfl.contract import JobSpec, RoundMetrics

if TYPE_CHECKING:
    from edge_agent.engine import GossipEngine
    from edge_agent.trainer import Trainer
    from edge_agent.versions import TopologyVersion

__all__ = ["Resumer", "delivery_state", "restore_delivery", "save_final_model"]

log = logging.getLogger("meshfl.agent.job")

KEEP_REPORTS = 16
"""Round reports kept in a checkpoint: more than the reporter lets wait unposted (8)."""


class Resumer:
    """Checkpoints of one gossip job of one agent (see the module docstring).

    Parameters
    ----------
    out : Path
        The agent's output folder (``--out``); files go to ``<out>/state/<name>/``.
    name : str
        The agent's device name (``--name``).
    job_id : str
        The job.
    spec : JobSpec
        The job's spec: its digest must match a checkpoint's, ``rounds`` bounds its
        round and ``round_deadline_s`` (seconds) sets the keyframe wait.

    Attributes
    ----------
    checkpoint : Checkpoint or None
        The checkpoint this run resumed from (None: it started afresh).
    behind_until : int
        Rounds before this one wait for no neighbour (0: none).
    save_s : list of float
        Seconds each checkpoint write took (fsync included).

    """

    def __init__(self, out: Path, name: str, job_id: str, spec: JobSpec) -> None:
        self.store = CheckpointStore(out, name)
        self.job_id = job_id
        self.spec = spec
        self.spec_hash = spec_digest(spec)
        self.checkpoint: Checkpoint | None = None
        self.behind_until = 0
        self.save_s: list[float] = []
        # The latest reports, kept in each checkpoint, each with its JSON (encoded once).
        self._kept: list[tuple[RoundMetrics, str]] = []
        self.first_sequence = 0  # the resumed engine's (restore)
        self.failed_saves = 0  # checkpoint writes refused (a full or read-only disk)

    def load(self, trainer: Trainer, topo: TopologyVersion) -> Checkpoint | None:
        """The job's usable checkpoint, kept as :attr:`checkpoint`; None if there is none.

        A checkpoint of a device that is no longer a participant (``topo`` removed it:
        the coordinator did not take it back) is deleted with a warning.
        """
        checkpoint = self.store.load(
            self.job_id,
            spec_hash=self.spec_hash,
            model_hash=trainer.spec_hash,
            layout=trainer.params(),
            rounds=int(self.spec["rounds"]),
            shuffle_size=len(trainer.shuffle_state()),
        )
        if checkpoint is not None and topo.removed:
            log.warning(
                "this device was taken out of job %s while it was down (topology v%d):"
                " its checkpoint of round %d is of no use",
                self.job_id,
                topo.version,
                checkpoint.round,
            )
            self.store.remove(self.job_id)
            checkpoint = None
        self.checkpoint = checkpoint
        return checkpoint

    def restore(self, engine: GossipEngine, trainer: Trainer, topo: TopologyVersion) -> None:
        """Put :attr:`checkpoint`'s state back, before the engine starts (no-op without one).

        The model, the shuffling generator, the momentum buffers and CHOCO's x̂_i; the
        replicas of every neighbour are dropped and asked for again as keyframes (they
        went stale while this device was down); the engine's first message is a keyframe
        (it was built with the checkpoint's ``first_sequence``). ε is the caller's
        (``checkpoint.epsilon``).
        """
        checkpoint = self.checkpoint
        if checkpoint is None:
            return
        trainer.set_params(checkpoint.params)
        trainer.set_shuffle_state(checkpoint.shuffle)
        trainer.set_momentum_state(checkpoint.momentum or {})
        restore_algorithm(engine.algorithm, checkpoint)
        self._kept = [(cast(RoundMetrics, r), json.dumps(r)) for r in checkpoint.reports]
        self.first_sequence = engine.sequence
        try:
            restore_delivery(engine, checkpoint.delivery)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("the checkpoint's delivery ledger is unusable (%s): counted afresh", exc)
        else:  # the numbers skipped since the checkpoint: sent before the crash, or never
            engine.ledger.counts.sent += engine.sequence - checkpoint.sequence
        engine.request_keyframes(topo.peers())

    def first_round(self, engine: GossipEngine, start_round: int, topo: TopologyVersion) -> int:
        """The round to run next after :meth:`restore`; catch up with the neighbours.

        ``start_round`` is the assignment's (1-based). Returns the checkpoint's round + 1
        and logs ``resuming job J at round R from its checkpoint of round C``; waits up to
        ``min(60, max(5, 2 · round_deadline_s))`` seconds for the neighbours' keyframes
        and sets :attr:`behind_until` to the later of their round and ``start_round``
        (rounds before it wait for nobody).

        Raises
        ------
        ValueError
            There is no checkpoint (:meth:`load` found none).

        """
        checkpoint = self.checkpoint
        if checkpoint is None:
            raise ValueError("first_round needs a checkpoint: load() found none")
        round_ = checkpoint.round + 1
        log.info(
            "resuming job %s at round %d from its checkpoint of round %d (%.1f s old);"
            " sequence numbers from %d, keyframes asked of %s",
            self.job_id,
            round_,
            checkpoint.round,
            max(0.0, time.time() - checkpoint.written_at),
            self.first_sequence + 1,
            ", ".join(sorted(topo.peers())) or "nobody",
        )
        if start_round > round_:
            log.info(
                "taken back into job %s from round %d: rounds %d-%d catch up alone",
                self.job_id,
                start_round,
                round_,
                start_round - 1,
            )
        self.behind_until = start_round
        if topo.peers():
            self._resync(engine, round_)
        return round_

    def _resync(self, engine: GossipEngine, round_: int) -> None:
        """Wait for the neighbours' keyframes; if they are ahead, catch up without waiting."""
        timeout_s = min(60.0, max(5.0, 2 * float(self.spec["round_deadline_s"])))
        caught = engine.catch_up(timeout_s)  # this device keeps its own model
        if caught is None:
            log.warning("no neighbour's keyframe within %.0f s: going on alone", timeout_s)
            return
        self.behind_until = max(self.behind_until, caught[0])
        if self.behind_until > round_:
            log.info(
                "neighbours are at round %d: rounds %d-%d mix with their keyframes without waiting",
                caught[0],
                round_,
                self.behind_until - 1,
            )

    def no_wait(self, round_: int, neighbours: Collection[str]) -> set[str]:
        """The neighbours not to wait for at ``round_``: all of them while catching up."""
        return set(neighbours) if round_ < self.behind_until else set()

    @property
    def unposted(self) -> list[RoundMetrics]:
        """The reports the checkpoint resumed from holds: maybe never posted (a crash)."""
        return [] if self.checkpoint is None else [r for r, _ in self._kept]

    def save(
        self,
        engine: GossipEngine,
        trainer: Trainer,
        round_: int,
        epsilon: float | None,
        report: RoundMetrics | None = None,
    ) -> None:
        """Write the job's checkpoint after ``round_``; a failure is logged, never raised.

        ``epsilon``: the DP budget spent so far (None: not a DP job). ``report``: the
        round's report, about to be posted; the latest :data:`KEEP_REPORTS` are kept.
        """
        if report is not None:
            self._kept = [*self._kept, (report, json.dumps(report))][-KEEP_REPORTS:]
        own, meta = algorithm_state(engine.algorithm)
        checkpoint = Checkpoint(
            job_id=self.job_id,
            round=round_,
            sequence=engine.sequence,
            spec_hash=self.spec_hash,
            model_hash=trainer.spec_hash,
            params=trainer.params(),
            shuffle=trainer.shuffle_state(),
            own_replica=own,
            algorithm=meta,
            epsilon=epsilon,
            written_at=time.time(),
            delivery=delivery_state(engine),
            reports=[cast(dict[str, Any], r) for r, _ in self._kept],  # never changed: no copy
            reports_json=tuple(text for _, text in self._kept),
            momentum=trainer.momentum_state() or None,
        )
        try:
            seconds = self.store.save(checkpoint)
        except (OSError, TypeError, ValueError) as exc:  # a full or read-only disk, mostly
            self.failed_saves += 1
            if self.failed_saves > 1:  # said once; the round's report goes out all the same
                log.debug("round %d: checkpoint not written (%s)", round_, exc)
                return
            log.warning(
                "round %d: could not write the checkpoint (%s); the job goes on, but a restart"
                " would resume from an earlier checkpoint or run the job from round 1",
                round_,
                getattr(exc, "strerror", None) or exc,
            )
            return
        self.save_s.append(seconds)
        log.debug("round %d: checkpoint written in %.1f ms", round_, 1000 * seconds)

    @property
    def outbox_folder(self) -> Path:
        """Where the job's durable outbox lives (:class:`edge_agent.outbox.Outbox`)."""
        return self.store.outbox_folder(self.job_id)

    def remove(self) -> None:
        """Delete the job's checkpoint and outbox: the job is over for this device."""
        self.store.remove(self.job_id)


def delivery_state(engine: GossipEngine) -> dict[str, Any]:
    """The ledger's state and the sequence numbers received per peer (a checkpoint's)."""
    held: dict[str, set[int]] = {}  # arrived for a later round: lost with the process
    for envelopes in engine._held.values():
        for env in envelopes:
            held.setdefault(env.sender, set()).add(env.sequence)
    seen = {p: to_ranges(s - held.get(p, set())) for p, s in engine._applied.items()}
    return {
        "ledger": engine.ledger.state(),
        "seen": seen,  # the inbox's (sender, sequence) pairs
        "held": {p: to_ranges(s) for p, s in held.items()},
    }


def restore_delivery(engine: GossipEngine, state: Mapping[str, Any]) -> None:
    """Put back :func:`delivery_state` of this device's earlier process (before start).

    Raises ValueError if ``state`` is not one (nothing is changed then).
    """
    seen = state.get("seen") or {}
    if not isinstance(seen, dict):
        raise ValueError("seen is not a JSON object")
    held = state.get("held") or {}
    if not isinstance(held, dict):
        raise ValueError("held is not a JSON object")
    numbers = {str(p): from_ranges(r) for p, r in seen.items()}
    forgotten = {str(p): from_ranges(r) for p, r in held.items()}
    engine.ledger.restore(state.get("ledger") or {})
    for peer, sequences in forgotten.items():
        engine.ledger.forgotten(peer, sequences)
    for peer, received in numbers.items():
        if peer in engine._applied:
            engine._applied[peer] |= received


def save_final_model(trainer: Trainer, path: Path) -> str:
    """Write the job's final model (:meth:`Trainer.save`); its absolute path, or ``""``.

    A full or read-only disk does not end the job: the error is said in one line, the
    model stays in memory and the done report carries its accuracy (``model_path`` "").
    """
    try:
        trainer.save(path)
    except OSError as exc:
        log.error(
            "cannot write the final model to %s (%s): it is kept in memory only and its"
            " accuracy is reported",
            path,
            exc.strerror or exc,
        )
        return ""
    return str(path.resolve())
