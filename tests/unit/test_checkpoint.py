"""Job checkpoints (edge_agent/checkpoint.py) and a resumed engine's sequence numbers."""

from __future__ import annotations

import json
import logging
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gossip_scenarios import FLEET, JOB, drift
from signed_scenarios import run_round, signed_engines

from edge_agent import checkpoint as ckpt_module
from edge_agent.checkpoint import (
    SEQUENCE_MARGIN,
    Checkpoint,
    CheckpointStore,
    algorithm_state,
    restore_algorithm,
    spec_digest,
)
from edge_agent.engine import GossipEngine
from edge_agent.resume import Resumer
from edge_agent.signing import Signer
from edge_agent.trainer import Trainer
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from edge_agent.versions import TopologyVersion
from meshfl.aggregation import ChocoGossip, DPSGDGossip, GaussianPrivatizer
from meshfl.codecs import parse_codec
from meshfl.errors import ConfigError

W1 = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}
SPEC = {"rounds": 10, "model": W1, "seed": 3}


def _trainer() -> Trainer:
    return Trainer(W1, seed=3, learning_rate=0.1, batch_size=32, local_epochs=1)


def _checkpoint(trainer: Trainer, round_: int = 4, sequence: int = 4) -> Checkpoint:
    params = trainer.params()
    return Checkpoint(
        job_id="job-1",
        round=round_,
        sequence=sequence,
        spec_hash=spec_digest(SPEC),
        model_hash=trainer.spec_hash,
        params=params,
        shuffle=trainer.shuffle_state(),
        own_replica={k: v + 1 for k, v in params.items()},
        algorithm={"name": "ChocoGossip", "baseline": [0.1, 0.2], "keyframes_sent": 2},
        epsilon=0.75,
        written_at=123.0,
    )


def _load(store: CheckpointStore, trainer: Trainer, **overrides: object) -> Checkpoint | None:
    kwargs: dict[str, object] = {
        "spec_hash": spec_digest(SPEC),
        "model_hash": trainer.spec_hash,
        "layout": trainer.params(),
        "rounds": 10,
        "shuffle_size": len(trainer.shuffle_state()),
    }
    return store.load("job-1", **{**kwargs, **overrides})  # type: ignore[arg-type]


def test_a_checkpoint_reads_back_exactly(tmp_path: Path) -> None:
    trainer, store = _trainer(), CheckpointStore(tmp_path, "device-0")
    written = _checkpoint(trainer)

    seconds = store.save(written)
    read = _load(store, trainer)

    assert store.path("job-1") == tmp_path / "state" / "device-0" / "job-1.npz"
    assert seconds > 0 and read is not None
    assert (read.round, read.sequence, read.epsilon, read.written_at) == (4, 4, 0.75, 123.0)
    assert read.first_sequence == 4 + SEQUENCE_MARGIN
    assert read.algorithm == written.algorithm
    assert list(read.params) == list(written.params)
    for name, value in written.params.items():
        np.testing.assert_array_equal(read.params[name], value)
        assert read.own_replica is not None
        np.testing.assert_array_equal(read.own_replica[name], value + 1)
    np.testing.assert_array_equal(read.shuffle, written.shuffle)
    assert [p.name for p in store.folder.iterdir()] == ["job-1.npz"]  # no temporary left


def test_reports_encoded_by_the_writer_read_back_as_the_reports(tmp_path: Path) -> None:
    trainer, store = _trainer(), CheckpointStore(tmp_path, "device-0")
    reports = [{"round": 3, "accuracy": 0.5, "sketch": [0.25, -1.5]}, {"round": 4, "missing": []}]
    plain = replace(_checkpoint(trainer), reports=reports)
    cached = replace(plain, reports_json=tuple(json.dumps(r) for r in reports))

    store.save(plain)
    from_plain = _load(store, trainer)
    store.save(cached)
    from_cached = _load(store, trainer)
    store.save(replace(plain, reports=[]))
    empty = _load(store, trainer)

    assert from_plain is not None and from_cached is not None and empty is not None
    assert from_plain.reports == from_cached.reports == reports
    assert empty.reports == []


def test_the_file_is_an_npz_without_pickles(tmp_path: Path) -> None:
    trainer, store = _trainer(), CheckpointStore(tmp_path, "d")
    store.save(_checkpoint(trainer))

    with np.load(store.path("job-1"), allow_pickle=False) as npz:
        assert "meta" in npz.files and all(npz[k].dtype != object for k in npz.files)


