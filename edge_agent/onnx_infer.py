"""Inference with an exported meshfl model, using onnxruntime and numpy only (no torch).

A meshfl ONNX model (written by :func:`models.onnx.export_onnx`) has one input
``"input"`` float32 ``[batch, input_dim]`` and one output ``"logits"`` float32
``[batch, num_classes]``. This module is what ``meshfl predict`` and the inference-only
agent run; it works in an environment with ``pip install "meshfl[infer]"`` (numpy and
onnxruntime), and an import-linter contract keeps torch and :mod:`models` out of it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from meshfl.errors import ConfigError, DataError

__all__ = ["OnnxModel", "softmax"]

_INPUT = "input"
_OUTPUT = "logits"


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``(n, k)`` logits as float32 (max-subtracted, so no overflow)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    probabilities: np.ndarray = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    return probabilities


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as error:
        raise ConfigError(
            'onnxruntime is not installed; install it with pip install "meshfl[infer]"'
        ) from error
    return onnxruntime


class OnnxModel:
    """A meshfl classifier loaded from an ONNX file, run on the CPU by onnxruntime.

    Parameters
    ----------
    path : Path
        The ``.onnx`` file.
    threads : int or None, default None
        onnxruntime intra-op threads; ``None`` lets onnxruntime choose (one per core).

    Attributes
    ----------
    path : Path
    input_dim : int
        Features per sample (the model's ``"input"`` width).
    num_classes : int
        Width of the ``"logits"`` output.
    sha256 : str
        Hex SHA-256 of the file's bytes (identifies the exact model).

    Raises
    ------
    ConfigError
        onnxruntime is not installed; the file is missing or unreadable, not a valid ONNX
        model, or not shaped like a meshfl classifier (one float input ``"input"`` of
        fixed width, one output ``"logits"`` of fixed width, and a dynamic batch axis).

    """

    def __init__(self, path: Path, threads: int | None = None) -> None:
        self.path = Path(path)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError as error:
            raise ConfigError(
                f"{self.path}: no such model file; pass the path of a .onnx model "
                f"(meshfl writes model.onnx next to each device's model and consensus.onnx)"
            ) from error
        except OSError as error:
            raise ConfigError(
                f"{self.path}: cannot read the model file ({error.strerror}); check the path"
            ) from error
        self.sha256 = hashlib.sha256(data).hexdigest()
        ort = _import_onnxruntime()
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: no warnings on the console
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                data, sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:  # onnxruntime raises untyped errors for bad files
            raise ConfigError(
                f"{self.path}: not a valid ONNX model ({type(error).__name__}); "
                f"export it again with meshfl (models.onnx.export_onnx)"
            ) from error
        self.input_dim, self.num_classes = self._check_signature()

    def _check_signature(self) -> tuple[int, int]:
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        names = ([i.name for i in inputs], [o.name for o in outputs])
        if names != ([_INPUT], [_OUTPUT]) or inputs[0].type != "tensor(float)":
            raise ConfigError(
                f"{self.path}: not a meshfl classifier (inputs {names[0]}, outputs "
                f"{names[1]}; expected one float input 'input' and one output 'logits'); "
                f"export it with meshfl"
            )
        in_shape, out_shape = inputs[0].shape, outputs[0].shape
        batch = [s[0] for s in (in_shape, out_shape) if s and isinstance(s[0], int)]
        if batch:  # a meshfl export names its batch axis ("batch"); a number fixes it
            raise ConfigError(
                f"{self.path}: not a meshfl classifier: its batch axis is fixed at {batch[0]};"
                " export with a dynamic batch axis (models.onnx.export_onnx)"
            )
        widths = (in_shape[-1] if len(in_shape) == 2 else None,
                  out_shape[-1] if len(out_shape) == 2 else None)  # fmt: skip
        if not all(isinstance(w, int) and w > 0 for w in widths):
            raise ConfigError(
                f"{self.path}: input shape {in_shape} / output shape {out_shape} are not "
                f"[batch, features] / [batch, classes] of fixed width; export it with meshfl"
            )
        return int(widths[0]), int(widths[1])  # type: ignore[arg-type]

    def check_input(self, x: np.ndarray) -> np.ndarray:
        """``x`` as a C-contiguous float32 ``(n, input_dim)`` array.

        Arrays of more than two dimensions (e.g. ``(n, 8, 8)`` images) are flattened to
        ``(n, d)``; a 1-D array of length ``input_dim`` is one sample.

        Raises
        ------
        DataError
            Non-numeric values, or a width other than :attr:`input_dim`.

        """
        x = np.asarray(x)
        if x.dtype.kind not in "biuf":
            raise DataError(f"inputs have dtype {x.dtype}, not numbers; pass numeric features")
        if x.ndim == 1 and x.shape[0] == self.input_dim:
            x = x.reshape(1, -1)
        elif x.ndim > 2:
            x = x.reshape(x.shape[0], -1)
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            width = x.shape[1] if x.ndim == 2 else "no"
            raise DataError(
                f"inputs have {width} features per sample (shape {x.shape}) but the model "
                f"{self.path.name} takes {self.input_dim}; pass data of the model's width"
            )
        return np.ascontiguousarray(x, dtype=np.float32)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """float32 ``(n, num_classes)`` logits for ``x`` (see :meth:`check_input`).

        Raises
        ------
        DataError
            Inputs refused by :meth:`check_input`, or onnxruntime failing to run the
            model (one line naming the model and the error).

        """
        x = self.check_input(x)
        if x.shape[0] == 0:
            return np.zeros((0, self.num_classes), dtype=np.float32)
        try:
            (out,) = self._session.run([_OUTPUT], {_INPUT: x})
        except Exception as error:  # onnxruntime raises its own untyped errors
            text = " ".join(str(error).split())[:200]
            raise DataError(
                f"the model {self.path.name} failed on inputs of shape {x.shape}"
                f" ({type(error).__name__}: {text}); export it again with meshfl"
                " (models.onnx.export_onnx)"
            ) from None
        out = np.asarray(out, dtype=np.float32)
        if out.shape != (x.shape[0], self.num_classes):
            raise DataError(
                f"the model {self.path.name} returned logits of shape {out.shape} for"
                f" {x.shape[0]} inputs, not ({x.shape[0]}, {self.num_classes}); export it"
                " again with meshfl (models.onnx.export_onnx)"
            )
        return out

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Class labels and probabilities for ``x``.

        Parameters
        ----------
        x : numpy.ndarray
            ``(n, input_dim)`` numeric features (cast to float32; see
            :meth:`check_input`).

        Returns
        -------
        labels : numpy.ndarray
            int64 ``(n,)``: the argmax of the logits (the first index on ties, as
            ``torch.argmax`` on CPU).
        probabilities : numpy.ndarray
            float32 ``(n, num_classes)``: the softmax of the logits; rows sum to 1.

        Raises
        ------
        DataError
            Inputs of the wrong width or not numeric, or onnxruntime failing to run the
            model.

        """
        logits = self.logits(x)
        return logits.argmax(axis=1).astype(np.int64), softmax(logits)
