"""Memory of a process (issue 10): heavy libraries loaded only on the path that needs them,
and the coordinator's cap on glibc malloc arenas.

Each check runs in a fresh interpreter: ``sys.modules`` of the test process holds
whatever earlier tests imported.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _run(code: str, cwd: Path, *, stderr: bool = False) -> str:
    """Run ``code`` in a new interpreter; its stdout (or stderr), stripped.

    The environment is this one without ``MALLOC_ARENA_MAX``; stderr is shown on failure.
    """
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return (done.stderr if stderr else done.stdout).strip()


def test_coordinator_serves_without_onnx_until_a_model_arrives(tmp_path: Path) -> None:
    # The CLI entry point, the app with its routers (artifact upload included), a migrated
    # store and a served request: onnx (~10 MiB resident) is still not loaded.
    db, artifacts = tmp_path / "c.db", tmp_path / "artifacts"
    out = _run(
        f"""
        import sys
        import meshfl.app.cli
        from fastapi.testclient import TestClient
        from coordinator import CoordinatorSettings, create_app
        from coordinator.server import serve

        settings = CoordinatorSettings(
            db_url="sqlite:///{db}",
            enrol_token="enrol",
            admin_token="admin",
            artifacts_dir=r"{artifacts}",
        )
        with TestClient(create_app(settings)) as client:
            r = client.get("/api/v1/jobs", headers={{"Authorization": "Bearer admin"}})
            assert r.status_code == 200, r.text
        print(sorted(m for m in sys.modules if m == "onnx" or m.startswith("onnx.")))
        """,
        tmp_path,
    )
    assert out == "[]"


def test_consensus_loads_onnx_on_first_model(tmp_path: Path) -> None:
    # The other half of the deferral: parsing a model still works from a cold start.
    out = _run(
        """
        import sys
        from coordinator.consensus import ConsensusError, parse_model

        assert "onnx" not in sys.modules
        try:
            parse_model(b"not a model", "the upload")
        except ConsensusError as error:
            print(error)
        """,
        tmp_path,
    )
    assert out.startswith("the upload is not an ONNX model")


ARENAS = """
import ctypes, os, sys, threading
from coordinator.server import limit_malloc_arenas

if sys.argv[1:] != ["uncapped"]:
    print("capped" if limit_malloc_arenas() else "not capped", file=sys.stderr)
together = threading.Barrier(8)

def allocate():  # eight threads allocating at once, as the request pool's do
    kept = [bytearray(2048) for _ in range(2000)]
    together.wait()

threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL("libc.so.6").malloc_stats()  # one "Arena k:" block per arena, on stderr
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_the_coordinator_caps_malloc_arenas(tmp_path: Path) -> None:
    script = tmp_path / "arenas.py"
    script.write_text(ARENAS)
    capped = _run(f"import runpy, sys; sys.argv = ['x']; runpy.run_path(r'{script}')",
                  tmp_path, stderr=True)  # fmt: skip
    uncapped = _run(
        f"import runpy, sys; sys.argv = ['x', 'uncapped']; runpy.run_path(r'{script}')",
        tmp_path,
        stderr=True,
    )

    assert capped.startswith("capped")
    assert capped.count("Arena ") == 2  # MALLOC_ARENAS
    assert uncapped.count("Arena ") > 2  # what the cap saves: an arena per thread


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_an_operators_malloc_arena_max_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.server import limit_malloc_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "3")
    assert limit_malloc_arenas() is False
