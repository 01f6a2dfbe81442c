"""Every zoo model through the agent's job code (JobRunner) over the in-memory bus; a job
whose model hash this device cannot build is declined."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_digits

from edge_agent.daemon import AgentConfig
from edge_agent.job import JobRunner
from edge_agent.transport.base import Message
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.errors import ConfigError
from meshfl.modelspec import ZOO_MODELS, from_options, with_hash
from meshfl.wire import status_topic

FLEET, JOB = "fleet", "job-1"
DEVICES = ["dev-0", "dev-1"]


class FakeClient:
    """The coordinator as the agent sees it: records what the device reports."""

    def __init__(self, assignment: dict[str, Any] | None = None) -> None:
        self.current = assignment
        self.metrics: list[Any] = []
        self.done: list[Any] = []
        self.declined: list[str] = []

    def put_profile(self, device_id: str, profile: Any) -> None:
        pass

    def post_metrics(self, job_id: str, metrics: Any) -> None:
        self.metrics.append(metrics)

    def post_metrics_batch(self, job_id: str, batch: list[Any]) -> None:
        self.metrics.extend(batch)  # reports that waited for each other (the reporter)

    def post_done(self, job_id: str, done: Any) -> None:
        self.done.append(done)

    def post_decline(self, job_id: str, reason: str) -> None:
        self.declined.append(reason)

    def assignment(self, device_id: str) -> Any:
        return self.current

    def __getattr__(self, name: str) -> Any:  # anything else the agent may post: accepted
        return lambda *args, **kwargs: None


def _digits_files(tmp_path: Path) -> list[Path]:
    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
    files = []
    for i in range(len(DEVICES)):
        path = tmp_path / f"device-{i}.npz"
        rows = slice(200 * i, 200 * (i + 1))
        np.savez(path, x=x[rows], y=y[rows], x_test=x[1500:1700], y_test=y[1500:1700])
        files.append(path)
    return files


def _assignment(model: dict[str, Any], index: int) -> dict[str, Any]:
    spec = {
        "name": "zoo", "model": model, "algorithm": "choco", "codec": "topk:0.3",
        "topology": "complete", "rounds": 1, "learning_rate": 0.05, "batch_size": 32,
        "local_epochs": 1, "consensus_step": 0.9, "round_deadline_s": 30.0,
        "max_payload_bytes": 131072, "seed": 0, "devices": 2, "test_data": None,
        "sketch_dim": 16, "signed_deltas": False,  # signing: test_signed_deltas.py
    }  # fmt: skip
    return {
        "job_id": JOB, "fleet": FLEET, "status": "running", "spec": spec, "index": index,
        "self_weight": 0.5, "neighbours": [{"device_id": DEVICES[1 - index], "weight": 0.5}],
        "topology_version": 1, "from_round": 1, "position": index, "devices": DEVICES,
        "start_round": 1, "plan": {"work_fraction": 1.0, "byte_budget": 0},
    }  # fmt: skip


def _config(tmp_path: Path, data: Path, name: str, once: bool = False) -> AgentConfig:
    return AgentConfig(coordinator="http://coordinator.invalid", token="t", data=data,
                       name=name, out=tmp_path / "out", profile_refresh_s=0, once=once)  # fmt: skip


def _connected(bus: MemoryBroker, device: str) -> MemoryTransport:
    transport = MemoryTransport(bus)
    will = Message(status_topic(FLEET, device), b'{"state": "offline"}', retain=True)
    transport.connect(device, will=will)
    return transport


_LINK = {"broker_rtt_s": 0.001, "uplink_bytes_per_s": 1e9, "downlink_bytes_per_s": 1e9}


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_each_zoo_model_trains_one_round_through_the_job_runner(tmp_path: Path, name: str) -> None:
    # The spec as the coordinator stores it: hash filled from the torch-free layout.
    model = with_hash(from_options(name, 64, 10))
    files = _digits_files(tmp_path)
    bus = MemoryBroker()
    assignments = [_assignment(model, i) for i in range(len(DEVICES))]
    # Each fake coordinator still lists the job: a poll that reads none would end it.
    clients = [FakeClient(assignment) for assignment in assignments]
    errors: list[BaseException] = []

    def device(i: int) -> None:
        try:
            runner = JobRunner(
                _config(tmp_path, files[i], DEVICES[i]),
                clients[i],  # type: ignore[arg-type]
                _connected(bus, DEVICES[i]),
                DEVICES[i],
                assignments[i],  # type: ignore[arg-type]
                link={**_LINK, "measured_at": time.time()},  # type: ignore[typeddict-item]
            )
            with np.load(files[i]) as data:
                runner.run(data["x"], data["y"])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=device, args=(i,)) for i in range(len(DEVICES))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    for client in clients:
        assert [m["round"] for m in client.metrics] == [1]
        metrics = client.metrics[0]
        assert np.isfinite(metrics["loss"]) and 0.0 <= metrics["accuracy"] <= 1.0
        assert metrics["missing"] == [] and metrics["bytes_sent"] > 0
        assert len(client.done) == 1


def test_a_mismatched_hash_is_refused_before_any_round(tmp_path: Path) -> None:
    # The daemon declines a job whose JobRunner.run raises ConfigError (posting the
    # message): the runner must raise, with this message, before it trains or reports.
    model = dict(from_options("mlp", 64, 10))
    model["hash"] = "ab" * 32  # what another version of the model code would build
    data = _digits_files(tmp_path)[0]
    client = FakeClient()
    runner = JobRunner(
        _config(tmp_path, data, DEVICES[0]),
        client,  # type: ignore[arg-type]
        _connected(MemoryBroker(), DEVICES[0]),
        DEVICES[0],
        _assignment(model, 0),  # type: ignore[arg-type]
        link={**_LINK, "measured_at": time.time()},  # type: ignore[typeddict-item]
    )
    with np.load(data) as arrays:
        x, y = arrays["x"], arrays["y"]

    with pytest.raises(ConfigError) as caught:
        runner.run(x, y)

    built = with_hash(from_options("mlp", 64, 10))["hash"]
    assert str(caught.value) == (
        f"model spec hash mismatch: job expects {'ab' * 6}…, this device built {built[:12]}…"
        " from mlp (64→10, hidden [64]); install the same model code (package version) on"
        " every device"
    )
    assert client.metrics == [] and client.done == []


def test_the_daemon_posts_the_mismatch_as_a_decline(tmp_path: Path) -> None:
    import inspect
    from types import SimpleNamespace

    from edge_agent import daemon

    model = dict(from_options("mlp", 64, 10))
    model["hash"] = "ab" * 32
    data = _digits_files(tmp_path)[0]
    client = FakeClient(_assignment(model, 0))
    with np.load(data) as arrays:
        x, y = arrays["x"], arrays["y"]
    kwargs: dict[str, Any] = {
        "config": _config(tmp_path, data, DEVICES[0], once=True), "client": client,
        "transport": _connected(MemoryBroker(), DEVICES[0]), "device_id": DEVICES[0],
        "fleet": FLEET, "x": x, "y": y, "link": {**_LINK, "measured_at": time.time()},
    }  # fmt: skip
    if "health" in inspect.signature(daemon._serve).parameters:  # the agent's health file
        kwargs["health"] = SimpleNamespace(job_id=None)

    with pytest.raises(ConfigError, match="model spec hash mismatch"):
        daemon._serve(**kwargs)  # once=True: declines, then re-raises

    assert len(client.declined) == 1
    assert client.declined[0].startswith(f"model spec hash mismatch: job expects {'ab' * 6}…")


class _PollCounter(FakeClient):
    """A FakeClient that counts assignment reads (the coordinator's sign of life)."""

    def __init__(self, assignment: dict[str, Any]) -> None:
        super().__init__(assignment)
        self.polls = 0

    def assignment(self, device_id: str) -> Any:
        self.polls += 1
        return self.current


def test_a_device_polls_its_assignment_while_it_waits_for_its_neighbours(tmp_path: Path) -> None:
    # The coordinator takes a participant silent for 1.5 s that its neighbours miss for a
    # departed one: a device that is still setting up (here waiting for its neighbour to
    # be ready) must keep asking for its assignment, as it does during the rounds.
    model = with_hash(from_options("mlp", 64, 10))
    files = _digits_files(tmp_path)
    bus = MemoryBroker()
    clients = [_PollCounter(_assignment(model, i)) for i in range(len(DEVICES))]
    errors: list[BaseException] = []

    def device(i: int) -> None:
        try:
            config = dataclasses.replace(_config(tmp_path, files[i], DEVICES[i]), poll_s=0.1)
            runner = JobRunner(
                config,
                clients[i],  # type: ignore[arg-type]
                _connected(bus, DEVICES[i]),
                DEVICES[i],
                _assignment(model, i),  # type: ignore[arg-type]
                link={**_LINK, "measured_at": time.time()},  # type: ignore[typeddict-item]
            )
            with np.load(files[i]) as data:
                runner.run(data["x"], data["y"])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    first = threading.Thread(target=device, args=(0,))
    first.start()
    deadline = time.monotonic() + 60
    while clients[0].polls < 5 and time.monotonic() < deadline and first.is_alive():
        time.sleep(0.05)
    polls_before_any_round = clients[0].polls
    assert clients[0].metrics == []  # still waiting for dev-1: no round has run
    second = threading.Thread(target=device, args=(1,))
    second.start()
    first.join(timeout=120)
    second.join(timeout=120)

    assert errors == []
    assert polls_before_any_round >= 5
    assert [m["round"] for m in clients[0].metrics] == [1]
