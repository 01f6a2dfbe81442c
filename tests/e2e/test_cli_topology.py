"""``meshfl topology show``: the summary, the JSON document and one-line errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.e2e


def meshfl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meshfl", *args], capture_output=True, text=True, timeout=60
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshfl: error:"), proc.stderr
    for word in words:
        assert word in lines[0]


def test_show_ring_prints_the_summary() -> None:
    proc = meshfl("topology", "show", "ring", "--devices", "8")

    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "0.1953" in out
    for row, value in [("nodes", "8"), ("edges", "8"), ("degree min / max", "2 / 2"),
                       ("connected", "yes")]:  # fmt: skip
        line = next(line for line in out.splitlines() if row in line)
        assert value in line


def test_show_json_parses_and_matches_the_kernel() -> None:
    proc = meshfl("topology", "show", "exponential", "--devices", "8", "--json")

    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert set(document) == {"kind", "n", "edges", "mixing_matrix", "spectral_gap"}
    assert document["kind"] == "exponential" and document["n"] == 8
    assert len(document["edges"]) == 20 and all(i < j for i, j in document["edges"])
    w = np.array(document["mixing_matrix"])
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    assert math.isclose(document["spectral_gap"], 2 / 3, abs_tol=1e-9)


def test_show_parameters_and_a_json_edge_list(tmp_path: Path) -> None:
    path = tmp_path / "path.json"
    path.write_text(json.dumps({"n": 3, "edges": [[0, 1], [1, 2]]}))

    regular = meshfl("topology", "show", "random-regular", "--devices", "10", "--degree", "3",
                     "--seed", "4", "--mixing", "max-degree", "--json")  # fmt: skip
    custom = meshfl("topology", "show", str(path), "--json")

    assert regular.returncode == 0, regular.stderr
    edges = json.loads(regular.stdout)["edges"]
    assert len(edges) == 15  # 10 nodes of degree 3
    assert custom.returncode == 0, custom.stderr
    assert json.loads(custom.stdout)["edges"] == [[0, 1], [1, 2]]
    assert json.loads(custom.stdout)["spectral_gap"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("hypercube", "--devices", "8"), ("unknown topology 'hypercube'", "valid kinds")),
        (("ring",), ("--devices",)),
        (("ring", "--devices", "0"), ("n >= 1",)),
        (("ring", "--devices", "8", "--mixing", "laplacian"), ("valid rules",)),
        (("random-regular", "--devices", "5", "--degree", "3"), ("even",)),
        (("missing.json",), ("does not exist",)),
        (("ring", "--devices", "100000"), ("too many", "at most 2048")),
        (("small-world", "--devices", "8", "--degree", "9"), ("k=9", "2 <= k < n")),
    ],
)
def test_bad_input_is_one_line_exit_2(args: tuple[str, ...], words: tuple[str, ...]) -> None:
    assert_one_line_error(meshfl("topology", "show", *args), *words)