def test_no_file_is_none_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert _load(CheckpointStore(tmp_path, "d"), _trainer()) is None
    assert caplog.records == []


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "unreadable"),
        (lambda p: p.write_bytes(b""), "unreadable"),
        (lambda p: p.write_bytes(b"\x00garbage" * 100), "unreadable"),
        (lambda p: _flip_in_array(p), "unreadable"),
    ],
    ids=["truncated", "empty", "garbage", "bit-flip"],
)
def test_a_damaged_file_is_ignored_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, reason: str
) -> None:
    trainer, store = _trainer(), CheckpointStore(tmp_path, "d")
    store.save(_checkpoint(trainer))
    damage(store.path("job-1"))  # type: ignore[operator]

    with caplog.at_level(logging.WARNING, logger="meshfl.agent.checkpoint"):
        assert _load(store, trainer) is None

    assert len(caplog.records) == 1
    assert reason in caplog.records[0].getMessage()
    assert "the job starts without it" in caplog.records[0].getMessage()


def _flip_in_array(path: Path) -> None:
    """Corrupt one byte inside a stored array: the zip member's CRC-32 catches it."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("param:0.weight.npy")
    data[info.header_offset + 30 + len(info.filename) + 200] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_pickled_array_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trainer, store = _trainer(), CheckpointStore(tmp_path, "d")
    store.save(_checkpoint(trainer))
    with np.load(store.path("job-1")) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["shuffle"] = np.array([{"evil": 1}], dtype=object)
    np.savez(store.path("job-1"), **arrays)

    assert _load(store, trainer) is None
    assert "unreadable" in caplog.text and "allow_pickle" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"spec_hash": spec_digest({**SPEC, "rounds": 11})}, "another job spec"),
        ({"model_hash": "0" * 64}, "another model"),
        ({"rounds": 3}, "round 4 is outside 1..3"),
        ({"layout": {"w": np.zeros(3, np.float32)}}, "expected ['w']"),
        ({"shuffle_size": 16}, "shuffle state"),
    ],
    ids=["spec", "model", "round", "layout", "shuffle"],
)
def test_a_mismatched_checkpoint_is_ignored_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, overrides: dict[str, object], reason: str
) -> None:
    trainer, store = _trainer(), CheckpointStore(tmp_path, "d")
    store.save(_checkpoint(trainer))

    assert _load(store, trainer, **overrides) is None

    assert len(caplog.records) == 1 and reason in caplog.records[0].getMessage()


def test_a_non_finite_model_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trainer, store = _trainer(), CheckpointStore(tmp_path, "d")
    bad = _checkpoint(trainer)
    bad.params["0.weight"][0, 0] = np.nan
    store.save(bad)

    assert _load(store, trainer) is None
    assert "NaN/inf" in caplog.text


def test_a_failed_write_removes_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, store = _trainer(), CheckpointStore(tmp_path, "d")
    store.save(_checkpoint(trainer, round_=1, sequence=1))

    def disk_full(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt_module, "atomic_write", disk_full)
    with pytest.raises(OSError):
        store.save(_checkpoint(trainer, round_=2, sequence=2))

    assert not store.path("job-1").exists()  # a stale one would resume too low a sequence


def test_remove_and_prune(tmp_path: Path) -> None:
    trainer, store = _trainer(), CheckpointStore(tmp_path, "d")
    for job in ("job-a", "job-b", "job-c"):
        store.save(Checkpoint(**{**_checkpoint(trainer).__dict__, "job_id": job}))

    store.remove("job-a")
    assert store.prune(keep="job-c") == ["job-b"]
    assert [p.name for p in store.folder.iterdir()] == ["job-c.npz"]
    with pytest.raises(ConfigError):
        store.path("../escape")


def test_the_shuffle_state_resumes_the_same_minibatch_order() -> None:
    x = np.random.default_rng(0).normal(size=(100, 64)).astype(np.float32)
    y = np.arange(100) % 10
    straight = _trainer()
    straight.train(x, y)
    resumed = _trainer()
    resumed.set_params(straight.params())
    resumed.set_shuffle_state(straight.shuffle_state())

    straight.train(x, y)
    resumed.train(x, y)

    for name, value in straight.params().items():
        np.testing.assert_array_equal(resumed.params()[name], value)
    with pytest.raises(ConfigError):
        resumed.set_shuffle_state(np.zeros(3, np.float32))


def _choco(x: dict[str, np.ndarray], dp: bool) -> ChocoGossip:
    privatizer = GaussianPrivatizer(1.0, 0.0, np.random.default_rng(0)) if dp else None
    return ChocoGossip(
        x, {"p": 1.0}, 0.0, 0.5, parse_codec("topk:0.3"), shared_start=True, privatizer=privatizer
    )


@pytest.mark.parametrize("dp", [False, True])
def test_chocos_own_replica_survives_a_restart(dp: bool) -> None:
    x0 = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
    running = _choco(x0, dp)
    x = x0
    for r in range(1, 4):
        x = drift(x, r, 0)
        running.outgoing(x)
    own, meta = algorithm_state(running)
    assert own is not None
    saved = Checkpoint("j", 3, 3, "s", "m", dict(x), np.zeros(1, np.uint8), own, meta)

    restarted = _choco(x0, dp)
    restore_algorithm(restarted, saved)

    # The keyframe a resumed device sends (with DP: its public replica x̂_i itself).
    want, got = running.keyframe(x), restarted.keyframe(x)
    assert [e.payload for e in got] == [e.payload for e in want]
    if dp:
        assert got[0].payload != x["w"].tobytes()  # x̂_i, not x: a fresh x̂_i would be x0
        assert got[0].payload != x0["w"].tobytes()


def test_restoring_an_own_replica_checks_it_and_copies_it() -> None:
    x0 = {"w": np.ones((3, 4), np.float32)}
    algo = _choco(x0, dp=False)
    saved = {"w": np.full((3, 4), 2.0, np.float32)}

    bad_shape = {"w": np.ones((4, 3), np.float32)}
    with pytest.raises(ConfigError, match="shape"):
        algo.restore_own_replica(bad_shape)
    with pytest.raises(ConfigError, match="NaN"):
        algo.restore_own_replica({"w": np.full((3, 4), np.nan, np.float32)})
    with pytest.raises(ConfigError, match="baseline"):
        algo.restore_own_replica(saved, [0.1, float("inf")])
    unchanged = algo.own_replica()
    algo.restore_own_replica(saved, [0.25, 0.5])
    saved["w"][0, 0] = 9.0  # the restored replica is a copy

    np.testing.assert_array_equal(unchanged["w"], x0["w"])
    assert algo.own_replica()["w"].dtype == np.float32
    np.testing.assert_array_equal(algo.own_replica()["w"], np.full((3, 4), 2.0, np.float32))
    assert algo.keyframe_baseline() == [0.25, 0.5]


class _CatchingUp:
    """An engine whose neighbours' keyframes are of ``round_`` (or never come: None)."""

    def __init__(self, round_: int | None) -> None:
        self.round = round_

    def catch_up(self, timeout_s: float) -> tuple[int, dict[str, np.ndarray]] | None:
        return None if self.round is None else (self.round, {})


