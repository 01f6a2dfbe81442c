"""``meshfl export tensorboard``: a run's per-round metrics as TensorBoard scalars.

Reads a ``meshfl local`` run's ``report.json`` and writes one event file with
torch's ``SummaryWriter`` (needs the ``tensorboard`` extra; imported only here). Each
scalar's step is the round; values are written in double precision (TensorBoard's
tensor-style scalars), so byte counts survive exactly:

=============================  ==========================================================
tag                            value (per round)
=============================  ==========================================================
``accuracy/mean``              mean test accuracy of the devices that reported the round
``accuracy/min``               their minimum
``consensus_distance``         mean ‖x_i − x̄‖² of their sketches (rounds that have one)
``bytes/sent``                 payload bytes the devices sent in the round (bytes)
``bytes/received``             payload bytes they received (bytes)
``accuracy/device/NAME``       each device's test accuracy (the report's ``device_rounds``)
=============================  ==========================================================

MLflow is not supported (out of scope; docs/observability.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from meshfl.errors import ConfigError, DataError

__all__ = ["check_report", "export_app", "read_report", "report_scalars", "write_tensorboard"]

export_app = typer.Typer(help="Export a run's metrics to other tools.", no_args_is_help=True)

_ROUND_TAGS = {
    "accuracy/mean": "mean_accuracy",
    "accuracy/min": "min_accuracy",
    "consensus_distance": "consensus_distance",
    "bytes/sent": "bytes_sent",
    "bytes/received": "bytes_received",
}
"""TensorBoard tag → the key of a ``report.json`` round entry."""


def report_scalars(report: dict[str, Any]) -> list[tuple[str, int, float]]:
    """``(tag, round, value)`` for every scalar of the module docstring, in report order.

    ``report`` is one :func:`check_report` accepts. A ``null`` or missing value (no
    consensus distance) contributes nothing for its tag; a report without
    ``device_rounds`` (written before they existed) has no per-device accuracy.
    """
    out: list[tuple[str, int, float]] = []
    for entry in report["rounds"]:
        for tag, key in _ROUND_TAGS.items():
            if entry.get(key) is not None:
                out.append((tag, int(entry["round"]), float(entry[key])))
    for entry in report.get("device_rounds", []):
        if entry.get("accuracy") is not None:
            tag = f"accuracy/device/{entry['device']}"
            out.append((tag, int(entry["round"]), float(entry["accuracy"])))
    return out


def check_report(report: Any) -> dict[str, Any]:
    """``report`` if it has the shape :func:`report_scalars` reads; else a one-line error.

    A JSON object with a ``rounds`` list and, optionally, a ``device_rounds`` list, of
    objects whose ``round`` is an integer in [0, 2⁶³) (TensorBoard's int64 step), whose
    values (``_ROUND_TAGS``, ``accuracy``) are numbers or ``null``, and whose ``device``
    is a UTF-8 string. Other keys are not looked at.

    Raises
    ------
    meshfl.errors.DataError
        What is wrong, with where (``rounds[3].round must be ...``).

    """
    if not isinstance(report, dict):
        raise DataError(f"it is {_a(report)}, not a JSON object")
    if not isinstance(report.get("rounds"), list):
        raise DataError("it has no 'rounds' list")
    keys = {"rounds": list(_ROUND_TAGS.values()), "device_rounds": ["accuracy"]}
    for section, values in keys.items():
        entries = report.get(section, [])
        if not isinstance(entries, list):
            raise DataError(f"'{section}' is {_a(entries)}, not a list")
        for i, entry in enumerate(entries):
            where = f"{section}[{i}]"
            if not isinstance(entry, dict):
                raise DataError(f"{where} is {_a(entry)}, not an object")
            if section == "device_rounds":
                _check_device(entry, where)
            _check_round(entry, where)
            for key in values:
                if not _is_number(entry.get(key)):
                    raise DataError(
                        f"{where}.{key} must be a number or null, not {_show(entry[key])}"
                    )
    return report


def _check_round(entry: dict[str, Any], where: str) -> None:
    if "round" not in entry:
        raise DataError(f"{where} has no 'round'")
    step = entry["round"]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
        raise DataError(
            f"{where}.round must be a round number (an integer >= 0), not {_show(step)}"
        )


def _check_device(entry: dict[str, Any], where: str) -> None:
    if "device" not in entry:
        raise DataError(f"{where} has no 'device'")
    name = entry["device"]
    try:
        valid = isinstance(name, str) and bool(name.encode())
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): not a TensorBoard tag
        valid = False
    if not valid:
        raise DataError(f"{where}.device must be a device name, not {_show(name)}")


def _is_number(value: Any) -> bool:
    """``None``, or an int/float that converts to a float (not a bool, not past 1.8e308)."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _a(value: Any) -> str:
    """The JSON type of ``value`` with its article: ``a list``, ``an int``."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _show(value: Any) -> str:
    """A scalar's repr, cut to 40 characters; a list's or an object's type."""
    if isinstance(value, list | dict):
        return _a(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def write_tensorboard(report: dict[str, Any], out: Path) -> int:
    """Write the report's scalars as one TensorBoard event file under ``out``; their count.

    ``report`` is one :func:`check_report` accepts; ``out`` (a directory) is created
    with its parents.

    Raises
    ------
    meshfl.errors.ConfigError
        torch's TensorBoard writer (the ``tensorboard`` extra) is not installed, or
        ``out`` cannot be created or written (``cannot write to OUT: <reason>``).

    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "exporting to TensorBoard needs tensorboard and torch: pip install"
            " 'meshfl[tensorboard]'"
        ) from None
    scalars = report_scalars(report)
    try:
        out.mkdir(parents=True, exist_ok=True)
        writer = SummaryWriter(log_dir=str(out))
        try:
            for tag, step, value in scalars:
                writer.add_scalar(
                    tag, value, global_step=step, new_style=True, double_precision=True
                )
        finally:
            writer.close()
    except OSError as exc:
        if out.exists() and not out.is_dir():
            reason = "it is a file, not a directory"
        else:
            reason = (exc.strerror or str(exc)).lower()
        raise ConfigError(f"cannot write to {out}: {reason}; choose another --out") from None
    return len(scalars)


def read_report(source: Path) -> dict[str, Any]:
    """The ``report.json`` at ``source`` (the file, or a run's ``--out`` directory).

    Raises
    ------
    meshfl.errors.DataError
        ``source`` does not exist or cannot be read, or it is not a ``meshfl local``
        report.json (not JSON, or not the shape :func:`check_report` accepts); one line.

    """
    path = source / "report.json" if source.is_dir() else source
    not_a_report = f"{path} is not a `meshfl local` report.json"
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(
            f"{path} does not exist; pass a `meshfl local` run's --out directory or its report.json"
        ) from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {(exc.strerror or str(exc)).lower()}") from None
    except ValueError as exc:  # a JSONDecodeError, or bytes that are not UTF-8
        raise DataError(f"{not_a_report}: not JSON ({exc})") from None
    except RecursionError:
        raise DataError(f"{not_a_report}: its JSON nests too deeply") from None
    try:
        return check_report(report)
    except DataError as exc:
        raise DataError(f"{not_a_report}: {exc}") from None


@export_app.command("tensorboard")
def tensorboard(
    source: Annotated[
        Path, typer.Argument(metavar="RUN_DIR_OR_REPORT", help="A run's --out or its report.json.")
    ],
    out: Annotated[Path, typer.Option(help="Directory the event file is written into.")] = Path(
        "meshfl-tensorboard"
    ),
) -> None:
    """Write a run's per-round metrics as TensorBoard scalars (tensorboard --logdir OUT)."""
    count = write_tensorboard(read_report(source), out)
    typer.echo(f"{count} scalars written to {out}/ (view: tensorboard --logdir {out})")
