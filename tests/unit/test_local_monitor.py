"""meshfl local's job monitor: rounds read incrementally, an overloaded coordinator waited for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from meshfl.app.local.monitor import Hooks, monitor
from meshfl.errors import CoordinatorError, CoordinatorUnreachable


def _round(r: int) -> dict[str, Any]:
    return {"round": r, "devices_reporting": 1, "mean_accuracy": 0.5}


class Admin:
    """A coordinator's operator API whose first ``timeouts`` reads time out."""

    def __init__(self, rounds: int, timeouts: int) -> None:
        self.total, self.timeouts = rounds, timeouts
        self.reported = 0
        self.since: list[int] = []

    def rounds(self, job_id: str, since: int = 1) -> list[dict[str, Any]]:
        if self.timeouts:
            self.timeouts -= 1
            raise CoordinatorUnreachable("cannot reach the coordinator (ReadTimeout)")
        self.since.append(since)
        self.reported = min(self.total, self.reported + 1)  # one more round a read
        return [_round(r) for r in range(since, self.reported + 1)]

    def job(self, job_id: str) -> dict[str, Any]:
        done = self.reported == self.total
        return {"job_id": job_id, "status": "completed" if done else "running",
                "spec": {"rounds": self.total},
                "devices": [{"device_id": "d", "name": "device-0", "joined_round": 1,
                             "left_round": None}]}  # fmt: skip

    def topology(self, job_id: str) -> dict[str, Any]:
        return {"events": [], "spectral_gap": 1.0, "version": 1, "devices": ["d"], "kind": "ring"}


def _follow(admin: Admin) -> tuple[list[Any], list[str]]:
    lines: list[str] = []
    agent = SimpleNamespace(name="device-0", returncode=None)
    supervisor = SimpleNamespace(children=[agent], log_dir="/tmp")
    churn = SimpleNamespace(start=lambda: None, on_round=lambda r, s: [], killed=set())
    hooks = Hooks(on_round=None, show=None, notify=lines.append)
    config = SimpleNamespace(round_deadline_s=60.0)
    job = admin.job("job-1")
    _, rounds, failed = monitor(admin, supervisor, job, config, hooks, churn)  # type: ignore[arg-type]
    assert failed == {}
    return rounds, lines


def test_rounds_already_complete_are_not_read_again() -> None:
    admin = Admin(rounds=4, timeouts=0)
    rounds, _ = _follow(admin)

    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert admin.since[:4] == [1, 2, 3, 4]  # each read starts after the rounds settled
    assert admin.since[-1] == 1  # the result: every round, read once more at the end


def test_a_coordinator_too_busy_to_answer_is_waited_for_with_one_line() -> None:
    admin = Admin(rounds=2, timeouts=3)
    rounds, lines = _follow(admin)

    assert [r["round"] for r in rounds] == [1, 2]
    slow = [line for line in lines if "slow to answer" in line]
    assert len(slow) == 1 and "ReadTimeout" in slow[0]


def test_a_coordinator_silent_past_the_stall_limit_fails_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter(float(t) for t in range(0, 10_000, 100))
    monkeypatch.setattr("meshfl.app.local.monitor.time.monotonic", lambda: next(clock))
    monkeypatch.setattr("meshfl.app.local.monitor.time.sleep", lambda s: None)
    with pytest.raises(CoordinatorUnreachable):
        _follow(Admin(rounds=2, timeouts=1_000))


class LateAdmin(Admin):
    """Its job reads stay "running" a poll behind: the job completes just after a read."""

    def __init__(self) -> None:
        super().__init__(rounds=2, timeouts=0)
        self.completed = False
        self.stops = 0

    def job(self, job_id: str) -> dict[str, Any]:
        shown = super().job(job_id)
        shown["status"] = "completed" if self.completed else "running"
        self.completed = self.reported == self.total  # seen as completed from the next read
        return shown

    def stop_job(self, job_id: str) -> dict[str, Any]:
        self.stops += 1
        raise CoordinatorError(f"job {job_id!r} is already completed; nothing to stop", status=409)


def test_a_job_that_completed_since_its_last_read_is_not_a_failed_stop() -> None:
    admin = LateAdmin()
    lines: list[str] = []
    agent = SimpleNamespace(name="device-0", returncode=None)
    supervisor = SimpleNamespace(children=[agent], log_dir="/tmp")
    churn = SimpleNamespace(start=lambda: None, on_round=lambda r, s: [], killed=set())
    hooks = Hooks(on_round=lambda r, s: setattr(agent, "returncode", 0) if r["round"] == 2
                  else None, show=None, notify=lines.append)  # fmt: skip
    config = SimpleNamespace(round_deadline_s=60.0)
    job, rounds, failed = monitor(admin, supervisor, admin.job("job-1"), config, hooks, churn)  # type: ignore[arg-type]

    assert admin.stops == 1  # it asked to stop a job it believed running ...
    assert job["status"] == "completed"  # ... and took the refusal as the job's end
    assert [r["round"] for r in rounds] == [1, 2] and failed == {}
