"""Churn end to end (issue 4): an agent joins at round 5, another dies at round 8."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshfl.app.local.run import LocalConfig, run_local

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_join_and_a_death_both_reach_the_topology_and_the_report(tmp_path: Path) -> None:
    config = LocalConfig(
        agents=8,
        rounds=30,
        join_at=(5,),
        kill=(("device-2", 8),),
        # Train 40x slower (sleeping, not spinning): rounds keep their pace while the
        # CPUs stay free for the joiner's start-up (imports, enrolment, profile) on a
        # small host; W1 rounds are otherwise ~0.1 s, over before a process starts.
        slow=tuple((f"device-{i}", 40.0) for i in range(8)),
        round_deadline_s=15.0,
        out=tmp_path / "run",
        topology="ring",  # the scenario's graph: a join and a death each change two edges
    )
    notes: list[str] = []

    result = run_local(config, notify=notes.append)

    report = result.report
    assert report["status"] == "completed"
    assert [r["round"] for r in report["rounds"]] == list(range(1, 31))
    assert [(e["event"], e["device"], e["round"]) for e in report["churn"]] == [
        ("join", "device-8", 5),
        ("kill", "device-2", 8),
    ]
    events = report["topology"]["events"]
    # Either may come first: the joiner's start-up (seconds) races the death's detection.
    assert sorted((e["kind"], e["device"]) for e in events if e["kind"] != "start") == [
        ("join", "device-8"),
        ("leave", "device-2"),
    ]
    assert [e["version"] for e in events] == list(range(1, len(events) + 1))
    joined = next(e for e in events if e["kind"] == "join")
    assert joined["from_round"] > 5
    left = next(e for e in events if e["kind"] == "leave")
    assert left["from_round"] > 8
    assert report["topology"]["version"] == events[-1]["version"]
    assert "device-8" in report["topology"]["devices"]
    assert "device-2" not in report["topology"]["devices"]
    devices = {d["name"]: d for d in report["devices"]}
    assert devices["device-8"]["joined_round"] == joined["from_round"]
    assert devices["device-2"]["left_round"] == left["from_round"]
    assert "device-2" not in result.failed_agents  # killed on purpose: churn, not failure
    assert any("device-8" in note for note in notes)
    assert report["final"]["mean_accuracy"] > 0.3  # it learns (chance: 0.1)
