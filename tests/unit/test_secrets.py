"""Secrets stay secret (issue 23, item 10): the coordinator's SQLite file (token hashes,
the declaration-signing key) is 0600; tokens come from a file or the environment instead
of argv; ``atomic_write`` makes the rename durable by fsyncing the folder."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from coordinator import secagg
from coordinator.db import make_engine, make_sessionmaker
from coordinator.migrate import upgrade
from meshfl import files
from meshfl.app.cli import app
from meshfl.errors import ConfigError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_coordinator_database_and_its_wal_are_created_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, under which SQLite would make 0644
    try:
        path = tmp_path / "fleet.db"
        engine = make_engine(f"sqlite:///{path}")
        upgrade(engine)
        key = secagg.load_signing_key(make_sessionmaker(engine), 0.0)  # now in the file
        with engine.connect() as conn:  # the WAL exists while a connection is open
            conn.exec_driver_sql("SELECT 1")
            wal = Path(f"{path}-wal")
            assert wal.exists() and _mode(wal) == 0o600
        engine.dispose()
    finally:
        os.umask(old)
    assert key is not None
    assert _mode(path) == 0o600


def test_an_existing_world_readable_database_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    path.write_bytes(b"")
    path.chmod(0o644)
    make_engine(f"sqlite:///{path}").dispose()
    assert _mode(path) == 0o600


def test_atomic_write_fsyncs_the_folder_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)

    files.atomic_write(tmp_path / "sub" / "model.npz", lambda f: f.write(b"x"))

    assert events == ["fsync file", "rename", "fsync dir"]
    assert (tmp_path / "sub" / "model.npz").read_bytes() == b"x"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(args: list[str], monkeypatch: pytest.MonkeyPatch, **env: str) -> tuple[Any, list]:
    seen: list[Any] = []
    monkeypatch.setattr("coordinator.server.serve", lambda settings, **_: seen.append(settings))
    result = CliRunner().invoke(
        app, ["coordinator", "serve", "--port", str(_free_port()), *args], env=env
    )
    return result, seen


def test_coordinator_tokens_come_from_files_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin, enrol = tmp_path / "admin", tmp_path / "enrol"
    admin.write_text("admin-from-file\n")
    enrol.write_text("enrol-from-file\n")
    db = ["--db", f"sqlite:///{tmp_path / 'c.db'}"]

    from_files, seen = _serve(
        [*db, "--admin-token-file", str(admin), "--enrol-token-file", str(enrol)], monkeypatch
    )
    assert from_files.exit_code == 0, from_files.output
    assert seen[0].admin_token == "admin-from-file" and seen[0].enrol_token == "enrol-from-file"

    from_env, seen = _serve(
        db,
        monkeypatch,
        MESHFL_COORDINATOR_ADMIN_TOKEN="a-env",
        MESHFL_COORDINATOR_ENROL_TOKEN="e-env",
    )
    assert from_env.exit_code == 0, from_env.output
    assert seen[0].admin_token == "a-env" and seen[0].enrol_token == "e-env"

    both, seen = _serve([*db, "--admin-token", "x", "--admin-token-file", str(admin)], monkeypatch)
    assert both.exit_code != 0 and seen == []
    assert isinstance(both.exception, ConfigError) or "not both" in both.output


def test_the_agent_token_comes_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2), np.float32), y=np.zeros(4, np.int64))
    seen: list[Any] = []
    monkeypatch.setattr("edge_agent.daemon.run_agent", lambda config, **_: seen.append(config))
    base = ["agent", "run", "--coordinator", "http://127.0.0.1:1", "--data",
            str(tmp_path / "d.npz"), "--name", "d0"]  # fmt: skip
    empty = tmp_path / "empty"
    empty.write_text("\n")

    from_env = CliRunner().invoke(app, base, env={"MESHFL_TOKEN": "tok-env"})
    missing = CliRunner().invoke(app, base, env={"MESHFL_TOKEN": ""})
    blank = CliRunner().invoke(app, [*base, "--token-file", str(empty)])

    assert from_env.exit_code == 0, from_env.output
    assert seen[0].token == "tok-env" and len(seen) == 1
    assert missing.exit_code != 0 and blank.exit_code != 0
