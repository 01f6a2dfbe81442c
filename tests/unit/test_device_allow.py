"""A device runs only the zoo and the model factories its owner allowed; a job's data paths
stay inside the device's data directory; a refused job is declined with the reason
(issue 23, item 1)."""

from __future__ import annotations

import inspect
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_digits

from edge_agent import daemon
from edge_agent.daemon import AgentConfig, run_agent
from edge_agent.transport.base import Message
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.errors import ConfigError, MeshflError, SecurityError
from meshfl.modelspec import (
    check_allow_list,
    check_allowed,
    confine_path,
    from_options,
    validate_model_spec,
)
from meshfl.wire import status_topic

FLEET, JOB, DEVICE = "fleet", "job-1", "dev-0"
_LINK = {"broker_rtt_s": 0.001, "uplink_bytes_per_s": 1e9, "downlink_bytes_per_s": 1e9}

FACTORY_MODULE = """
import pathlib
from torch import nn

pathlib.Path(__file__).with_name("imported.marker").write_text("imported")


def make_net(input_dim, num_classes):
    return nn.Sequential(nn.Linear(input_dim, num_classes))
"""


class FakeClient:
    """The coordinator as the agent sees it: records reports and declines."""

    def __init__(self, assignment: dict[str, Any] | None = None) -> None:
        self.current = assignment
        self.metrics: list[Any] = []
        self.done: list[Any] = []
        self.declined: list[str] = []

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


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
    folder = tmp_path / "data"
    folder.mkdir()
    test = {"x_test": x[1500:1600], "y_test": y[1500:1600]}
    np.savez(folder / "device-0.npz", x=x[:200], y=y[:200], **test)
    np.savez(folder / "test.npz", x=x[1500:1600], y=y[1500:1600])
    np.savez(tmp_path / "outside.npz", x=x[1500:1600], y=y[1500:1600])
    return folder


@pytest.fixture
def user_models(tmp_path: Path) -> Iterator[Path]:
    package = tmp_path / "usernets_allow"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(textwrap.dedent(FACTORY_MODULE))
    sys.path.insert(0, str(tmp_path))
    try:
        yield package
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("usernets_allow")]:
            del sys.modules[name]


def _assignment(model: dict[str, Any], test_data: str | None = None) -> dict[str, Any]:
    spec = {
        "name": "trust", "model": model, "algorithm": "choco", "codec": "identity",
        "topology": "complete", "rounds": 1, "learning_rate": 0.05, "batch_size": 32,
        "local_epochs": 1, "consensus_step": 0.9, "round_deadline_s": 30.0,
        "max_payload_bytes": 131072, "seed": 0, "devices": 1, "test_data": test_data,
        "sketch_dim": 0, "signed_deltas": False,
    }  # fmt: skip
    return {
        "job_id": JOB, "fleet": FLEET, "status": "running", "spec": spec, "index": 0,
        "self_weight": 1.0, "neighbours": [], "topology_version": 1, "from_round": 1,
        "position": 0, "devices": [DEVICE], "start_round": 1,
        "plan": {"work_fraction": 1.0, "byte_budget": 0},
    }  # fmt: skip


def _config(tmp_path: Path, data_dir: Path, allowed: tuple[str, ...] = ()) -> AgentConfig:
    return AgentConfig(coordinator="http://coordinator.invalid", token="t",
                       data=data_dir / "device-0.npz", name=DEVICE, out=tmp_path / "out",
                       profile_refresh_s=0, once=True, allowed_models=allowed)  # fmt: skip


def _serve(config: AgentConfig, client: FakeClient) -> None:
    """The daemon's job loop, once: the job is run, or declined with the reason posted."""
    transport = MemoryTransport(MemoryBroker())
    transport.connect(DEVICE, will=Message(status_topic(FLEET, DEVICE), b"{}", retain=True))
    with np.load(config.data) as arrays:
        x, y = arrays["x"], arrays["y"]
    kwargs: dict[str, Any] = {
        "config": config, "client": client, "transport": transport, "device_id": DEVICE,
        "fleet": FLEET, "x": x, "y": y, "link": {**_LINK, "measured_at": time.time()},
    }  # fmt: skip
    if "health" in inspect.signature(daemon._serve).parameters:
        kwargs["health"] = SimpleNamespace(job_id=None)
    daemon._serve(**kwargs)


