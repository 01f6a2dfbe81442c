"""The pooled reference of a local run: the job's model trained centrally on all its data.

Issue 22's promise is that decentralized, compressed, private learning ends where pooled
training ends. ``meshfl local`` has every device's data on this machine, so it can say
how far the fleet got from that reference: the same model (the job's seed), learning
rate, batch size and local momentum β (as heavy ball, the centralized optimizer, even
where the job runs quasi-global momentum), trained with minibatch steps on the union of
the devices' training files for ``rounds × local_epochs`` epochs (the fleet passes over
all training data once a round), evaluated on the same test set. The reference is not
private (no DP-SGD, no noise) whatever the job's privacy options: it is what the data
allows without any of meshfl's constraints. The launcher computes it from the data
files it wrote itself; nothing from the devices enters it, so a private job's report
carries it too (its consensus model, built from the devices' models, it does not).

It is trained only when it is cheap: at most :data:`MAX_SAMPLE_EPOCHS` training samples
× epochs (W1: 1,437 × 30 = 43,110, about a second of CPU). It runs in a child of the
agents' fork server (torch already imported there) beside the end-of-job ONNX check, so
it adds no wall time to a run on two cores; without the fork server it runs here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshfl.contract import JobSpec, ModelSpec
from meshfl.errors import MeshflError

if TYPE_CHECKING:
    from meshfl.app.local.zygote import Zygote

__all__ = ["MAX_SAMPLE_EPOCHS", "pooled_reference", "start_pooled_reference"]

MAX_SAMPLE_EPOCHS = 200_000
"""Largest training samples × epochs trained for the reference (W1: 43,110)."""


def pooled_reference(
    model: ModelSpec,
    train_files: Sequence[str],
    test_file: str,
    seed: int,
    learning_rate: float,
    batch_size: int,
    epochs: int,
    momentum: float,
) -> dict[str, Any]:
    """Train ``model`` on the union of ``train_files`` and evaluate it on ``test_file``.

    Returns ``{"accuracy", "epochs", "samples", "learning_rate", "batch_size",
    "momentum", "momentum_kind"}`` (accuracy on the test set, a float in [0, 1]; the
    momentum is heavy ball, the centralized optimizer, whatever the job's kind); or
    ``{"skipped": why}``
    when samples × epochs exceeds :data:`MAX_SAMPLE_EPOCHS`. Uses the agents' own
    :class:`edge_agent.trainer.Trainer`, so the steps are the agents' steps.
    """
    import numpy as np

    from edge_agent.trainer import Trainer
    from models.data import load_dataset_file

    parts = [load_dataset_file(Path(f)) for f in train_files]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    if len(y) * epochs > MAX_SAMPLE_EPOCHS:
        return {
            "skipped": f"{len(y):,} samples × {epochs} epochs is more than a local run trains"
            f" for its reference ({MAX_SAMPLE_EPOCHS:,})"
        }
    x_test, y_test = load_dataset_file(Path(test_file))
    trainer = Trainer(model, seed=seed, learning_rate=learning_rate, batch_size=batch_size,
                      local_epochs=epochs, momentum=momentum)  # fmt: skip
    trainer.train(x, y)
    return {
        "accuracy": round(float(trainer.evaluate(x_test, y_test)[0]), 4),
        "epochs": epochs,
        "samples": len(y),
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "momentum": momentum,
        "momentum_kind": "heavy-ball",
    }


def start_pooled_reference(
    spec: JobSpec, train_files: Sequence[Path], test_file: Path, zygote: Zygote | None, out: Path
) -> Callable[[], dict[str, Any]]:
    """Start training the reference in the background; the returned call waits for it.

    The call returns :func:`pooled_reference`'s result, or ``{"skipped": why}`` when it
    failed (its log: ``OUT/logs/pooled-reference.log``); it never raises.
    """
    kwargs: dict[str, Any] = {
        "model": spec["model"], "train_files": [str(f) for f in train_files],
        "test_file": str(test_file), "seed": spec["seed"],
        "learning_rate": spec["learning_rate"], "batch_size": spec["batch_size"],
        "epochs": spec["rounds"] * spec["local_epochs"],
        "momentum": spec.get("local_momentum", 0.0),
    }  # fmt: skip
    result: dict[str, Any] = {"skipped": "not finished"}

    def run() -> None:
        try:
            if zygote is not None:
                result.update(
                    zygote.call(
                        "meshfl.app.local.pooled:pooled_reference",
                        kwargs,
                        out / "logs" / "pooled-reference.log",
                        timeout_s=120.0,
                    )
                )
            else:
                result.update(pooled_reference(**kwargs))
            if "accuracy" in result:
                del result["skipped"]
        except MeshflError as exc:
            result["skipped"] = f"failed: {exc}"
        except Exception as exc:  # a reference never ends the run
            result["skipped"] = f"failed: {type(exc).__name__}: {exc}"

    thread = threading.Thread(target=run, name="pooled-reference", daemon=True)
    thread.start()

    def wait() -> dict[str, Any]:
        thread.join(130.0)
        return dict(result)

    return wait
