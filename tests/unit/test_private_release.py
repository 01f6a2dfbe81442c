"""Nothing un-noised leaves a device of a private job (DP or secure aggregation): no count
sketch in its round reports, no uploaded final model; the coordinator refuses both and
a spec asking to publish models (issue 23, item 3)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_agent_models import _LINK, DEVICES, FakeClient, _assignment, _config, _connected
from test_artifacts import clock, enrol, job_spec, running_job, tiny_model, upload  # noqa: F401
from test_coordinator_api import ADMIN_H, API, metrics
from test_coordinator_privacy import DP, SECURE, Fleet, fleet  # noqa: F401

from edge_agent.job import JobRunner
from edge_agent.transport.memory import MemoryBroker
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.errors import ConfigError
from meshfl.modelspec import from_options, with_hash


class SpendClient(FakeClient):
    """Grants every DP release; records model uploads."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: list[str] = []

    def spend(self, job_id: str, device_id: str, spend: dict[str, int]) -> dict[str, Any]:
        return {"device_id": device_id, "epsilon_spent": 1.0, "delta": 1e-5,
                "epsilon_budget": None, "releases": spend["round"]}  # fmt: skip

    def put_model(self, job_id: str, device_id: str, data: bytes) -> dict[str, Any]:
        self.uploads.append(device_id)
        return {"size_bytes": len(data), "sha256": "0" * 64}


def _digits(tmp_path: Path) -> Path:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
    path = tmp_path / "device-0.npz"
    np.savez(path, x=x[:200], y=y[:200], x_test=x[1500:1600], y_test=y[1500:1600])
    return path


def _private_job(publish: bool) -> dict[str, Any]:
    assignment = _assignment(with_hash(from_options("mlp", 64, 10)), 0)
    assignment.update(neighbours=[], self_weight=1.0, devices=[DEVICES[0]])
    assignment["spec"].update(codec="identity", dp_noise_multiplier=1.0, dp_clip=1.0,
                              sketch_dim=256, devices=1, publish_model=publish)  # fmt: skip
    return assignment


def _run(tmp_path: Path, assignment: dict[str, Any]) -> SpendClient:
    data = _digits(tmp_path)
    client = SpendClient()
    runner = JobRunner(
        _config(tmp_path, data, DEVICES[0]),
        client,  # type: ignore[arg-type]
        _connected(MemoryBroker(), DEVICES[0]),
        DEVICES[0],
        assignment,  # type: ignore[arg-type]
        link={**_LINK, "measured_at": time.time()},  # type: ignore[typeddict-item]
    )
    with np.load(data) as arrays:
        runner.run(arrays["x"], arrays["y"])
    return client


def test_a_dp_device_reports_no_sketch(tmp_path: Path) -> None:
    client = _run(tmp_path, _private_job(publish=False))

    assert [m["round"] for m in client.metrics] == [1]
    assert client.metrics[0]["sketch"] == []  # the job asked for 256 values
    assert client.uploads == [] and len(client.done) == 1


def test_a_dp_job_that_publishes_models_is_declined_and_uploads_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="publish_model uploads each device's final model"):
        _run(tmp_path, _private_job(publish=True))


@pytest.mark.parametrize("private", [DP, SECURE])
def test_the_rule_is_one_for_every_caller(private: dict[str, Any]) -> None:
    spec = {"algorithm": "choco", "publish_model": True, **private}
    options = PrivacyOptions.from_spec(spec)  # a stored job still reads back
    assert options.private
    with pytest.raises(ConfigError, match="set publish_model false"):
        options.check_release(spec)
    PrivacyOptions.from_spec({"publish_model": True}).check_release({"publish_model": True})


def test_the_coordinator_refuses_a_private_job_that_publishes_models(fleet: Fleet) -> None:  # noqa: F811
    for private in (DP, SECURE):
        from test_coordinator_api import spec

        r = fleet.client.post(
            f"{API}/jobs", json=spec(publish_model=True, **private), headers=ADMIN_H
        )
        assert r.status_code == 422, r.text
        assert "set publish_model false" in r.text


def test_the_coordinator_refuses_a_sketch_from_a_private_job(fleet: Fleet) -> None:  # noqa: F811
    job_id, ids = fleet.running(**DP, rounds=2)
    url = f"{API}/jobs/{job_id}/metrics"
    sketch = [0.5] * 256

    refused = fleet.client.post(url, json=metrics(1, 0.5, sketch), headers=fleet.headers[ids[0]])
    taken = fleet.client.post(url, json=metrics(1, 0.5, []), headers=fleet.headers[ids[0]])

    assert refused.status_code == 422 and "must carry no sketch" in refused.text
    assert taken.status_code in (200, 201, 204), taken.text


def test_the_coordinator_refuses_a_model_upload_of_a_private_job(
    tmp_path: Path,
    clock: Any,  # noqa: F811
) -> None:
    from test_artifacts import make_client

    with make_client(tmp_path, clock) as client:
        job_id, [(a, a_h), _] = running_job(
            client, clock, publish_model=False, codec="identity", dp_noise_multiplier=1.0,
            dp_clip=1.0,
        )  # fmt: skip
        r = upload(client, job_id, a, a_h, tiny_model(1))
        listing = client.get(f"{API}/jobs/{job_id}/artifacts", headers=ADMIN_H)

    assert r.status_code == 409 and "is private" in r.json()["detail"]
    assert listing.status_code == 200 and listing.json()["devices"] == []
