"""Publish models end to end: agents upload, the coordinator averages, a serve agent answers."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from edge_agent.onnx_infer import OnnxModel
from meshfl.app.local.processes import Supervisor, free_port, wait_for_port
from meshfl.app.local.run import LocalConfig, run_local
from models.data import load_dataset_file

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_local_job_publishes_models_and_a_serve_agent_predicts_with_the_consensus(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    run = run_local(LocalConfig(agents=2, rounds=2, out=out))

    artifacts = run.report["artifacts"]
    assert artifacts["status"] == "completed" and len(artifacts["devices"]) == 2
    consensus = artifacts["consensus"]
    assert consensus["error"] is None and len(consensus["devices"]) == 2
    fetched = Path(artifacts["path"])  # downloaded over REST by run_local
    assert fetched == out / "consensus.onnx"
    x, _ = load_dataset_file(out / "data" / "test.npz")
    coordinator_mean = OnnxModel(fetched)
    assert coordinator_mean.sha256 == consensus["sha256"]
    # The coordinator averaged ONNX initializers; the report checks that file against the
    # torch mean of the devices' final state dicts.
    checked = run.report["onnx"]["consensus"]
    assert checked["source"] == "coordinator" and checked["path"] == str(fetched)
    assert checked["ok"] and checked["max_abs_diff"] <= 1e-5
    assert checked["accuracy_onnx"] == checked["accuracy_torch"]

    # The same store behind a restarted coordinator; an inference-only agent enrols.
    supervisor = Supervisor(tmp_path / "logs")
    try:
        port = free_port()
        db = f"sqlite:///{out / 'coordinator.db'}"
        coordinator = supervisor.start(
            "coordinator",
            ["coordinator", "serve", "--port", str(port), "--db", db,
             "--enrol-token", "enrol", "--admin-token", "admin"],
        )  # fmt: skip
        wait_for_port("127.0.0.1", port, 60.0, alive=coordinator)
        serve = supervisor.start(
            "serve",
            ["agent", "serve", "--coordinator", f"http://127.0.0.1:{port}", "--token", "enrol",
             "--port", "0", "--out", str(tmp_path / "serve"), "--poll", "60"],
        )  # fmt: skip
        url = _served_url(serve.log_path, serve)
        r = httpx.post(f"{url}/predict", json={"inputs": x[:32].tolist()})
        assert r.status_code == 200, r.text
        labels, _ = coordinator_mean.predict(x[:32])
        assert r.json()["labels"] == labels.tolist()
        assert r.json()["model_sha256"] == consensus["sha256"]
        assert r.json()["job_id"] == artifacts["job_id"]
        devices = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/devices", headers={"Authorization": "Bearer admin"}
        ).json()
        assert [d["profile"].get("role") for d in devices].count("inference") == 1
    finally:
        supervisor.stop_all()


def _served_url(log: Path, child: object) -> str:
    """Wait (up to 60 s) for the serve agent's "serving predictions on URL" with a model."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        match = re.search(r"serving predictions on (http://\S+)", text)
        if match and "consensus model" in text:
            return match[1]
        assert getattr(child, "returncode", None) is None, text
        time.sleep(0.2)
    raise AssertionError(f"the serve agent did not come up: {log.read_text()}")
