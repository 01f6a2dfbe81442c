"""benchmarks/round_overhead.py: round time is a slope, training the slowest device's."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import ModuleType

import pytest
from bench_scripts import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("round_overhead")


def test_the_round_time_is_the_slope_whatever_the_offsets(bench: ModuleType) -> None:
    # 40 ms a round, reports arriving up to 0.2 s late in a repeating pattern (batches).
    points = [(r, 3.0 + 0.04 * r + (0.2 if r % 5 == 0 else 0.0)) for r in range(2, 202)]
    assert bench.slope_ms(points) == pytest.approx(40.0, abs=0.2)
    assert bench.slope_ms([(r, 0.015 * r) for r in range(2, 30)]) == pytest.approx(15.0)


def test_training_is_the_slowest_device_of_each_round_from_round_2(
    bench: ModuleType, tmp_path: Path
) -> None:
    db = tmp_path / "coordinator.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE round_metrics (round INTEGER, metrics TEXT)")
        rows = [(1, 0.9), (1, 0.1), (2, 0.002), (2, 0.004), (3, 0.006), (3, 0.001)]
        conn.executemany(
            "INSERT INTO round_metrics VALUES (?, ?)",
            [(r, json.dumps({"train_s": t, "accuracy": 0.5})) for r, t in rows],
        )
    assert bench.slowest_training_ms(db, 2) == pytest.approx(5.0)  # mean of 4 ms and 6 ms


def test_cpu_is_counted_by_role_between_the_two_rounds(bench: ModuleType) -> None:
    agent, coordinator = "meshfl agent run --name device-0", "python -m meshfl coordinator serve"
    samples = [
        (10.0, {1: (agent, 1.0), 2: (coordinator, 2.0)}),
        (10.2, {1: (agent, 1.5), 2: (coordinator, 2.1), 3: ("meshfl agent run", 0.5)}),
        (10.4, {1: (agent, 2.0), 2: (coordinator, 2.4), 3: ("meshfl agent run", 0.9)}),
        (10.6, {1: (agent, 9.0), 2: (coordinator, 9.0)}),  # after the window: not counted
    ]
    used = bench._cpu_between(samples, 10.1, 10.3)  # from the sample at 10.0 to 10.4
    assert used == pytest.approx({"agents": 1.0 + 0.9, "coordinator": 0.4})