@pytest.mark.parametrize(
    ("start_round", "neighbours_at", "behind_until"),
    [(1, 9, 9), (5, 9, 9), (12, 9, 12), (12, None, 12), (3, None, 3)],
)
def test_a_resumed_device_runs_from_its_checkpoint_and_catches_up(
    tmp_path: Path, start_round: int, neighbours_at: int | None, behind_until: int
) -> None:
    # start_round 12 > 5: the coordinator took it out while it was down and took it back.
    topo = TopologyVersion(1, 1, "ring", "metropolis-hastings", ("a", "b", "c"), 0,
                           {"b": 1 / 3, "c": 1 / 3}, 1 / 3)  # fmt: skip
    resumer = Resumer(tmp_path, "pi", "job-1", {"rounds": 20, "round_deadline_s": 1.0})  # type: ignore[typeddict-item]
    resumer.checkpoint = _checkpoint(_trainer(), round_=4)

    first = resumer.first_round(_CatchingUp(neighbours_at), start_round, topo)  # type: ignore[arg-type]

    assert first == 5  # never round 1 again
    assert resumer.behind_until == behind_until
    assert resumer.no_wait(behind_until - 1, ["b", "c"]) == {"b", "c"}
    assert resumer.no_wait(behind_until, ["b", "c"]) == set()


def test_dpsgd_has_no_state_to_save() -> None:
    algo = DPSGDGossip({"w": np.zeros(3, np.float32)}, {"p": 1.0}, 0.0)
    assert algorithm_state(algo) == (None, {"name": "DPSGDGossip"})


