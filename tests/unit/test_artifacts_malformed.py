"""A malformed ONNX initializer is a clear 422 once at upload, never a 500 at every listing
(issue 23, item 11)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from test_artifacts import ADMIN_H, API, Clock, clock, make_client, running_job, tiny_model, upload  # noqa: F401

from coordinator.consensus import ConsensusError, average_models, parse_model


def _malformed(name: str = "fc1.weight", raw: bytes = b"\0" * 8) -> bytes:
    """``tiny_model`` whose ``name`` initializer says [5, 4] float32 but holds ``raw``."""
    model = onnx.load_from_string(tiny_model(1))
    tensor = next(t for t in model.graph.initializer if t.name == name)
    tensor.raw_data = raw
    return model.SerializeToString()


@pytest.mark.parametrize(
    "data",
    [
        _malformed(),  # 2 floats for 20
        _malformed(raw=b"\0" * 81),  # not a whole number of float32
        _malformed("shape", b"\1\2\3"),  # the int64 constant, truncated
    ],
)
def test_a_malformed_initializer_is_one_422_and_listing_stays_200(
    tmp_path: Path,
    clock: Clock,  # noqa: F811
    data: bytes,
) -> None:
    with make_client(tmp_path, clock) as client:
        job_id, [(a, a_h), (b, b_h)] = running_job(client, clock)

        refused = upload(client, job_id, a, a_h, data)
        good = upload(client, job_id, b, b_h, tiny_model(2))
        listings = [client.get(f"{API}/jobs/{job_id}/artifacts", headers=ADMIN_H) for _ in "ab"]

    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert "malformed initializer" in detail and "\n" not in detail
    assert good.status_code == 200
    assert [r.status_code for r in listings] == [200, 200]
    assert [d["name"] for d in listings[0].json()["devices"]] == [b]


def test_a_stored_malformed_model_is_a_consensus_error_not_a_crash() -> None:
    # A file stored before uploads were checked: averaging refuses it by name.
    with pytest.raises(ConsensusError, match=r"malformed initializer 'fc1\.weight'"):
        average_models([("dev-a", tiny_model(1)), ("dev-b", _malformed())])
    with pytest.raises(ConsensusError, match="malformed initializer"):
        parse_model(_malformed(), "the upload")
