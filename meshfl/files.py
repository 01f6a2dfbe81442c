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

__all__ = ["atomic_write"]


def atomic_write(
    path: str | Path, write: Callable[[BinaryIO], object], *, mode: int = 0o644
) -> Path:
    """Write ``path`` through ``write(handle)`` into a temporary file, then rename it.

    The temporary file is in ``path``'s folder (created if missing), flushed and fsynced
    before ``os.replace``, and made ``mode`` (default 0644: ``mkstemp`` makes 0600, and
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
    return path
