"""The ``onnx`` section of a local run's report: per-device exports and the consensus model.

The **consensus model** is the parameter mean (equal weights) of the final models of the
devices that finished the job — the average that decentralized SGD converges to
(Lian et al., NeurIPS 2017, eq. 3's x̄; Koloskova et al., ICML 2019). Devices that failed,
declined or left mid-job are excluded and named. It is exported to ``OUT/consensus.onnx``
and checked: parity (max |Δlogit| of torch vs onnxruntime on the test inputs, issue 8
wants ≤ 1e-5) and test accuracy with torch and with onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meshfl.contract import JobPublic, ModelSpec
from meshfl.errors import ConfigError, DataError, MeshflError

if TYPE_CHECKING:
    from meshfl.app.local.zygote import Zygote
    from meshfl.contract import JobSpec

__all__ = [
    "PARITY_TOLERANCE",
    "consensus_line",
    "mean_arrays",
    "onnx_section",
    "onnx_section_from_files",
    "report_section",
]

PARITY_TOLERANCE = 1e-5
"""Largest max |logit(torch) − logit(onnxruntime)| accepted (issue 8); the value of
``models.onnx.PARITY_TOLERANCE``, repeated so that importing this module needs no torch."""


def mean_arrays(models: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Element-wise mean of same-layout parameter sets (float64 sum, float32 result).

    Raises
    ------
    ConfigError
        No models, or two models whose names or shapes differ (the message names the tensor).

    """
    if not models:
        raise ConfigError("no final model to average: every device failed or left")
    first = models[0]
    for other in models[1:]:
        for name in set(first) | set(other):
            if name not in first or name not in other or first[name].shape != other[name].shape:
                raise ConfigError(f"the devices' final models differ in tensor {name!r}")
    return {
        name: np.mean([np.asarray(m[name], np.float64) for m in models], axis=0).astype(np.float32)
        for name in first
    }


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _devices(
    job: JobPublic, failed: Mapping[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    entries, excluded = [], []
    for d in job["devices"]:
        diff = d.get("onnx_max_abs_diff")
        entries.append({
            "name": d["name"], "path": d.get("onnx_path"), "max_abs_diff": diff,
            "ok": diff is not None and diff <= PARITY_TOLERANCE,
        })  # fmt: skip
        why = failed.get(d["name"]) or d["error"]
        if why is None and d.get("left_round") is not None:
            why = f"left at round {d['left_round']}"
        if why is None and not d["done"]:
            why = "did not finish"
        if why is not None:
            excluded.append({"name": d["name"], "why": why})
    return entries, excluded


def onnx_section(
    job: JobPublic,
    spec: ModelSpec,
    x_test: np.ndarray,
    y_test: np.ndarray,
    models_dir: Path,
    out: Path,
    failed: Mapping[str, str],
    published: Path | None = None,
    private: str | None = None,
) -> dict[str, Any]:
    """Build the report's ``onnx`` section; the consensus model is ``out / "consensus.onnx"``.

    With ``published`` (the coordinator's consensus, already saved there) that file is
    checked against the torch mean of the devices' ``model.npz`` — one parity check covers
    the coordinator's averaging of ONNX initializers and the export; without it (the job
    published no model) the torch mean is exported there.

    Parameters
    ----------
    job : JobPublic
        The job at the end; each device's ``onnx_path`` and ``onnx_max_abs_diff`` come
        from its done report.
    spec : ModelSpec
        The job's model.
    x_test, y_test : numpy.ndarray
        float32 (n, d) test inputs and int64 (n,) labels.
    models_dir : Path
        Where agents wrote their models: ``models_dir/<job_id>/<name>/model.npz``.
    out : Path
        The run's output folder.
    failed : mapping of str to str
        ``{agent name: why}`` for agents that failed (excluded from the consensus).
    published : Path or None
        The coordinator's ``consensus.onnx`` (``GET /jobs/{id}/artifacts/consensus.onnx``).
    private : str or None
        A private job (DP or secure aggregation): no consensus of the devices' un-noised
        models is built; ``consensus`` is ``{"error": private, "excluded": []}``.

    Returns
    -------
    dict
        ``tolerance``; ``devices``: ``[{name, path, max_abs_diff, ok}]`` (None: the device
        reported no export); ``consensus``: ``{path, devices, excluded: [{name, why}],
        max_abs_diff, accuracy_torch, accuracy_onnx, ok}`` or ``{"error": why}``;
        ``failures``: one line per parity violation or export failure (empty: all good).

    """
    from edge_agent.onnx_infer import OnnxModel
    from models.arrays import load_arrays
    from models.onnx import export_onnx, parity, torch_logits
    from models.zoo import build_model

    devices, excluded = _devices(job, failed)
    failures = [
        f"{d['name']}: ONNX parity {d['max_abs_diff']:.3g} > {PARITY_TOLERANCE:g}"
        if d["max_abs_diff"] is not None
        else f"{d['name']}: no ONNX export reported"
        for d in devices
        if not d["ok"] and d["name"] not in {e["name"] for e in excluded}
    ]
    names = [d["name"] for d in devices if d["name"] not in {e["name"] for e in excluded}]
    consensus: dict[str, Any]
    if private is not None:
        return {"tolerance": PARITY_TOLERANCE, "devices": devices, "failures": failures,
                "consensus": {"error": private, "excluded": []}}  # fmt: skip
    try:
        paths = [models_dir / job["job_id"] / name / "model.npz" for name in names]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise DataError(f"{missing[0]}: final model missing; the device did not save it")
        module = build_model(spec, 0)
        load_arrays(module, mean_arrays([_load_npz(p) for p in paths]))
        if published is None:
            path = export_onnx(module, out / "consensus.onnx", int(spec["input_dim"]))
        else:
            path = published
        diff = parity(module, path, x_test)
        labels, _ = OnnxModel(path).predict(x_test)
        torch_labels = torch_logits(module, x_test).argmax(axis=1)
        consensus = {
            "path": str(path), "source": "meshfl local" if published is None else "coordinator",
            "devices": names, "excluded": excluded, "max_abs_diff": diff,
            "accuracy_torch": float(np.mean(torch_labels == y_test)),
            "accuracy_onnx": float(np.mean(labels == y_test)),
            "ok": diff <= PARITY_TOLERANCE,
        }  # fmt: skip
        if not consensus["ok"]:
            failures.append(f"consensus: ONNX parity {diff:.3g} > {PARITY_TOLERANCE:g}")
    except Exception as error:  # report any export failure, never lose the run's report
        consensus = {"error": f"{type(error).__name__}: {error}", "excluded": excluded}
        failures.append(f"consensus: {consensus['error']}")
    return {
        "tolerance": PARITY_TOLERANCE,
        "devices": devices,
        "consensus": consensus,
        "failures": failures,
    }


def onnx_section_from_files(
    job: JobPublic,
    spec: ModelSpec,
    test_file: str,
    models_dir: str,
    out: str,
    failed: Mapping[str, str],
    published: str | None = None,
    private: str | None = None,
) -> dict[str, Any]:
    """:func:`onnx_section` given the test set's file and paths as strings (JSON).

    What ``meshfl local`` runs in a child of its agents' zygote
    (:meth:`meshfl.app.local.zygote.Zygote.call`), where torch is already imported, instead
    of importing torch into the launcher.
    """
    from models.data import load_dataset_file

    x_test, y_test = load_dataset_file(Path(test_file))
    return onnx_section(
        job, spec, x_test, y_test, Path(models_dir), Path(out), failed,
        None if published is None else Path(published), private,
    )  # fmt: skip


def report_section(
    job: JobPublic,
    spec: JobSpec,
    test_file: Path,
    out: Path,
    failed: Mapping[str, str],
    published: Path | None,
    zygote: Zygote | None = None,
    private: str | None = None,
) -> dict[str, Any]:
    """The report's ``onnx`` section of a local run, checking ``OUT/consensus.onnx``.

    With the agents' ``zygote`` (:mod:`meshfl.app.local.zygote`) it runs in a child forked
    from it, where torch is already imported: the launcher never imports torch, seconds
    of CPU at the end of every run. Where the zygote is gone or its child fails, it runs
    here. Agents' models are under ``OUT/models``. ``private``, when given, is why no
    consensus model is built (a private job: :func:`onnx_section`).
    """
    if zygote is not None:
        try:
            section: dict[str, Any] = zygote.call(
                "meshfl.app.local.onnx_report:onnx_section_from_files",
                {
                    "job": job, "spec": spec["model"], "test_file": str(test_file),
                    "models_dir": str(out / "models"), "out": str(out), "failed": dict(failed),
                    "published": None if published is None else str(published),
                    "private": private,
                },
                out / "logs" / "onnx-check.log",
                timeout_s=300.0,
            )  # fmt: skip
            return section
        except MeshflError:
            pass  # check here instead
    return onnx_section_from_files(
        job, spec["model"], str(test_file), str(out / "models"), str(out), failed,
        None if published is None else str(published), private,
    )  # fmt: skip


def consensus_line(section: Mapping[str, Any]) -> str:
    """The console's line: ``consensus model: PATH, accuracy A (N devices), ONNX parity P``."""
    c = section["consensus"]
    if "error" in c:
        return f"consensus model: not exported ({c['error']})"
    line = (
        f"consensus model: {c['path']}, accuracy {c['accuracy_onnx']:.4f}"
        f" ({len(c['devices'])} devices), ONNX parity {c['max_abs_diff']:.1g}"
    )
    if c["excluded"]:
        line += "; excluded " + ", ".join(f"{e['name']} ({e['why']})" for e in c["excluded"])
    return line
