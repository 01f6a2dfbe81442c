"""``meshfl local`` options of issue 4: topology, rounds, slow devices, links, churn."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshfl.app.local.fleet import (
    Churn,
    device_name,
    joiner_names,
    parse_kill,
    parse_link_option,
    parse_slow,
)
from meshfl.app.local.jobspec import job_spec, prepare_data
from meshfl.app.local.report import build_report
from meshfl.app.local.run import LocalConfig, validate
from meshfl.errors import ConfigError


def _one_line(info: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("text", "name"), [("3", "device-3"), ("device-3", "device-3"), (" 07 ", "device-7")]
)
def test_device_names(text: str, name: str) -> None:
    assert device_name(text, "--slow") == name


def test_device_option_parsers() -> None:
    assert parse_slow("3:4") == ("device-3", 4.0)
    assert parse_slow("device-0:1.5") == ("device-0", 1.5)
    assert parse_link_option("3:1mbit:200ms") == ("device-3", "1mbit:200ms")
    assert parse_link_option("device-1:256kbit") == ("device-1", "256kbit")
    assert parse_kill("device-2@8") == ("device-2", 8)
    assert parse_kill("2@8") == ("device-2", 8)


@pytest.mark.parametrize(
    ("parse", "text", "fragment"),
    [
        (parse_slow, "3", "DEVICE:FACTOR"),
        (parse_slow, "3:fast", "DEVICE:FACTOR"),
        (parse_slow, "cpu:2", "not a device"),
        (parse_link_option, "3", "DEVICE:RATE"),
        (parse_link_option, "3:1mb:200ms", "1mbit:200ms"),
        (parse_kill, "device-2", "DEVICE@ROUND"),
        (parse_kill, "device-2@x", "DEVICE@ROUND"),
        (parse_kill, "pi@3", "not a device"),
    ],
)
def test_device_option_parsers_refuse_in_one_line(parse: Any, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text)

    assert fragment in _one_line(info)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"slow": (("device-8", 2.0),)}, "--slow: device-8 is not in this fleet"),
        ({"slow": (("1", 2.0), ("device-1", 3.0))}, "named twice"),
        ({"slow": (("1", 0.5),)}, "factor must be a finite number >= 1"),
        ({"step_time_s": -0.05}, "--step-time -0.05: use a number of seconds >= 0"),
        ({"step_time_s": float("nan")}, "--step-time nan"),
        ({"links": (("2", "1mbit:fast"),)}, "bad link"),
        ({"join_at": (0,)}, "--join-at 0: use a round in 1..9"),
        ({"join_at": (10,)}, "--join-at 10"),
        ({"kill": (("2", 10),)}, "--kill 2@10: use a round in 1..9"),
        ({"join_at": (5,), "kill": (("device-4", 5),)}, "joins after round 5; kill it later"),
        ({"kill": (("0", 2), ("1", 2), ("2", 2))}, "fewer than two agents"),
        ({"agents": 64, "join_at": (3,)}, "at most 64"),
        ({"topology": "custom"}, "or a path to a JSON edge list"),
        ({"topology": "hypercube"}, "--topology 'hypercube'"),
        ({"topology": "random-regular", "topology_degree": 3, "agents": 5}, "random-regular"),
        ({"topology": "erdos-renyi", "topology_probability": 1.5}, "probability"),
        ({"topology_seed": -1}, "--topology-seed"),
        ({"mixing": "uniform"}, "--mixing 'uniform'"),
        ({"mode": "lockstep"}, "--mode 'lockstep'"),
        ({"staleness": -1}, "--staleness"),
        ({"quorum": 0.0}, "--quorum"),
        ({"quorum": 1.5}, "--quorum"),
        ({"uplink_budget_s": 0.0}, "--uplink-budget"),
        ({"min_battery_percent": 101.0}, "--min-battery"),
        ({"hidden": (100_000, 100_000)}, "--hidden width 100000 is out of range"),
        ({"hidden": (0,)}, "--hidden width 0"),
        ({"hidden": (8,) * 65}, "at most 64"),
    ],
)
def test_validate_refuses_bad_options_in_one_line(overrides: dict[str, Any], fragment: str) -> None:
    config = LocalConfig(**{"agents": 4, "rounds": 10, **overrides})

    with pytest.raises(ConfigError) as info:
        validate(config)

    assert fragment in _one_line(info)


def test_validate_accepts_a_heterogeneous_changing_fleet() -> None:
    config = LocalConfig(
        agents=8,
        rounds=20,
        topology="random-regular",
        topology_degree=3,
        mode="async",
        staleness=0,
        quorum=0.5,
        plan=True,
        slow=(("3", 4.0), ("device-9", 2.0)),
        links=(("device-3", "1mbit:200ms"),),
        join_at=(5, 7),
        kill=(("device-2", 8), ("9", 9)),
    )

    validate(config)

    assert joiner_names(config) == ["device-8", "device-9"]


def _graph_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({"n": n, "edges": [[i, (i + 1) % n] for i in range(n)]}))
    return path


def test_a_custom_graph_must_have_one_node_per_agent(tmp_path: Path) -> None:
    path = _graph_file(tmp_path, 5)

    with pytest.raises(ConfigError) as info:
        validate(LocalConfig(agents=4, topology=str(path)))

    assert "has 5 nodes but --agents is 4" in _one_line(info)


def _spec(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    config = LocalConfig(**{"agents": 4, "rounds": 10, "out": tmp_path / "run", **overrides})
    validate(config)
    files, test_file = prepare_data(config)
    return dict(job_spec(config, test_file)), files


def test_default_spec_carries_no_issue_4_keys(tmp_path: Path) -> None:
    spec, _ = _spec(tmp_path)

    assert (spec["topology"], spec["codec"], spec["consensus_step"]) == ("complete", "sign", 1.0)
    assert spec["local_momentum"] == 0.9 and spec["seed"] == 0
    new_keys = {"topology_degree", "topology_probability", "topology_seed", "mixing",
                "custom_graph", "mode", "staleness", "quorum", "plan", "uplink_budget_s",
                "min_battery_percent", "elastic"}  # fmt: skip
    assert not new_keys & set(spec)


def test_the_model_seed_changes_the_model_but_not_the_partition(tmp_path: Path) -> None:
    spec, files = _spec(tmp_path / "a", model_seed=2, local_momentum=0.5)
    default_spec, default_files = _spec(tmp_path / "b")

    assert (spec["seed"], default_spec["seed"]) == (2, 0)
    assert spec["local_momentum"] == 0.5
    for mine, theirs in zip(files, default_files, strict=True):
        with np.load(mine) as a, np.load(theirs) as b:
            assert sorted(a.files) == sorted(b.files)
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key])


def test_spec_carries_the_options_that_differ(tmp_path: Path) -> None:
    spec, _ = _spec(
        tmp_path,
        topology="small-world",
        topology_degree=2,
        topology_probability=0.5,
        topology_seed=7,
        mixing="max-degree",
        mode="async",
        staleness=3,
        quorum=0.5,
        plan=True,
        uplink_budget_s=0.1,
        min_battery_percent=20.0,
        join_at=(3,),
    )

    assert {k: spec[k] for k in ("topology", "topology_degree", "topology_probability",
                                 "topology_seed", "mixing", "mode", "staleness", "quorum",
                                 "plan", "uplink_budget_s", "min_battery_percent",
                                 "elastic")} == {
        "topology": "small-world", "topology_degree": 2, "topology_probability": 0.5,
        "topology_seed": 7, "mixing": "max-degree", "mode": "async", "staleness": 3,
        "quorum": 0.5, "plan": True, "uplink_budget_s": 0.1, "min_battery_percent": 20.0,
        "elastic": True,  # implied by --join-at
    }  # fmt: skip
    assert spec["devices"] == 4  # joiners come later


def test_a_graph_file_becomes_a_custom_graph(tmp_path: Path) -> None:
    path = _graph_file(tmp_path, 4)

    spec, _ = _spec(tmp_path, topology=str(path))

    assert spec["topology"] == "custom"
    assert spec["custom_graph"] == {"n": 4, "edges": [(0, 1), (0, 3), (1, 2), (2, 3)]}


def test_joiners_get_their_own_data_files(tmp_path: Path) -> None:
    _, files = _spec(tmp_path, join_at=(3, 5))

    assert [f.name for f in files] == [f"device-{i}.npz" for i in range(6)]


@dataclass
class _FakeChild:
    name: str
    returncode: int | None = None
    signals: list[int] = field(default_factory=list)

    def stop(self, sig: int) -> None:
        self.signals.append(sig)
        self.returncode = -sig


@dataclass
class _FakeSupervisor:
    children: list[_FakeChild]


def test_churn_starts_joiners_and_kills_at_their_rounds() -> None:
    config = LocalConfig(agents=4, rounds=10, join_at=(5, 3), kill=(("2", 4), ("device-4", 6)))
    supervisor = _FakeSupervisor([_FakeChild(f"device-{i}") for i in range(4)])
    started: list[str] = []

    def start(name: str) -> None:
        started.append(name)
        supervisor.children.append(_FakeChild(name))

    churn = Churn(config, start)
    churn.start()
    lines = [line for r in range(1, 10) for line in churn.on_round(r, supervisor)]

    assert started == ["device-4", "device-5"]  # named in the order they join
    assert [(e["event"], e["device"], e["round"]) for e in churn.events] == [
        ("join", "device-4", 3),
        ("kill", "device-2", 4),
        ("join", "device-5", 5),
        ("kill", "device-4", 6),
    ]
    assert all(e["at_s"] >= 0 for e in churn.events)
    assert churn.killed == {"device-2", "device-4"}
    victim = next(c for c in supervisor.children if c.name == "device-2")
    assert victim.signals == [signal.SIGKILL]
    assert lines[0] == "after round 3: device-4 started (joins the job)"


def test_report_has_topology_churn_links_and_keeps_its_keys() -> None:
    job: Any = {
        "job_id": "j1",
        "status": "completed",
        "devices": [
            {"device_id": "id0", "name": "device-0", "index": 0, "final_accuracy": 0.9,
             "bytes_sent": 1, "bytes_received": 1, "missing_rounds": [],
             "isolated_rounds": [], "error": None, "joined_round": 1, "left_round": None},
            {"device_id": "id8", "name": "device-8", "index": 1, "final_accuracy": 0.8,
             "bytes_sent": 1, "bytes_received": 1, "missing_rounds": [],
             "isolated_rounds": [], "error": None, "joined_round": 7, "left_round": None},
        ],
    }  # fmt: skip
    topology = {
        "kind": "ring", "devices": ["id0", "id8"], "edges": [(0, 1)],
        "mixing_matrix": [[0.5, 0.5], [0.5, 0.5]], "spectral_gap": 1.0, "version": 2,
        "from_round": 7,
        "events": [
            {"version": 1, "from_round": 1, "kind": "start", "device_id": None,
             "reason": "started", "at": 1.0},
            {"version": 2, "from_round": 7, "kind": "join", "device_id": "id8",
             "reason": "joined", "at": 2.0},
        ],
    }  # fmt: skip
    churn = [{"event": "join", "device": "device-8", "round": 5, "at_s": 3.5}]

    report = build_report(
        LocalConfig(join_at=(5,)), job, [], 1.0, {}, topology=topology, churn=churn,
        profiles={"id0": {"train_samples_per_s": 100.0}},
    )  # fmt: skip

    assert set(report) >= {"config", "job_id", "status", "rounds", "devices", "final",
                           "time_to_accuracy", "topology", "churn", "links"}  # fmt: skip
    assert report["churn"] == churn
    topo = report["topology"]
    assert "mixing_matrix" not in topo
    assert topo["devices"] == ["device-0", "device-8"]
    assert [(e["kind"], e["device"]) for e in topo["events"]] == [
        ("start", None),
        ("join", "device-8"),
    ]
    assert report["devices"][1]["joined_round"] == 7
    assert report["devices"][0]["profile"]["train_samples_per_s"] == 100.0
    assert report["devices"][1]["profile"]["broker_rtt_s"] is None
    json.dumps(report)  # report.json must serialise


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["local", "--kill", "pi@3"], "--kill: 'pi' is not a device"),
        (["local", "--link", "3:fast"], "bad link 'fast'"),
        (["local", "--agents", "4", "--slow", "9:2"], "--slow: device-9 is not in this fleet"),
        (["local", "--mode", "eventual"], "--mode 'eventual'"),
        (["agent", "run", "--coordinator", "http://127.0.0.1:9", "--token", "t",
          "--data", "nope.npz", "--slowdown", "0.5"], "--slowdown must be"),
    ],
)  # fmt: skip
def test_cli_refuses_bad_options_in_one_line(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from meshfl.app.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)

    assert exit_info.value.code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("meshfl: error:")
    assert fragment in errors[0]


def test_live_time_to_accuracy_follows_the_devices_latest_reports() -> None:
    from meshfl.app.local.report import live_time_to_accuracy

    reports = [
        {"device_id": "a", "round": 1, "accuracy": 0.70, "bytes_sent": 10, "elapsed_s": 1.0},
        {"device_id": "a", "round": 2, "accuracy": 0.95, "bytes_sent": 10, "elapsed_s": 2.0},
        {"device_id": "b", "round": 1, "accuracy": 0.75, "bytes_sent": 10, "elapsed_s": 3.0},
        {"device_id": "b", "round": 2, "accuracy": 0.90, "bytes_sent": 10, "elapsed_s": 4.0},
    ]
    reached = live_time_to_accuracy(reports)  # type: ignore[arg-type]
    # The mean counts once both reported: (0.95 + 0.75) / 2 = 0.85 at 3 s, 0.925 at 4 s.
    assert reached["0.80"] == {"elapsed_s": 3.0, "bytes_sent": 30}
    assert reached["0.85"] == {"elapsed_s": 3.0, "bytes_sent": 30}
    assert reached["0.90"] == {"elapsed_s": 4.0, "bytes_sent": 40}


def test_the_churn_summary_says_what_really_happened() -> None:
    from meshfl.app.cli.local import _churn_lines

    report = {
        "churn": [
            {"event": "join", "device": "device-8", "round": 5},
            {"event": "join", "device": "device-9", "round": 6},
            {"event": "kill", "device": "device-2", "round": 8},
            {"event": "kill", "device": "device-3", "round": 9},
        ],
        "topology": {"events": [{"kind": "join", "device": "device-8", "from_round": 9}]},
        "devices": [
            {"name": "device-2", "left_round": 11, "missing_rounds": [10]},
            {"name": "device-3", "left_round": None, "missing_rounds": []},
        ],
    }
    lines = _churn_lines(report)
    assert lines[0] == "device-8 started after round 5 and joined from round 9"
    assert "device-9" in lines[1] and "never admitted" in lines[1]
    assert lines[2] == "device-2 was SIGKILLed after round 8"
    assert "device-3" in lines[3] and "already reported every round" in lines[3]


def test_topology_kinds_are_case_insensitive_like_codecs_but_files_keep_their_name(
    tmp_path: Path,
) -> None:
    from meshfl.app.local.validation import canonical_topology, topology_fields

    path = _graph_file(tmp_path, 4)
    upper = tmp_path / "RING.JSON"
    upper.write_text(path.read_text())

    assert canonical_topology("Ring") == "ring"
    assert topology_fields("One-Peer-Exponential") == {"topology": "one-peer-exponential"}
    assert topology_fields(str(upper))["topology"] == "custom"
    assert canonical_topology("Hypercube") == "Hypercube"  # refused later, as typed
    with pytest.raises(ConfigError, match="--topology 'Hypercube'"):
        topology_fields("Hypercube")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--dataset", "no-such.npz"], "--dataset 'no-such.npz' is neither"),
        (["--out", "{file}"], "is not a writable directory"),
        (["--in-process", "2", "--step-time", "0.1"], "--in-process runs agents as threads"),
    ],
)
def test_a_refused_local_run_prints_its_reason_and_no_banner(
    args: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from meshfl.app.cli import main

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    args = [a.replace("{file}", str(a_file)) for a in args]

    with pytest.raises(SystemExit) as exit_info:
        main(["local", "--agents", "2", "--out", str(tmp_path / "run"), *args])

    captured = capsys.readouterr()
    assert exit_info.value.code == 2
    assert captured.out == ""  # no "meshfl local: 2 agents, ..." banner before the error
    (error,) = captured.err.strip().splitlines()
    assert error.startswith("meshfl: error:") and fragment in error
