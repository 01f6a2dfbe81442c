"""The coordinator plans a job at start: topology parameters, capability-aware plans, W.

Over TestClient with an in-memory SQLite store, a hand-moved clock and a fake control
publisher that records every message. ``Fleet`` is reused by test_coordinator_churn.py.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coordinator import CoordinatorSettings, create_app
from coordinator.planning import UNKNOWN_MODEL_BYTES, dense_bytes
from edge_agent.secagg.crypto import IdentityKey
from edge_agent.versions import TopologyVersion
from meshfl.topology import (
    build_graph,
    exponential,
    metropolis_hastings,
    spectral_gap,
    uniform_weights,
)
from meshfl.wire.control import decode_control

with warnings.catch_warnings():  # starlette prefers httpx2; httpx is what we ship
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

API = "/api/v1"
ADMIN_H = {"Authorization": "Bearer admin"}
FAST = {"train_samples_per_s": 400.0, "uplink_bytes_per_s": 10e6}


class Fleet:
    """A coordinator, its clock and its published control messages, driven by hand."""

    def __init__(self, *, publish_fails: bool = False, **settings: Any) -> None:
        self.now = 1_000.0
        self.published: list[tuple[str, dict[str, Any]]] = []
        self.publish_fails = publish_fails
        config = CoordinatorSettings(
            db_url="sqlite://", fleet="lab", enrol_token="enrol", admin_token="admin", **settings
        )
        self.client = TestClient(create_app(config, self._publish, clock=lambda: self.now))
        self.headers: dict[str, dict[str, str]] = {}

    def _publish(self, topic: str, payload: bytes) -> None:
        if self.publish_fails:
            raise OSError("broker gone")
        self.published.append((topic, json.loads(payload)))

    def enrol(self, name: str, profile: dict[str, Any] | None = None) -> str:
        body: dict[str, Any] = {"token": "enrol", "name": name}
        body["identity_key"] = IdentityKey.generate().public_b64  # as agents send
        if profile is not None:
            body["profile"] = profile
        reply = self.client.post(f"{API}/devices/enrol", json=body).json()
        self.headers[reply["device_id"]] = {"Authorization": f"Bearer {reply['device_token']}"}
        return str(reply["device_id"])

    def put_profile(self, device: str, profile: dict[str, Any]) -> Any:
        url = f"{API}/devices/{device}/profile"
        return self.client.put(url, json=profile, headers=self.headers[device])

    def create(self, **overrides: Any) -> Any:
        return self.client.post(f"{API}/jobs", json=spec(**overrides), headers=ADMIN_H)

    def start(self, **overrides: Any) -> str:
        created = self.create(**overrides)
        assert created.status_code == 201, created.text
        job_id = str(created.json()["job_id"])
        started = self.client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
        assert started.status_code == 200, started.text
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json())

    def topology(self, job_id: str) -> dict[str, Any]:
        return dict(self.client.get(f"{API}/jobs/{job_id}/topology", headers=ADMIN_H).json())

    def assignment(self, device: str) -> Any:
        return self.client.get(f"{API}/devices/{device}/assignment", headers=self.headers[device])

    def report(
        self, job_id: str, device: str, rnd: int, missing: tuple[str, ...] = (), **fields: Any
    ) -> int:
        body = {
            "round": rnd, "accuracy": 0.5, "loss": 0.5, "bytes_sent": 10, "bytes_received": 20,
            "missing": list(missing), "sketch": [], "train_s": 0.1, "round_s": 0.2, **fields,
        }  # fmt: skip
        url = f"{API}/jobs/{job_id}/metrics"
        return int(self.client.post(url, json=body, headers=self.headers[device]).status_code)

    def done(self, job_id: str, device: str) -> int:
        body = {"final_accuracy": 0.9, "bytes_sent": 1, "bytes_received": 2, "model_path": "m"}
        url = f"{API}/jobs/{job_id}/done"
        return int(self.client.post(url, json=body, headers=self.headers[device]).status_code)


def spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "plan",
        "model": {"name": "mlp", "input_dim": 784, "num_classes": 10, "hidden": [64]},
        "algorithm": "choco",
        "codec": "topk:0.1",
        "topology": "ring",
        "rounds": 20,
        "learning_rate": 0.05,
        "batch_size": 32,
        "local_epochs": 1,
        "consensus_step": 0.5,
        "round_deadline_s": 30.0,
        "max_payload_bytes": 131072,
        "seed": 7,
        "devices": 4,
        "test_data": None,
        "sketch_dim": 0,
    }
    body.update(overrides)
    return body


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    made = Fleet()
    with made.client:
        yield made


def by_id(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["device_id"]: d for d in job["devices"]}


# --- capability-aware planning ---------------------------------------------------------------


def test_the_plan_follows_the_measured_profiles(fleet: Fleet) -> None:
    # pi-0 trains 4x slower than the median, pi-1 has a 1 Mbit/s uplink; the others are fast.
    ids = [fleet.enrol(f"pi-{k}") for k in range(4)]
    fleet.put_profile(ids[0], {**FAST, "train_samples_per_s": 100.0})
    fleet.put_profile(ids[1], {**FAST, "uplink_bytes_per_s": 125_000.0})
    for device in ids[2:]:
        fleet.put_profile(device, FAST)

    job_id = fleet.start(plan=True)

    plans = {d: p["plan"] for d, p in by_id(fleet.job(job_id)).items()}
    topo = fleet.topology(job_id)
    degree = {d: 0 for d in ids}
    for i, j in topo["edges"]:
        degree[topo["devices"][i]] += 1
        degree[topo["devices"][j]] += 1
    w = np.array(topo["mixing_matrix"])
    slow_link = fleet.assignment(ids[1]).json()
    # The slow link's one neighbour mixes it late instead of waiting for it.
    (neighbour,) = [d for d in ids if plans[d].get("no_wait")]
    assert plans[neighbour].pop("no_wait") == [ids[1]]
    assert plans[ids[0]] == {"work_fraction": pytest.approx(0.25), "byte_budget": 0}
    assert plans[ids[1]] == {"work_fraction": 1.0, "byte_budget": 6250}  # 125 kB/s · 0.05 s
    assert plans[ids[2]] == plans[ids[3]] == {"work_fraction": 1.0, "byte_budget": 0}
    assert degree[ids[1]] == 1 and min(degree.values()) >= 1
    assert slow_link["plan"] == plans[ids[1]] and len(slow_link["neighbours"]) == 1
    np.testing.assert_allclose(w, w.T)
    np.testing.assert_allclose(w.sum(axis=1), np.ones(4))
    assert topo["spectral_gap"] == pytest.approx(spectral_gap(w)) and topo["spectral_gap"] > 0


def test_an_uplink_budget_and_unmeasured_devices(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in range(2)]
    fleet.put_profile(ids[0], {"uplink_bytes_per_s": 1e6})  # ids[1] measured nothing

    job_id = fleet.start(devices=2, plan=True, uplink_budget_s=0.01)

    plans = {d: p["plan"] for d, p in by_id(fleet.job(job_id)).items()}
    assert plans[ids[0]] == {"work_fraction": 1.0, "byte_budget": 10_000}
    assert plans[ids[1]] == {"work_fraction": 1.0, "byte_budget": 0}


def test_without_plan_every_device_does_all_the_work(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in range(4)]
    fleet.put_profile(ids[0], {**FAST, "train_samples_per_s": 1.0, "uplink_bytes_per_s": 1.0})

    job_id = fleet.start()

    topo = fleet.topology(job_id)
    assert {d["plan"]["work_fraction"] for d in fleet.job(job_id)["devices"]} == {1.0}
    assert sorted(map(tuple, topo["edges"])) == sorted(build_graph("ring", 4).edges)
    assert fleet.assignment(ids[0]).json()["plan"] == {"work_fraction": 1.0, "byte_budget": 0}


def test_devices_low_on_battery_sit_out_at_start(fleet: Fleet) -> None:
    low = fleet.enrol("pi-low", {"battery_percent": 12.0, "charging": False})
    plugged = fleet.enrol("pi-plugged", {"battery_percent": 5.0, "charging": True})
    mains = [fleet.enrol(f"pi-{k}") for k in range(2)]

    job_id = fleet.start(devices=0, min_battery_percent=20.0)

    topo = fleet.topology(job_id)
    reason = topo["events"][0]["reason"]
    assert sorted(topo["devices"]) == sorted([plugged, *mains])
    assert low in reason and "battery 12% < 20%" in reason
    assert fleet.assignment(low).status_code == 204


def test_too_few_devices_after_the_battery_rule_is_a_409(fleet: Fleet) -> None:
    fleet.enrol("pi-low", {"battery_percent": 3.0, "charging": False})
    fleet.enrol("pi-ok")
    job_id = fleet.create(devices=2, min_battery_percent=20.0).json()["job_id"]

    r = fleet.client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)

    assert r.status_code == 409 and "low on battery" in r.json()["detail"]


def test_dense_bytes_counts_the_mlp_parameters() -> None:
    mlp = spec(model={"name": "mlp", "input_dim": 784, "num_classes": 10, "hidden": [64]})
    flat = spec(model={"name": "mlp", "input_dim": 4, "num_classes": 2, "hidden": []})
    assert dense_bytes(mlp) == 4 * (785 * 64 + 65 * 10)  # type: ignore[arg-type]
    assert dense_bytes(flat) == 4 * 5 * 2  # type: ignore[arg-type]
    cnn = spec(model={"name": "cnn1d", "input_dim": 40, "num_classes": 10, "hidden": [8]})
    assert dense_bytes(cnn) == 4 * (8 * 5 + 8 + 8 * 19 * 10 + 10)  # type: ignore[arg-type]
    custom = spec(model={"name": "custom", "factory": "pkg.mod:make", "input_dim": 40,
                         "num_classes": 10, "hidden": [], "hash": "0" * 64})  # fmt: skip
    assert dense_bytes(custom) == UNKNOWN_MODEL_BYTES  # type: ignore[arg-type]


# --- topology parameters and kinds -----------------------------------------------------------


def test_topology_parameters_reach_the_builder_and_the_mixing_rule(fleet: Fleet) -> None:
    for k in range(6):
        fleet.enrol(f"pi-{k}")
    job_id = fleet.start(
        devices=6, topology="random-regular", topology_degree=3, topology_seed=11,
        mixing="max-degree",
    )  # fmt: skip

    topo = fleet.topology(job_id)
    graph = build_graph("random-regular", 6, degree=3, seed=11)
    assert sorted(map(tuple, topo["edges"])) == sorted(graph.edges)
    np.testing.assert_allclose(topo["mixing_matrix"], uniform_weights(graph))
    assert (topo["version"], topo["from_round"]) == (1, 1)
    assert [e["kind"] for e in topo["events"]] == ["start"]


def test_the_topology_seed_defaults_to_the_job_seed(fleet: Fleet) -> None:
    for k in range(6):
        fleet.enrol(f"pi-{k}")

    job_id = fleet.start(devices=6, topology="erdos-renyi", topology_probability=0.5, seed=3)

    graph = build_graph("erdos-renyi", 6, probability=0.5, seed=3)
    assert sorted(map(tuple, fleet.topology(job_id)["edges"])) == sorted(graph.edges)


def test_a_custom_graph_is_the_topology(fleet: Fleet) -> None:
    ids = sorted((fleet.enrol(f"pi-{k}") for k in range(4)), key=lambda d: d)
    custom = {"n": 4, "edges": [[0, 1], [0, 2], [0, 3]]}  # a star around node 0

    job_id = fleet.start(devices=0, topology="custom", custom_graph=custom)

    topo = fleet.topology(job_id)
    assert topo["kind"] == "custom" and len(topo["devices"]) == len(ids)
    assert sorted(map(tuple, topo["edges"])) == [(0, 1), (0, 2), (0, 3)]


def test_one_peer_exponential_stores_the_union_graph(fleet: Fleet) -> None:
    for k in range(8):
        fleet.enrol(f"pi-{k}")

    job_id = fleet.start(devices=8, topology="one-peer-exponential")

    topo = fleet.topology(job_id)
    assert sorted(map(tuple, topo["edges"])) == sorted(exponential(8).edges)
    np.testing.assert_allclose(topo["mixing_matrix"], metropolis_hastings(exponential(8)))


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"topology_degree": 0}, "topology_degree"),
        ({"topology_probability": 1.5}, "topology_probability"),
        ({"topology_seed": -1}, "topology_seed"),
        ({"staleness": 1001}, "staleness"),
        ({"quorum": 0.0}, "quorum"),
        ({"quorum": 1.5}, "quorum"),
        ({"uplink_budget_s": 0.0}, "uplink_budget_s"),
        ({"uplink_budget_s": 61.0}, "uplink_budget_s"),
        ({"min_battery_percent": 101.0}, "min_battery_percent"),
        ({"mixing": "uniform"}, "mixing"),
        ({"mode": "lazy"}, "mode"),
        ({"topology": "custom"}, "custom_graph"),
        ({"custom_graph": {"n": 4, "edges": [[0, 1]]}}, "custom_graph"),
        ({"topology": "custom", "custom_graph": {"n": 4, "edges": [[0, 1], [2, 3]]}}, "disconn"),
        ({"topology": "custom", "custom_graph": {"n": 3, "edges": [[0, 1], [1, 2]]}}, "devices"),
        ({"topology": "random-regular", "topology_degree": 5}, "random-regular"),
        ({"topology": "random-regular", "topology_degree": 1}, "disconnected"),
    ],
)
def test_bad_topology_and_planning_fields_are_422_in_one_line(
    fleet: Fleet, override: dict[str, Any], field: str
) -> None:
    r = fleet.create(**override)
    detail = r.json()["detail"]
    assert r.status_code == 422
    assert field in detail and "\n" not in detail


def test_every_new_field_is_accepted_within_bounds(fleet: Fleet) -> None:
    fields = {
        "topology_degree": 3, "topology_probability": 0.0, "topology_seed": 2**32 - 1,
        "mixing": "max-degree", "mode": "async", "staleness": 0, "quorum": 1.0, "plan": True,
        "uplink_budget_s": 60.0, "min_battery_percent": 100.0, "elastic": True,
    }  # fmt: skip
    r = fleet.create(**fields)
    assert r.status_code == 201, r.text
    assert {k: r.json()["spec"][k] for k in fields} == fields


# --- control topic ---------------------------------------------------------------------------


def test_start_and_stop_are_published_on_the_control_topic(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in range(3)]
    job_id = fleet.start(devices=3)
    topo = fleet.topology(job_id)

    fleet.client.post(f"{API}/jobs/{job_id}/stop", headers=ADMIN_H)

    (topic, started), (_, stopped) = fleet.published
    assert topic == "meshfl/v1/lab/control"
    assert started == {
        "job": job_id, "version": 1, "from_round": 1, "kind": "ring",
        "devices": topo["devices"], "edges": topo["edges"], "status": "running",
    }  # fmt: skip
    assert sorted(started["devices"]) == sorted(ids)
    assert stopped["status"] == "stopped" and stopped["version"] == 1


def test_each_agent_computes_the_assignments_row_of_w_from_the_control_message(
    fleet: Fleet,
) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in range(6)]
    fleet.start(devices=6, topology="random-regular", topology_degree=3)
    ((_, started),) = fleet.published

    assert "W" not in started  # the graph, not the N x N matrix
    for device in ids:
        message = decode_control(json.dumps(started).encode())
        pushed = TopologyVersion.from_control(message, device, "metropolis-hastings")
        polled = TopologyVersion.from_assignment(fleet.assignment(device).json())
        assert pushed == polled  # the same weights, to the last bit


def test_a_failing_publisher_never_fails_the_request() -> None:
    broken = Fleet(publish_fails=True)
    with broken.client:
        for k in range(2):
            broken.enrol(f"pi-{k}")
        job_id = broken.start(devices=2)
        stopped = broken.client.post(f"{API}/jobs/{job_id}/stop", headers=ADMIN_H)
    assert stopped.status_code == 200 and broken.published == []


# --- the operator CLI ------------------------------------------------------------------------


def test_job_start_sends_the_new_options_and_job_topology_prints_the_versions(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import meshfl.app.cli.job as job_cli
    from meshfl.app.cli import app
    from meshfl.app.local.admin import AdminClient

    def through_the_app(url: str, token: str) -> AdminClient:
        client = AdminClient(url, token)
        client._http = TestClient(  # an httpx.Client on the app itself
            fleet.client.app,
            base_url="http://testserver/api/v1",
            headers={"Authorization": f"Bearer {token}"},
        )
        return client

    monkeypatch.setattr(job_cli, "AdminClient", through_the_app)
    for k in range(4):
        fleet.enrol(f"pi-{k}")
    graph = tmp_path / "star.json"
    graph.write_text(json.dumps({"n": 4, "edges": [[0, 1], [0, 2], [0, 3]]}))
    runner, common = CliRunner(), ["--coordinator", "http://127.0.0.1:9", "--admin-token", "admin"]

    started = runner.invoke(app, ["job", "start", *common, "--topology", str(graph), "--plan",
                                  "--min-battery", "20", "--elastic", "--mode", "async",
                                  "--staleness", "3", "--quorum", "0.5", "--mixing",
                                  "max-degree", "--uplink-budget", "0.1", "--topology-seed",
                                  "5", "--input-dim", "8", "--no-follow"])  # fmt: skip
    job_id = started.output.split()[1]
    shown = runner.invoke(app, ["job", "topology", *common, job_id])

    spec = fleet.job(job_id)["spec"]
    assert started.exit_code == 0, started.output
    assert (spec["topology"], spec["custom_graph"]["n"]) == ("custom", 4)
    assert spec["name"].endswith("-star")
    assert {k: spec[k] for k in ("plan", "min_battery_percent", "elastic", "mode", "staleness",
                                 "quorum", "mixing", "uplink_budget_s", "topology_seed")} == {
        "plan": True, "min_battery_percent": 20.0, "elastic": True, "mode": "async",
        "staleness": 3, "quorum": 0.5, "mixing": "max-degree", "uplink_budget_s": 0.1,
        "topology_seed": 5,
    }  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert "custom topology, version 1 from round 1" in shown.output
    assert "devices 4, edges 3" in shown.output and "start" in shown.output


def test_job_start_refuses_an_unknown_topology_name(fleet: Fleet) -> None:
    from typer.testing import CliRunner

    from meshfl.app.cli import app

    r = CliRunner().invoke(
        app, ["job", "start", "--coordinator", "http://127.0.0.1:9", "--admin-token", "a",
              "--topology", "hypercube", "--no-follow"],
    )  # fmt: skip
    assert r.exit_code != 0 and "hypercube" in str(r.exception or r.output)


def test_training_that_fits_in_the_round_floor_is_not_cut(fleet: Fleet) -> None:
    # 4x slower, but 40 samples at 100 samples/s is 0.4 s: above the 0.1 s floor, so cut;
    # with 4 samples (0.04 s) the slow device holds nobody and keeps all its work.
    ids = [fleet.enrol(f"pi-{k}") for k in range(4)]
    fleet.put_profile(ids[0], {**FAST, "train_samples_per_s": 100.0, "train_samples": 40})
    for device in ids[1:]:
        fleet.put_profile(device, {**FAST, "train_samples": 40})
    job_id = fleet.start(plan=True)
    assert by_id(fleet.job(job_id))[ids[0]]["plan"]["work_fraction"] == pytest.approx(0.25)
    fleet.done(job_id, ids[0])
    for device in ids[1:]:
        fleet.done(job_id, device)

    for device in ids:
        fleet.put_profile(device, {**FAST, "train_samples": 4})
    fleet.put_profile(ids[0], {**FAST, "train_samples_per_s": 100.0, "train_samples": 4})
    second = fleet.start(plan=True)
    assert by_id(fleet.job(second))[ids[0]]["plan"]["work_fraction"] == 1.0


def test_per_device_reports_in_arrival_order(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in range(4)]
    for device in ids:
        fleet.put_profile(device, FAST)
    job_id = fleet.start()
    fleet.now += 2.0
    assert fleet.report(job_id, ids[1], 1, accuracy=0.25) == 204
    fleet.now += 1.0
    assert fleet.report(job_id, ids[0], 1, accuracy=0.75) == 204
    reply = fleet.client.get(f"{API}/jobs/{job_id}/reports", headers=ADMIN_H)
    assert reply.status_code == 200
    assert [(r["device_id"], r["round"], r["accuracy"], r["elapsed_s"]) for r in reply.json()] == [
        (ids[1], 1, 0.25, 2.0),
        (ids[0], 1, 0.75, 3.0),
    ]
    assert fleet.client.get(f"{API}/jobs/{job_id}/reports").status_code == 401
