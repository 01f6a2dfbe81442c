"""Job checkpoints: a SIGKILLed and restarted agent resumes its job where it stopped.

After every completed round the :class:`~edge_agent.job.JobRunner` of a gossip job writes
one file per job, ``<out>/state/<name>/<job>.npz``, overwritten each round (temporary
file, fsync, ``os.replace``: :func:`meshfl.files.atomic_write`). It holds:

- the round just completed and the sequence number of the last message published;
- the model after that round's consensus step (float32, by tensor name), the state
  of the trainer's shuffling generator and, with local momentum, its heavy-ball buffers
  (plain SGD keeps no optimizer state);
- CHOCO's own public replica x̂_i (and its keyframe-trigger baseline): with differential
  privacy a keyframe *is* x̂_i, so it must survive the restart. The neighbours' replicas
  x̂_j are not saved: a resumed device asks every neighbour for a keyframe, which
  replaces them. D-PSGD keeps nothing else (the neighbours' models come again);
- ε spent so far (DP jobs; the coordinator's accountant stays the authority), the job
  spec's and the model's hashes;
- the delivery ledger's state and the sequence numbers already received from each
  neighbour (:meth:`edge_agent.ledger.DeliveryLedger.state`), and the latest round
  reports: the checkpoint is written *before* the round's report is posted, and a
  resumed agent posts them again (the coordinator keeps the first of each round), so a
  round's report and the ledger's counts are never lost nor counted twice by a crash.

Format: an uncompressed ``.npz`` (``np.load(allow_pickle=False)``, never pickle) whose
``meta`` entry is UTF-8 JSON; arrays ``param:<name>``, ``own:<name>``,
``momentum:<name>``, ``shuffle``. A
file that is truncated, corrupted, of another format version, for another job spec or
model, or whose arrays do not fit the model is ignored with one warning line, and the
job starts as it would without one.

**Sequence numbers after a restart.** Receivers drop a message whose
``(sender, sequence)`` they already hold (a duplicate; refused as replayed in a signed
job, :class:`~edge_agent.signing.ReplayWindow`). A resumed engine therefore starts at
``sequence + SEQUENCE_MARGIN``: the engine publishes exactly one message per round
(re-sends on request reuse their number), and a checkpoint is written after every round,
so at most one message — the next round's — went out after the checkpoint. A margin of 1
covers it exactly: a receiver that got that message sees no gap, one that did not sees
one missing message, which the resumed device's first message (a KEYFRAME) recovers.
A failed checkpoint write removes the previous file, so a stale one never undercounts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meshfl.aggregation import ChocoGossip, GossipAlgorithm
from meshfl.errors import ConfigError
from meshfl.files import atomic_write
from meshfl.wire import validate_id

__all__ = [
    "FORMAT",
    "SEQUENCE_MARGIN",
    "Checkpoint",
    "CheckpointStore",
    "algorithm_state",
    "restore_algorithm",
    "spec_digest",
]

log = logging.getLogger("meshfl.agent.checkpoint")

FORMAT = 1
"""Version of the checkpoint layout; another version is ignored (with a warning)."""

SEQUENCE_MARGIN = 1
"""Sequence numbers skipped after a restart: messages published after a checkpoint."""

_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, TypeError, zipfile.BadZipFile)


def spec_digest(spec: Mapping[str, Any]) -> str:
    """sha256 (hex) of the job spec as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    """One job's state after a completed round (see the module docstring).

    ``params`` and ``own_replica`` map tensor names to float32 arrays in model order;
    ``own_replica`` is None for D-PSGD. ``shuffle`` is the trainer's generator state
    (1-D uint8); ``momentum`` its heavy-ball buffers by tensor name (None: no local
    momentum). ``sequence`` is the engine's last published sequence number;
    ``epsilon`` the DP budget spent (None: not a DP job); ``written_at`` unix seconds.
    ``reports_json``: the same ``reports``, each already JSON-encoded (a writer that keeps
    them across rounds encodes each report once, not once a round; empty: encoded here).
    """

    job_id: str
    round: int
    sequence: int
    spec_hash: str
    model_hash: str
    params: dict[str, np.ndarray]
    shuffle: np.ndarray
    own_replica: dict[str, np.ndarray] | None = None
    algorithm: dict[str, Any] = field(default_factory=dict)
    epsilon: float | None = None
    written_at: float = 0.0
    delivery: dict[str, Any] = field(default_factory=dict)
    reports: list[dict[str, Any]] = field(default_factory=list)
    momentum: dict[str, np.ndarray] | None = None
    reports_json: tuple[str, ...] = ()

    @property
    def first_sequence(self) -> int:
        """The resumed engine's starting sequence (its next message is this + 1)."""
        return self.sequence + SEQUENCE_MARGIN


