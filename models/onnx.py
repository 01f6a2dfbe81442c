"""ONNX export of a zoo model and its parity check against torch.

Every meshfl model maps float32 ``(n, input_dim)`` inputs to ``(n, num_classes)`` logits;
the exported graph keeps that contract: one input ``"input"`` float32
``[batch, input_dim]`` with a dynamic batch axis, one output ``"logits"`` float32
``[batch, num_classes]``.

Exporter choice (torch 2.2–2.x): the TorchScript-based exporter
(``torch.onnx.export(..., dynamo=False)``) is used first. It needs neither ``onnxscript``
nor ``torch.export``, exports a zoo model in ~0.1 s (the ``torch.export``-based exporter
takes ~2 s on the same CPU) and writes the same bytes for the same weights. torch ≥ 2.9
marks it deprecated; where it is missing or fails, the ``torch.export``-based exporter
(``dynamo=True``, needs ``onnxscript``) is used instead. Both give max |Δlogit| < 1e-6
on the zoo models (checked by ``tests/unit/test_onnx.py``).

Reading and running an exported model needs only numpy and onnxruntime: see
:mod:`edge_agent.onnx_infer`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import select
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from meshfl.errors import ConfigError, DataError
from meshfl.files import atomic_write

__all__ = [
    "INPUT_NAME",
    "OPSET",
    "OUTPUT_NAME",
    "PARITY_TOLERANCE",
    "export_checked",
    "export_onnx",
    "parity",
]

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
#: ONNX opset written by :func:`export_onnx` (onnxruntime ≥ 1.14 runs it).
OPSET = 18
#: Largest max |logit(torch) − logit(onnxruntime)| accepted as parity (issue 8).
PARITY_TOLERANCE = 1e-5

Exporter = Literal["auto", "torchscript", "dynamo"]

_EXPORT_LOCK = threading.Lock()
"""One export at a time per process: torch's exporters keep module-global state, and
:func:`_quiet_exporter` changes the process's warning filters and logger levels (agents
that are threads of one process, :mod:`edge_agent.fleet`, export concurrently)."""


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    # The exporters warn about their own deprecations and log progress; neither concerns
    # the user of a finished export, and the test suite turns warnings into errors.
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxscript")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def _export_torchscript(module: nn.Module, example: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.onnx.export(
        module,
        (example,),
        buffer,  # type: ignore[arg-type]  # the TorchScript exporter takes a file object
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        opset_version=OPSET,
        do_constant_folding=True,
        dynamo=False,
    )
    return buffer.getvalue()


def _export_dynamo(module: nn.Module, example: torch.Tensor) -> bytes:
    program = torch.onnx.export(
        module,
        (example,),
        None,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_shapes=({0: torch.export.Dim("batch")},),
        opset_version=OPSET,
        dynamo=True,
        verbose=False,
    )
    if program is None:  # pragma: no cover - torch always returns the program here
        raise ConfigError("torch.onnx.export returned no ONNX program; upgrade torch")
    data: bytes = program.model_proto.SerializeToString()
    return data


def export_bytes(module: nn.Module, input_dim: int, exporter: Exporter = "auto") -> bytes:
    """Serialise ``module`` to an ONNX model in memory (see :func:`export_onnx`)."""
    if isinstance(input_dim, bool) or not isinstance(input_dim, int) or input_dim < 1:
        raise ConfigError(f"input_dim must be a positive integer, got {input_dim!r}")
    with _EXPORT_LOCK:
        return _export_unlocked(module, input_dim, exporter)


def _export_unlocked(module: nn.Module, input_dim: int, exporter: Exporter = "auto") -> bytes:
    was_training = module.training
    module.eval()
    # Batch 2, not 1: a batch of 1 lets an exporter specialise the batch axis away.
    example = torch.zeros(2, input_dim, dtype=torch.float32)
    try:
        with _quiet_exporter(), torch.no_grad():
            if exporter == "dynamo":
                return _export_dynamo(module, example)
            try:
                return _export_torchscript(module, example)
            except Exception:
                if exporter == "torchscript":
                    raise
                return _export_dynamo(module, example)
    finally:
        module.train(was_training)


def export_onnx(
    module: nn.Module, path: Path, input_dim: int, *, exporter: Exporter = "auto"
) -> Path:
    """Export ``module`` to the ONNX file ``path`` (written atomically).

    Parameters
    ----------
    module : torch.nn.Module
        A model mapping float32 ``(n, input_dim)`` to ``(n, num_classes)`` logits. It is
        exported in eval mode and put back in the mode it was in; its weights are not
        changed.
    path : Path
        Destination (conventionally ``*.onnx``). Parent folders are created; the file is
        written to a temporary name and renamed, so a reader never sees half a model.
    input_dim : int
        Features per sample, the width of the ``"input"`` tensor.
    exporter : {"auto", "torchscript", "dynamo"}, default "auto"
        ``"auto"``: the TorchScript exporter, or the ``torch.export``-based one where the
        former is missing or fails (see the module docstring).

    Returns
    -------
    Path
        ``path``. The model has input ``"input"`` float32 ``[batch, input_dim]`` and output
        ``"logits"`` float32 ``[batch, num_classes]``, opset :data:`OPSET`; the same
        weights give the same bytes.

    Raises
    ------
    ConfigError
        ``input_dim`` is not a positive integer.
    Exception
        Whatever the exporter raises for a module it cannot convert (torch's errors are
        passed on unchanged: they name the operator).

    """
    data = export_bytes(module, input_dim, exporter)
    return atomic_write(path, lambda handle: handle.write(data))


def torch_logits(module: nn.Module, x: np.ndarray) -> np.ndarray:
    """Logits of ``module`` in eval mode under ``torch.no_grad``: float32 ``(n, k)``."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
    finally:
        module.train(was_training)
    return np.asarray(out.detach().cpu().numpy(), dtype=np.float32)


