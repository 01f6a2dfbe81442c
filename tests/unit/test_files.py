"""meshfl.files.atomic_write: all or nothing."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from meshfl.files import atomic_write


def test_writes_the_whole_file_world_readable(tmp_path: Path) -> None:
    path = atomic_write(tmp_path / "sub" / "model.bin", lambda h: h.write(b"abc"))

    assert path.read_bytes() == b"abc"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["model.bin"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"old")

    def fail(handle: object) -> None:
        handle.write(b"half")  # type: ignore[attr-defined]
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, fail)

    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]