class CheckpointStore:
    """The checkpoints of one agent: ``<out>/state/<name>/<job>.npz``, one per job.

    Parameters
    ----------
    out : Path
        The agent's output folder (``--out``).
    name : str
        The agent's device name (``--name``).

    """

    def __init__(self, out: Path, name: str) -> None:
        self.folder = Path(out) / "state" / name

    def path(self, job_id: str) -> Path:
        """The checkpoint file of ``job_id``; ConfigError if it is not a valid job id."""
        validate_id(job_id, "job id")
        return self.folder / f"{job_id}.npz"

    def save(self, checkpoint: Checkpoint) -> float:
        """Write ``checkpoint`` atomically; return the seconds it took (fsync included).

        Raises
        ------
        OSError
            The file could not be written; the previous checkpoint is then removed (a
            stale one would resume with too low a sequence number).

        """
        started = time.perf_counter()
        arrays = _arrays(checkpoint)
        path = self.path(checkpoint.job_id)
        try:
            atomic_write(path, lambda handle: np.savez(handle, **arrays))  # type: ignore[arg-type]
        except OSError:
            with contextlib.suppress(OSError):  # a read-only folder keeps it: see resume
                path.unlink(missing_ok=True)
            raise
        return time.perf_counter() - started

    def load(
        self,
        job_id: str,
        *,
        spec_hash: str,
        model_hash: str,
        layout: Mapping[str, np.ndarray],
        rounds: int,
        shuffle_size: int,
    ) -> Checkpoint | None:
        """The checkpoint of ``job_id`` if there is a usable one, else None.

        ``layout`` is the model's parameters (names, shapes); ``rounds`` the job's last
        round; ``shuffle_size`` the length of the trainer's generator state. A missing
        file is None silently; an unusable one (unreadable, truncated, another format,
        spec, model or layout, a round outside 1..``rounds``) is None with one warning
        line.
        """
        path = self.path(job_id)
        if not path.exists():
            return None
        try:
            checkpoint = _read(path)
            problem = _mismatch(checkpoint, job_id, spec_hash, model_hash, layout, rounds)
            if problem is None and checkpoint.shuffle.shape != (shuffle_size,):
                problem = f"its shuffle state has shape {checkpoint.shuffle.shape}"
        except _READ_ERRORS as exc:
            problem = f"unreadable ({type(exc).__name__}: {str(exc)[:120]})"
        if problem is not None:
            log.warning("ignoring checkpoint %s: %s; the job starts without it", path, problem)
            return None
        return checkpoint

    def outbox_folder(self, job_id: str) -> Path:
        """The folder of ``job_id``'s durable outbox (:class:`edge_agent.outbox.Outbox`)."""
        return self.path(job_id).with_suffix(".outbox")  # ConfigError: not a job id

    def remove(self, job_id: str) -> None:
        """Delete the checkpoint and the outbox of ``job_id`` (the job ended for this device).

        A folder that refuses (read-only) keeps them, with a debug line: a later start
        finds the job ended and removes them then.
        """
        try:
            self.path(job_id).unlink(missing_ok=True)
        except OSError as exc:
            log.debug("cannot remove the checkpoint of job %s: %s", job_id, exc)
        shutil.rmtree(self.outbox_folder(job_id), ignore_errors=True)

    def prune(self, keep: str | None = None) -> list[str]:
        """Delete every checkpoint (and outbox) except ``keep``'s; return the job ids deleted.

        An agent takes part in one job at a time: once it is assigned another job, the
        checkpoints of earlier ones can never be resumed.
        """
        removed = []
        for path in sorted(self.folder.glob("*.npz")):
            if path.stem != keep:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:  # a read-only folder: left, harmless (another job)
                    log.warning("cannot remove %s (%s)", path, exc.strerror or exc)
                    continue
                removed.append(path.stem)
        for path in sorted(self.folder.glob("*.outbox")):
            if path.stem != keep:
                shutil.rmtree(path, ignore_errors=True)
        return removed


def algorithm_state(
    algorithm: GossipAlgorithm,
) -> tuple[dict[str, np.ndarray] | None, dict[str, Any]]:
    """What of ``algorithm`` a resumed device needs: CHOCO's x̂_i and keyframe baseline.

    Returns ``(own_replica, meta)``: ``own_replica`` maps tensor names to float32
    copies (None for D-PSGD), ``meta`` is JSON-able.
    """
    if not isinstance(algorithm, ChocoGossip):
        return None, {"name": type(algorithm).__name__}
    meta = {
        "name": "ChocoGossip",
        "baseline": algorithm.keyframe_baseline(),
        "keyframes_sent": int(algorithm.keyframes_sent),
    }
    return algorithm.own_replica(), meta


def restore_algorithm(algorithm: GossipAlgorithm, checkpoint: Checkpoint) -> None:
    """Put a checkpoint's x̂_i and keyframe baseline back into a fresh ``algorithm``.

    A baseline that is not a list of finite non-negative floats is dropped with a
    warning (it is measured afresh); the replica itself was checked by
    :meth:`CheckpointStore.load`.
    """
    if not isinstance(algorithm, ChocoGossip) or checkpoint.own_replica is None:
        return
    baseline = checkpoint.algorithm.get("baseline", [])
    try:
        algorithm.restore_own_replica(checkpoint.own_replica, baseline)
    except (ConfigError, TypeError, ValueError) as exc:
        log.warning("checkpoint's keyframe baseline dropped (%s): measured afresh", exc)
        algorithm.restore_own_replica(checkpoint.own_replica)
    sent = checkpoint.algorithm.get("keyframes_sent", 0)
    algorithm.keyframes_sent = sent if isinstance(sent, int) and sent >= 0 else 0