def parity(module: nn.Module, onnx_path: Path, x: np.ndarray) -> float:
    """Largest absolute difference of the logits of torch and onnxruntime on ``x``.

    Parameters
    ----------
    module : torch.nn.Module
        The model that was exported (run in eval mode, under ``torch.no_grad``).
    onnx_path : Path
        Its ONNX export (from :func:`export_onnx`).
    x : numpy.ndarray
        float32 (cast if not) ``(n, input_dim)`` inputs, ``n >= 1``.

    Returns
    -------
    float
        ``max |logits_torch − logits_onnxruntime|`` over all ``n × num_classes`` entries
        (0.0 for identical outputs). Issue 8 requires ≤ :data:`PARITY_TOLERANCE`; this
        function only measures. NaN in either output gives ``inf``.

    Raises
    ------
    DataError
        ``x`` is not a non-empty 2-D array.
    ConfigError
        onnxruntime cannot load or run ``onnx_path`` (e.g. ``x`` of the wrong width).

    """
    import onnxruntime

    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0:
        raise DataError(f"parity needs a non-empty (n, d) input, got shape {x.shape}")
    try:
        session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        (got,) = session.run([OUTPUT_NAME], {INPUT_NAME: x})
    except Exception as error:  # onnxruntime raises its own untyped errors
        raise ConfigError(
            f"{onnx_path}: onnxruntime cannot run this model ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); re-export it"
        ) from error
    expected = torch_logits(module, x)
    got = np.asarray(got)
    if expected.shape != got.shape:
        raise ConfigError(
            f"{onnx_path}: ONNX logits have shape {got.shape}, torch's {expected.shape}; "
            f"re-export the model"
        )
    diff = np.abs(expected.astype(np.float64) - got.astype(np.float64))
    if not np.all(np.isfinite(diff)):
        return float("inf")
    return float(diff.max())


CHILD_TIMEOUT_S = 300.0
"""How long :func:`export_checked` waits for its child (seconds) before killing it."""


def export_checked(
    module: nn.Module,
    path: Path,
    input_dim: int,
    x: np.ndarray | None = None,
    *,
    isolate: bool = True,
) -> float | None:
    """Export ``module`` to ``path`` and measure its parity on ``x``, in a short child.

    The exporter and onnxruntime need tens of MiB (issue 24, item 5: the agent's peak RSS
    grew by about 60 MiB at its end-of-job export). With ``isolate`` they run in a
    child forked for the purpose, which writes the file, sends back the parity as one
    JSON line and exits, so the caller keeps none of that memory and imports neither
    onnxruntime nor its threads. The child is single-threaded, shares the model's pages
    copy-on-write and runs no torch operation in parallel: the caller forks only from the
    main thread (an agent of ``meshfl agent run``; the agents of ``meshfl agent fleet``
    are threads that may be training while another exports, so they export in-process),
    when torch runs one intra-op thread (``torch.get_num_threads() == 1``, the agent's
    default), and holds the export lock while forking. Otherwise, or where ``fork`` is
    missing or the child dies without an answer, the export runs in this process.

    Parameters
    ----------
    module, path, input_dim
        As :func:`export_onnx`.
    x : numpy.ndarray, optional
        ``(n, input_dim)`` inputs for :func:`parity`; None or empty: no parity.
    isolate : bool, default True
        Run in a forked child (see above).

    Returns
    -------
    float or None
        :func:`parity` on ``x``; None without ``x``.

    Raises
    ------
    ConfigError
        As :func:`export_onnx` and :func:`parity`.
    RuntimeError
        The exporter failed in the child (its error type and message).

    """
    check = x is not None and len(x) > 0
    alone = threading.current_thread() is threading.main_thread()  # not a fleet's agent
    if not (isolate and alone and hasattr(os, "fork")) or torch.get_num_threads() != 1:
        export_onnx(module, path, input_dim)
        return parity(module, path, x) if check and x is not None else None
    if isinstance(input_dim, bool) or not isinstance(input_dim, int) or input_dim < 1:
        raise ConfigError(f"input_dim must be a positive integer, got {input_dim!r}")
    answer = _in_child(module, Path(path), input_dim, x if check else None)
    if answer is None:  # the child died without a word: do it here
        export_onnx(module, path, input_dim)
        return parity(module, path, x) if check and x is not None else None
    if "error" in answer:
        kind = ConfigError if answer["error"] == "ConfigError" else RuntimeError
        raise kind(f"{answer['error']}: {answer['message']}" if kind is RuntimeError
                   else answer["message"])  # fmt: skip
    diff = answer["diff"]
    return None if diff is None else float(diff)  # type: ignore[arg-type]


def _in_child(
    module: nn.Module, path: Path, input_dim: int, x: np.ndarray | None
) -> dict[str, object] | None:
    """Fork, export and check in the child; its JSON answer, or None if it gave none."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    with _EXPORT_LOCK:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child (its answer is what is tested)
            os.close(read_fd)
            try:
                try:
                    data = _export_unlocked(module, input_dim)
                    atomic_write(path, lambda handle: handle.write(data))
                    diff = None if x is None else parity(module, path, x)
                    message: dict[str, object] = {"diff": diff}
                except Exception as error:
                    message = {"error": type(error).__name__, "message": str(error)}
                os.write(write_fd, json.dumps(message).encode())
            finally:
                os._exit(0)
    os.close(write_fd)
    data = b""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([read_fd], [], [], left)
            if not ready:
                break
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            data += chunk
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(read_fd)
        if not data:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not data:
        return None
    answer: dict[str, object] = json.loads(data)
    return answer
