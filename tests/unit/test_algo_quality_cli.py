"""``benchmarks/quality.py``: a short sweep prints the table and writes every field."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def quality() -> object:
    sys.path.insert(0, str(BENCH))
    try:
        import quality

        yield quality
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.slow  # imports torch and scikit-learn, trains 6 short runs
def test_a_two_round_sweep_prints_and_writes_the_rows(
    quality: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.json"
    argv = ["--workload", "W1", "--seeds", "0", "--rounds", "2", "--only", "efavg",
            "--json", str(out)]  # fmt: skip
    assert quality.main(argv) == 0  # type: ignore[attr-defined]
    text = capsys.readouterr().out
    assert "command: python benchmarks/quality.py --workload W1 --seeds 0 --rounds 2" in text
    assert "| efavg sign hb0.9 |" in text
    data = json.loads(out.read_text())
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
        (["--only", "gossip"], "gossip is not an algorithm"),
        (["--rounds", "0"], "--rounds must be >= 1"),
    ],
)
def test_bad_options_are_one_line_errors(
    quality: object, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert quality.main(argv) == 2  # type: ignore[attr-defined]
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
