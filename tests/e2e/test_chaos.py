"""``meshfl local --chaos`` end to end (issue 7): faults between every agent and the broker.

Both scenarios run 4 agents on digits. The fault scenario runs the same job twice on the
embedded broker, without and with faults, and compares them; the partition scenario
cuts one device off Mosquitto for longer than 1.5x the MQTT keepalive (5 s here), with a
broker queue too short for what the device misses meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from broker.mosquitto import MosquittoProcess
from broker.tuning import MosquittoTuning
from meshfl.app.local.lab.lockstep import run_lockstep
from meshfl.app.local.run import LocalConfig, LocalRun, run_local

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FAULTS = "drop=0.1,dup=0.1,reorder=0.05,corrupt=0.01,seed=67"
"""The issue's mix. Seed 67 corrupts the 3rd, 8th and 21st data PUBLISH that device-1
receives and the 5th that device-0 receives (drawn per device in arrival order; each
receives about 60 in the 30 rounds), so corruptions surely happen mid-job (1 % of ~240
deliveries alone would miss one about one run in ten)."""

MID_JOB_CORRUPTIONS = {"device-0": 1, "device-1": 3}
"""The corruptions of ``FAULTS`` that reach their device while its job still reads them.
Later draws (device-1's 92nd and 110th delivery, device-0's 156th) may come after the
device's last round, when it no longer parses messages: those are not applied either,
and not refused by a CRC that never ran."""


@dataclass
class Runs:
    calm: LocalRun
    stormy: LocalRun
    out: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The same job without and with ``FAULTS``: 4 agents, 30 rounds (W1's), 3 s deadline."""
    out = tmp_path_factory.mktemp("chaos")
    job = LocalConfig(agents=4, rounds=30, dataset="digits", seed=0, round_deadline_s=3.0)
    calm = run_local(replace(job, out=out / "calm"))
    stormy = run_local(replace(job, chaos=FAULTS, out=out / "chaos"))
    return Runs(calm, stormy, out)


def _rejected_in_logs(out: Path) -> dict[str, int]:
    """Messages each agent dropped as malformed (its log's warning per rejection)."""
    logs = sorted((out / "logs").glob("device-*.log"))
    return {log.stem: log.read_text().count("dropped a message on") for log in logs}


def test_faulty_chunks_are_injected_and_none_corrupted_is_applied(runs: Runs) -> None:
    report = runs.stormy.report
    assert report["status"] == "completed"
    assert [r["round"] for r in report["rounds"]] == list(range(1, 31))
    chaos = report["chaos"]
    totals = chaos["totals"]
    assert chaos["spec"] == FAULTS and chaos["seed"] == 67
    assert totals["publishes"] > 150
    assert totals["dropped"] > 0 and totals["duplicated"] > 0 and totals["reordered"] > 0
    assert totals["corrupted"] >= 1
    assert totals["acks_forged"] == totals["dropped"]  # every delta travels at QoS 1
    # Every corrupted chunk a device read was refused by its CRC (its log and its ledger),
    # and nothing else was: a corrupted PUBLISH that is also duplicated is refused twice.
    rejected = _rejected_in_logs(runs.out / "chaos")
    for device, counts in chaos["devices"].items():
        assert MID_JOB_CORRUPTIONS.get(device, 0) <= rejected[device] <= 2 * counts["corrupted"]
    ledger = report["ledger"]["totals"]
    assert ledger["rejected_malformed"] == sum(rejected.values())
    assert ledger["corrupted_applied"] == 0 and ledger["applied_twice"] == 0
    assert ledger["duplicates"] > 0
    # Dropped messages were asked for again and re-sent (edge_agent/outbox.py): each
    # missing one was applied late, repaired by a keyframe, or reported lost.
    assert ledger["retransmitted"] > 0 and ledger["delivered_late"] > 0
    assert ledger["missing"] + ledger["awaiting_keyframe"] == (
        ledger["delivered_late"] + ledger["recovered_by_keyframe"] + ledger["unrecovered_losses"]
    )
    assert sum(_rejected_in_logs(runs.out / "calm").values()) == 0
    assert runs.calm.report["chaos"] is None
    assert report["final"]["mean_accuracy"] > 0.6  # it learns (chance: 0.1)