def _arrays(checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    meta = {
        "format": FORMAT,
        "job_id": checkpoint.job_id,
        "round": checkpoint.round,
        "sequence": checkpoint.sequence,
        "spec_hash": checkpoint.spec_hash,
        "model_hash": checkpoint.model_hash,
        "names": list(checkpoint.params),
        "own_replica": checkpoint.own_replica is not None,
        "algorithm": checkpoint.algorithm,
        "epsilon": checkpoint.epsilon,
        "written_at": checkpoint.written_at or time.time(),
        "delivery": checkpoint.delivery,
        "momentum": checkpoint.momentum is not None,
    }
    reports = checkpoint.reports_json or tuple(json.dumps(r) for r in checkpoint.reports)
    text = f'{json.dumps(meta)[:-1]}, "reports": [{", ".join(reports)}]}}'
    arrays = {"meta": np.frombuffer(text.encode(), dtype=np.uint8)}
    for name, a in checkpoint.params.items():
        arrays[f"param:{name}"] = np.asarray(a, dtype=np.float32)
    for name, a in (checkpoint.own_replica or {}).items():
        arrays[f"own:{name}"] = np.asarray(a, dtype=np.float32)
    for name, a in (checkpoint.momentum or {}).items():
        arrays[f"momentum:{name}"] = np.asarray(a, dtype=np.float32)
    arrays["shuffle"] = np.asarray(checkpoint.shuffle, dtype=np.uint8)
    return arrays


def _read(path: Path) -> Checkpoint:
    """Parse a checkpoint file; one of ``_READ_ERRORS`` if it is not one."""
    with open(path, "rb") as handle, np.load(handle, allow_pickle=False) as npz:
        meta = json.loads(bytes(npz["meta"]).decode())
        if not isinstance(meta, dict):
            raise ValueError("meta is not a JSON object")
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT}")
        names = [str(n) for n in meta["names"]]
        params = {n: npz[f"param:{n}"] for n in names}
        own = {n: npz[f"own:{n}"] for n in names} if meta["own_replica"] else None
        shuffle = npz["shuffle"]
        velocity = {n: npz[f"momentum:{n}"] for n in names} if meta.get("momentum") else None
    epsilon = meta.get("epsilon")
    delivery, reports = meta.get("delivery") or {}, meta.get("reports") or []
    if not isinstance(delivery, dict):
        raise ValueError("delivery is not a JSON object")
    if not (isinstance(reports, list) and all(isinstance(r, dict) for r in reports)):
        raise ValueError("reports is not a list of JSON objects")
    return Checkpoint(
        job_id=str(meta["job_id"]),
        round=_int(meta["round"]),
        sequence=_int(meta["sequence"]),
        spec_hash=str(meta["spec_hash"]),
        model_hash=str(meta["model_hash"]),
        params=params,
        shuffle=shuffle,
        own_replica=own,
        algorithm=dict(meta.get("algorithm") or {}),
        epsilon=None if epsilon is None else float(epsilon),
        written_at=float(meta.get("written_at", 0.0)),
        delivery=delivery,
        reports=reports,
        momentum=velocity,
    )


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _mismatch(
    checkpoint: Checkpoint,
    job_id: str,
    spec_hash: str,
    model_hash: str,
    layout: Mapping[str, np.ndarray],
    rounds: int,
) -> str | None:
    """Why ``checkpoint`` cannot resume this job, or None."""
    if checkpoint.job_id != job_id:
        return f"written for job {checkpoint.job_id!r}"
    if checkpoint.spec_hash != spec_hash:
        return "written for another job spec"
    if checkpoint.model_hash != model_hash:
        return "written for another model"
    if not 1 <= checkpoint.round <= rounds:
        return f"round {checkpoint.round} is outside 1..{rounds}"
    if checkpoint.sequence < 0:
        return f"negative sequence number {checkpoint.sequence}"
    if checkpoint.shuffle.dtype != np.uint8 or checkpoint.shuffle.ndim != 1:
        return "the shuffle state is not a uint8 vector"
    for what, tensors in (
        ("model", checkpoint.params),
        ("replica", checkpoint.own_replica),
        ("momentum", checkpoint.momentum),
    ):
        if tensors is None:
            continue
        if list(tensors) != list(layout):
            return f"its {what} has tensors {list(tensors)}, expected {list(layout)}"
        for name, a in tensors.items():
            if a.dtype != np.float32 or a.shape != np.shape(layout[name]):
                return f"its {what}'s {name!r} is {a.dtype} {a.shape}"
            if not np.all(np.isfinite(a)):
                return f"its {what}'s {name!r} holds NaN/inf"
    return None
