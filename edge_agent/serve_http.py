"""The inference-only agent's HTTP server: ``POST /predict`` and ``GET /healthz``.

Stdlib ``http.server`` (a ``ThreadingHTTPServer``; agents carry no web framework) over a
:class:`ModelSlot`, the model being served, which :mod:`edge_agent.serve`'s poller swaps
when a new consensus model has loaded. Request and answer formats are in
:mod:`edge_agent.serve`'s docstring; every error is ``{"detail": "<one line>"}``.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from edge_agent.onnx_infer import OnnxModel
from meshfl.errors import ConfigError, MeshflError

__all__ = ["ModelSlot", "Served", "make_server"]

log = logging.getLogger("meshfl.agent.serve")


@dataclass(frozen=True)
class Served:
    """A loaded model and where it came from."""

    model: OnnxModel
    job_id: str
    sha256: str


class ModelSlot:
    """The model being served; readers get the current one, a swap is atomic."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._served: Served | None = None

    def get(self) -> Served | None:
        """The current model, or ``None`` before the first one loaded."""
        with self._lock:
            return self._served

    def set(self, served: Served) -> None:
        """Serve ``served`` from now on (requests in flight finish on the old model)."""
        with self._lock:
            self._served = served


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    slot: ModelSlot
    max_request_bytes: int


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/predict":
            self._reply(405, {"detail": 'POST /predict with {"inputs": [[...], ...]}'})
            return
        if self.path.split("?")[0] != "/healthz":
            self._reply(404, {"detail": f"no such path {self.path[:100]!r}; use /healthz"})
            return
        served = self.server.slot.get()
        if served is None:
            self._reply(503, {"model_loaded": False, "model_sha256": None, "job_id": None})
            return
        self._reply(
            200,
            {"model_loaded": True, "model_sha256": served.sha256, "job_id": served.job_id,
             "input_dim": served.model.input_dim, "num_classes": served.model.num_classes},
        )  # fmt: skip

    def do_POST(self) -> None:
        if self.path.split("?")[0] != "/predict":
            self._reply(404, {"detail": f"no such path {self.path[:100]!r}; POST /predict"})
            return
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self._reply(411, {"detail": "send a Content-Length header with the JSON body"})
            self.close_connection = True
            return
        if int(length) > self.server.max_request_bytes:
            self._reply(413, {"detail": f"body over {self.server.max_request_bytes} bytes;"
                                        " send fewer inputs per request"})  # fmt: skip
            self.close_connection = True
            return
        body = self.rfile.read(int(length))
        served = self.server.slot.get()
        if served is None:
            self._reply(503, {"detail": "no model loaded yet; wait for the coordinator's first"
                                        " consensus model (GET /healthz)"})  # fmt: skip
            return
        try:
            x = _inputs(body, served.model.input_dim)
        except ValueError as exc:
            self._reply(400, {"detail": str(exc)})
            return
        try:
            labels, probabilities = served.model.predict(x)
        except MeshflError as exc:  # onnxruntime failed on these inputs: one line, no drop
            self._reply(422, {"detail": str(exc)})
            return
        self._reply(
            200,
            {"labels": labels.tolist(), "probabilities": probabilities.tolist(),
             "model_sha256": served.sha256, "job_id": served.job_id},
        )  # fmt: skip

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


_MAX_DIGITS = 400
"""Longest JSON integer accepted (float32 overflows at 39 digits; Python refuses > 4300)."""


class _TooLong(ValueError):
    pass


def _parse_int(text: str) -> float:
    """JSON integers as floats; an absurdly long one gets our message, not Python's."""
    if len(text) > _MAX_DIGITS:
        raise _TooLong(f"an input number has {len(text)} digits; send float32 values")
    return float(text)


def _inputs(body: bytes, width: int) -> np.ndarray:
    """Parse ``{"inputs": [[...], ...]}`` into float32 ``(n, width)``; ValueError: one line.

    Every value must be a JSON number: strings, booleans, null and nested lists are
    refused, as are bodies nested too deeply for the parser.
    """
    try:
        payload = json.loads(body, parse_int=_parse_int)
    except _TooLong as exc:
        raise ValueError(str(exc)) from None
    except RecursionError:
        raise ValueError('the body nests too deeply; send {"inputs": [[x1, ...], ...]}') from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f'the body is not JSON ({exc}); send {{"inputs": [[...]]}}') from None
    except ValueError:  # any other refusal of the parser, in our own words
        raise ValueError('the body is not valid JSON; send {"inputs": [[...]]}') from None
    rows = payload.get("inputs") if isinstance(payload, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise ValueError('send {"inputs": [[x1, x2, ...], ...]}: a list of rows of numbers')
    lengths = {len(r) for r in rows}
    if lengths - {width}:
        got = "rows of different lengths" if len(lengths) > 1 else f"rows of {lengths.pop()}"
        raise ValueError(f"each input row must be {width} numbers (the model's width); got {got}")
    if not all(type(v) is float for row in rows for v in row):  # ints were parsed as floats
        raise ValueError(
            f"each input row must be {width} numbers; some are not (strings, booleans,"
            " null or lists)"
        )
    x = np.asarray(rows, dtype=np.float32).reshape(len(rows), width)
    if not np.isfinite(x).all():
        raise ValueError("inputs must be finite numbers (no NaN or infinity)")
    return x


def make_server(
    slot: ModelSlot, host: str, port: int, max_request_bytes: int = 16 << 20
) -> ThreadingHTTPServer:
    """Bind the prediction server (``port`` 0: any free port; see ``server_address``)."""
    try:
        server = _Server((host, port), _Handler)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port"
        ) from None
    server.slot = slot
    server.max_request_bytes = max_request_bytes
    return server
