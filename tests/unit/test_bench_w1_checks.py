"""benchmarks/w1_flower.py fails loudly on a run that is no side by side (issue 24, item 7)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from bench_scripts import BENCH, load_script


@pytest.fixture(scope="module")
def w1_flower() -> ModuleType:
    return load_script("w1_flower")


def _run(accuracies: list[float], bytes_up: int = 100, clients: int = 8) -> dict[str, Any]:
    return {"rounds": [{"round": i + 1, "accuracy": a, "bytes_up": bytes_up, "clients": clients}
                       for i, a in enumerate(accuracies)]}  # fmt: skip


def _results(**engines: dict[str, Any]) -> dict[str, Any]:
    return {"engines": {k: [v] for k, v in engines.items()}, "overhead": {}, "unavailable": {}}


def test_the_partition_and_workloads_are_in_the_repository(w1_flower: ModuleType) -> None:
    assert w1_flower.PARTITION == BENCH / "data" / "w1_partition.json"
    assert w1_flower.PARTITION.is_file()
    assert (BENCH.parent / "docs" / "workloads.md").read_text().startswith("# Fixed benchmark")


def test_runs_that_train_with_every_client_pass(w1_flower: ModuleType) -> None:
    results = _results(grpc=_run([0.3, 0.6]), meshfl=_run([0.2, 0.5]))
    assert w1_flower.problems(results, ["grpc", "meshfl"], 8) == []


def test_a_peer_that_never_trained_fails_the_benchmark(w1_flower: ModuleType) -> None:
    results = _results(sim=_run([0.0889, 0.0889, 0.0889], bytes_up=0), meshfl=_run([0.2, 0.5]))
    found = w1_flower.problems(results, ["sim", "meshfl"], 8)
    assert any("flat at 0.0889" in line for line in found)
    assert any("0 bytes up" in line for line in found)


def test_lost_clients_failed_and_missing_engines_fail_the_benchmark(
    w1_flower: ModuleType,
) -> None:
    results = _results(meshfl=_run([0.2, 0.5], clients=7))
    results["unavailable"]["grpc"] = "FileNotFoundError: w1_partition.json"
    found = w1_flower.problems(results, ["grpc", "sim", "meshfl"], 8)
    assert any("had 7 of 8 clients" in line for line in found)
    assert any(line.startswith("grpc: FileNotFoundError") for line in found)
    assert "sim: requested, no run" in found
