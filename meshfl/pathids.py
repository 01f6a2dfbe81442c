"""Ids that name files and folders: one strict pattern, checked before any path is built.

A job id from the coordinator, a device name from the command line: each becomes a path
segment on the device (``<out>/<job id>/<name>/model.pt``, ``<out>/state/<name>/``).
:func:`meshfl.wire.validate_id` allows ``.``, so ``..`` passes it and climbs out of the
folder; :func:`path_id` also wants a letter or digit first, which refuses ``.``, ``..``
and hidden names. Standard library only.
"""

from __future__ import annotations

import re

from meshfl.errors import ConfigError

__all__ = ["PATH_ID", "path_id"]

PATH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
"""1-64 characters of ``A-Z a-z 0-9 _ . -``, the first a letter or digit (ASCII)."""


def path_id(value: object, what: str = "id") -> str:
    """Return ``value`` if it is safe as one path segment, else raise.

    Parameters
    ----------
    value : object
        The id: a str matching :data:`PATH_ID` (no slash or backslash, NUL, ``..``, leading dot).
    what : str, default "id"
        What it names ("job id", "device name"), for the error.

    Raises
    ------
    ConfigError
        Not a str, or not matching :data:`PATH_ID`; the message names the rule.

    """
    if not isinstance(value, str) or PATH_ID.fullmatch(value) is None:
        raise ConfigError(
            f"invalid {what} {str(value)[:80]!r}: use 1-64 characters from A-Z, a-z, 0-9,"
            " '_', '.', '-', starting with a letter or digit"
        )
    return value
