"""Ids that reach file paths are checked by one strict pattern (issue 23 item 2)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from test_agent_models import _LINK, DEVICES, FakeClient, _assignment, _config, _digits_files

from edge_agent.job import JobRunner
from edge_agent.transport.memory import MemoryBroker, MemoryTransport
from meshfl.errors import ConfigError
from meshfl.modelspec import from_options, with_hash
from meshfl.pathids import path_id


@pytest.mark.parametrize(
    "bad", ["..", ".", "../x", "../../etc", "a/b", "a\\b", ".hidden", "", "x" * 65, "é", None]
)
def test_a_path_id_refuses_anything_that_could_leave_its_folder(bad: object) -> None:
    with pytest.raises(ConfigError, match="starting with a letter or digit"):
        path_id(bad, "job id")


def test_ordinary_ids_pass_unchanged() -> None:
    for good in ("job-3f2a", "dev-0", "pi.kitchen", "A_1", "9" * 64):
        assert path_id(good) == good


@pytest.mark.parametrize("job_id", ["..", "../escaped", "../../tmp"])
def test_a_job_id_that_climbs_out_is_declined_before_any_file_is_written(
    tmp_path: Path, job_id: str
) -> None:
    files = _digits_files(tmp_path)
    assignment = {**_assignment(with_hash(from_options("mlp", 64, 10)), 0), "job_id": job_id}
    transport = MemoryTransport(MemoryBroker())
    transport.connect(DEVICES[0])
    runner = JobRunner(
        _config(tmp_path / "agent", files[0], DEVICES[0]),
        FakeClient(),  # type: ignore[arg-type]
        transport,
        DEVICES[0],
        assignment,  # type: ignore[arg-type]
        link={**_LINK, "measured_at": time.time()},  # type: ignore[typeddict-item]
    )
    before = sorted(tmp_path.rglob("*"))
    with np.load(files[0]) as data, pytest.raises(ConfigError, match="invalid job id"):
        runner.run(data["x"], data["y"])  # ConfigError: the daemon declines the job
    assert sorted(tmp_path.rglob("*")) == before  # no model.pt anywhere, in or out of --out
