"""Secrets on the command line without the command line: ``--X`` (or its env var) or ``--X-file``.

A token given as an argument is visible to every user of the machine (``ps``, ``/proc``);
an environment variable or a file readable only by its owner is not.
"""

from __future__ import annotations

from pathlib import Path

from meshfl.errors import ConfigError

__all__ = ["optional_secret", "read_secret"]


def read_secret(value: str | None, file: Path | None, option: str) -> str:
    """A secret given as ``--OPTION`` (or its environment variable) or ``--OPTION-file``.

    The file's first line, stripped, is the secret (a trailing newline is not part of
    it). Exactly one of the two must be given.

    Raises
    ------
    meshfl.errors.ConfigError
        Neither or both given, an unreadable file, or an empty secret.

    """
    if value is not None and file is not None:
        raise ConfigError(f"give {option} or {option}-file, not both")
    if file is None:
        if not value:
            raise ConfigError(
                f"{option} is required: pass {option}-file FILE (or set the environment"
                f" variable) so that it stays out of the process list"
            )
        return value
    try:
        lines = Path(file).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {option}-file {file} ({exc}); check the path") from None
    secret = lines[0].strip() if lines else ""
    if not secret:
        raise ConfigError(f"{option}-file {file} is empty; write the secret on its first line")
    return secret


def optional_secret(value: str | None, file: Path | None, option: str) -> str | None:
    """Like :func:`read_secret`, but ``None`` when neither is given (a default applies)."""
    if value is None and file is None:
        return None
    return read_secret(value, file, option)
