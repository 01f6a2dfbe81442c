"""Atomic file writes: a reader sees the old file or the whole new one, never half.

Every file meshfl writes for someone else to read — models, data partitions, predictions,
health records, ONNX exports — goes through :func:`atomic_write`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write", "fsync_dir", "private_file", "writable_dir"]


def atomic_write(
    path: str | Path, write: Callable[[BinaryIO], object], *, mode: int = 0o644
) -> Path:
    """Write ``path`` through ``write(handle)`` into a temporary file, then rename it.

    The temporary file is in ``path``'s folder (created if missing), flushed and fsynced
    before ``os.replace``, and the folder is fsynced after it (so the rename itself
    survives a power cut, not only the bytes); the file is made ``mode`` (default 0644:
    ``mkstemp`` makes 0600, and
    these are ordinary output files; pass 0o600 for a secret such as a private key, which
    is then never readable by others, not even briefly). On any exception it is removed
    and the exception re-raised; an existing ``path`` is then left as it was.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OSError
        The folder cannot be created or written.

    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


def fsync_dir(folder: str | Path) -> None:
    """Flush a folder (fsync): a rename or creation in it becomes durable (POSIX only).

    A file system that cannot fsync a folder (some network mounts) is not an error: the
    data was already fsynced, only the rename's durability is then the file system's.
    """
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:  # e.g. Windows, where folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def private_file(path: str | Path) -> Path:
    """Make ``path`` a file only its owner can read: created empty 0600, or tightened to 0600.

    For files that hold secrets and are written by another library (the coordinator's
    SQLite database keeps token hashes and its declaration-signing key): created with
    ``os.open(..., 0o600)`` before that library opens it, so it is never world-readable,
    not even briefly (SQLite gives its ``-wal``/``-shm`` files the database's mode). An
    existing file readable by group or others is chmod-ed to 0600. A missing folder or
    a file owned by someone else is left for the caller's library to report.
    """
    path = Path(path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        with contextlib.suppress(OSError):
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, 0o600)
    except OSError:
        pass
    return path


def writable_dir(path: Path, option: str = "--out") -> Path:
    """Create the folder ``path`` if needed and check a file can be written in it.

    For an output folder given as ``option``, checked before minutes of work. Returns
    ``path``. Raises :class:`~meshfl.errors.ConfigError` naming the option, the folder
    and the reason (read-only, not a folder, no permission) in one line.
    """
    from meshfl.errors import ConfigError

    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".meshfl-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"{option} {path} is not a writable directory ({exc.strerror}); choose another"
        ) from None
    return path
