"""Job control (issue 6): pause and resume, per-device metrics, device selection.

Over TestClient with an in-memory store, a hand-moved clock and the fake control
publisher of ``test_coordinator_plan.Fleet``. The agent side of a pause (``JobRunner``
waits and goes on) runs against this same coordinator through the REST client.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from test_coordinator_plan import ADMIN_H, API, Fleet, spec

from coordinator.db import Device
from edge_agent.job import JobRunner
from edge_agent.reporter import Reporter
from edge_agent.rest import CoordinatorClient

UNSIGNED = {"signed_deltas": False}  # these fake devices enrolled without identity keys


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    made = Fleet()
    with made.client:
        yield made


def started(fleet: Fleet, n: int, **overrides: Any) -> tuple[str, list[str]]:
    ids = [fleet.enrol(f"pi-{k}") for k in range(n)]
    return fleet.start(devices=n, **UNSIGNED, **overrides), ids


def post(fleet: Fleet, path: str) -> Any:
    return fleet.client.post(f"{API}{path}", headers=ADMIN_H)


def set_device(fleet: Fleet, device_id: str, **columns: Any) -> None:
    """Write device columns (tags, state) straight to the store."""
    app: Any = fleet.client.app
    with app.state.sessionmaker() as session:
        device = session.get(Device, device_id)
        for name, value in columns.items():
            setattr(device, name, value)
        session.commit()


# --- pause and resume ------------------------------------------------------------------------


def test_pause_and_resume_follow_their_transitions_and_refuse_the_others(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in range(3)]
    created = fleet.create(devices=3, **UNSIGNED).json()["job_id"]
    early = post(fleet, f"/jobs/{created}/pause")
    post(fleet, f"/jobs/{created}/start")
    for rnd in (1, 2, 3):
        for device in ids:
            fleet.report(created, device, rnd)

    paused = post(fleet, f"/jobs/{created}/pause")
    again = post(fleet, f"/jobs/{created}/pause")
    resumed = post(fleet, f"/jobs/{created}/resume")
    not_paused = post(fleet, f"/jobs/{created}/resume")

    assert early.status_code == 409 and "start it first" in early.json()["detail"]
    assert paused.status_code == 200
    assert (paused.json()["status"], paused.json()["pause_round"]) == ("paused", 5)
    assert again.status_code == 409 and "resume it" in again.json()["detail"]
    assert "\n" not in again.json()["detail"]
    assert resumed.status_code == 200
    assert (resumed.json()["status"], resumed.json()["pause_round"]) == ("running", None)
    assert not_paused.status_code == 409 and "not paused" in not_paused.json()["detail"]
    statuses = [(m["status"], m.get("pause_round")) for _, m in fleet.published]
    assert statuses == [("running", None), ("paused", 5), ("running", None)]


def test_stop_ends_a_paused_job_and_an_ended_job_neither_pauses_nor_resumes(
    fleet: Fleet,
) -> None:
    job_id, ids = started(fleet, 2)
    post(fleet, f"/jobs/{job_id}/pause")

    stopped = post(fleet, f"/jobs/{job_id}/stop")
    told = fleet.assignment(ids[0]).json()
    codes = [post(fleet, f"/jobs/{job_id}/{verb}").status_code for verb in ("pause", "resume")]

    assert stopped.status_code == 200 and stopped.json()["status"] == "stopped"
    assert told["status"] == "stopped" and "pause_round" not in told
    assert codes == [409, 409]
    assert fleet.published[-1][1]["status"] == "stopped"


def test_a_paused_assignment_names_the_round_held_back(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 2)
    fleet.report(job_id, ids[0], 1)
    post(fleet, f"/jobs/{job_id}/pause")

    held = fleet.assignment(ids[1]).json()
    post(fleet, f"/jobs/{job_id}/resume")
    going = fleet.assignment(ids[1]).json()

    assert (held["status"], held["pause_round"], held["job_id"]) == ("paused", 3, job_id)
    assert going["status"] == "running" and "pause_round" not in going


def test_nobody_is_evicted_while_paused_and_silence_counts_again_after_resume(
    fleet: Fleet,
) -> None:
    job_id, ids = started(fleet, 3)
    for rnd in (1, 2):
        for device in ids:
            fleet.report(job_id, device, rnd)
    post(fleet, f"/jobs/{job_id}/pause")
    for now in (1_100.0, 1_200.0, 1_300.0):  # pi-0 and pi-1 wait and poll; pi-2 went quiet
        fleet.now = now
        fleet.assignment(ids[0])
        fleet.assignment(ids[1])
    during = fleet.job(job_id)

    post(fleet, f"/jobs/{job_id}/resume")  # at 1300: every clock restarts
    fleet.now = 1_330.0
    fleet.report(job_id, ids[0], 3)
    fleet.report(job_id, ids[1], 3)
    kept = fleet.topology(job_id)["version"]
    fleet.now = 1_361.0  # pi-2 silent for 61 s since the resume, while the others report
    fleet.report(job_id, ids[0], 4)
    topo = fleet.topology(job_id)

    assert during["status"] == "paused" and all(not d["done"] for d in during["devices"])
    assert kept == 1
    assert topo["version"] == 2 and topo["devices"] == ids[:2]
    assert topo["events"][-1]["reason"] == "silent for 61 s"


def test_a_paused_jobs_devices_are_busy_and_it_completes_when_all_are_done(
    fleet: Fleet,
) -> None:
    job_id, ids = started(fleet, 2, rounds=2)
    for device in ids:
        fleet.report(job_id, device, 2)
    post(fleet, f"/jobs/{job_id}/pause")  # pause_round 4 > rounds: the devices finish
    other = fleet.create(devices=2, **UNSIGNED).json()["job_id"]
    refused = post(fleet, f"/jobs/{other}/start")
    for device in ids:
        fleet.done(job_id, device)

    assert refused.status_code == 409 and "0 live, idle" in refused.json()["detail"]
    assert fleet.job(job_id)["status"] == "completed"


# --- the agent waits while paused ------------------------------------------------------------


def _runner(fleet: Fleet, device_id: str, job_id: str) -> tuple[JobRunner, Reporter]:
    """A JobRunner and its Reporter talking to ``fleet``'s coordinator over REST."""
    transport: Any = fleet.client._transport  # the TestClient's in-process ASGI transport
    client = CoordinatorClient("http://testserver", transport=transport, retry_s=1.0)
    client.device_token = fleet.headers[device_id]["Authorization"].removeprefix("Bearer ")
    assignment = fleet.assignment(device_id).json()
    config = SimpleNamespace(poll_s=0.05)
    runner = JobRunner(config, client, None, device_id, assignment)  # type: ignore[arg-type]
    runner.versions, runner.plan = {}, assignment["plan"]
    return runner, Reporter(client, device_id, job_id, poll_s=0.05)


