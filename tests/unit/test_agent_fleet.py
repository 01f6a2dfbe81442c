"""The in-process agent mode's pieces: threads per agent, options, process blocks."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from edge_agent.daemon import AgentConfig
from edge_agent.fleet import AgentOutcome, fleet_configs, run_fleet
from meshfl.app.local.inprocess import blocks, check_in_process_options
from meshfl.app.local.run import LocalConfig
from meshfl.errors import ConfigError, DataError

TEMPLATE = AgentConfig(coordinator="http://127.0.0.1:1", token="t", data=Path("x"), name="x")


def test_each_agent_gets_its_name_and_data_file() -> None:
    configs = fleet_configs(TEMPLATE, ["a-0", "a-1"], [Path("d0.npz"), Path("d1.npz")])

    assert [(c.name, c.data) for c in configs] == [("a-0", Path("d0.npz")), ("a-1", Path("d1.npz"))]
    assert all(c.coordinator == TEMPLATE.coordinator and c.token == "t" for c in configs)


@pytest.mark.parametrize(
    ("names", "files", "why"),
    [
        ([], [], "1 to 1024 agents"),
        (["a", "a"], ["x", "y"], "its own name"),
        (["a", "b"], ["x"], "2 agents but 1 data files"),
    ],
)
def test_bad_fleets_are_refused(names: list[str], files: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        fleet_configs(TEMPLATE, names, [Path(f) for f in files])


def test_one_failing_agent_does_not_stop_the_others() -> None:
    configs = fleet_configs(TEMPLATE, [f"a-{i}" for i in range(6)], [Path("d")] * 6)
    ran: list[str] = []
    threads: set[str] = set()
    all_started = threading.Barrier(6, timeout=5)

    def fake(config: AgentConfig) -> None:
        threads.add(threading.current_thread().name)
        all_started.wait()  # every agent runs at the same time, each in its own thread
        if config.name == "a-2":
            raise DataError("no such file")
        if config.name == "a-4":
            raise SystemExit(3)  # even a thread's exit is only that agent's failure
        ran.append(config.name)

    ended: list[AgentOutcome] = []
    outcomes = run_fleet(configs, run=fake, on_end=ended.append)

    assert [o.name for o in outcomes] == [c.name for c in configs]
    assert {o.name: o.error for o in outcomes if o.error} == {
        "a-2": "DataError: no such file",
        "a-4": "SystemExit: 3",
    }
    assert sorted(ran) == ["a-0", "a-1", "a-3", "a-5"]
    assert threads == {c.name for c in configs}
    assert sorted(o.name for o in ended) == sorted(c.name for c in configs)


def test_agents_with_different_torch_threads_are_refused() -> None:
    configs = [replace(TEMPLATE, name="a"), replace(TEMPLATE, name="b", threads=2)]

    with pytest.raises(ConfigError, match="process-wide"):
        run_fleet(configs, run=lambda c: None)


def test_blocks_are_contiguous_and_balanced() -> None:
    assert blocks(256, 2) == [range(0, 128), range(128, 256)]
    assert blocks(10, 3) == [range(0, 4), range(4, 7), range(7, 10)]
    assert [len(b) for b in blocks(7, 7)] == [1] * 7


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"in_process": 9}, "between 1 and --agents"),
        ({"kill": (("device-1", 2),)}, "--kill"),
        ({"secure": True}, "--secure"),
        ({"brokers": 2}, "--brokers"),
        ({"chaos": "drop=0.1"}, "--chaos"),
        ({"step_time_s": 0.05}, "--step-time"),
    ],
)
def test_options_that_need_a_process_per_agent_are_refused(
    change: dict[str, Any], why: str
) -> None:
    config = replace(LocalConfig(agents=8, in_process=2), **change)

    with pytest.raises(ConfigError, match=why):
        check_in_process_options(config)
    check_in_process_options(LocalConfig(agents=8, in_process=2))  # the plain case is fine
