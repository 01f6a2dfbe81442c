"""``meshfl predict``: run an exported ONNX model on a data file with onnxruntime alone.

Nothing on this path imports torch: it works in an install with
``pip install "meshfl[infer]"`` (numpy and onnxruntime).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["predict"]


def predict(
    model: Annotated[Path, typer.Option(help="The .onnx model (model.onnx, consensus.onnx).")],
    input: Annotated[
        Path, typer.Option(help=".npz (x, optional y) or .csv (features, optional label).")
    ],
    output: Annotated[
        Path | None,
        typer.Option(help="Write predictions to this .csv or .npz (default: CSV on stdout)."),
    ] = None,
    label_column: Annotated[
        str | None,
        typer.Option(help="CSV: the label column (default: 'label' if the header has one)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON summary on stdout.")
    ] = False,
) -> None:
    """Predict the class of every sample of INPUT with MODEL (onnxruntime, no torch).

    Prints the accuracy when INPUT has labels. Predictions (the argmax class and the
    softmax probabilities) go to --output, or as CSV to stdout (the summary then goes
    to stderr).
    """
    from edge_agent.onnx_infer import OnnxModel
    from edge_agent.predict import accuracy, read_inputs, write_predictions
    from meshfl.errors import DataError

    onnx = OnnxModel(model)
    x, y = read_inputs(input, label_column)
    try:
        labels, probabilities = onnx.predict(x)
    except DataError as error:
        raise DataError(f"{input}: {error}") from None
    acc = None if y is None else accuracy(labels, y)
    if output is not None:
        write_predictions(output, labels, probabilities, y)
    if as_json:
        summary: dict[str, Any] = {
            "model": str(model), "sha256": onnx.sha256, "input": str(input),
            "samples": int(x.shape[0]), "input_dim": onnx.input_dim,
            "num_classes": onnx.num_classes, "accuracy": acc,
            "output": None if output is None else str(output),
        }  # fmt: skip
        if output is None:
            summary["predictions"] = labels.tolist()
        typer.echo(json.dumps(summary))
        return
    if output is None:
        sys.stdout.write(write_predictions(None, labels, probabilities, y) or "")
    lines = [f"{x.shape[0]} samples, model {model} ({onnx.sha256[:12]})"]
    if output is not None:
        lines.append(f"predictions written to {output}")
    if acc is not None:
        correct = int((labels == y).sum())
        lines.append(f"accuracy {acc:.4f} ({correct}/{x.shape[0]})")
    typer.echo("\n".join(lines), err=output is None)