def _hold_in_thread(runner: JobRunner, reporter: Reporter, rnd: int) -> tuple[Any, list[bool]]:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(runner._hold(reporter, rnd)))
    thread.start()
    return thread, result


def test_the_agent_waits_before_the_paused_round_and_goes_on_when_resumed(
    fleet: Fleet,
) -> None:
    job_id, ids = started(fleet, 2)
    fleet.report(job_id, ids[0], 1)
    post(fleet, f"/jobs/{job_id}/pause")  # pause_round 3
    runner, reporter = _runner(fleet, ids[0], job_id)
    try:
        assert reporter.wait_for_poll(5.0)
        before = runner._hold(reporter, 2)  # round 2 is before the pause: no wait
        thread, result = _hold_in_thread(runner, reporter, 3)
        for _ in range(3):  # it keeps waiting through several polls
            assert reporter.wait_for_poll(5.0)
        waiting = thread.is_alive()
        post(fleet, f"/jobs/{job_id}/resume")
        thread.join(5.0)
    finally:
        reporter.close()

    assert before is False
    assert waiting and not thread.is_alive()
    assert result == [False]  # resumed, not stopped


def test_the_agent_stops_when_a_paused_job_is_stopped(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 2)
    post(fleet, f"/jobs/{job_id}/pause")  # pause_round 2
    runner, reporter = _runner(fleet, ids[1], job_id)
    try:
        assert reporter.wait_for_poll(5.0)
        thread, result = _hold_in_thread(runner, reporter, 2)
        assert reporter.wait_for_poll(5.0)
        waiting = thread.is_alive()
        post(fleet, f"/jobs/{job_id}/stop")
        thread.join(5.0)
    finally:
        reporter.close()

    assert waiting and result == [True]


# --- per-device metrics ----------------------------------------------------------------------


