"""``meshfl bench quality``: a short sweep prints the table and writes every field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshfl.app.cli import main


def _run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "quality", *argv])
    return int(exc.value.code or 0)


@pytest.mark.slow  # imports torch and scikit-learn, trains 6 short runs
def test_a_two_round_sweep_prints_and_writes_the_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--workload", "W1", "--seeds", "0", "--rounds", "2", "--only", "efavg",
            "--out", str(tmp_path)]  # fmt: skip
    assert _run(argv) == 0
    text = capsys.readouterr().out
    assert "command: meshfl bench quality --workload W1 --seeds 0 --rounds 2 --only efavg" in text
    assert "| efavg sign hb0.9 |" in text
    data = json.loads((tmp_path / "quality-W1.json").read_text())
    rows = {r["label"]: r for r in data["rows"]}
    assert set(rows) >= {"efavg identity", "efavg sign", "efavg sign hb0.9"}
    # 2 rounds × 8 devices × one signed, chunked sign message of 888 bytes
    assert rows["efavg sign"]["upload_total"] == 2 * 8 * 888
    assert rows["efavg identity"]["upload_total"] == 2 * 8 * 19_510
    assert rows["efavg sign"]["consensus"] == 0.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "x"], "--seeds must be integers"),
        (["--seeds", ","], "--seeds is empty"),
        (["--only", "gossip"], "gossip is not an algorithm"),
        (["--rounds", "0"], "--rounds must be in [1, 10,000] (got 0)"),
        (["--rounds", "99999999999999999999"], "--rounds must be in [1, 10,000]"),
        (["--seeds", "99999999999999999999999"], "is out of range; a model seed is in [0, 2^32)"),
        (["--seeds", "-1"], "--seeds -1 is out of range"),
        (["--seeds", "0,1,0"], "--seeds repeats 0; give distinct seeds"),
        (["--only", ",, "], "names no algorithm"),
        (["--workload", "W9"], "unknown workload 'W9'; use W1 or W2"),
    ],
)
def test_bad_options_are_one_line_errors(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing written
