"""A finished job's model: written, exported to ONNX with a parity check, published.

None of these end the job: a full disk, a failed export or an unreachable coordinator
costs only the file or the upload, and the device's done report still goes out.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.resume import save_final_model
from meshfl.errors import MeshflError

if TYPE_CHECKING:
    from edge_agent.rest import CoordinatorClient
    from edge_agent.trainer import Trainer

__all__ = ["export_onnx", "publish_model", "save_and_export"]

log = logging.getLogger("meshfl.agent.job")


def save_and_export(
    trainer: Trainer, path: Path, x_test: np.ndarray
) -> tuple[str, str | None, float | None]:
    """Write the final model to ``path`` and, if that worked, ``model.onnx`` beside it.

    Parameters
    ----------
    trainer : Trainer
        The job's trainer, holding the final parameters.
    path : Path
        Where the model goes (``.../model.pt``); the ONNX file is ``path.with_name
        ("model.onnx")``.
    x_test : np.ndarray
        (n, d) float32 test inputs for the ONNX parity check.

    Returns
    -------
    tuple of (str, str or None, float or None)
        The model's absolute path (``""``: not written, the disk refused it), the ONNX
        file's absolute path and its parity (both ``None`` when not exported).

    """
    model_path = save_final_model(trainer, path)
    if not model_path:
        return model_path, None, None
    onnx_path, diff = export_onnx(trainer, path.with_name("model.onnx"), x_test)
    return model_path, onnx_path, diff


def export_onnx(
    trainer: Trainer, path: Path, x_test: np.ndarray
) -> tuple[str | None, float | None]:
    """Export the final model to ONNX and check parity; (None, None) if that fails.

    A failed export costs only the ONNX file: ``model.pt``/``model.npz`` are already
    written, and the done report still goes out (with nulls).
    """
    from models.onnx import PARITY_TOLERANCE

    try:
        diff = trainer.export_onnx(path, x_test)
    except Exception as error:  # any exporter/onnxruntime failure: keep the job's result
        log.warning("ONNX export of the final model failed (%s: %s)", type(error).__name__, error)
        return None, None
    if diff is not None and not math.isfinite(diff):
        log.warning("the ONNX model's logits are not finite; parity not reported")
        diff = None
    elif diff is not None and diff > PARITY_TOLERANCE:
        log.warning("ONNX parity %.3g exceeds %g", diff, PARITY_TOLERANCE)
    return str(path.resolve()), diff


def publish_model(client: CoordinatorClient, job_id: str, device_id: str, path: Path) -> None:
    """Upload the final ``model.onnx`` (a ``publish_model`` job); never raises.

    Transient failures are retried with backoff for the client's ``retry_s``; a
    refusal (too large, not ONNX) or an unreachable coordinator is logged: the model
    stays on the device and the job's result is unaffected.
    """
    try:
        reply = client.put_model(job_id, device_id, path.read_bytes())
    except (MeshflError, OSError) as exc:
        log.error("could not publish %s to the coordinator: %s", path, exc)
        return
    log.info("published %s (%d bytes, sha256 %s)", path, reply["size_bytes"] or 0,
             (reply["sha256"] or "")[:12])  # fmt: skip
