"""Record-level DP through the agent's job code (over the in-memory bus, a fake
coordinator): the trainer runs DP-SGD, each round's spend counts its DP-SGD steps at
their Poisson sampling rate, and the released deltas carry no device-level noise."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import numpy as np
from test_agent_models import _LINK as LINK
from test_agent_models import DEVICES, _assignment, _config, _connected, _digits_files
from test_agent_privacy import BudgetClient

from edge_agent.algorithms.choco import privatizer
from edge_agent.job import JobRunner
from edge_agent.transport.memory import MemoryBroker
from meshfl.modelspec import from_options, with_hash


def test_a_record_level_job_spends_its_dp_sgd_steps_and_adds_no_release_noise(
    tmp_path: Path,
) -> None:
    model = with_hash(from_options("mlp", 64, 10))
    files = _digits_files(tmp_path)
    bus = MemoryBroker()
    clients = [BudgetClient(limit=100), BudgetClient(limit=100)]
    runners: list[JobRunner] = []
    sizes: list[int] = []
    errors: list[BaseException] = []

    def device(i: int) -> None:
        assignment = _assignment(model, i)
        assignment["spec"].update(
            rounds=3, codec="identity", dp_noise_multiplier=1.0, dp_clip=4.0,
            dp_unit="record", round_deadline_s=10.0,
        )  # fmt: skip
        clients[i].current = assignment
        try:
            runner = JobRunner(
                _config(tmp_path, files[i], DEVICES[i]),
                clients[i],  # type: ignore[arg-type]
                _connected(bus, DEVICES[i]),
                DEVICES[i],
                assignment,  # type: ignore[arg-type]
                link={**LINK, "measured_at": time.time()},  # type: ignore[typeddict-item]
            )
            runners.append(runner)
            with np.load(files[i]) as data:
                sizes.append(len(data["y"]))
                runner.run(data["x"], data["y"])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=device, args=(i,)) for i in range(len(DEVICES))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    for client in clients:
        n = sizes[0]  # both devices hold the same number of examples here
        assert sizes == [n, n]
        steps, q = math.ceil(n / 32), min(1.0, 32 / n)
        assert client.spends[0] == {"round": 1, "releases": steps, "new_run": True,
                                    "sampling_rate": q}  # fmt: skip
        assert [s["round"] for s in client.spends] == [1, 2, 3]
        assert all(s["releases"] == steps and s["sampling_rate"] == q for s in client.spends)
        assert [m["round"] for m in client.metrics] == [1, 2, 3]
        assert all(m["sketch"] == [] for m in client.metrics)  # still a private job
    for runner in runners:
        assert runner.privacy.record_dp and privatizer(runner.privacy) is None
