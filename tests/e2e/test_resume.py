"""A SIGKILLed agent, restarted, resumes its job from its checkpoint (issue 7)."""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from meshfl.contract import RoundSummary
from meshfl.local.processes import Supervisor
from meshfl.local.run import LocalConfig, run_local

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

VICTIM = "device-1"


def test_a_killed_and_restarted_agent_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    # The coordinator's default departure rules: the killed device is usually taken out
    # (its neighbours miss it twice, 1.5 s of silence) before it is back, and taken back
    # when its restarted agent asks for its assignment (docs/reliability.md).
    out = tmp_path / "run"
    checkpoint = out / "models" / "state" / VICTIM
    killed: dict[str, object] = {}

    def kill_and_restart(summary: RoundSummary, supervisor: Supervisor) -> None:
        if killed or summary["round"] < 3:
            return
        child = next(c for c in supervisor.children if c.name == VICTIM)
        assert list(checkpoint.glob("*.npz")), "no checkpoint after 3 rounds"
        child.stop(signal.SIGKILL)
        child.process.wait()
        killed["at_round"] = summary["round"]
        shutil.copy(child.log_path, out / "killed.log")  # the restart rewrites the log
        args = [str(a) for a in child.process.args][3:]  # after `python -m meshfl`
        time.sleep(1.0)  # dead for a moment, its neighbours go on without it
        supervisor.start(VICTIM, args)

    # Its neighbours train 30x slower than this machine can: the job is still running when
    # the victim is back, and the victim catches up with them by training alone.
    slow = (("device-0", 30.0), ("device-2", 30.0))
    config = LocalConfig(agents=3, rounds=30, out=out, round_deadline_s=10.0, slow=slow)

    result = run_local(config, on_round=kill_and_restart)

    report = result.report
    assert killed, "the job ended before round 3"
    assert report["status"] == "completed"
    before = (out / "killed.log").read_text()
    after = (out / "logs" / f"{VICTIM}.log").read_text()
    done_before = [int(r) for r in re.findall(r"round (\d+): accuracy", before)]
    assert done_before, before[-2000:]
    assert "carrying on as that device" in after  # the same device id, not a new one
    resumed = re.search(
        r"resuming job \S+ at round (\d+) from its checkpoint of round (\d+)", after
    )
    assert resumed is not None, after[-3000:]
    start, saved = int(resumed.group(1)), int(resumed.group(2))
    assert start == saved + 1 and saved in (max(done_before), max(done_before) - 1)
    events = [e for e in report["topology"]["events"] if e["device"] == VICTIM]
    if any(e["kind"] == "leave" for e in events):  # taken out while down: taken back
        assert [e["kind"] for e in events] == ["leave", "join"], events
        assert events[-1]["reason"] == "rejoined" and "taken back into job" in after
    done_after = [int(r) for r in re.findall(r"round (\d+): accuracy", after)]
    assert done_after[0] == start and done_after[-1] == config.rounds  # round 1 not redone
    assert "round 1: accuracy" not in after
    assert not list(checkpoint.glob("*.npz"))  # removed when the job completed
    victim = next(d for d in report["devices"] if d["name"] == VICTIM)
    assert victim["left_round"] is None  # still a participant at the end
    others = [d["final_accuracy"] for d in report["devices"] if d["name"] != VICTIM]
    assert victim["final_accuracy"] >= min(others) - 0.05  # it mixed with them again
    ledger = report["ledger"]["totals"]
    assert ledger["applied_twice"] == 0 and ledger["corrupted_applied"] == 0
    assert ledger["rejected_replayed"] == 0  # its sequence numbers continued above the old
    assert ledger["missing"] + ledger["awaiting_keyframe"] == (  # every loss accounted for
        ledger["delivered_late"] + ledger["recovered_by_keyframe"] + ledger["unrecovered_losses"]
    )
    assert report["final"]["mean_accuracy"] >= 0.8  # digits, 10 classes: it learned
