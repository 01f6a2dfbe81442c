"""``meshfl local`` end to end: real processes, the embedded broker and Mosquitto."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meshfl.app.local.lab.lockstep import run_lockstep
from meshfl.app.local.processes import Supervisor
from meshfl.app.local.run import LocalConfig, run_local
from meshfl.contract import RoundSummary

pytestmark = pytest.mark.e2e


def test_the_cli_runs_a_small_fleet_that_beats_chance(tmp_path: Path) -> None:
    out = tmp_path / "run"

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "meshfl",
            "local",
            "--agents",
            "4",
            "--rounds",
            "5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert set(report) >= {"config", "rounds", "devices", "final"}
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3, 4, 5]
    for r in report["rounds"]:
        assert set(r) >= {
            "round",
            "mean_accuracy",
            "min_accuracy",
            "consensus_distance",
            "bytes_sent",
            "bytes_received",
            "elapsed_s",
        }
        assert r["bytes_sent"] > 0 and r["bytes_received"] > 0
    assert len(report["devices"]) == 4
    assert all(d["missing_rounds"] == [] for d in report["devices"])
    assert set(report["final"]) >= {"mean_accuracy", "min_accuracy", "bytes_sent_total", "wall_s"}
    assert report["final"]["mean_accuracy"] > 0.5  # chance is 0.1
    assert set(report["time_to_accuracy"]) == {"0.80", "0.85", "0.90"}
    assert (out / "report.png").stat().st_size > 10_000
    assert "final mean accuracy" in proc.stdout
    # the pooled reference: the same model and optimizer on all 4 devices' data, 5 epochs
    pooled = report["final"]["pooled_reference"]
    assert (pooled["samples"], pooled["epochs"], pooled["momentum"]) == (1437, 5, 0.9)
    assert 0.5 < pooled["accuracy"] <= 1.0
    assert f"pooled reference {pooled['accuracy']:.4f}" in proc.stdout
    # every device exported its final model to ONNX with parity, and the consensus too
    onnx = report["onnx"]
    assert onnx["failures"] == []
    assert [d["ok"] for d in onnx["devices"]] == [True] * 4
    assert all(Path(d["path"]).is_file() and d["max_abs_diff"] <= 1e-5 for d in onnx["devices"])
    consensus = onnx["consensus"]
    assert consensus["path"] == str(out / "consensus.onnx") and consensus["excluded"] == []
    assert consensus["max_abs_diff"] <= 1e-5
    assert consensus["accuracy_onnx"] == consensus["accuracy_torch"] > 0.5
    assert f"consensus model: {out / 'consensus.onnx'}, accuracy" in proc.stdout
    # the delivery ledger: every message sent once, applied once by each neighbour
    totals = report["ledger"]["totals"]
    received = 2 * len(report["topology"]["edges"]) * 5  # each edge carries 2 per round
    assert (totals["sent"], totals["applied"], totals["delivered"]) == (20, received, received)
    assert totals["applied_twice"] == totals["unrecovered_losses"] == totals["rejected"] == 0
    assert [r["sent"] for r in report["ledger"]["rounds"]] == [4] * 5
    assert f"ledger: 20 sent, {received} applied, 0 applied twice" in proc.stdout
    # every message arrived in time, so the fleet computed what lockstep computes — with
    # the defaults' local heavy-ball momentum, whose buffers live across the rounds
    config = report["config"]
    assert (config["codec"], config["topology"], config["local_momentum"]) == (
        "sign", "complete", 0.9)  # fmt: skip
    lockstep = run_lockstep(LocalConfig(agents=4, rounds=5))
    np.testing.assert_allclose([r["mean_accuracy"] for r in report["rounds"]],
                               lockstep.mean_accuracy, atol=1e-9)  # fmt: skip


def fedavg_reference(data_dir: Path, rounds: int, seed: int, momentum: float) -> float:
    """Exact averaging after every round (FedAvg, equal weights), computed here.

    Each device keeps its own heavy-ball buffer (``momentum``) across rounds, as the agents
    do; only the models are averaged.
    """
    from edge_agent.trainer import Trainer
    from models.data import load_dataset_file

    files = [data_dir / f"device-{i}.npz" for i in range(len(list(data_dir.glob("device-*.npz"))))]
    x_test, y_test = load_dataset_file(data_dir / "test.npz")
    spec = {"name": "mlp", "input_dim": 64, "num_classes": 10, "hidden": [64]}
    trainers = [
        Trainer(
            spec,
            seed=seed,
            data_seed=seed + 1 + i,
            learning_rate=0.1,  # type: ignore[arg-type]
            batch_size=32,
            local_epochs=1,
            momentum=momentum,
        )
        for i in range(len(files))
    ]
    data = [load_dataset_file(f) for f in files]
    for _ in range(rounds):
        params = []
        for trainer, (x, y) in zip(trainers, data, strict=True):
            trainer.train(x, y)
            params.append(trainer.params())
        mean = {k: np.mean([p[k] for p in params], axis=0) for k in params[0]}
        for trainer in trainers:
            trainer.set_params(mean)
    return trainers[0].evaluate(x_test, y_test)[0]


def test_dpsgd_on_the_complete_graph_is_exact_averaging(tmp_path: Path) -> None:
    config = LocalConfig(
        agents=4,
        rounds=8,
        algorithm="dpsgd",
        codec="identity",
        topology="complete",
        out=tmp_path / "run",
    )

    result = run_local(config)

    expected = fedavg_reference(tmp_path / "run" / "data", 8, seed=0, momentum=0.9)
    assert config.local_momentum == 0.9  # the default: the reference runs it too
    final = result.report["final"]
    assert abs(final["mean_accuracy"] - expected) <= 0.01
    assert final["min_accuracy"] == pytest.approx(final["mean_accuracy"], abs=1e-9)


def test_quasi_global_momentum_on_the_fleet_is_the_lockstep_algorithm(tmp_path: Path) -> None:
    # Issue 22: the agents' quasi-global momentum (edge_agent/local_step.py) computes what
    # the lockstep reference computes, round by round, and its m̂ moves (it is not HB).
    config = LocalConfig(agents=4, rounds=5, topology="ring", consensus_step=0.8,
                         momentum_kind="quasi-global", out=tmp_path / "run")  # fmt: skip

    result = run_local(config)

    assert result.report["config"]["momentum_kind"] == "quasi-global"
    fleet = [r["mean_accuracy"] for r in result.report["rounds"]]
    lockstep = run_lockstep(config)
    np.testing.assert_allclose(fleet, lockstep.mean_accuracy, atol=1e-9)
    heavy_ball = run_lockstep(LocalConfig(agents=4, rounds=5, topology="ring", consensus_step=0.8))
    assert heavy_ball.mean_accuracy != lockstep.mean_accuracy


def test_mosquitto_and_the_embedded_broker_reach_the_same_accuracy(
    tmp_path: Path, mosquitto_url: str
) -> None:
    embedded = run_local(LocalConfig(agents=4, rounds=5, out=tmp_path / "amqtt"))
    mosquitto = run_local(
        LocalConfig(agents=4, rounds=5, out=tmp_path / "mosq", broker=mosquitto_url)
    )

    a, b = embedded.report["final"], mosquitto.report["final"]
    assert a["mean_accuracy"] > 0.5
    assert abs(a["mean_accuracy"] - b["mean_accuracy"]) <= 0.01
    assert a["bytes_sent_total"] == b["bytes_sent_total"]


def test_a_killed_agent_does_not_hang_the_others(tmp_path: Path) -> None:
    killed: list[str] = []

    def kill_device_1(summary: RoundSummary, supervisor: Supervisor) -> None:
        if not killed:  # at the first round summary: rounds are fast, kill early
            child = next(c for c in supervisor.children if c.name == "device-1")
            child.stop(signal.SIGKILL)
            killed.append(child.name)

    config = LocalConfig(agents=4, rounds=20, out=tmp_path / "run", round_deadline_s=15.0)

    result = run_local(config, on_round=kill_device_1)

    report = result.report
    assert killed == ["device-1"]
    assert [r["round"] for r in report["rounds"]] == list(range(1, 21))
    victim = next(d for d in report["devices"] if d["name"] == "device-1")
    # Dead from its first missing round on: missing, until the coordinator takes it out of
    # the topology (left_round; how soon depends on the machine's speed), then gone.
    first = min(victim["missing_rounds"])
    left = min(victim["left_round"] or 21, 21)  # it may be taken out after the last round
    assert set(victim["missing_rounds"]) == set(range(first, left))
    assert all(
        ("device-1" in r["missing_devices"]) == (r["round"] < left)
        for r in report["rounds"][first - 1 :]
    )
    others = [d for d in report["devices"] if d["name"] != "device-1"]
    assert all(d["missing_rounds"] == [] for d in others)
    assert "device-1" in result.failed_agents
    assert report["final"]["wall_s"] < 120  # the Last Will ends the wait, not 4 deadlines


def test_a_slowed_agent_and_a_shaped_link_are_measured_as_such(tmp_path: Path) -> None:
    config = LocalConfig(
        agents=3,
        rounds=3,
        slow=(("device-1", 4.0),),
        links=(("device-2", "1mbit:200ms"),),
        out=tmp_path / "run",
    )

    result = run_local(config)

    report = result.report
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    profile = {d["name"]: d["profile"] for d in report["devices"]}
    # device-1 sleeps 3x each step's time: it cannot train at even half the others' rate
    fastest = max(profile[n]["train_samples_per_s"] for n in ("device-0", "device-2"))
    assert profile["device-1"]["train_samples_per_s"] < 0.5 * fastest
    # device-2's broker traffic crosses a 1 Mbit/s, 200 ms link (physical bounds)
    assert profile["device-2"]["broker_rtt_s"] >= 0.19
    assert profile["device-2"]["uplink_bytes_per_s"] < 2 * 125_000
    (link,) = report["links"]
    assert link["device"] == "device-2" and link["link"] == "1mbit:200ms"
    assert link["bytes_up"] > 0 and link["bytes_down"] > 0
