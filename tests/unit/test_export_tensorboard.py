"""``meshfl export tensorboard``: a report.json fixture written and read back with
TensorBoard's own EventAccumulator; every value comes back exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from meshfl.app.cli import main
from meshfl.app.cli.export import read_report, report_scalars
from meshfl.errors import MeshflError

REPORT: dict[str, Any] = {
    "job_id": "job-1",
    "rounds": [
        {"round": 1, "mean_accuracy": 0.5, "min_accuracy": 0.25, "consensus_distance": None,
         "bytes_sent": 123_456_789, "bytes_received": 246_913_578, "elapsed_s": 1.0,
         "devices_reporting": 2, "missing_devices": []},
        {"round": 2, "mean_accuracy": 0.75, "min_accuracy": 0.625, "consensus_distance": 0.0123,
         "bytes_sent": 1001, "bytes_received": 2002, "elapsed_s": 2.0,
         "devices_reporting": 2, "missing_devices": []},
    ],
    "device_rounds": [
        {"device": "device-0", "round": 1, "accuracy": 0.25, "bytes_sent": 10, "elapsed_s": 1.0},
        {"device": "device-1", "round": 1, "accuracy": 0.75, "bytes_sent": 10, "elapsed_s": 1.0},
        {"device": "device-0", "round": 2, "accuracy": 0.625, "bytes_sent": 9, "elapsed_s": 2.0},
        {"device": "device-1", "round": 2, "accuracy": 0.875, "bytes_sent": 9, "elapsed_s": 2.0},
    ],
}  # fmt: skip


def export(*args: str) -> int | str | None:
    """Run ``meshfl export tensorboard ARGS``; its exit code."""
    with pytest.raises(SystemExit) as exit_:
        main(["export", "tensorboard", *args])
    return exit_.value.code


def read_back(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files under ``logdir``: ``{tag: [(step, value), ...]}``."""
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return {
        tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
    }


def test_an_exported_run_reads_back_with_equal_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps(REPORT))

    code = export(str(run), "--out", str(tmp_path / "tb"))
    scalars = read_back(tmp_path / "tb")

    assert code == 0
    assert scalars["accuracy/mean"] == [(1, 0.5), (2, 0.75)]
    assert scalars["accuracy/min"] == [(1, 0.25), (2, 0.625)]
    assert scalars["consensus_distance"] == [(2, 0.0123)]  # round 1 had none
    assert scalars["bytes/sent"] == [(1, 123_456_789.0), (2, 1001.0)]  # exact: doubles
    assert scalars["bytes/received"] == [(1, 246_913_578.0), (2, 2002.0)]
    assert scalars["accuracy/device/device-0"] == [(1, 0.25), (2, 0.625)]
    assert scalars["accuracy/device/device-1"] == [(1, 0.75), (2, 0.875)]
    assert len(report_scalars(REPORT)) == sum(len(v) for v in scalars.values()) == 13
    assert "13 scalars written" in capsys.readouterr().out


def test_a_report_json_path_works_too_and_an_old_report_has_no_device_tags(
    tmp_path: Path,
) -> None:
    old = {k: v for k, v in REPORT.items() if k != "device_rounds"}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(old))

    assert export(str(path), "--out", str(tmp_path / "tb")) == 0
    assert sorted(read_back(tmp_path / "tb")) == [
        "accuracy/mean", "accuracy/min", "bytes/received", "bytes/sent", "consensus_distance",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist; pass a `meshfl local` run's --out directory"),
        ("{not json", "is not a `meshfl local` report.json: not JSON"),
        ('{"rounds": 3}', "is not a `meshfl local` report.json: it has no 'rounds' list"),
        ("[1]", "report.json: it is a list, not a JSON object"),
        ('{"rounds": [1, 2]}', "report.json: rounds[0] is an int, not an object"),
        ('{"rounds": [{"mean_accuracy": 0.5}]}', "report.json: rounds[0] has no 'round'"),
        ('{"rounds": [{"round": "abc"}]}', "report.json: rounds[0].round must be a round number"),
        ('{"rounds": [{"round": true}]}', "report.json: rounds[0].round must be a round number"),
        ('{"rounds": [{"round": -1}]}', "report.json: rounds[0].round must be a round number"),
        ('{"rounds": [{"round": 1e400}]}', "report.json: rounds[0].round must be a round number"),
        ('{"rounds": [{"round": 1, "mean_accuracy": "high"}]}',
         "report.json: rounds[0].mean_accuracy must be a number or null, not 'high'"),
        ('{"rounds": [{"round": 1, "bytes_sent": 1' + "0" * 400 + "}]}",
         "report.json: rounds[0].bytes_sent must be a number or null"),
        ('{"rounds": [], "device_rounds": 5}', "'device_rounds' is an int, not a list"),
        ('{"rounds": [], "device_rounds": [{"device": "a"}]}',
         "report.json: device_rounds[0] has no 'round'"),
        ('{"rounds": [], "device_rounds": [{"device": 7, "round": 1, "accuracy": 0.5}]}',
         "report.json: device_rounds[0].device must be a device name"),
        ('{"rounds": [], "device_rounds": [{"device": "\\ud800", "round": 1, "accuracy": 0.5}]}',
         "report.json: device_rounds[0].device must be a device name"),
        ("[" * 100_000, "report.json: its JSON nests too deeply"),
    ],
)  # fmt: skip
def test_a_bad_source_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)

    code = export(str(path), "--out", str(tmp_path / "tb"))

    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(["rounds", "device_rounds", "round", "mean_accuracy", "bytes_sent",
                         "consensus_distance", "device", "accuracy"]) | st.text(max_size=4),
        inner,
        max_size=5,
    ),
    max_leaves=30,
)  # fmt: skip
"""Any JSON value, its objects often carrying a report.json's keys."""


@settings(max_examples=300, deadline=None)
@given(document=_JSON)
def test_any_json_either_reads_as_a_report_or_raises_a_meshfl_error(
    tmp_path_factory: pytest.TempPathFactory, document: Any
) -> None:
    path = tmp_path_factory.mktemp("report") / "report.json"
    path.write_text(json.dumps(document))

    try:
        report = read_report(path)
    except MeshflError as exc:
        assert "\n" not in str(exc)
        return
    for tag, step, value in report_scalars(report):
        assert isinstance(tag, str) and isinstance(step, int) and isinstance(value, float)


@pytest.mark.parametrize(
    ("out", "reason"),
    [
        ("/etc/passwd/x", "not a directory"),
        ("/proc/1/x", "no such file or directory"),
        ("{tmp}/report.json", "it is a file, not a directory"),
    ],
)
def test_an_unwritable_out_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, reason: str
) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(REPORT))
    out = out.format(tmp=tmp_path)

    code = export(str(path), "--out", out)

    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == f"meshfl: error: cannot write to {out}: {reason}; choose another --out"
