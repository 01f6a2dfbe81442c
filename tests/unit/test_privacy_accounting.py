"""ε is counted right (issue 23, item 4): sensitivity 2C under the documented replacement
adjacency, checked against Opacus; a restarted agent's re-release of a recorded round is
counted; the budget check and the spend (and a start's claim of its devices) are one
atomic step, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from postgres import scratch_schema
from test_coordinator_api import ADMIN, ADMIN_H, API, ENROL
from test_coordinator_privacy import DP, Fleet, fleet  # noqa: F401

from coordinator import CoordinatorSettings, lifecycle, store
from coordinator.budget import record_spend
from coordinator.db import Device, make_engine, make_sessionmaker
from coordinator.errors import Conflict
from coordinator.privacy import SENSITIVITY, epsilon


def test_epsilon_is_that_of_sensitivity_2c_and_matches_opacus() -> None:
    from opacus.accountants import RDPAccountant

    theirs = RDPAccountant()  # independent: Opacus's RDP, noise multiplier σ·C / 2C
    theirs.history = [(3.49 / 2, 1.0, 30)]
    under_c = RDPAccountant()
    under_c.history = [(3.49, 1.0, 30)]

    ours = epsilon([(3.49, 30)], 1e-5)

    assert SENSITIVITY == 2.0
    assert ours == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-6)
    assert ours == pytest.approx(18.87, abs=0.01)  # the figure under replacement
    assert under_c.get_epsilon(1e-5) == pytest.approx(8.0, abs=0.01)  # what main reported


def test_a_new_run_re_releasing_a_recorded_round_is_counted_again(fleet: Fleet) -> None:  # noqa: F811
    job_id, ids = fleet.running(**DP, rounds=5)
    url = f"{API}/jobs/{job_id}/privacy/{ids[0]}/spend"
    headers = fleet.headers[ids[0]]

    first = fleet.client.post(
        url, json={"round": 1, "releases": 1, "new_run": True}, headers=headers
    )
    retried = fleet.client.post(url, json={"round": 1, "releases": 1}, headers=headers)
    # The agent crashed in round 1 after its spend; restarted, it noises round 1 afresh.
    restarted = fleet.client.post(
        url, json={"round": 1, "releases": 1, "new_run": True}, headers=headers
    )

    assert first.status_code == retried.status_code == restarted.status_code == 200
    assert first.json()["releases"] == retried.json()["releases"] == 1  # a retry is free
    assert restarted.json()["releases"] == 2
    assert restarted.json()["epsilon_spent"] == pytest.approx(epsilon([(1.0, 2)], 1e-5))


def test_a_new_run_past_the_budget_is_refused(fleet: Fleet) -> None:  # noqa: F811
    budget = (epsilon([(1.0, 5)], 1e-5) + epsilon([(1.0, 6)], 1e-5)) / 2  # 5 fit, 6 do not
    job_id, ids = fleet.running(**DP, rounds=5, dp_epsilon_budget=budget)
    for rnd in range(1, 6):
        assert fleet.spend(job_id, ids[0], rnd).status_code == 200
    url = f"{API}/jobs/{job_id}/privacy/{ids[0]}/spend"
    again = {"round": 5, "releases": 1, "new_run": True}

    refused = fleet.client.post(url, json=again, headers=fleet.headers[ids[0]])

    assert refused.status_code == 409 and "privacy budget exhausted" in refused.text
    assert fleet.privacy(ids[0]).json()["releases"] == 5


# --- atomic check and spend ----------------------------------------------------------------


@contextmanager
def _coordinator(url: str) -> Iterator[Fleet]:
    settings = CoordinatorSettings(db_url=url, fleet="lab", enrol_token=ENROL, admin_token=ADMIN)
    made = Fleet(settings)
    made.client.__enter__()
    try:
        yield made
    finally:
        made.client.__exit__(None, None, None)


def _first_call_waits(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, barrier: threading.Barrier
) -> None:
    """Make each thread's first call of ``module.name`` wait for the other thread's."""
    real: Callable[..., Any] = getattr(module, name)
    seen: set[int] = set()

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            barrier.wait(timeout=20)  # both read before either writes
        return result

    monkeypatch.setattr(module, name, wrapped)


def _race(work: Callable[[int], None]) -> list[BaseException | None]:
    outcomes: list[BaseException | None] = [None, None]

    def run(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # collected for the assertions
            outcomes[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


def _two_starts_one_device(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with _coordinator(url) as made:
        ids = [made.enrol(f"pi-{k}") for k in range(2)]
        jobs = [made.create(devices=2, **DP) for _ in range(2)]
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        _first_call_waits(monkeypatch, store, "busy_device_ids", threading.Barrier(2))

        def start(k: int) -> None:
            with sessions() as session:
                job = store.get_job(session, jobs[k])
                lifecycle.start_job(session, job, made.clock.now, made.settings)

        try:
            outcomes = _race(start)
        finally:
            engine.dispose()
        statuses = [made.client.get(f"{API}/jobs/{j}", headers=ADMIN_H).json() for j in jobs]

    assert sorted(type(o).__name__ for o in outcomes) == ["Conflict", "NoneType"], outcomes
    refused = next(o for o in outcomes if o is not None)
    assert "was just taken by another job" in str(refused)
    assert sorted(s["status"] for s in statuses) == ["created", "running"]
    running = next(s for s in statuses if s["status"] == "running")
    assert sorted(d["device_id"] for d in running["devices"]) == sorted(ids)


def test_two_concurrent_starts_cannot_both_take_a_device_on_sqlite(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _two_starts_one_device(f"sqlite:///{tmp_path / 'race.db'}", monkeypatch)


def test_two_concurrent_starts_cannot_both_take_a_device_on_postgresql(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with scratch_schema() as url:
        _two_starts_one_device(url, monkeypatch)


def _two_spends_one_budget(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = (epsilon([(1.0, 2)], 1e-5) + epsilon([(1.0, 3)], 1e-5)) / 2  # room for two
    with _coordinator(url) as made:
        job_id, ids = made.running(n=2, **DP, rounds=2, dp_epsilon_budget=budget)
        assert made.spend(job_id, ids[0], 1).status_code == 200  # one left
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        # Both threads are past their first read before either takes the device's lock.
        _first_call_waits(monkeypatch, store, "participation", threading.Barrier(2))

        def spend(k: int) -> None:
            with sessions() as session:
                job = store.get_job(session, job_id)
                device = session.get(Device, ids[0])
                assert device is not None
                # round 2, and a restarted run's round 1 again: each fits alone
                body = {"round": 2 - k, "releases": 1, **({"new_run": True} if k else {})}
                record_spend(session, job, device, body, 1.0)  # type: ignore[arg-type]

        try:
            outcomes = _race(spend)
        finally:
            engine.dispose()
        status = made.privacy(ids[0]).json()

    assert sorted(type(o).__name__ for o in outcomes) == ["Conflict", "NoneType"], outcomes
    assert isinstance(next(o for o in outcomes if o is not None), Conflict)
    assert status["releases"] == 2 and status["epsilon_spent"] <= budget


def test_two_concurrent_spends_cannot_both_take_the_last_budget_on_sqlite(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _two_spends_one_budget(f"sqlite:///{tmp_path / 'race.db'}", monkeypatch)


def test_two_concurrent_spends_cannot_both_take_the_last_budget_on_postgresql(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with scratch_schema() as url:
        _two_spends_one_budget(url, monkeypatch)
