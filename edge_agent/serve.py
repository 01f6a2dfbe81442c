"""The inference-only agent: pull the latest consensus model and serve predictions locally.

``meshfl agent serve`` calls :func:`run_serve`. It needs numpy, httpx and onnxruntime
only — never torch (nothing on this path imports it) — so it runs where training cannot:

1. load the model cached in ``out`` by an earlier run, if any (it serves at once);
2. enrol as an *inference-only* device (profile ``role`` ``"inference"``: the coordinator
   never makes it a job participant), or use the admin token;
3. every ``poll_s`` seconds ask ``GET /jobs/{job}/artifacts/consensus.onnx`` with
   ``If-None-Match: "<sha256 held>"``; a new model is written to a temporary file,
   checked against its sha256, loaded, then renamed over ``out/consensus.onnx`` — the old
   model keeps answering until the new one has loaded. An unreachable coordinator is
   retried with exponential backoff (1 s doubling up to ``max(poll_s, 60)``) while the
   current model keeps serving;
4. answer on ``host:port`` (``127.0.0.1:8500`` by default; stdlib ``http.server``):

   - ``POST /predict`` ``{"inputs": [[x11, x12, ...], ...]}`` → ``{"labels": [...],
     "probabilities": [[...], ...], "model_sha256": ..., "job_id": ...}``; 400 with
     ``{"detail": "<one line>"}`` for a body that is not JSON (or nests too deeply),
     values that are not JSON numbers (strings, booleans, null) or inputs of the wrong
     shape, 422 if onnxruntime fails on them, 503 before a model is loaded;
   - ``GET /healthz`` → ``{"model_loaded": ..., "model_sha256", "job_id", "input_dim",
     "num_classes"}``, 200 with a model and 503 without.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import random
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from edge_agent.onnx_infer import OnnxModel
from edge_agent.rest import CoordinatorClient
from edge_agent.serve_http import ModelSlot, Served, make_server
from meshfl.errors import ConfigError, CoordinatorError, CoordinatorUnreachable, MeshflError

__all__ = ["ModelPoller", "ModelSlot", "ServeConfig", "Served", "make_server", "run_serve"]

log = logging.getLogger("meshfl.agent.serve")

MODEL_FILE = "consensus.onnx"
_META_FILE = "consensus.json"


@dataclass(frozen=True)
class ServeConfig:
    """What ``meshfl agent serve`` was asked to do.

    Exactly one of ``token`` (the fleet's enrolment token: enrol as an inference-only
    device) and ``admin_token`` is set. ``job`` is a job id or ``"latest"`` (the latest
    completed job with a consensus model). ``out`` keeps the downloaded model across
    restarts. ``poll_s`` seconds between checks for a new model; ``threads`` onnxruntime
    intra-op threads; ``max_request_bytes`` the largest ``/predict`` body (bytes).
    ``coordinator_ca``/``insecure_http``: as :class:`edge_agent.daemon.AgentConfig`'s.
    """

    coordinator: str
    token: str | None = None
    admin_token: str | None = None
    job: str = "latest"
    host: str = "127.0.0.1"
    port: int = 8500
    poll_s: float = 30.0
    out: Path = Path("meshfl-serve")
    name: str = "serve"
    threads: int = 1
    max_request_bytes: int = 16 << 20
    coordinator_ca: Path | None = None
    insecure_http: bool = False


class ModelPoller:
    """Keeps ``slot`` on the coordinator's newest consensus model of ``job``.

    Parameters
    ----------
    client
        The coordinator client, authenticated (admin token) or not yet (then ``enrol_token``
        enrols it as an inference-only device on the first poll).
    slot
        Where loaded models go.
    directory
        Where the model file and its ``consensus.json`` (job id, sha256) are kept.
    job
        Job id, or ``"latest"``.

    """

    def __init__(
        self,
        client: CoordinatorClient,
        slot: ModelSlot,
        directory: Path,
        job: str = "latest",
        *,
        enrol_token: str | None = None,
        name: str = "serve",
        threads: int | None = 1,
    ) -> None:
        self.client = client
        self.slot = slot
        self.directory = directory
        self.job = job
        self.enrol_token = enrol_token
        self.name = name
        self.threads = threads
        self._last_problem = ""

    def load_cached(self) -> bool:
        """Serve the model an earlier run downloaded, if it is still there and intact."""
        try:
            meta = json.loads((self.directory / _META_FILE).read_text())
            model = OnnxModel(self.directory / MODEL_FILE, threads=self.threads)
        except (OSError, ValueError, MeshflError):
            return False
        if model.sha256 != meta.get("sha256"):
            return False
        self.slot.set(Served(model, str(meta.get("job_id", "")), model.sha256))
        log.info("serving the cached model of job %s (%s)", meta.get("job_id"), model.sha256[:12])
        return True

    def poll_once(self) -> str:
        """Check for a new model once.

        Returns ``"updated"`` (a new model now serves), ``"unchanged"``, ``"none"`` (the
        coordinator has no consensus for ``job`` yet, or refused: logged) or ``"failed"``
        (a corrupt download or a file onnxruntime cannot load: the old model stays).

        Raises
        ------
        meshfl.errors.CoordinatorUnreachable
            The coordinator did not answer (the caller backs off).
        meshfl.errors.ConfigError
            The enrolment token was refused, the admin or device token was refused
            (401/403), or ``job`` does not exist.

        """
        if self.client.device_token is None and self.enrol_token is not None:
            self._enrol()
        current = self.slot.get()
        try:
            got = self.client.get_consensus(self.job, None if current is None else current.sha256)
        except CoordinatorUnreachable:
            raise
        except CoordinatorError as exc:
            if exc.status in (401, 403):
                option = "--admin-token" if self.enrol_token is None else "--token"
                raise ConfigError(f"{exc}; check {option}") from None
            if self.job != "latest" and "does not exist" in str(exc):
                raise ConfigError(f"{exc}; check --job (meshfl job list)") from None
            self._note(str(exc))
            return "none"
        if got is None:
            return "unchanged"
        digest = hashlib.sha256(got.data).hexdigest()
        if got.sha256 and digest != got.sha256:
            self._note(f"the downloaded model's sha256 {digest[:12]} is not {got.sha256[:12]}")
            return "failed"
        if current is not None and digest == current.sha256 and got.job_id == current.job_id:
            return "unchanged"
        return "updated" if self._install(got.job_id, digest, got.data) else "failed"

    def first_poll(self) -> int:
        """Poll once at start; 1 if the coordinator was unreachable (logged), else 0.

        Raises :class:`~meshfl.errors.ConfigError` for a refused enrolment or admin
        token (so ``meshfl agent serve`` exits 2 at start instead of serving nothing).
        """
        try:
            self.poll_once()
        except CoordinatorUnreachable as exc:
            self._last_problem = str(exc)
            serving = "the cached model" if self.slot.get() is not None else "nothing yet"
            log.warning("%s; serving %s and retrying", exc, serving)
            return 1
        return 0

    def run(self, stop: threading.Event, poll_s: float, failures: int = 0) -> None:
        """Wait, poll, repeat until ``stop`` is set; back off while polls fail.

        The wait is ``poll_s`` seconds, or after ``failures`` failed polls in a row
        ``min(max(poll_s, 60), 2 ** (failures - 1))`` seconds with ±50 % jitter.
        """
        while not stop.wait(_delay(poll_s, failures)):
            try:
                outcome = self.poll_once()
            except MeshflError as exc:  # unreachable, or an enrolment refused meanwhile
                self._note(str(exc))
                outcome = "failed"
            failures = failures + 1 if outcome == "failed" else 0

    def _enrol(self) -> None:
        token = self.enrol_token or ""
        try:
            reply = self.client.enrol(
                token,
                self.name,
                {"role": "inference", "cores": os.cpu_count() or 1,
                 "platform": platform.platform()[:256]},
            )  # fmt: skip
        except CoordinatorUnreachable:
            raise
        except CoordinatorError as exc:
            raise ConfigError(str(exc)) from None
        log.info("enrolled as inference-only device %s", reply["device_id"])

    def _install(self, job_id: str, sha256: str, data: bytes) -> bool:
        """Write, load and only then rename and swap in a downloaded model."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{MODEL_FILE}-{secrets.token_hex(6)}.tmp"
        try:
            _write_synced(tmp, data)
            model = OnnxModel(tmp, threads=self.threads)
        except (OSError, MeshflError) as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self._note(f"cannot load job {job_id}'s consensus model ({exc}); keeping the old one")
            return False
        final = self.directory / MODEL_FILE
        os.replace(tmp, final)
        model.path = final
        meta = self.directory / f".{_META_FILE}.tmp"
        _write_synced(meta, json.dumps({"job_id": job_id, "sha256": sha256}).encode())
        os.replace(meta, self.directory / _META_FILE)
        self.slot.set(Served(model, job_id, sha256))
        self._last_problem = ""
        log.info("serving job %s's consensus model (%s, %d bytes)", job_id, sha256[:12], len(data))
        return True

    def _note(self, problem: str) -> None:
        """Log a problem once until it changes (a 30 s poll would repeat it forever)."""
        if problem != self._last_problem:
            log.warning("%s", problem)
            self._last_problem = problem


