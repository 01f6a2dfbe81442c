"""Errors the coordinator's store raises; ``app.py`` maps each to one HTTP status.

They extend the meshfl tree (:class:`meshfl.errors.CoordinatorError`); invalid user
input raises :class:`meshfl.errors.ConfigError` (HTTP 422). Messages are one line that
says the problem and the fix, and become the response's ``detail``.
"""

from __future__ import annotations

from meshfl.errors import CoordinatorError

__all__ = ["Conflict", "Forbidden", "NotFound", "Unauthorized"]


class NotFound(CoordinatorError):
    """The device or job does not exist (HTTP 404)."""


class Conflict(CoordinatorError):
    """The request does not fit the job's or fleet's current state (HTTP 409)."""


class Forbidden(CoordinatorError):
    """An authenticated device asked for something that is not its own (HTTP 403)."""


class Unauthorized(CoordinatorError):
    """A credential that is unknown, expired, revoked or used up (HTTP 401)."""
