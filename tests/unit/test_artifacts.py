"""Model artifacts on the coordinator: uploads, auth, limits, and the consensus model."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from coordinator import CoordinatorSettings, create_app
from coordinator.consensus import ConsensusError, average_models
from edge_agent.secagg.crypto import IdentityKey

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

ENROL, ADMIN = "enrol-secret", "admin-secret"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
API = "/api/v1"
DONE = {"final_accuracy": 0.9, "bytes_sent": 1, "bytes_received": 2, "model_path": "m.pt"}


def tiny_model(
    seed: int, hidden: int = 5, inputs: int = 4, classes: int = 3, layers: str = "fc1,fc2"
) -> bytes:
    """A 2-layer MLP as ONNX (Gemm, Relu, Gemm, Softmax) plus an int64 shape constant.

    ``layers``: the two Linear layers' names ("0,2": those of the zoo's mlp state_dict).
    """
    rng = np.random.default_rng(seed)
    one, two = layers.split(",")
    weights = {
        f"{one}.weight": rng.normal(size=(hidden, inputs)).astype(np.float32),
        f"{one}.bias": rng.normal(size=hidden).astype(np.float32),
        f"{two}.weight": rng.normal(size=(classes, hidden)).astype(np.float32),
        f"{two}.bias": rng.normal(size=classes).astype(np.float32),
    }
    inits = [numpy_helper.from_array(a, name) for name, a in weights.items()]
    inits.append(numpy_helper.from_array(np.array([-1, inputs], np.int64), "shape"))
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", f"{one}.weight", f"{one}.bias"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", f"{two}.weight", f"{two}.bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inputs])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def arrays(data: bytes) -> dict[str, np.ndarray]:
    model = onnx.load_from_string(data)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_client(tmp_path: Path, clock: Clock, **settings: Any) -> TestClient:
    config = CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}",
        fleet="lab",
        enrol_token=ENROL,
        admin_token=ADMIN,
        artifacts_dir=tmp_path / "artifacts",
        **settings,
    )
    return TestClient(create_app(config, clock=clock))


@pytest.fixture
def client(tmp_path: Path, clock: Clock) -> Iterator[TestClient]:
    with make_client(tmp_path, clock) as test_client:
        yield test_client


def enrol(client: TestClient, clock: Clock, name: str, **profile: Any) -> tuple[str, dict]:
    clock.now += 1.0
    body = {"token": ENROL, "name": name, "profile": profile}
    body["identity_key"] = IdentityKey.generate().public_b64  # as agents send: signed jobs
    r = client.post(f"{API}/devices/enrol", json=body)
    assert r.status_code == 200, r.text
    return r.json()["device_id"], {"Authorization": f"Bearer {r.json()['device_token']}"}


def job_spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "tiny",
        "model": {"name": "mlp", "input_dim": 4, "num_classes": 3, "hidden": [5]},
        "algorithm": "choco",
        "codec": "topk:0.5",
        "topology": "ring",
        "rounds": 2,
        "learning_rate": 0.1,
        "batch_size": 8,
        "local_epochs": 1,
        "consensus_step": 0.5,
        "round_deadline_s": 30.0,
        "max_payload_bytes": 131072,
        "seed": 0,
        "devices": 2,
        "test_data": None,
        "sketch_dim": 0,
        "publish_model": True,
    }
    body.update(overrides)
    return body


def running_job(
    client: TestClient, clock: Clock, **overrides: Any
) -> tuple[str, list[tuple[str, dict]]]:
    devices = [enrol(client, clock, f"pi-{k}") for k in range(2)]
    r = client.post(f"{API}/jobs", json=job_spec(**overrides), headers=ADMIN_H)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    assert client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H).status_code == 200
    return job_id, devices


def upload(
    client: TestClient, job_id: str, device: str, headers: dict, data: bytes, sha: str | None = None
) -> Any:
    digest = hashlib.sha256(data).hexdigest() if sha is None else sha
    return client.put(
        f"{API}/jobs/{job_id}/devices/{device}/model",
        content=data,
        headers={**headers, "X-Content-SHA256": digest, "Content-Type": "application/octet-stream"},
    )


def test_only_the_device_itself_may_upload_its_model(client: TestClient, clock: Clock) -> None:
    job_id, [(a, a_h), (_, b_h)] = running_job(client, clock)
    outsider, outsider_h = enrol(client, clock, "pi-9")
    data = tiny_model(1)
    assert upload(client, job_id, a, {}, data).status_code == 401
    assert upload(client, job_id, a, ADMIN_H, data).status_code == 403
    assert upload(client, job_id, a, b_h, data).status_code == 403  # b's token, a's path
    refused = upload(client, job_id, outsider, outsider_h, data)
    assert refused.status_code == 403 and "does not take part" in refused.json()["detail"]
    ok = upload(client, job_id, a, a_h, data)
    assert ok.status_code == 200, ok.text
    assert ok.json()["sha256"] == hashlib.sha256(data).hexdigest()
    assert ok.json()["size_bytes"] == len(data) and ok.json()["devices"] == [a]
    assert (Path(client.app.state.artifacts.root) / job_id / f"{a}.onnx").read_bytes() == data


def test_upload_is_refused_for_a_job_that_did_not_opt_in(client: TestClient, clock: Clock) -> None:
    job_id, [(a, a_h), _] = running_job(client, clock, publish_model=False)
    r = upload(client, job_id, a, a_h, tiny_model(1))
    assert r.status_code == 409 and "publish_model" in r.json()["detail"]


def test_upload_over_the_size_limit_is_413_declared_or_streamed(
    tmp_path: Path, clock: Clock
) -> None:
    data = tiny_model(1)
    with make_client(tmp_path, clock, max_model_bytes=len(data) - 1) as client:
        job_id, [(a, a_h), _] = running_job(client, clock)
        declared = upload(client, job_id, a, a_h, data)
        assert declared.status_code == 413 and "max_model_bytes" in declared.json()["detail"]
        chunks = iter([data[:100], data[100:]])  # no Content-Length: chunked transfer
        streamed = client.put(
            f"{API}/jobs/{job_id}/devices/{a}/model",
            content=chunks,
            headers={**a_h, "X-Content-SHA256": hashlib.sha256(data).hexdigest()},
        )
        assert streamed.status_code == 413
        root = tmp_path / "artifacts" / job_id
        assert not root.exists() or list(root.iterdir()) == []  # no temporary file left
        assert upload(client, job_id, a, a_h, tiny_model(1, hidden=2)).status_code == 200


def test_sha256_mismatch_or_missing_header_is_400(client: TestClient, clock: Clock) -> None:
    job_id, [(a, a_h), _] = running_job(client, clock)
    data = tiny_model(1)
    wrong = upload(client, job_id, a, a_h, data, sha="0" * 64)
    assert wrong.status_code == 400 and "SHA-256" in wrong.json()["detail"]
    missing = client.put(f"{API}/jobs/{job_id}/devices/{a}/model", content=data, headers=a_h)
    assert missing.status_code == 400 and "X-Content-SHA256" in missing.json()["detail"]
    listing = client.get(f"{API}/jobs/{job_id}/artifacts", headers=ADMIN_H).json()
    assert listing["devices"] == [] and listing["consensus"] is None


def test_a_body_that_is_not_onnx_is_422(client: TestClient, clock: Clock) -> None:
    job_id, [(a, a_h), _] = running_job(client, clock)
    r = upload(client, job_id, a, a_h, b"\x00not a model at all")
    assert r.status_code == 422 and "not an ONNX model" in r.json()["detail"]


@pytest.mark.parametrize(
    ("model", "words"),
    [
        (tiny_model(1, inputs=40), "input shape is ['batch', 40] but the job's model mlp (4→3"),
        (tiny_model(1, classes=4), "output shape is ['batch', 4]"),
        (tiny_model(1, hidden=6, layers="0,2"), "'0.weight' is [6, 4] but the job's model"),
    ],
)
def test_a_model_that_is_not_the_jobs_is_422(
    client: TestClient, clock: Clock, model: bytes, words: str
) -> None:
    job_id, [(a, a_h), _] = running_job(client, clock)

    r = upload(client, job_id, a, a_h, model)

    assert r.status_code == 422, r.text
    assert words in r.json()["detail"] and "\n" not in r.json()["detail"]
    assert list((Path(client.app.state.artifacts.root) / job_id).iterdir()) == []
    assert upload(client, job_id, a, a_h, tiny_model(1, layers="0,2")).status_code == 200


def test_consensus_is_exactly_the_mean_of_the_initializers(
    client: TestClient, clock: Clock
) -> None:
    job_id, [(a, a_h), (b, b_h)] = running_job(client, clock)
    models = {a: tiny_model(1), b: tiny_model(2)}
    for device, headers in ((a, a_h), (b, b_h)):
        assert upload(client, job_id, device, headers, models[device]).status_code == 200
    r = client.get(f"{API}/jobs/{job_id}/artifacts/consensus.onnx", headers=ADMIN_H)
    assert r.status_code == 200 and r.headers["x-meshfl-job-id"] == job_id
    assert r.headers["etag"] == f'"{hashlib.sha256(r.content).hexdigest()}"'
    got, first, second = arrays(r.content), arrays(models[a]), arrays(models[b])
    for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
        want = np.mean([first[name], second[name]], axis=0, dtype=np.float64).astype(np.float32)
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], want)
    np.testing.assert_array_equal(got["shape"], first["shape"])  # int64 constant kept
    meta = {p.key: p.value for p in onnx.load_from_string(r.content).metadata_props}
    assert meta["meshfl.consensus_of"] == ",".join(sorted([a, b]))
    again = client.get(
        f"{API}/jobs/{job_id}/artifacts/consensus.onnx",
        headers={**ADMIN_H, "If-None-Match": r.headers["etag"]},
    )
    assert again.status_code == 304 and again.content == b""


def test_average_models_refuses_different_graphs_naming_both_devices() -> None:
    with pytest.raises(ConsensusError, match=r"dev-a's and device dev-b's.*fc1.weight"):
        average_models([("dev-a", tiny_model(1)), ("dev-b", tiny_model(2, hidden=6))])
    with pytest.raises(ConsensusError, match="no device model"):
        average_models([])


def test_structure_mismatch_shows_in_the_listing_and_consensus_is_409(
    client: TestClient, clock: Clock
) -> None:
    job_id, [(a, a_h), (b, b_h)] = running_job(client, clock)
    assert upload(client, job_id, a, a_h, tiny_model(1)).status_code == 200
    assert upload(client, job_id, b, b_h, tiny_model(2, hidden=6)).status_code == 200
    consensus = client.get(f"{API}/jobs/{job_id}/artifacts", headers=ADMIN_H).json()["consensus"]
    assert consensus["sha256"] is None and consensus["devices"] == sorted([a, b])
    assert "cannot average" in consensus["error"] and "fc1.weight" in consensus["error"]
    r = client.get(f"{API}/jobs/{job_id}/artifacts/consensus.onnx", headers=ADMIN_H)
    assert r.status_code == 409 and "cannot average" in r.json()["detail"]


def test_listing_device_files_latest_and_rebuild_after_a_new_upload(
    client: TestClient, clock: Clock
) -> None:
    job_id, [(a, a_h), (b, b_h)] = running_job(client, clock)
    latest = f"{API}/jobs/latest/artifacts/consensus.onnx"
    assert client.get(latest, headers=a_h).status_code == 404  # nothing finished yet
    assert upload(client, job_id, a, a_h, tiny_model(1)).status_code == 200
    listing = client.get(f"{API}/jobs/{job_id}/artifacts", headers=ADMIN_H).json()
    assert [d["name"] for d in listing["devices"]] == [a]
    assert listing["consensus"]["devices"] == [a]
    only_a = listing["consensus"]["sha256"]
    assert upload(client, job_id, b, b_h, tiny_model(2)).status_code == 200
    for headers in (a_h, b_h):
        assert (
            client.post(f"{API}/jobs/{job_id}/done", json=DONE, headers=headers).status_code == 204
        )
    listing = client.get(f"{API}/jobs/{job_id}/artifacts", headers=ADMIN_H).json()
    assert listing["status"] == "completed"
    assert [d["name"] for d in listing["devices"]] == sorted([a, b])
    assert listing["consensus"]["devices"] == sorted([a, b])
    assert listing["consensus"]["sha256"] not in (None, only_a)
    # A device of the fleet may read the consensus (here by "latest"), not device files.
    r = client.get(latest, headers=b_h)
    assert r.status_code == 200 and r.headers["x-meshfl-job-id"] == job_id
    assert hashlib.sha256(r.content).hexdigest() == listing["consensus"]["sha256"]
    assert client.get(latest, headers={"Authorization": "Bearer nope"}).status_code == 403
    device_file = f"{API}/jobs/{job_id}/artifacts/{a}.onnx"
    assert client.get(device_file, headers=b_h).status_code == 403
    assert client.get(device_file, headers=ADMIN_H).content == tiny_model(1)
    assert client.get(f"{API}/jobs/{job_id}/artifacts", headers=a_h).status_code == 403
    missing = client.get(f"{API}/jobs/{job_id}/artifacts/dev-none.onnx", headers=ADMIN_H)
    assert missing.status_code == 404


def test_an_inference_only_device_is_never_a_participant(client: TestClient, clock: Clock) -> None:
    enrol(client, clock, "serve", role="inference")
    trainer, _ = enrol(client, clock, "pi-0")
    job_id = client.post(f"{API}/jobs", json=job_spec(devices=0), headers=ADMIN_H).json()["job_id"]
    started = client.post(f"{API}/jobs/{job_id}/start", headers=ADMIN_H).json()
    assert [d["device_id"] for d in started["devices"]] == [trainer]
    bad = client.post(
        f"{API}/devices/enrol", json={"token": ENROL, "name": "x", "profile": {"role": "boss"}}
    )
    assert bad.status_code == 422 and "role" in bad.json()["detail"]


# --- agent side ---------------------------------------------------------------------------


def test_the_agent_uploads_with_the_digest_and_a_refusal_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import httpx

    from edge_agent.final_model import publish_model
    from edge_agent.rest import CoordinatorClient

    seen: list[httpx.Request] = []
    answer = {"code": 200}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if answer["code"] != 200:
            return httpx.Response(answer["code"], json={"detail": "the model is over 10 bytes"})
        body = {"name": "dev-a", "sha256": hashlib.sha256(request.content).hexdigest(),
                "size_bytes": len(request.content), "created_at": 1.0, "devices": ["dev-a"],
                "error": None}  # fmt: skip
        return httpx.Response(200, json=body)

    client = CoordinatorClient("http://c", retry_s=0.0, transport=httpx.MockTransport(handler))
    client.device_token = "device-token"
    path = tmp_path / "model.onnx"
    path.write_bytes(tiny_model(1))
    with caplog.at_level("INFO", logger="meshfl.agent.job"):
        publish_model(client, "job-1", "dev-a", path)
        answer["code"] = 413
        publish_model(client, "job-1", "dev-a", path)
        publish_model(client, "job-1", "dev-a", tmp_path / "missing.onnx")
    request = seen[0]
    assert request.method == "PUT" and request.url.path == "/api/v1/jobs/job-1/devices/dev-a/model"
    assert request.headers["x-content-sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert request.headers["authorization"] == "Bearer device-token"
    assert "published" in caplog.text
    assert "could not publish" in caplog.text and "over 10 bytes" in caplog.text
    assert len(seen) == 2  # a refusal is not retried; a missing file sends nothing