def _delay(poll_s: float, failures: int) -> float:
    if not failures:
        return poll_s
    return min(max(poll_s, 60.0), 2.0 ** (failures - 1)) * (0.5 + random.random())


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def run_serve(config: ServeConfig) -> None:
    """Serve predictions until interrupted (see the module docstring).

    Raises
    ------
    meshfl.errors.ConfigError
        Neither or both tokens given, a refused enrolment or admin token, or a port in
        use.

    """
    if (config.token is None) == (config.admin_token is None):
        raise ConfigError("pass either --token ENROL_TOKEN or --admin-token TOKEN (one of them)")
    if not config.poll_s > 0:
        raise ConfigError(f"--poll must be a positive number of seconds (got {config.poll_s})")
    client = CoordinatorClient(
        config.coordinator, retry_s=0.0, ca_file=config.coordinator_ca,
        insecure_http=config.insecure_http,
    )  # fmt: skip
    client.device_token = config.admin_token  # the bearer token of every request
    slot = ModelSlot()
    poller = ModelPoller(client, slot, config.out, config.job, enrol_token=config.token,
                         name=config.name, threads=config.threads)  # fmt: skip
    server = make_server(slot, config.host, config.port, config.max_request_bytes)
    stop = threading.Event()
    try:
        poller.load_cached()
        failures = poller.first_poll()  # a refused enrolment token fails here, at start
        thread = threading.Thread(
            target=poller.run,
            args=(stop, config.poll_s, failures),
            name="model-poller",
            daemon=True,
        )
        thread.start()
        host, port = server.server_address[:2]
        log.info("serving predictions on http://%s:%d (POST /predict, GET /healthz)", host, port)
        server.serve_forever(poll_interval=1.0)
    finally:
        stop.set()
        server.server_close()
        client.close()
