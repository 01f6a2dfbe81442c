"""DP through the agent's job code: every round's releases are recorded first, and a device
whose budget would be crossed stops there (over the in-memory bus, a fake coordinator)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from test_agent_models import (
    _LINK,
    DEVICES,
    FakeClient,
    _assignment,
    _config,
    _connected,
    _digits_files,
)

from edge_agent.job import JobRunner
from edge_agent.transport.memory import MemoryBroker
from meshfl.errors import CoordinatorError
from meshfl.modelspec import from_options, with_hash


class BudgetClient(FakeClient):
    """Grants DP releases until ``limit`` rounds were recorded, then refuses (409)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.spends: list[dict[str, int]] = []

    def spend(self, job_id: str, device_id: str, spend: dict[str, int]) -> dict[str, Any]:
        if len(self.spends) >= self.limit:
            raise CoordinatorError("privacy budget exhausted: ε would reach 8.1 > 8", status=409)
        self.spends.append(spend)
        return {"device_id": device_id, "epsilon_spent": 1.0, "delta": 1e-5,
                "epsilon_budget": 8.0, "releases": len(self.spends)}  # fmt: skip


def test_a_device_stops_before_its_privacy_budget_is_crossed(tmp_path: Path) -> None:
    model = with_hash(from_options("mlp", 64, 10))
    files = _digits_files(tmp_path)
    bus = MemoryBroker()
    clients = [BudgetClient(limit=2), BudgetClient(limit=100)]
    errors: list[BaseException] = []

    def device(i: int) -> None:
        assignment = _assignment(model, i)
        assignment["spec"].update(
            rounds=5, codec="identity", dp_noise_multiplier=1.0, dp_clip=1.0,
            round_deadline_s=10.0,
        )  # fmt: skip
        clients[i].current = assignment  # what the reporter's polls read: still running
        try:
            runner = JobRunner(
                _config(tmp_path, files[i], DEVICES[i]),
                clients[i],  # type: ignore[arg-type]
                _connected(bus, DEVICES[i]),
                DEVICES[i],
                assignment,  # type: ignore[arg-type]
                link={**_LINK, "measured_at": time.time()},  # type: ignore[typeddict-item]
            )
            with np.load(files[i]) as data:
                runner.run(data["x"], data["y"])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=device, args=(i,)) for i in range(len(DEVICES))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    limited, free = clients
    # Releases were recorded before each round, one per round (a broadcast).
    # The first spend of a run says so: a restarted agent's round is counted again.
    first = {"round": 1, "releases": 1, "new_run": True}
    assert limited.spends == [first, {"round": 2, "releases": 1}]
    assert [m["round"] for m in limited.metrics] == [1, 2]  # no third release
    assert len(limited.done) == 1  # it stopped with its model so far
    # Its neighbour saw it leave and finished the job alone.
    assert [m["round"] for m in free.metrics] == [1, 2, 3, 4, 5]
    assert [s["round"] for s in free.spends] == [1, 2, 3, 4, 5]


def test_a_device_refuses_to_share_secrets_under_a_low_or_swapped_threshold() -> None:
    """Issue 23 item 5: the agent checks t in (|N(i)|/2, |N(i)|] before it splits secrets."""
    import pytest

    from edge_agent.secagg.keyring import Directory
    from edge_agent.secure_job import check_shares
    from meshfl.aggregation.privacy import PrivacyOptions
    from meshfl.errors import ConfigError, SecurityError

    spec = {"algorithm": "choco", "codec": "int8", "mode": "sync", "topology": "complete"}
    complete = {d: tuple(p for p in "abcde" if p != d) for d in "abcde"}  # neighbourhoods of 4
    options = PrivacyOptions.from_spec({**spec, "secure_aggregation": 3})
    check_shares(Directory(3, "", complete, {}), options, {"b": 0.2, "c": 0.2})
    low = PrivacyOptions.from_spec({**spec, "secure_aggregation": 2})
    with pytest.raises(ConfigError, match="not above half of device b's 4 neighbours"):
        check_shares(Directory(2, "", complete, {}), low, {"b": 0.2, "c": 0.2})
    with pytest.raises(SecurityError, match="threshold 2 is not the job's secure_aggregation 3"):
        check_shares(Directory(2, "", complete, {}), options, {"b": 0.2})