def test_per_device_totals_and_paged_round_reports(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 2)
    for rnd in (1, 2, 3):
        fleet.report(job_id, ids[0], rnd, accuracy=0.1 * rnd, bytes_sent=100)
    fleet.report(job_id, ids[1], 1, accuracy=0.4, missing=(ids[0],))
    fleet.done(job_id, ids[1])

    totals = fleet.client.get(f"{API}/jobs/{job_id}/devices", headers=ADMIN_H).json()
    url = f"{API}/jobs/{job_id}/devices/{ids[0]}/metrics"
    page = fleet.client.get(url, params={"limit": 2, "offset": 1}, headers=ADMIN_H)
    other = fleet.client.get(f"{API}/jobs/{job_id}/devices/{ids[1]}/metrics", headers=ADMIN_H)
    stranger = fleet.enrol("stranger")
    absent = fleet.client.get(f"{API}/jobs/{job_id}/devices/{stranger}/metrics", headers=ADMIN_H)
    as_device = fleet.client.get(f"{API}/jobs/{job_id}/devices", headers=fleet.headers[ids[0]])

    first, second = totals
    assert (first["device_id"], first["name"], second["name"]) == (ids[0], "pi-0", "pi-1")
    assert (first["latest_round"], first["latest_accuracy"]) == (3, pytest.approx(0.3))
    assert (first["rounds_reported"], first["bytes_sent"], first["bytes_received"]) == (
        3,
        300,
        60,
    )
    assert (first["done"], first["final_accuracy"], first["epsilon_spent"]) == (False, None, None)
    assert second["done"] and second["final_accuracy"] == 0.9
    assert (second["bytes_sent"], second["bytes_received"]) == (1, 2)  # its done report's
    assert (second["joined_round"], second["left_round"]) == (1, None)
    assert page.headers["X-Total-Count"] == "3"
    assert [m["round"] for m in page.json()] == [2, 3]
    assert page.json()[0]["accuracy"] == pytest.approx(0.2)
    assert page.json()[0]["received_at"] == 1_000.0 and "sketch" not in page.json()[0]
    assert other.json()[0]["missing"] == [ids[0]]
    assert absent.status_code == 404 and "does not take part" in absent.json()["detail"]
    assert as_device.status_code == 403


# --- device selection ------------------------------------------------------------------------


def test_a_job_starts_only_on_active_devices_matching_its_selector(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}", {"cores": 2 + 2 * k}) for k in range(5)]  # 2,4,6,8,10
    for device in ids[1:]:
        set_device(fleet, device, tags=["lab", "gpu"] if device != ids[2] else ["lab"])
    set_device(fleet, ids[4], state="draining")  # matches, but takes no new work
    select = {"tags": ["gpu"], "min_cores": 4}

    job_id = fleet.start(devices=2, select=select, **UNSIGNED)
    chosen = fleet.topology(job_id)["devices"]
    too_many = fleet.create(devices=3, select=select, **UNSIGNED).json()["job_id"]
    refused = post(fleet, f"/jobs/{too_many}/start")

    assert chosen == [ids[1], ids[3]]
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert "needs 3 device(s) but 0 live, idle, active device(s) match its selector" in detail
    assert "tags [gpu], min_cores 4" in detail


def test_capability_minimums_need_the_field_reported(fleet: Fleet) -> None:
    fast = fleet.enrol("fast", {"train_samples_per_s": 900.0, "memory_bytes": 8 << 30})
    fleet.enrol("slow", {"train_samples_per_s": 90.0, "memory_bytes": 8 << 30})
    fleet.enrol("unmeasured")
    select = {"min_train_samples_per_s": 100.0, "min_memory_bytes": 4 << 30}

    job_id = fleet.start(devices=0, select=select, **UNSIGNED)

    assert fleet.topology(job_id)["devices"] == [fast]


def test_an_elastic_job_admits_only_matching_active_devices(fleet: Fleet) -> None:
    ids = [fleet.enrol(f"pi-{k}") for k in range(2)]
    for device in ids:
        set_device(fleet, device, tags=["lab"])
    job_id = fleet.start(devices=2, select={"tags": ["lab"]}, elastic=True, **UNSIGNED)
    outsider = fleet.enrol("outsider")
    drained = fleet.enrol("drained")
    set_device(fleet, drained, tags=["lab"], state="draining")
    member = fleet.enrol("member")
    set_device(fleet, member, tags=["lab"])

    replies = [fleet.assignment(d).status_code for d in (outsider, drained, member)]

    assert replies == [204, 204, 200]
    assert fleet.topology(job_id)["devices"] == [*ids, member]


BAD_SELECTORS: list[tuple[dict[str, Any], str]] = [
    ({"tags": ["no spaces"]}, "spec.select.tags"),
    ({"tags": [f"t{k}" for k in range(33)]}, "spec.select.tags"),
    ({"min_cores": -1}, "spec.select.min_cores"),
    ({"min_cores": 2.5}, "min_cores"),
    ({"min_memory_bytes": 2**60}, "spec.select.min_memory_bytes"),
    ({"min_uplink_bytes_per_s": -0.5}, "spec.select.min_uplink_bytes_per_s"),
    ({"tags": "gpu"}, "select.tags"),
]


def test_bad_selectors_are_422_naming_the_field(fleet: Fleet) -> None:
    for select, field in BAD_SELECTORS:
        reply = fleet.client.post(f"{API}/jobs", json=spec(select=select), headers=ADMIN_H)

        assert reply.status_code == 422, select
        assert field in reply.json()["detail"], select
