"""Options that several commands share, declared once and handed over as one value.

A group is a function whose parameters are Typer options; :func:`option_group` makes a
decorator that gives a command those options and calls it with the function's result in
one parameter (FastAPI's dependencies, for Typer). ``meshfl job start`` and ``meshfl local``
share a job's options this way (:mod:`meshfl.app.cli.options`), ``meshfl agent run`` and
``meshfl agent fleet`` the agent's (:mod:`meshfl.app.cli.agent_options`), every
``meshfl fleet`` command the coordinator's (:mod:`meshfl.app.cli.fleet_common`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["option_group"]

_Result = TypeVar("_Result")
Decorator = Callable[[Callable[..., _Result]], Callable[..., _Result]]


def option_group(build: Callable[..., Any], into: str) -> Decorator[Any]:
    """A decorator giving a Typer command the options of ``build`` as one value.

    ``build``'s parameters (``Annotated`` Typer options with their defaults) become
    options of the decorated command, after its own; the command's parameter ``into``
    receives ``build(**their values)``.
    """
    group = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(build, eval_str=True).parameters.values()
    ]

    def decorate(command: Callable[..., _Result]) -> Callable[..., _Result]:
        own = inspect.signature(command, eval_str=True)
        parameters = [p for p in own.parameters.values() if p.name != into] + group

        @functools.wraps(command)
        def run(**values: Any) -> _Result:
            built = build(**{p.name: values.pop(p.name) for p in group})
            return command(**values, **{into: built})

        run.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run

    return decorate