def test_the_os_system_job_is_declined_and_runs_nothing(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reproduction: a job (any operator token) naming os:system with a command.
    monkeypatch.chdir(tmp_path)
    calls: list[Any] = []
    monkeypatch.setattr(os, "system", lambda *a, **k: calls.append((a, k)) or 0)
    model = {"name": "custom", "factory": "os:system", "input_dim": 64, "num_classes": 10,
             "kwargs": {"command": "id > pwned.txt"}}  # fmt: skip
    client = FakeClient(_assignment(model))
    # Even when the owner lists it, the standard library is refused at start ...
    with pytest.raises(ConfigError, match="standard library"):
        check_allow_list(["os:system"])

    with pytest.raises(SecurityError, match="standard library"):
        _serve(_config(tmp_path, data_dir), client)  # once: declines, then re-raises

    assert calls == [] and not (tmp_path / "pwned.txt").exists()
    assert len(client.declined) == 1 and "'os:system'" in client.declined[0]
    assert client.metrics == [] and client.done == []


def test_an_unlisted_factory_is_declined_before_it_is_imported(
    tmp_path: Path, data_dir: Path, user_models: Path
) -> None:
    model = dict(from_options("usernets_allow.nets:make_net", 64, 10))
    client = FakeClient(_assignment(model))

    with pytest.raises(SecurityError, match="not allowed on this device"):
        _serve(_config(tmp_path, data_dir), client)

    assert not (user_models / "imported.marker").exists()  # its module never ran
    assert client.declined == [
        "model factory 'usernets_allow.nets:make_net' is not allowed on this device; its owner"
        " can allow it with `meshfl agent run --allow-model usernets_allow.nets:make_net`"
    ]


def test_an_allowed_factory_still_trains(tmp_path: Path, data_dir: Path, user_models: Path) -> None:
    from models.arrays import spec_hash
    from models.zoo import build_model

    model = dict(from_options("usernets_allow.nets:make_net", 64, 10))
    model["hash"] = spec_hash(build_model(model, 0))
    client = FakeClient(_assignment(model, test_data="test.npz"))  # relative: in the data dir
    config = _config(tmp_path, data_dir, allowed=("usernets_allow.nets:make_net",))

    _serve(config, client)

    assert client.declined == []
    assert [m["round"] for m in client.metrics] == [1] and len(client.done) == 1


@pytest.mark.parametrize(
    "path",
    ["/etc/shadow", "/etc/passwd", "../outside.npz", "{tmp}/outside.npz", "link.npz"],
)
def test_a_data_path_outside_the_data_directory_is_declined(
    tmp_path: Path, data_dir: Path, path: str
) -> None:
    (data_dir / "link.npz").symlink_to(tmp_path / "outside.npz")  # points out of the folder
    client = FakeClient(_assignment(dict(from_options("mlp", 64, 10)), path.format(tmp=tmp_path)))

    with pytest.raises(SecurityError, match="outside this device's data directory"):
        _serve(_config(tmp_path, data_dir), client)

    assert len(client.declined) == 1
    assert "outside this device's data directory" in client.declined[0]
    assert client.metrics == []


def test_confine_path_resolves_inside_and_refuses_escapes(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert confine_path("sub/../a.npz", tmp_path) == (tmp_path / "a.npz").resolve()
    inner = tmp_path / "sub" / "b.csv"
    assert confine_path(inner, tmp_path) == inner.resolve()
    for bad in ("..", "../x", "/", "sub/../../x", "a\0.npz"):
        with pytest.raises(SecurityError):
            confine_path(bad, tmp_path / "sub")


@pytest.mark.parametrize(
    "factory", ["os:system", "subprocess:run", "builtins:exec", "os.path:join", "shutil:rmtree"]
)
def test_standard_library_factories_are_refused_everywhere(factory: str) -> None:
    spec = {"name": "custom", "factory": factory, "input_dim": 64, "num_classes": 10}
    with pytest.raises(ConfigError, match="standard library"):  # the coordinator, at creation
        validate_model_spec(spec)
    with pytest.raises(SecurityError, match="standard library"):  # the device, before import
        check_allowed(spec, [factory])
    with pytest.raises(ConfigError, match="standard library"):  # the owner's list, at start
        check_allow_list([factory])


def test_the_agent_refuses_a_standard_library_allow_entry_at_start(
    tmp_path: Path, data_dir: Path
) -> None:
    config = _config(tmp_path, data_dir, allowed=("builtins:eval",))
    with pytest.raises(ConfigError, match="--allow-model 'builtins:eval' is refused"):
        run_agent(config)  # before the data file or the network
    with pytest.raises(ConfigError, match=r"must be 'package\.module:callable'"):
        check_allow_list(["not a factory"])


def test_meshfl_agent_run_takes_allow_model_and_a_token_file(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from meshfl.app.cli import app

    seen: list[AgentConfig] = []
    monkeypatch.setattr("edge_agent.daemon.run_agent", lambda config, **_: seen.append(config))
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    result = CliRunner().invoke(app, [
        "agent", "run", "--coordinator", "http://127.0.0.1:1", "--token-file", str(token),
        "--data", str(data_dir / "device-0.npz"), "--name", "d0",
        "--allow-model", "a.b:c", "--allow-model", "d.e:f",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert seen[0].token == "s3cret" and seen[0].allowed_models == ("a.b:c", "d.e:f")
    assert isinstance(seen[0], AgentConfig) and not isinstance(seen[0], MeshflError)
