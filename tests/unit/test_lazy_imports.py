"""Heavy libraries a process loads only on the path that needs them (issue 10: memory).

Each check runs in a fresh interpreter: ``sys.modules`` of the test process holds
whatever earlier tests imported.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(code: str, cwd: Path) -> str:
    """Run ``code`` in a new interpreter; its stdout, stripped (stderr shown on failure)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_coordinator_serves_without_onnx_until_a_model_arrives(tmp_path: Path) -> None:
    # The CLI entry point, the app with its routers (artifact upload included), a migrated
    # store and a served request: onnx (~10 MiB resident) is still not loaded.
    db, artifacts = tmp_path / "c.db", tmp_path / "artifacts"
    out = _run(
        f"""
        import sys
        import meshfl.cli
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
