"""What a device's owner allows a job to make it do: which model code runs, which files are read.

A job's spec comes from whoever holds an operator token; the device runs it. Two things in
a spec would otherwise reach the device's own code and files:

- a **custom model factory** (``"package.module:callable"``) is imported and called with
  the job's ``kwargs``: ``os:system`` with ``{"command": ...}`` would run a shell command.
  A device runs only the zoo and the factories its owner listed (``meshfl agent run
  --allow-model PKG.MOD:FN``, :func:`check_allowed`); a factory in Python's standard
  library or its built-ins is refused everywhere, listed or not
  (:func:`refuse_standard_library`: the coordinator at job creation, the agent at start
  and before it imports anything);
- a **test data path** is opened on the device: it must resolve, symlinks followed,
  inside the device's data directory (:func:`confine_path`).

A refusal is a :class:`~meshfl.errors.SecurityError` naming the factory or path and the
owner's fix; the agent declines the job with it (the coordinator records the reason).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from meshfl.errors import ConfigError, SecurityError

__all__ = ["check_allow_list", "check_allowed", "confine_path", "refuse_standard_library"]

_FACTORY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

_STANDARD = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)
"""Top-level names of Python's standard library and of the modules built into the interpreter."""


def refuse_standard_library(factory: str) -> None:
    """Refuse a factory whose module is in the standard library or built in (``os``, ``builtins``).

    Standard-library callables (``os:system``, ``subprocess:run``, ``builtins:exec``,
    ``shutil:rmtree``, ...) are never models; called with a job's kwargs they run
    commands or touch files. The check is on the top-level package name, so
    ``os.path:join`` and ``importlib:import_module`` are refused too.

    Raises
    ------
    SecurityError
        Naming the factory and saying that only the device owner's own model code runs.

    """
    top = factory.partition(":")[0].split(".")[0]
    if top in _STANDARD or top.startswith("__"):
        raise SecurityError(
            f"model factory {factory!r} is in Python's standard library ({top!r}), which is"
            " never a model: a custom factory must be model code of your own package"
        )


def check_allow_list(entries: Iterable[str]) -> tuple[str, ...]:
    """Check the device owner's ``--allow-model`` entries at agent start.

    Parameters
    ----------
    entries : iterable of str
        Factories ``"package.module:callable"``, exactly as jobs name them.

    Returns
    -------
    tuple of str
        The entries, sorted and without duplicates.

    Raises
    ------
    ConfigError
        A malformed entry, or one in the standard library or built in (never allowed,
        even when listed), naming the entry and the fix.

    """
    allowed = set()
    for entry in entries:
        text = str(entry).strip()
        if not _FACTORY.fullmatch(text):
            raise ConfigError(
                f"--allow-model {entry!r} must be 'package.module:callable' (dotted Python"
                " names), e.g. 'mypkg.nets:make_net'"
            )
        try:
            refuse_standard_library(text)
        except SecurityError as exc:
            raise ConfigError(f"--allow-model {text!r} is refused: {exc}") from None
        allowed.add(text)
    return tuple(sorted(allowed))


def check_allowed(model: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Refuse a job's model unless it is a zoo model or a factory the owner allowed.

    Parameters
    ----------
    model : ModelSpec
        The job's model spec (``name``, and ``factory`` for a custom model).
    allowed : iterable of str
        The device's allow list (:func:`check_allow_list`'s result).

    Raises
    ------
    SecurityError
        A standard-library factory (always), or a factory not in ``allowed``; the message
        names it and the ``--allow-model`` option that allows it. Nothing is imported.

    """
    if model.get("name") != "custom" and "factory" not in model:
        return  # a zoo model: the device's own installed code, no job-chosen callable
    factory = str(model.get("factory"))
    refuse_standard_library(factory)
    if factory not in set(allowed):
        raise SecurityError(
            f"model factory {factory!r} is not allowed on this device; its owner can allow"
            f" it with `meshfl agent run --allow-model {factory}`"
        )


def confine_path(path: str | Path, data_dir: Path) -> Path:
    """Resolve a data path a job names; refuse it unless it lies inside ``data_dir``.

    Parameters
    ----------
    path : str or Path
        The job's path; a relative one is taken relative to ``data_dir``.
    data_dir : Path
        The device's data directory.

    Returns
    -------
    Path
        The resolved path (symlinks followed, ``..`` removed).

    Raises
    ------
    SecurityError
        The resolved path is outside the resolved ``data_dir`` (``/etc/shadow``,
        ``../x``, a symlink pointing out), naming both; or the path holds a NUL byte.

    """
    if "\0" in str(path):
        raise SecurityError(f"the job's data path {str(path)[:200]!r} holds a NUL byte")
    root = Path(data_dir).resolve()
    target = (root / Path(path)).resolve()
    if not target.is_relative_to(root):
        raise SecurityError(
            f"the job's data path {str(path)[:200]!r} resolves to {str(target)[:200]!r},"
            f" outside this device's data directory {str(root)!r}; a job may name only"
            " files in it (put the file there, or pass --test-data on the device)"
        )
    return target
