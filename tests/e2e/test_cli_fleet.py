"""``meshfl fleet`` against a real coordinator: a uvicorn server thread on a free port.

Most commands run in-process through typer's CliRunner (fast); a few run the real entry
point as a subprocess to check the one-line errors and exit codes users see.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from broker.ports import free_port
from coordinator import CoordinatorSettings, create_app
from meshfl.app.cli import app
from meshfl.errors import ConfigError, CoordinatorError

pytestmark = pytest.mark.e2e

ADMIN = "admin-token-for-the-fleet-cli-tests"
ENROL = "enrol-token-for-the-fleet-cli-tests"


@dataclass
class Coordinator:
    url: str
    clock: list[float] = field(default_factory=lambda: [time.time()])

    def api(self, method: str, path: str, token: str = ADMIN, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.request(method, f"{self.url}/api/v1{path}", headers=headers, **kwargs)

    def enrol(self, name: str, token: str = ENROL, **profile: Any) -> str:
        body = {"token": token, "name": name, "profile": profile}
        response = httpx.post(f"{self.url}/api/v1/devices/enrol", json=body)
        assert response.status_code == 200, response.text
        self.clock[0] += 0.01  # the next one enrols later: the listing order is defined
        device_id: str = response.json()["device_id"]
        return device_id


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    import uvicorn

    settings = CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'coordinator.db'}",
        enrol_token=ENROL,
        admin_token=ADMIN,
        artifacts_dir=tmp_path / "artifacts",
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # clients connect (and wait in the backlog) before uvicorn accepts
    handle = Coordinator(url=f"http://127.0.0.1:{sock.getsockname()[1]}")
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, clock=lambda: handle.clock[0]), log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield handle
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def fleet(c: Coordinator, *args: str, token: str = ADMIN, input: str | None = None) -> Any:
    """Run ``meshfl fleet ARGS`` in-process; the result carries stdout and the exception."""
    argv = ["fleet", *args, "--coordinator", c.url, "--token", token]
    return CliRunner().invoke(app, argv, input=input, env={"COLUMNS": "200"})


def ok(c: Coordinator, *args: str, token: str = ADMIN) -> str:
    result = fleet(c, *args, token=token)
    assert result.exit_code == 0, (result.output, result.exception)
    output: str = result.stdout
    return output


def as_json(c: Coordinator, *args: str, token: str = ADMIN) -> Any:
    return json.loads(ok(c, *args, "--json", token=token))


def refused(c: Coordinator, *args: str, token: str = ADMIN) -> CoordinatorError:
    result = fleet(c, *args, token=token)
    assert isinstance(result.exception, CoordinatorError), (result.output, result.exception)
    assert result.exception.exit_code == 1
    assert "\n" not in str(result.exception)
    return result.exception


def meshfl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MESHFL_")}
    return subprocess.run(
        [sys.executable, "-m", "meshfl", *args],
        capture_output=True, text=True, timeout=60, env={**environ, **(env or {})},
    )  # fmt: skip


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshfl: error:"), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_ls_prints_a_table_and_json_with_the_total(coordinator: Coordinator) -> None:
    c = coordinator
    ids = [c.enrol(f"pi-{i}", cores=2 + 2 * i, train_samples_per_s=100.0 * (i + 1))
           for i in range(3)]  # fmt: skip

    table = ok(c, "ls")
    listed = as_json(c, "ls")
    page = ok(c, "ls", "--limit", "2", "--offset", "1")

    for i, device_id in enumerate(ids):
        row = next(line for line in table.splitlines() if device_id in line)
        assert f"pi-{i}" in row and "active" in row and "yes" in row
        assert str(2 + 2 * i) in row and f"{100 * (i + 1)}" in row and "s ago" in row
    assert "1-3 of 3 devices" in table
    assert [d["device_id"] for d in listed] == ids
    assert ids[0] not in page and ids[1] in page and ids[2] in page
    assert "2-3 of 3 devices" in page


def test_ls_filters_by_tag_state_online_and_cores(coordinator: Coordinator) -> None:
    c = coordinator
    now = c.clock[0]
    c.clock[0] = now - 3600  # enrolled an hour ago and silent since: offline
    old = c.enrol("old", cores=8)
    c.clock[0] = now
    small, big = c.enrol("small", cores=2), c.enrol("big", cores=16)
    ok(c, "tag", big, "--add", "gpu", "--add", "lab")
    ok(c, "tag", small, "--add", "lab")
    ok(c, "drain", small)

    def ids(*args: str) -> list[str]:
        return [d["device_id"] for d in as_json(c, "ls", *args)]

    assert ids("--tag", "lab") == [small, big]
    assert ids("--tag", "lab", "--tag", "gpu") == [big]
    assert ids("--state", "draining") == [small]
    assert ids("--online") == [small, big]
    assert ids("--offline") == [old]
    assert ids("--min-cores", "8") == [old, big]
    assert "no devices (of 0)" in ok(c, "ls", "--tag", "nowhere")


def test_show_prints_profile_labels_and_privacy(coordinator: Coordinator) -> None:
    c = coordinator
    device_id = c.enrol("jetson", cores=6, memory_bytes=8 << 30, accelerator="cuda")
    ok(c, "tag", device_id, "--add", "edge", "--label", "site=lab-2")

    text = ok(c, "show", device_id)
    document = as_json(c, "show", device_id)

    assert document["device_id"] == device_id and document["labels"] == {"site": "lab-2"}
    assert "jetson" in text and "site=lab-2" in text and "edge" in text
    assert "8.0 GiB" in text and "cuda" in text
    assert "no differentially private releases yet" in text
    assert "404" in str(refused(c, "show", "no-such-device"))


def test_tag_adds_removes_and_labels(coordinator: Coordinator) -> None:
    c = coordinator
    device_id = c.enrol("cam-1")

    ok(c, "tag", device_id, "--add", "a", "--add", "b", "--label", "k=v", "--label", "x=y")
    after = as_json(c, "tag", device_id, "--add", "c", "--remove", "a", "--unlabel", "x")

    assert after["tags"] == ["b", "c"]
    assert after["labels"] == {"k": "v"}
    assert c.api("GET", f"/devices/{device_id}").json()["tags"] == ["b", "c"]
    nothing = fleet(c, "tag", device_id)
    assert isinstance(nothing.exception, ConfigError) and "--add" in str(nothing.exception)
    bad = fleet(c, "tag", device_id, "--label", "novalue")
    assert isinstance(bad.exception, ConfigError) and "KEY=VALUE" in str(bad.exception)
    assert "422" in str(refused(c, "tag", device_id, "--add", "bad tag!"))


def test_drain_undrain_revoke_and_delete(coordinator: Coordinator) -> None:
    c = coordinator
    device_id = c.enrol("phone")

    assert "draining" in ok(c, "drain", device_id)
    assert as_json(c, "undrain", device_id)["state"] == "active"
    declined = fleet(c, "revoke", device_id, input="n\n")
    assert declined.exit_code == 1
    assert c.api("GET", f"/devices/{device_id}").json()["state"] == "active"
    assert "revoked" in ok(c, "revoke", device_id, "--yes")
    assert c.api("GET", f"/devices/{device_id}").json()["state"] == "revoked"

    assert "deleted" in ok(c, "delete", device_id, "--yes")
    assert device_id not in [d["device_id"] for d in as_json(c, "ls")]


def test_enrolment_tokens_create_ls_revoke(coordinator: Coordinator) -> None:
    c = coordinator

    text = ok(c, "tokens", "create", "--uses", "2", "--ttl", "1h", "--tag", "field")
    secret = text.split("secret (shown only now): ")[1].split()[0]
    assert f"meshfl agent run --coordinator {c.url} --token {secret}" in text
    device_id = c.enrol("field-1", token=secret)
    listed = as_json(c, "tokens", "ls")
    table = ok(c, "tokens", "ls")

    assert c.api("GET", f"/devices/{device_id}").json()["tags"] == ["field"]
    assert len(listed) == 1 and listed[0]["uses_left"] == 1
    assert secret not in json.dumps(listed) and secret not in table
    token_id = listed[0]["token_id"]
    assert token_id in table and "in 59 min" in table
    assert "revoked" in ok(c, "tokens", "revoke", token_id)
    again = httpx.post(f"{c.url}/api/v1/devices/enrol", json={"token": secret, "name": "x"})
    assert again.status_code == 401
    bad_ttl = fleet(c, "tokens", "create", "--ttl", "soon")
    assert isinstance(bad_ttl.exception, ConfigError) and "1h" in str(bad_ttl.exception)


def test_api_tokens_and_a_read_only_token_refused_on_revoke(coordinator: Coordinator) -> None:
    c = coordinator
    device_id = c.enrol("sensor")

    created = as_json(c, "tokens", "api", "create", "--role", "read-only", "--name", "ci")
    reader = created["token"]
    listed = as_json(c, "tokens", "api", "ls")

    assert [t["role"] for t in listed] == ["read-only"] and reader not in json.dumps(listed)
    assert device_id in ok(c, "ls", token=reader)
    error = refused(c, "revoke", device_id, "--yes", token=reader)
    assert error.status == 403
    assert c.api("GET", f"/devices/{device_id}").json()["state"] == "active"
    assert "revoked" in ok(c, "tokens", "api", "revoke", listed[0]["token_id"])
    assert refused(c, "ls", token=reader).status == 401


def test_jobs_lists_status_rounds_and_devices_and_job_pause_resume(
    coordinator: Coordinator,
) -> None:
    c = coordinator
    assert "no jobs yet" in ok(c, "jobs")
    spec = {
        "name": "cli-job", "model": {"name": "mlp", "input_dim": 4, "num_classes": 2,
                                     "hidden": [8]},
        "algorithm": "choco", "codec": "identity", "topology": "ring", "rounds": 7,
        "learning_rate": 0.1, "batch_size": 8, "local_epochs": 1, "consensus_step": 0.5,
        "round_deadline_s": 5.0, "max_payload_bytes": 131072, "seed": 0, "devices": 3,
        "test_data": None, "sketch_dim": 0, "signed_deltas": False,
    }  # fmt: skip
    for i in range(3):
        c.enrol(f"worker-{i}")
    waiting = c.api("POST", "/jobs", json={**spec, "name": "waiting"}).json()["job_id"]
    running = c.api("POST", "/jobs", json=spec).json()["job_id"]
    assert c.api("POST", f"/jobs/{running}/start").status_code == 200

    table = ok(c, "jobs")
    listed = as_json(c, "jobs")
    job = ["job", "--coordinator", c.url, "--admin-token", ADMIN]
    paused = CliRunner().invoke(app, [*job[:1], "pause", *job[1:], running])
    paused_row = next(line for line in ok(c, "jobs").splitlines() if running in line)
    resumed = CliRunner().invoke(app, [*job[:1], "resume", *job[1:], running])

    row = next(line for line in table.splitlines() if running in line)
    assert "cli-job" in row and "running" in row and "0/7" in row and "3/3" in row
    assert "ring" in row and "s ago" in row
    assert "created" in next(line for line in table.splitlines() if waiting in line)
    assert "meshfl job" in table
    assert {j["job_id"] for j in listed} == {waiting, running}
    assert paused.exit_code == 0 and "paused" in paused.output, paused.output
    assert "paused" in paused_row
    assert resumed.exit_code == 0 and f"job {running}: running" in resumed.output
    again = CliRunner().invoke(app, [*job[:1], "resume", *job[1:], running])
    assert isinstance(again.exception, CoordinatorError) and again.exception.status == 409


def test_topology_show_and_set(coordinator: Coordinator, tmp_path: Path) -> None:
    c = coordinator
    for i in range(4):
        c.enrol(f"node-{i}")

    ring = as_json(c, "topology")
    text = ok(c, "topology", "set", "--kind", "complete")
    shown = ok(c, "topology")
    path = tmp_path / "path.json"
    path.write_text(json.dumps({"n": 3, "edges": [[0, 1], [1, 2]]}))
    custom = as_json(c, "topology", "set", "--custom", str(path))

    from meshfl.topology import build_graph, mixing_matrix, spectral_gap

    assert ring["spectral_gap"] == pytest.approx(
        spectral_gap(mixing_matrix(build_graph("ring", 4)))
    )
    assert "complete" in text and "edges 6" in text and "0.2500" in text
    assert "fleet topology: complete" in shown
    assert custom["setting"] == {"topology": "custom",
                                 "custom_graph": {"n": 3, "edges": [[0, 1], [1, 2]]}}  # fmt: skip
    assert custom["nodes"] == [] and custom["error"]  # 3 nodes given, 4 live devices
    bad = fleet(c, "topology", "set", "--kind", "hypercube")
    assert isinstance(bad.exception, ConfigError) and "ring" in str(bad.exception)
    assert "422" in str(refused(c, "topology", "set", "--kind", "random-regular",
                                "--degree", "-1"))  # fmt: skip


def test_entry_point_errors_are_one_line(coordinator: Coordinator) -> None:
    url = f"http://127.0.0.1:{free_port()}"

    unreachable = meshfl("fleet", "ls", "--coordinator", url, "--token", "x")
    from_env = {"MESHFL_COORDINATOR_URL": coordinator.url, "MESHFL_ADMIN_TOKEN": ADMIN}
    listed = meshfl("fleet", "ls", "--json", env=from_env)
    unknown = fleet(coordinator, "ls", token="not-a-token")
    no_env = {"MESHFL_API_TOKEN": "", "MESHFL_ADMIN_TOKEN": ""}
    no_token = CliRunner().invoke(
        app, ["fleet", "ls", "--coordinator", coordinator.url], env=no_env
    )

    assert_one_line_error(unreachable, url, "meshfl coordinator serve", "--coordinator")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    assert isinstance(unknown.exception, CoordinatorError)
    assert unknown.exception.status in (401, 403) and "token" in str(unknown.exception)
    assert "\n" not in str(unknown.exception)
    assert isinstance(no_token.exception, ConfigError) and "--token" in str(no_token.exception)


def test_an_id_is_one_path_segment_and_a_bad_url_is_one_line() -> None:
    from meshfl.app.local.admin import AdminClient, path_segment
    from meshfl.errors import ConfigError

    assert path_segment("../tokens/tok-1") == "..%2Ftokens%2Ftok-1"
    with pytest.raises(ConfigError, match="is not valid"):
        AdminClient("http://[::1", "t")
    with pytest.raises(ConfigError, match="http:// or https://"):
        AdminClient("ftp://host", "t")
