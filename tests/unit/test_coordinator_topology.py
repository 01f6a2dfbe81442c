"""The fleet topology resource, readiness and Prometheus metrics (issue 6).

Graphs, W and spectral gaps are checked against :mod:`meshfl.topology`'s own builders and
functions; ``/metrics`` is parsed with prometheus-client's parser.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from postgres import PG_URL, postgres_or_fail
from prometheus_client.parser import text_string_to_metric_families
from test_coordinator_plan import ADMIN_H, API, Fleet, spec
from test_coordinator_store import TestClient

from coordinator import CoordinatorSettings, create_app, migrate
from coordinator.db import Device, make_engine
from meshfl.topology import Graph, build_graph, mixing_matrix, ring, spectral_gap

UNSIGNED = {"signed_deltas": False}  # these fake devices enrolled without identity keys


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    made = Fleet()
    with made.client:
        yield made


def set_device(fleet: Fleet, device_id: str, **columns: Any) -> None:
    app: Any = fleet.client.app
    with app.state.sessionmaker() as session:
        device = session.get(Device, device_id)
        for name, value in columns.items():
            setattr(device, name, value)
        session.commit()


def get(fleet: Fleet) -> dict[str, Any]:
    reply = fleet.client.get(f"{API}/topology", headers=ADMIN_H)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def put(fleet: Fleet, body: dict[str, Any], headers: dict[str, str] = ADMIN_H) -> Any:
    return fleet.client.put(f"{API}/topology", json=body, headers=headers)


def assert_graph(view: dict[str, Any], ids: list[str], graph: Graph, rule: str) -> None:
    """The view's nodes, edges, weights and gap are ``graph``'s under ``rule``."""
    w = mixing_matrix(graph, rule)
    assert [n["device_id"] for n in view["nodes"]] == ids
    assert [n["self_weight"] for n in view["nodes"]] == pytest.approx(np.diag(w).tolist())
    edges = {(ids.index(e["source"]), ids.index(e["target"])): e["weight"] for e in view["edges"]}
    assert set(edges) == set(graph.edges)
    for (i, j), weight in edges.items():
        assert weight == pytest.approx(w[i, j])
    assert view["spectral_gap"] == pytest.approx(spectral_gap(w))
    assert view["error"] is None


# --- the fleet topology ----------------------------------------------------------------------


def test_the_default_is_a_ring_over_the_live_active_devices_by_name(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in (3, 0, 4, 1, 2)]
    by_name = [ids[1], ids[3], ids[4], ids[0], ids[2]]
    drained, revoked = fleet.enrol("pi-9"), fleet.enrol("pi-8")
    set_device(fleet, drained, state="draining")
    set_device(fleet, revoked, state="revoked")
    server = fleet.enrol("server", {"role": "inference"})
    fleet.now = 1_020.0  # everyone enrolled at 1000; only these polled since
    for device in [*ids, drained, revoked, server]:
        set_device(fleet, device, last_seen=1_020.0)
    offline = fleet.enrol("pi-5")
    set_device(fleet, offline, last_seen=1_004.0)  # 16 s ago: live_within_s is 15

    view = get(fleet)

    assert (view["setting"], view["updated_at"]) == ({"topology": "ring"}, None)
    assert_graph(view, by_name, ring(5), "metropolis-hastings")
    assert [n["name"] for n in view["nodes"]] == [f"pi-{k}" for k in range(5)]


def test_a_set_kind_and_parameters_give_their_graph_and_gap(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in range(6)]
    fleet.now = 1_005.0
    body = {"topology": "random-regular", "topology_degree": 3, "topology_seed": 11,
            "mixing": "max-degree"}  # fmt: skip

    reply = put(fleet, body)
    view = get(fleet)

    assert reply.status_code == 200 and reply.json() == view
    assert (view["setting"], view["updated_at"]) == (body, 1_005.0)
    graph = build_graph("random-regular", 6, degree=3, seed=11)
    assert_graph(view, ids, graph, "max-degree")


def test_a_custom_graph_fits_only_its_own_fleet_size(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in range(3)]
    path = {"n": 3, "edges": [[0, 1], [1, 2]]}

    put(fleet, {"topology": "custom", "custom_graph": path})
    fits = get(fleet)
    fleet.enrol("pi-3")
    too_many = get(fleet)

    assert_graph(fits, ids, Graph(3, frozenset({(0, 1), (1, 2)})), "metropolis-hastings")
    assert too_many["nodes"] == [] and too_many["spectral_gap"] is None
    assert "cannot be built for 4 devices" in too_many["error"]
    assert "3 nodes" in too_many["error"]


def test_a_kind_that_cannot_be_built_or_connects_nobody_says_why(fleet: Fleet) -> None:
    nobody = get(fleet)
    for k in range(5):
        fleet.enrol(f"pi-{k}")
    put(fleet, {"topology": "random-regular", "topology_degree": 3})  # 5 × 3 is odd
    odd = get(fleet)
    put(fleet, {"topology": "erdos-renyi", "topology_probability": 0.0})
    apart = get(fleet)

    assert nobody["error"].startswith("no live, active device")
    assert odd["edges"] == [] and "random-regular" in odd["error"]
    assert apart["nodes"] == [] and apart["spectral_gap"] is None
    assert "disconnected" in apart["error"]  # the builder's own reason


def test_bad_settings_are_422_naming_the_field(fleet: Fleet) -> None:
    cases = [
        ({"topology": "hypercube"}, "topology = 'hypercube'"),
        ({"topology": "ring", "topology_degree": 0}, "topology_degree = 0"),
        ({"topology": "erdos-renyi", "topology_probability": 1.5}, "topology_probability"),
        ({"topology": "ring", "topology_seed": -1}, "topology_seed"),
        ({"topology": "ring", "mixing": "uniform"}, "mixing"),
        ({"topology": "custom"}, "needs custom_graph"),
        ({"topology": "ring", "custom_graph": {"n": 2, "edges": [[0, 1]]}}, "custom_graph is"),
        ({"topology": "custom", "custom_graph": {"n": 2, "edges": [[0, 5]]}}, "custom_graph"),
        ({}, "topology"),
    ]
    for body, words in cases:
        reply = put(fleet, body)

        assert reply.status_code == 422, body
        assert words in reply.json()["detail"], (body, reply.json()["detail"])
    assert get(fleet)["setting"] == {"topology": "ring"}  # nothing stored


def test_reading_needs_any_role_and_setting_an_operator(fleet: Fleet) -> None:
    created = fleet.client.post(f"{API}/tokens", json={"role": "read-only"}, headers=ADMIN_H)
    reader = {"Authorization": f"Bearer {created.json()['token']}"}
    device = fleet.enrol("pi-0")

    read = fleet.client.get(f"{API}/topology", headers=reader)
    written = put(fleet, {"topology": "star"}, headers=reader)
    by_device = fleet.client.get(f"{API}/topology", headers=fleet.headers[device])
    anonymous = fleet.client.get(f"{API}/topology")

    assert read.status_code == 200
    assert (written.status_code, by_device.status_code, anonymous.status_code) == (403, 403, 401)


def test_jobs_without_a_topology_take_the_fleet_default(fleet: Fleet) -> None:
    for k in range(6):
        fleet.enrol(f"pi-{k}")
    put(fleet, {"topology": "random-regular", "topology_degree": 3, "topology_seed": 4})
    bare = spec(devices=6, **UNSIGNED)
    del bare["topology"]
    own_seed = {**bare, "topology_seed": 9}

    inherited = fleet.client.post(f"{API}/jobs", json=bare, headers=ADMIN_H).json()
    seeded = fleet.client.post(f"{API}/jobs", json=own_seed, headers=ADMIN_H).json()
    explicit = fleet.create(devices=6, **UNSIGNED).json()  # names "ring"
    fleet.client.post(f"{API}/jobs/{inherited['job_id']}/start", headers=ADMIN_H)
    topo = fleet.topology(inherited["job_id"])

    assert inherited["spec"]["topology"] == "random-regular"
    assert (inherited["spec"]["topology_degree"], inherited["spec"]["topology_seed"]) == (3, 4)
    assert (seeded["spec"]["topology_degree"], seeded["spec"]["topology_seed"]) == (3, 9)
    assert explicit["spec"]["topology"] == "ring" and "topology_degree" not in explicit["spec"]
    graph = build_graph("random-regular", 6, degree=3, seed=4)
    assert topo["kind"] == "random-regular"
    assert topo["spectral_gap"] == pytest.approx(spectral_gap(mixing_matrix(graph)))
    assert {tuple(e) for e in topo["edges"]} == set(graph.edges)


# --- readiness -------------------------------------------------------------------------------


def test_readyz_is_200_when_migrated_and_503_problem_details_otherwise(
    fleet: Fleet, tmp_path: Path
) -> None:
    app: Any = fleet.client.app
    ready = fleet.client.get("/readyz")
    app.state.engine = make_engine(f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
    unreachable = fleet.client.get("/readyz")
    behind = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrate.upgrade(behind, "0006")
    app.state.engine = behind
    old = fleet.client.get("/readyz")
    healthy = fleet.client.get("/healthz")

    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert unreachable.status_code == 503
    assert unreachable.headers["content-type"].startswith("application/problem+json")
    problem = unreachable.json()
    assert (problem["status"], problem["title"], problem["instance"]) == (
        503,
        "Service Unavailable",
        "/readyz",
    )
    assert "not reachable" in problem["detail"] and "\n" not in problem["detail"]
    assert old.status_code == 503 and "at revision 0006" in old.json()["detail"]
    assert healthy.status_code == 200  # liveness does not depend on the database


# --- Prometheus metrics ----------------------------------------------------------------------


def scrape(fleet: Fleet, headers: dict[str, str] = ADMIN_H) -> dict[str, Any]:
    reply = fleet.client.get("/metrics", headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(reply.text)}


def value(family: Any, suffix: str = "", **labels: str) -> float:
    found = [
        s.value
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (family.name, labels, family.samples)
    return float(found[0])


def test_metrics_count_requests_by_route_template_and_status(fleet: Fleet) -> None:
    for _ in range(3):
        fleet.client.get(f"{API}/jobs", headers=ADMIN_H)
    fleet.client.get(f"{API}/jobs/job-nope", headers=ADMIN_H)
    fleet.client.get(f"{API}/jobs/job-nope/rounds", headers=ADMIN_H)
    fleet.client.get("/no/such/path")

    families = scrape(fleet)
    again = scrape(fleet)

    requests = families["meshfl_http_requests"]
    assert requests.type == "counter"
    assert value(requests, "_total", route="/api/v1/jobs", method="GET", status="200") == 3
    assert value(requests, "_total", route="/api/v1/jobs/{job_id}", status="404") == 1
    assert value(requests, "_total", route="/api/v1/jobs/{job_id}/rounds", status="404") == 1
    assert value(requests, "_total", route="unmatched", status="404") == 1
    duration = families["meshfl_http_request_duration_seconds"]
    assert duration.type == "histogram"
    assert value(duration, "_count", route="/api/v1/jobs", method="GET") == 3
    assert value(again["meshfl_http_requests"], "_total", route="/metrics", status="200") == 1


def test_metrics_gauge_devices_by_state_and_online_and_jobs_by_status(fleet: Fleet) -> None:
    a, b, _ = (fleet.enrol(name) for name in ("a", "b", "c"))
    fleet.now = 1_020.0  # enrolled at 1000; live_within_s is 15
    fleet.assignment(a)  # heard from now
    set_device(fleet, b, state="draining")
    fleet.create(devices=1, **UNSIGNED)

    families = scrape(fleet)

    devices, jobs = families["meshfl_devices"], families["meshfl_jobs"]
    assert value(devices, state="active", online="true") == 1
    assert value(devices, state="active", online="false") == 1  # c
    assert value(devices, state="draining", online="false") == 1
    assert value(devices, state="revoked", online="false") == 0
    assert value(jobs, status="created") == 1 and value(jobs, status="paused") == 0
    assert value(families["meshfl_store_up"]) == 1


def test_metrics_need_a_token_unless_public() -> None:
    private, public = Fleet(), Fleet(metrics_public=True)
    with private.client, public.client:
        device = private.enrol("pi-0")
        anonymous = private.client.get("/metrics")
        by_device = private.client.get("/metrics", headers=private.headers[device])
        scraped = public.client.get("/metrics")

    assert anonymous.status_code == 401 and by_device.status_code == 403
    assert scraped.status_code == 200 and "meshfl_jobs" in scraped.text


def test_two_apps_in_one_process_keep_their_own_counts() -> None:
    first, second = Fleet(), Fleet()
    with first.client, second.client:
        first.client.get(f"{API}/jobs", headers=ADMIN_H)
        first_jobs = scrape(first)["meshfl_http_requests"]
        second_jobs = scrape(second)["meshfl_http_requests"]

    assert value(first_jobs, "_total", route="/api/v1/jobs") == 1
    assert not [s for s in second_jobs.samples if s.labels.get("route") == "/api/v1/jobs"]


# --- PostgreSQL ------------------------------------------------------------------------------


def fleet_on(db_url: str) -> Fleet:
    """A :class:`Fleet` (same helpers, clock and publisher) whose store is ``db_url``."""
    fleet = object.__new__(Fleet)
    fleet.now, fleet.published, fleet.publish_fails, fleet.headers = 1_000.0, [], False, {}
    config = CoordinatorSettings(db_url=db_url, fleet="lab", enrol_token="enrol",
                                 admin_token="admin")  # fmt: skip
    fleet.client = TestClient(create_app(config, fleet._publish, clock=lambda: fleet.now))
    return fleet


def test_pause_topology_readiness_and_metrics_on_postgresql() -> None:
    postgres_or_fail()
    schema = f"meshfl_test_{secrets.token_hex(4)}"
    admin = make_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        fleet = fleet_on(f"{PG_URL}?options=-csearch_path%3D{schema}")
        with fleet.client:
            ids = [fleet.enrol(f"pi-{k}") for k in range(4)]
            put(fleet, {"topology": "complete"})
            body = spec(devices=4, **UNSIGNED)
            del body["topology"]
            job_id = fleet.client.post(f"{API}/jobs", json=body, headers=ADMIN_H).json()["job_id"]
            fleet.client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H)
            fleet.report(job_id, ids[0], 1)
            paused = fleet.client.post(f"{API}/jobs/{job_id}/pause", headers=ADMIN_H).json()
            ready = fleet.client.get("/readyz")
            families = scrape(fleet)
            view = get(fleet)
            topo = fleet.topology(job_id)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()

    assert (paused["status"], paused["pause_round"]) == ("paused", 3)
    assert ready.status_code == 200
    assert value(families["meshfl_jobs"], status="paused") == 1
    assert value(families["meshfl_devices"], state="active", online="true") == 4
    assert topo["kind"] == "complete" and topo["spectral_gap"] == pytest.approx(1.0)
    assert view["spectral_gap"] == pytest.approx(1.0) and len(view["edges"]) == 6


def test_the_openapi_documents_the_new_routes(fleet: Fleet) -> None:
    paths = fleet.client.get("/openapi.json").json()["paths"]

    for path in ("/readyz", "/metrics", f"{API}/topology", f"{API}/jobs/{{job_id}}/pause",
                 f"{API}/jobs/{{job_id}}/resume", f"{API}/jobs/{{job_id}}/devices",
                 f"{API}/jobs/{{job_id}}/devices/{{device_id}}/metrics"):  # fmt: skip
        assert path in paths, path
    assert "503" in paths["/readyz"]["get"]["responses"]
    assert {"401", "403"} <= set(paths["/metrics"]["get"]["responses"])
    assert "409" in paths[f"{API}/jobs/{{job_id}}/pause"]["post"]["responses"]
