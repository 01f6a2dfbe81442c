"""Churn in the coordinator: departures (silence, evidence, battery), joins, versions.

Each change is a new topology version from ``from_round`` = last reported round + 2,
visible over REST and pushed on the control topic (the fake publisher of ``Fleet``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_coordinator_plan import ADMIN_H, API, Fleet, by_id

from coordinator.churn import MISSED_BY_ALL, REJOINED
from meshfl.topology import exponential, metropolis_hastings


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    made = Fleet(departure_check_s=0)  # the rules on every request, as the clock is by hand
    with made.client:
        yield made


def started(fleet: Fleet, n: int, **overrides: Any) -> tuple[str, list[str]]:
    """A running job on devices pi-0..pi-{n-1}; positions follow the names."""
    ids = [fleet.enrol(f"pi-{k}") for k in range(n)]
    return fleet.start(devices=n, **overrides), ids


def all_report(fleet: Fleet, job_id: str, ids: list[str], rnd: int) -> None:
    for device in ids:
        assert fleet.report(job_id, device, rnd) == 204


# --- departure by silence --------------------------------------------------------------------


def test_a_silent_device_leaves_and_the_graph_is_replanned(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 3)
    for rnd in (1, 2):
        all_report(fleet, job_id, ids, rnd)
    fleet.now = 1_030.0
    all_report(fleet, job_id, ids[:2], 3)
    fleet.now = 1_061.0  # pi-2 silent for 61 s while pi-0 reports
    fleet.report(job_id, ids[0], 4)

    topo = fleet.topology(job_id)
    job = by_id(fleet.job(job_id))
    fleet.done(job_id, ids[2])  # its agent saw v2 on the control topic and stopped
    gone = fleet.assignment(ids[2]).json()
    stays = fleet.assignment(ids[1]).json()
    leave = topo["events"][-1]
    assert (topo["version"], topo["from_round"], topo["devices"]) == (2, 6, ids[:2])
    assert topo["edges"] == [[0, 1]]
    assert leave == {"version": 2, "from_round": 6, "kind": "leave", "device_id": ids[2],
                     "reason": "silent for 61 s", "at": 1_061.0}  # fmt: skip
    assert job[ids[2]]["left_round"] == 6 and job[ids[2]]["done"]
    assert job[ids[2]]["error"] == "left at round 6: silent for 61 s"
    assert job[ids[1]]["left_round"] is None and job[ids[1]]["joined_round"] == 1
    assert (gone["position"], gone["neighbours"], gone["self_weight"]) == (-1, [], 1.0)
    assert (gone["status"], gone["topology_version"], gone["index"]) == ("running", 2, 2)
    assert (stays["position"], stays["index"], stays["from_round"]) == (1, 1, 6)
    assert [n["device_id"] for n in stays["neighbours"]] == [ids[0]]
    assert [(m["version"], len(m["devices"])) for _, m in fleet.published] == [(1, 3), (2, 2)]


def test_polling_keeps_a_device_in_and_a_fleet_silent_together_stays(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 3)
    all_report(fleet, job_id, ids, 1)
    fleet.now = 1_040.0
    for device in ids[1:]:
        fleet.assignment(device)  # alive: they ask for their assignment between rounds
    fleet.now = 1_070.0
    fleet.report(job_id, ids[0], 2)
    fleet.report(job_id, ids[1], 2)
    fleet.now = 5_000.0  # everyone silent (a coordinator outage): nobody is removed
    fleet.assignment(ids[0])

    assert fleet.topology(job_id)["version"] == 1


def test_a_report_after_leaving_is_ignored(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 3)
    all_report(fleet, job_id, ids, 1)
    fleet.now = 1_030.0
    all_report(fleet, job_id, ids[:2], 2)
    fleet.now = 1_061.0
    fleet.report(job_id, ids[0], 3)  # pi-2 leaves from round 5
    late = [fleet.report(job_id, ids[2], rnd) for rnd in (2, 5)]

    rounds = fleet.client.get(f"{API}/jobs/{job_id}/rounds", headers=ADMIN_H).json()
    assert late == [204, 204]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert rounds[1]["devices_reporting"] == 3  # round 2 was before it left
    assert rounds[2]["missing_devices"] == [ids[1], ids[2]]


def test_the_job_completes_when_the_rest_finish_after_a_departure(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 3)
    all_report(fleet, job_id, ids, 1)
    fleet.now = 1_030.0
    all_report(fleet, job_id, ids[:2], 2)
    fleet.now = 1_061.0
    fleet.report(job_id, ids[0], 3)
    fleet.report(job_id, ids[1], 3)
    fleet.done(job_id, ids[0])
    fleet.done(job_id, ids[1])

    job = fleet.job(job_id)
    assert job["status"] == "completed" and job["finished_at"] == 1_061.0
    assert fleet.published[-1][1]["status"] == "completed"


# --- departure by evidence (a killed agent) --------------------------------------------------


def test_a_device_missed_by_every_neighbour_twice_leaves_fast(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 4)  # a ring: pi-2's neighbours are pi-1 and pi-3
    all_report(fleet, job_id, ids, 1)
    fleet.now = 1_002.0
    fleet.report(job_id, ids[0], 2)
    for device in (ids[1], ids[3]):
        fleet.report(job_id, device, 2, missing=(ids[2],))
    fleet.now = 1_004.0
    fleet.report(job_id, ids[1], 3, missing=(ids[2],))
    one_neighbour_so_far = fleet.topology(job_id)["version"]
    fleet.report(job_id, ids[3], 3, missing=(ids[2],))

    topo = fleet.topology(job_id)
    assert one_neighbour_so_far == 1
    assert topo["version"] == 2 and ids[2] not in topo["devices"]
    assert topo["events"][-1]["reason"] == MISSED_BY_ALL
    assert topo["from_round"] == 5 and len(topo["edges"]) == 3  # the ring on 3 devices


def test_two_adjacent_dead_devices_are_each_judged_by_their_live_neighbours(
    fleet: Fleet,
) -> None:
    job_id, ids = started(fleet, 6)  # a ring: pi-2 and pi-3 die; pi-1 and pi-4 miss them
    all_report(fleet, job_id, ids, 1)
    live = [ids[0], ids[1], ids[4], ids[5]]
    for rnd, now in ((2, 1_002.0), (3, 1_004.0)):
        fleet.now = now
        fleet.report(job_id, ids[1], rnd, missing=(ids[2],))
        fleet.report(job_id, ids[4], rnd, missing=(ids[3],))
        for device in (ids[0], ids[5]):
            fleet.report(job_id, device, rnd)
    fleet.job(job_id)

    topo = fleet.topology(job_id)
    assert topo["devices"] == live  # 4 s after their last word, not depart_after_s (60 s)
    assert {e["device_id"]: e["reason"] for e in topo["events"][1:]} == {
        ids[2]: MISSED_BY_ALL,
        ids[3]: MISSED_BY_ALL,
    }


def test_the_departure_rules_run_at_most_once_per_check_period() -> None:
    throttled = Fleet(departure_check_s=1.0)
    with throttled.client:
        job_id, ids = started(throttled, 4)
        all_report(throttled, job_id, ids, 1)
        throttled.now = 1_002.0
        throttled.report(job_id, ids[0], 2)  # the rules ran: pi-2 is not missed by all yet
        for device in (ids[1], ids[3]):
            throttled.report(job_id, device, 2, missing=(ids[2],))
        throttled.now = 1_002.5
        throttled.report(job_id, ids[1], 3, missing=(ids[2],))
        throttled.report(job_id, ids[3], 3, missing=(ids[2],))
        within_the_period = throttled.topology(job_id)["version"]
        throttled.now = 1_003.0
        throttled.job(job_id)

        assert within_the_period == 1  # the evidence is complete, the rules not yet due
        topo = throttled.topology(job_id)
        assert topo["version"] == 2 and ids[2] not in topo["devices"]


def test_evidence_waits_for_silence_and_for_a_slow_devices_rounds(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 4)
    for device in ids:
        fleet.report(job_id, device, 1, round_s=5.0 if device == ids[2] else 0.2)
    for rnd in (2, 3):
        for device in (ids[1], ids[3]):
            fleet.report(job_id, device, rnd, missing=(ids[2],))
    fleet.now = 1_004.0  # silent 4 s > 1.5 s, but its rounds take 5 s: wait 10 s
    fleet.job(job_id)
    waited = fleet.topology(job_id)["version"]
    fleet.now = 1_011.0
    fleet.job(job_id)

    assert waited == 1
    assert fleet.topology(job_id)["events"][-1]["device_id"] == ids[2]


# --- departure by battery --------------------------------------------------------------------


def test_a_participant_below_the_battery_threshold_leaves(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 3, min_battery_percent=20.0)
    fleet.put_profile(ids[1], {"battery_percent": 50.0, "charging": False})
    fleet.put_profile(ids[1], {"battery_percent": 12.0, "charging": True})
    still = fleet.topology(job_id)["version"]

    r = fleet.put_profile(ids[1], {"battery_percent": 12.0, "charging": False})

    topo = fleet.topology(job_id)
    assert r.status_code == 200 and still == 1
    assert topo["version"] == 2 and topo["devices"] == [ids[0], ids[2]]
    assert topo["events"][-1]["reason"] == "battery 12% < 20%, not charging"
    assert fleet.published[-1][1]["version"] == 2


def test_when_the_last_device_leaves_the_job_stops(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 1, min_battery_percent=20.0)

    fleet.put_profile(ids[0], {"battery_percent": 5.0, "charging": False})

    job, topo = fleet.job(job_id), fleet.topology(job_id)
    assert job["status"] == "stopped" and job["finished_at"] == 1_000.0
    assert topo["devices"] == [ids[0]] and topo["events"][-1]["kind"] == "leave"
    assert fleet.published[-1][1]["status"] == "stopped"


# --- joins -----------------------------------------------------------------------------------


def test_an_idle_device_joins_an_elastic_job_at_a_round_boundary(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 3, elastic=True)
    for rnd in (1, 2, 3):
        all_report(fleet, job_id, ids, rnd)
    late = fleet.enrol("pi-late")

    joined = fleet.assignment(late)
    again = fleet.assignment(late).json()

    a = joined.json()
    topo = fleet.topology(job_id)
    job = by_id(fleet.job(job_id))
    w = np.array(topo["mixing_matrix"])
    assert joined.status_code == 200 and a["job_id"] == job_id
    assert (a["start_round"], a["from_round"], a["topology_version"]) == (5, 5, 2)
    assert (a["position"], a["index"], a["devices"]) == (3, 3, [*ids, late])
    assert sorted(n["device_id"] for n in a["neighbours"]) == sorted(ids[:2])
    assert a["self_weight"] == pytest.approx(w[3, 3])
    assert again["topology_version"] == 2 and len(topo["devices"]) == 4
    assert topo["events"][-1] == {"version": 2, "from_round": 5, "kind": "join",
                                  "device_id": late, "reason": "joined", "at": 1_000.0}  # fmt: skip
    assert (job[late]["joined_round"], job[late]["missing_rounds"]) == (5, [])
    assert fleet.published[-1][1]["devices"] == [*ids, late]


def test_no_join_without_elastic_near_the_end_or_on_low_battery(fleet: Fleet) -> None:
    plain, plain_ids = started(fleet, 2)
    ending, ending_ids = started(fleet, 2, elastic=True, rounds=4)  # the latest started
    for rnd in (1, 2, 3):
        all_report(fleet, ending, ending_ids, rnd)  # a join would apply from round 5 > 4
    late = fleet.enrol("pi-late")
    low = fleet.enrol("pi-low", {"battery_percent": 10.0, "charging": False})
    battery_job, _ = started(fleet, 1, elastic=True, min_battery_percent=20.0)

    statuses = [fleet.assignment(late).status_code, fleet.assignment(low).status_code]

    assert statuses[1] == 204
    assert statuses[0] == 200  # it joined the battery-rule job, the only one that fits
    assert fleet.topology(plain)["version"] == fleet.topology(ending)["version"] == 1
    assert late in fleet.topology(battery_job)["devices"] and plain_ids


def test_a_device_that_left_does_not_rejoin(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 2, elastic=True, min_battery_percent=20.0)
    fleet.put_profile(ids[1], {"battery_percent": 5.0, "charging": False})
    fleet.put_profile(ids[1], {"battery_percent": 90.0, "charging": True})

    a = fleet.assignment(ids[1]).json()

    assert a["position"] == -1 and fleet.topology(job_id)["version"] == 2


def test_joins_and_leaves_make_successive_versions_one_peer(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 4, topology="one-peer-exponential", elastic=True,
                          min_battery_percent=20.0)  # fmt: skip
    all_report(fleet, job_id, ids, 1)
    late = fleet.enrol("pi-late")
    fleet.assignment(late)
    five = fleet.topology(job_id)
    fleet.put_profile(ids[0], {"battery_percent": 1.0, "charging": False})

    topo = fleet.topology(job_id)
    assert sorted(map(tuple, five["edges"])) == sorted(exponential(5).edges)
    assert sorted(map(tuple, topo["edges"])) == sorted(exponential(4).edges)
    np.testing.assert_allclose(topo["mixing_matrix"], metropolis_hastings(exponential(4)))
    assert [(e["version"], e["kind"]) for e in topo["events"]] == [
        (1, "start"), (2, "join"), (3, "leave")
    ]  # fmt: skip
    assert topo["devices"] == [*ids[1:], late]
    assert [m["version"] for _, m in fleet.published] == [1, 2, 3]


# --- re-admission of a participant taken out while silent ------------------------------------


def taken_out(fleet: Fleet, **overrides: Any) -> tuple[str, list[str]]:
    """pi-2 of 3 silent for 61 s: version 2 without it, from round 6."""
    job_id, ids = started(fleet, 3, **overrides)
    for rnd in (1, 2):
        all_report(fleet, job_id, ids, rnd)
    fleet.now = 1_030.0
    all_report(fleet, job_id, ids[:2], 3)
    fleet.now = 1_061.0
    fleet.report(job_id, ids[0], 4)
    fleet.report(job_id, ids[1], 4)
    # (a secure job orders its devices by a salted hash, not by name)
    assert sorted(fleet.topology(job_id)["devices"]) == sorted(ids[:2])
    return job_id, ids


def test_a_device_taken_out_while_silent_is_taken_back_when_it_asks_again(fleet: Fleet) -> None:
    job_id, ids = taken_out(fleet)  # not elastic: a rebooted device is no new member
    fleet.now = 1_070.0

    back = fleet.assignment(ids[2]).json()
    reported = fleet.report(job_id, ids[2], 6)

    topo = fleet.topology(job_id)
    job = by_id(fleet.job(job_id))
    assert (topo["version"], topo["from_round"], topo["devices"]) == (3, 6, ids)
    assert topo["events"][-1] == {"version": 3, "from_round": 6, "kind": "join",
                                  "device_id": ids[2], "reason": REJOINED,
                                  "at": 1_070.0}  # fmt: skip
    assert [e["kind"] for e in topo["events"]] == ["start", "leave", "join"]
    assert (back["position"], back["index"], back["start_round"]) == (2, 2, 6)
    assert (back["topology_version"], back["from_round"]) == (3, 6)
    assert {n["device_id"] for n in back["neighbours"]} <= set(ids[:2]) and back["neighbours"]
    assert (job[ids[2]]["left_round"], job[ids[2]]["joined_round"]) == (None, 6)
    assert not job[ids[2]]["done"] and job[ids[2]]["error"] is None
    assert reported == 204 and job[ids[2]]["rounds_reported"] == 3  # rounds 1, 2 and 6
    assert fleet.assignment(ids[2]).json()["topology_version"] == 3  # taken back once
    assert [m["version"] for _, m in fleet.published] == [1, 2, 3]


def test_a_device_that_stopped_after_it_was_taken_out_is_not_taken_back(fleet: Fleet) -> None:
    job_id, ids = taken_out(fleet)
    fleet.done(job_id, ids[2])  # its agent saw that it left and posted done

    gone = fleet.assignment(ids[2]).json()

    assert gone["position"] == -1 and fleet.topology(job_id)["version"] == 2


def test_a_revoked_device_is_not_taken_back(fleet: Fleet) -> None:
    job_id, ids = taken_out(fleet)
    revoked = fleet.client.post(f"{API}/devices/{ids[2]}/revoke", headers=ADMIN_H)

    asked = fleet.assignment(ids[2])

    assert revoked.status_code == 200 and asked.status_code == 401
    assert fleet.topology(job_id)["version"] == 2
    assert by_id(fleet.job(job_id))[ids[2]]["left_round"] == 6


def test_a_drained_device_is_not_taken_back_even_once_undrained(fleet: Fleet) -> None:
    job_id, ids = started(fleet, 3)
    all_report(fleet, job_id, ids, 1)
    drained = fleet.client.post(f"{API}/devices/{ids[2]}/drain", headers=ADMIN_H)
    draining = fleet.assignment(ids[2]).json()
    undrained = fleet.client.post(f"{API}/devices/{ids[2]}/undrain", headers=ADMIN_H)

    active = fleet.assignment(ids[2]).json()

    assert drained.status_code == undrained.status_code == 200
    assert draining["position"] == active["position"] == -1
    topo = fleet.topology(job_id)
    assert topo["version"] == 2 and topo["devices"] == ids[:2]


def test_a_completed_job_is_not_reopened(fleet: Fleet) -> None:
    job_id, ids = taken_out(fleet)
    fleet.done(job_id, ids[0])
    fleet.done(job_id, ids[1])

    late = fleet.assignment(ids[2])

    job = by_id(fleet.job(job_id))
    assert fleet.job(job_id)["status"] == "completed"
    assert late.status_code == 204  # no job for it: it left, and the job ended
    assert fleet.topology(job_id)["version"] == 2 and job[ids[2]]["left_round"] == 6


def test_no_taking_back_when_the_change_would_come_after_the_last_round(fleet: Fleet) -> None:
    job_id, ids = taken_out(fleet, rounds=5)  # the next boundary is round 6

    gone = fleet.assignment(ids[2]).json()

    assert gone["position"] == -1 and fleet.topology(job_id)["version"] == 2


def test_a_secure_aggregation_job_does_not_take_a_device_back(fleet: Fleet) -> None:
    # A restarted agent lost its per-job keys (docs/privacy.md, "Limits").
    job_id, ids = taken_out(fleet, codec="int8", secure_aggregation=2, rounds=20)

    gone = fleet.assignment(ids[2]).json()

    assert gone["position"] == -1 and fleet.topology(job_id)["version"] == 2
