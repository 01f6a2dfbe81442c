"""Which device and job a log line is about: context variables and a ``logging.Filter``.

The agent binds ``device`` once enrolled and ``job`` while it runs one; the coordinator
binds them per request from the path parameters (``/jobs/{job_id}``,
``/devices/{device_id}``). :class:`ContextFilter`, installed on the log handler by the
CLI, copies both onto every record as ``record.device`` / ``record.job`` (``None``
where nothing is bound), so a text or JSON formatter can show them. A value passed
with ``extra={"device": ...}`` wins over the bound one.

Context variables follow the code that set them: an asyncio task, and a thread started
with :func:`run_in_context`; a thread started otherwise (a library's network thread)
logs ``None``.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["FIELDS", "ContextFilter", "bind", "current", "run_in_context", "set_values"]

FIELDS = ("device", "job")
"""The record attributes :class:`ContextFilter` sets."""

_device: contextvars.ContextVar[str | None] = contextvars.ContextVar("meshfl_device", default=None)
_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("meshfl_job", default=None)
_VARS = {"device": _device, "job": _job}


def current() -> dict[str, str | None]:
    """The values bound now: ``{"device": ..., "job": ...}`` (``None``: not bound)."""
    return {name: var.get() for name, var in _VARS.items()}


def _check(fields: dict[str, str | None]) -> None:
    unknown = set(fields) - set(_VARS)
    if unknown:
        raise TypeError(f"cannot bind {sorted(unknown)}; the log context has {list(FIELDS)}")


def set_values(**fields: str | None) -> None:
    """Bind ``device`` and/or ``job`` for the rest of the current context.

    For code that owns its context and ends with it (an asyncio task serving one
    request); elsewhere use :func:`bind`, which restores the previous values.

    Raises
    ------
    TypeError
        A field other than ``device`` or ``job``.

    """
    _check(fields)
    for name, value in fields.items():
        _VARS[name].set(value)


@contextmanager
def bind(**fields: str | None) -> Iterator[None]:
    """Bind ``device`` and/or ``job`` for the code inside the ``with`` block.

    Raises
    ------
    TypeError
        A field other than ``device`` or ``job``.

    """
    _check(fields)
    tokens = [(_VARS[name], _VARS[name].set(value)) for name, value in fields.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def run_in_context(target: Callable[..., Any]) -> Callable[..., Any]:
    """``target`` made to run in a copy of the caller's context (for ``Thread(target=...)``)."""
    context = contextvars.copy_context()

    def run(*args: Any, **kwargs: Any) -> Any:
        return context.run(target, *args, **kwargs)

    return run


class ContextFilter(logging.Filter):
    """Sets ``record.device`` and ``record.job`` from the bound values; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the context fields a record does not carry yet; always True."""
        for name, var in _VARS.items():
            if not hasattr(record, name):
                setattr(record, name, var.get())
        return True