def _engine(transport: MemoryTransport, first_sequence: int) -> GossipEngine:
    x0 = {"w": np.zeros(4, np.float32)}
    return GossipEngine(
        transport=transport, fleet=FLEET, job_id=JOB, device_id="dev-0", neighbours=["dev-1"],
        algorithm=_choco(x0, dp=False), deadline_s=0.2, first_sequence=first_sequence,
    )  # fmt: skip


def test_a_resumed_engine_starts_with_a_keyframe_above_its_old_sequence() -> None:
    bus = MemoryBroker()
    transport = MemoryTransport(bus)
    transport.connect("dev-0")
    engine = _engine(transport, first_sequence=7)
    engine.start()

    engine.exchange(5, {"w": np.ones(4, np.float32)})
    engine.exchange(6, {"w": np.ones(4, np.float32)})

    assert engine.sequence == 9
    assert engine.stats.keyframes_sent == 1  # only the first
    kept = engine.outbox.after("dev-1", 0)
    assert [s for s, _ in kept] == [8, 9]
    with pytest.raises(ConfigError):
        _engine(transport, first_sequence=-1)


def _parallel(work: list[tuple[GossipEngine, list[int], dict[str, np.ndarray]]]) -> list:
    """Run each engine's rounds in its own thread; return each one's last model."""
    out: list = [None] * len(work)
    errors: list[BaseException] = []

    def device(k: int) -> None:
        engine, rounds, x = work[k]
        try:
            for r in rounds:
                x, _ = engine.exchange(r, drift(x, r, k))
            out[k] = x
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=device, args=(k,)) for k in range(len(work))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("margin", [SEQUENCE_MARGIN, 0])
def test_signed_neighbours_take_a_resumed_devices_messages(margin: int) -> None:
    # A 4-ring runs 3 rounds; dev-0 checkpointed round 2, published round 3, died, and
    # resumes at round 3 while its neighbours run round 4.
    bus = MemoryBroker()
    engines, transports, xs, keys = signed_engines(
        lambda _id: MemoryTransport(bus), 4, deadline_s=2.0
    )
    for r in (1, 2):
        run_round(engines, xs, r)
    old = engines[0]
    saved_sequence, saved_x = old.sequence, dict(xs[0])
    saved_own, meta = algorithm_state(old.algorithm)
    run_round(engines, xs, 3)
    transports[0].kill()

    fresh = MemoryTransport(bus)
    fresh.connect("dev-0")
    weights = {p: 0.5 for p in sorted(old.peers)}  # w_ij of the ring's Metropolis-Hastings
    algo = ChocoGossip(saved_x, {p: 1 / 3 for p in weights}, 1 / 3, 0.5, parse_codec("topk:0.3"))
    restore_algorithm(
        algo, Checkpoint("j", 2, saved_sequence, "s", "m", saved_x, np.zeros(1, np.uint8),
                         saved_own, meta)
    )  # fmt: skip
    resumed = GossipEngine(
        transport=fresh, fleet=FLEET, job_id=JOB, device_id="dev-0",
        neighbours=sorted(old.peers), algorithm=algo, deadline_s=2.0, max_payload=1024,
        signer=Signer(keys[0]), verifier=old.verifier,
        first_sequence=saved_sequence + margin,
    )  # fmt: skip
    resumed.request_keyframes(old.peers)
    resumed.start()

    # Peers awaiting a keyframe are not waited for: dev-0 trains on alone until theirs
    # come (held for their round).
    _parallel([(resumed, [3, 4, 5], saved_x)] + [(engines[i], [4, 5], xs[i]) for i in (1, 2, 3)])

    neighbours = [engines[1], engines[3]]
    if margin == 0:  # sequence 3 again: refused as a replay, the replicas go wrong
        assert sum(e.stats.replayed for e in neighbours) >= 2
        return
    assert all(e.stats.replayed == 0 for e in neighbours)
    assert all(e.stats.keyframes_received >= 1 for e in neighbours)
    for e in neighbours:  # both ends hold the same x̂ of dev-0, bit for bit
        assert e.ledger.counts.applied_twice == 0
        mine_all = algo.own_replica().values()
        for mine, theirs in zip(mine_all, e.algorithm._replicas["dev-0"], strict=True):
            np.testing.assert_array_equal(mine, theirs)
    fresh.flush(5.0)
    resumed.drain()
    # Both neighbours answered its request (one may answer twice: a request repeated
    # while its first keyframe was on the way, as the two cores' timing allows).
    assert resumed.stats.keyframes_received >= 2
    assert resumed.need == frozenset()
    for t in [*transports[1:], fresh]:
        t.close()
