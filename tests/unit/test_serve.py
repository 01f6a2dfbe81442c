"""The inference-only agent: HTTP predictions, model polling and swaps, no torch."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_agent.onnx_infer import OnnxModel
from edge_agent.rest import CoordinatorClient
from edge_agent.serve import ModelPoller, ModelSlot, Served, make_server
from meshfl.errors import ConfigError, CoordinatorUnreachable

WIDTH, CLASSES = 4, 3


def meshfl_model(seed: int) -> bytes:
    """A linear classifier shaped like a meshfl export: "input" [batch, 4] → "logits"."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.normal(size=(CLASSES, WIDTH)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.normal(size=CLASSES).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w", "b"], ["logits"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [weight, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by older onnxruntime builds too
    return model.SerializeToString()


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(meshfl_model(1))
    return path


@pytest.fixture
def serving(model_file: Path) -> Iterator[tuple[str, ModelSlot]]:
    slot = ModelSlot()
    model = OnnxModel(model_file, threads=1)
    slot.set(Served(model, "job-1", model.sha256))
    server = make_server(slot, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", slot
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_predict_returns_onnx_models_labels_and_probabilities(
    serving: tuple[str, ModelSlot], model_file: Path
) -> None:
    url, _ = serving
    x = np.random.default_rng(0).normal(size=(16, WIDTH)).astype(np.float32)
    r = httpx.post(f"{url}/predict", json={"inputs": x.tolist()})
    assert r.status_code == 200, r.text
    labels, probabilities = OnnxModel(model_file).predict(x)
    body = r.json()
    assert body["labels"] == labels.tolist()
    np.testing.assert_allclose(body["probabilities"], probabilities, rtol=1e-6)
    assert body["model_sha256"] == hashlib.sha256(model_file.read_bytes()).hexdigest()
    assert body["job_id"] == "job-1"
    health = httpx.get(f"{url}/healthz")
    assert health.status_code == 200
    assert health.json()["model_loaded"] is True and health.json()["input_dim"] == WIDTH


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "not JSON"),
        (b'{"rows": [[1, 2, 3, 4]]}', "list of rows"),
        (b'{"inputs": [1, 2, 3, 4]}', "list of rows"),
        (b'{"inputs": [[1, 2, 3]]}', "must be 4 numbers"),
        (b'{"inputs": [[1, 2, 3, 4], [1, 2]]}', "different lengths"),
        (b'{"inputs": [["a", 2, 3, 4]]}', "some are not"),
        (b'{"inputs": [[NaN, 2, 3, 4]]}', "finite"),
        (b'{"inputs": [["1", 2, 3, 4]]}', "some are not"),
        (b'{"inputs": [[true, false, 3, 4]]}', "some are not"),
        (b'{"inputs": [[null, 2, 3, 4]]}', "some are not"),
        (b'{"inputs": [[[1], 2, 3, 4]]}', "some are not"),
        (b'{"inputs": [[' + b"7" * 5000 + b", 2, 3, 4]]}", "has 5000 digits"),
        (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests too deeply"),
    ],
)
def test_bad_requests_are_400_with_one_line(
    serving: tuple[str, ModelSlot], body: bytes, words: str
) -> None:
    url, _ = serving
    r = httpx.post(f"{url}/predict", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert words in r.json()["detail"] and "\n" not in r.json()["detail"]


def test_no_model_yet_is_503_and_unknown_paths_404() -> None:
    server = make_server(ModelSlot(), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert httpx.get(f"{url}/healthz").status_code == 503
        r = httpx.post(f"{url}/predict", json={"inputs": [[1, 2, 3, 4]]})
        assert r.status_code == 503 and "no model" in r.json()["detail"]
        assert httpx.get(f"{url}/nope").status_code == 404
        wrong_method = httpx.get(f"{url}/predict")
        assert wrong_method.status_code == 405 and "POST" in wrong_method.json()["detail"]
        assert httpx.post(f"{url}/nope", json={}).status_code == 404
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class FakeCoordinator:
    """The consensus endpoint, with ETag / If-None-Match, over httpx.MockTransport."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.job_id = "job-a"
        self.announced: str | None = None  # sha256 header; None: that of data
        self.seen: list[httpx.Request] = []
        self.token = "device-token"

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if request.url.path.endswith("/devices/enrol"):
            return httpx.Response(200, json={"device_id": "dev-1", "device_token": self.token,
                                             "fleet": "lab", "broker_url": None})  # fmt: skip
        if request.headers.get("authorization") not in (f"Bearer {self.token}", "Bearer admin"):
            return httpx.Response(403, json={"detail": "needs a token"})
        if self.data is None:
            return httpx.Response(404, json={"detail": "no completed job has a consensus model"})
        sha = hashlib.sha256(self.data).hexdigest()
        headers = {"ETag": f'"{sha}"', "X-Content-SHA256": self.announced or sha,
                   "X-Meshfl-Job-Id": self.job_id}  # fmt: skip
        if request.headers.get("if-none-match") == f'"{sha}"':
            return httpx.Response(304, headers=headers)
        return httpx.Response(200, content=self.data, headers=headers)


def poller_for(
    fake: FakeCoordinator | Callable[[httpx.Request], httpx.Response], directory: Path, **kw: str
) -> tuple[ModelPoller, ModelSlot]:
    handler = fake.handler if isinstance(fake, FakeCoordinator) else fake
    client = CoordinatorClient(
        "http://coordinator", retry_s=0.0, transport=httpx.MockTransport(handler)
    )
    if "enrol_token" not in kw:
        client.device_token = "admin"
    slot = ModelSlot()
    return ModelPoller(client, slot, directory, **kw), slot  # type: ignore[arg-type]


def test_poller_swaps_the_model_only_when_its_sha256_changes(tmp_path: Path) -> None:
    fake = FakeCoordinator()
    poller, slot = poller_for(fake, tmp_path / "serve")
    assert poller.poll_once() == "none" and slot.get() is None
    fake.data = meshfl_model(1)
    assert poller.poll_once() == "updated"
    first = slot.get()
    assert first is not None and first.sha256 == hashlib.sha256(fake.data).hexdigest()
    assert poller.poll_once() == "unchanged"
    assert fake.seen[-1].headers["if-none-match"] == f'"{first.sha256}"'
    fake.data, fake.job_id = meshfl_model(2), "job-b"
    assert poller.poll_once() == "updated"
    second = slot.get()
    assert second is not None and second.job_id == "job-b" and second.sha256 != first.sha256
    x = np.eye(WIDTH, dtype=np.float32)
    np.testing.assert_array_equal(
        second.model.predict(x)[1],
        OnnxModel(tmp_path / "serve" / "consensus.onnx").predict(x)[1],
    )
    # A corrupted download, then a file onnxruntime cannot load: the old model stays.
    fake.data, fake.announced = meshfl_model(3), "0" * 64
    assert poller.poll_once() == "failed" and slot.get() is second
    fake.data, fake.announced = b"garbage, not a model", None
    assert poller.poll_once() == "failed" and slot.get() is second
    assert sorted(p.name for p in (tmp_path / "serve").iterdir()) == [
        "consensus.json",
        "consensus.onnx",
    ]
    # A restarted agent serves the cached model before it reaches the coordinator.
    again, again_slot = poller_for(fake, tmp_path / "serve")
    assert again.load_cached()
    cached = again_slot.get()
    assert cached is not None and (cached.sha256, cached.job_id) == (second.sha256, "job-b")


def test_a_job_that_does_not_exist_is_a_config_error(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "job 'job-nope' does not exist"})

    poller, _ = poller_for(handler, tmp_path, job="job-nope")
    with pytest.raises(ConfigError, match=r"job-nope.*check --job"):
        poller.first_poll()
    latest, _ = poller_for(FakeCoordinator(), tmp_path)  # no consensus yet: keep polling
    assert latest.first_poll() == 0


@pytest.mark.parametrize("code", [401, 403])
def test_a_refused_admin_token_at_the_first_poll_is_a_config_error(
    tmp_path: Path, code: int
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(code, json={"detail": "unknown token"})

    poller, _ = poller_for(handler, tmp_path)
    with pytest.raises(ConfigError, match=r"unknown token; check --admin-token") as info:
        poller.first_poll()
    assert "\n" not in str(info.value)


def test_serve_with_a_wrong_admin_token_stops_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge_agent import serve as serve_module
    from edge_agent.serve import ServeConfig, run_serve

    client = CoordinatorClient(
        "http://coordinator", retry_s=0.0, transport=httpx.MockTransport(FakeCoordinator().handler)
    )
    monkeypatch.setattr(serve_module, "CoordinatorClient", lambda *a, **k: client)
    config = ServeConfig("http://coordinator", admin_token="WRONG", port=0, out=tmp_path)

    with pytest.raises(ConfigError, match=r"refused GET .*needs a token; check --admin-token"):
        run_serve(config)  # ConfigError: the CLI prints one line and exits 2


def test_poller_enrols_as_an_inference_only_device(tmp_path: Path) -> None:
    fake = FakeCoordinator()
    fake.data = meshfl_model(1)
    poller, _ = poller_for(fake, tmp_path, enrol_token="enrol-secret", name="kiosk")
    assert poller.poll_once() == "updated"
    enrol = json.loads(fake.seen[0].content)
    assert enrol["token"] == "enrol-secret" and enrol["name"] == "kiosk"
    assert enrol["profile"]["role"] == "inference"
    assert fake.seen[1].headers["authorization"] == "Bearer device-token"


def test_an_unreachable_coordinator_raises_and_keeps_the_model(tmp_path: Path) -> None:
    fake = FakeCoordinator()
    fake.data = meshfl_model(1)
    poller, slot = poller_for(fake, tmp_path)
    assert poller.poll_once() == "updated"
    served = slot.get()

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    poller.client = poller_for(down, tmp_path)[0].client
    with pytest.raises(CoordinatorUnreachable):
        poller.poll_once()
    assert slot.get() is served


def test_serve_runs_without_torch_on_a_cached_model(tmp_path: Path, model_file: Path) -> None:
    out = tmp_path / "serve"
    out.mkdir()
    data = model_file.read_bytes()
    (out / "consensus.onnx").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    (out / "consensus.json").write_text(json.dumps({"job_id": "job-9", "sha256": sha}))
    args = ["agent", "serve", "--coordinator", "http://127.0.0.1:9", "--admin-token", "x",
            "--port", "0", "--out", str(out), "--poll", "60"]  # fmt: skip
    code = (
        f"import sys; sys.modules['torch'] = None; from meshfl.app.cli import main; main({args!r})"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url, lines = None, []
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            match = re.search(r"serving predictions on (http://\S+)", line)
            if match:
                url = match[1]
                break
        assert url is not None, "".join(lines)
        r = httpx.post(f"{url}/predict", json={"inputs": [[1, 2, 3, 4], [0, 0, 0, 1]]})
        assert r.status_code == 200, r.text
        want, _ = OnnxModel(model_file).predict(np.array([[1, 2, 3, 4], [0, 0, 0, 1]]))
        assert r.json()["labels"] == want.tolist() and r.json()["job_id"] == "job-9"
        assert any("cannot reach the coordinator" in line for line in lines)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


def test_the_onnx_model_in_this_file_is_valid() -> None:
    onnx.checker.check_model(onnx.load_from_string(meshfl_model(0)))


def test_backoff_doubles_from_one_second_up_to_max_of_poll_and_a_minute() -> None:
    from edge_agent.serve import _delay

    assert _delay(30.0, 0) == 30.0
    for failures, base in ((1, 1.0), (2, 2.0), (5, 16.0), (7, 60.0), (30, 60.0)):
        assert all(0.5 * base <= _delay(30.0, failures) <= 1.5 * base for _ in range(50))
    assert all(_delay(300.0, 12) <= 1.5 * 300.0 for _ in range(50))
    assert all(_delay(300.0, 12) >= 0.5 * 300.0 for _ in range(50))