def test_the_final_accuracy_is_within_one_point_of_the_run_without_faults(runs: Runs) -> None:
    calm = runs.calm.report["final"]["mean_accuracy"]
    stormy = runs.stormy.report["final"]["mean_accuracy"]
    assert abs(stormy - calm) <= 0.01


def test_a_device_partitioned_past_its_keepalive_and_its_broker_queue_recovers_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mosquitto drops a client silent for 1.5x its keepalive (7.5 s with the agents'
    # --keepalive 5) and publishes its Last Will; the embedded amqtt never drops one.
    # Its persistent session then queues what device-1 misses, up to 3 messages: the
    # rest Mosquitto drops, silently to every client (issue 25, item 3).
    monkeypatch.setenv("MESHFL_KEEPALIVE", "5")
    (tmp_path / "mosquitto").mkdir()
    tuning = MosquittoTuning(max_queued_messages=3)
    with MosquittoProcess(workdir=tmp_path / "mosquitto", tuning=tuning) as broker:
        config = LocalConfig(
            agents=4,
            rounds=20,
            dataset="digits",
            round_deadline_s=10.0,
            broker=broker.url,
            # Rounds of ~1 s (training takes 100x longer, sleeping; W1 rounds are ~0.1 s):
            # the partition (after round 1, 12 s) heals several rounds before the job ends.
            slow=tuple((f"device-{i}", 100.0) for i in range(4)),
            chaos="partition=device-1@1:12",
            out=tmp_path / "run",
        )
        notes: list[str] = []

        result = run_local(config, notify=notes.append)
        broker_log = broker.log_path.read_text(errors="replace")

    report = result.report
    assert report["status"] == "completed"
    assert not result.failed_agents
    assert [r["round"] for r in report["rounds"]] == list(range(1, 21))
    (event,) = report["chaos"]["partitions"]
    assert (event["device"], event["round"], event["seconds"]) == ("device-1", 1, 12.0)
    assert "after round 1: device-1 cut off the broker for 12 s" in notes
    cut = report["chaos"]["devices"]["device-1"]
    assert cut["partitions"] == 1 and cut["partitioned_s"] == 12.0
    assert cut["reconnects"] == 1  # the old connection died (keepalive); a new one came
    others = [d for name, d in report["chaos"]["devices"].items() if name != "device-1"]
    assert all(d["partitions"] == 0 and d["reconnects"] == 0 for d in others)
    devices = {d["name"]: d for d in report["devices"]}
    assert devices["device-1"]["final_accuracy"] is not None
    ledger = report["ledger"]
    totals = ledger["totals"]
    assert totals["applied_twice"] == 0 and totals["corrupted_applied"] == 0
    # The broker dropped messages queued for device-1, and said so only in its log ...
    assert "Outgoing messages are being dropped for client" in broker_log
    # ... and every message is accounted for, none lost: device-1 had the dropped ones
    # again, re-sent on its repair requests (it asks for whatever follows the last one it
    # applied) or, where it saw a gap first, covered by a keyframe. Which of the two
    # depends on what arrives first after the reconnect; that one of them ran does not.
    derived = {k: v for k, v in ledger["derived"].items() if k != "pairs"}
    assert derived["lost"] == derived["unaccounted"] == derived["unrepaired"] == 0, derived
    assert totals["retransmitted"] + totals["recovered_by_keyframe"] > 0, totals
    assert totals["delivered_late"] + totals["recovered_by_keyframe"] >= totals["missing"]
    assert totals["unrecovered_losses"] == 0, totals
    # Within 2 points of the same job without faults (the lockstep reference: what a
    # fault-free fleet computes, tests/e2e/test_local.py). Not 1, as without the overflow:
    # a gap holds the sender's later differences until its keyframe, and device-1 mixes
    # a stale replica meanwhile: up to 1.18 points below in the runs of docs/reliability.md
    # (0.9417 against 0.9535). A repair that fails costs far more (re-sends refused by a
    # broker packet limit took a job from 0.908 to 0.696: issue 25, item 2).
    calm = run_lockstep(replace(config, chaos="", slow=())).mean_accuracy[-1]
    assert abs(report["final"]["mean_accuracy"] - calm) <= 0.02, (report["final"], calm)
