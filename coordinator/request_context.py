"""Bind each request's ``job`` and ``device`` to its log lines (:mod:`meshfl.logcontext`).

:func:`bind_request_context` is an app-wide dependency: it reads the ``job_id`` and
``device_id`` path parameters of the matched route (``None`` when the route has none)
into the log context, so every line logged while the request is served — in the
endpoint, its dependencies or the error handlers — names them. Each request runs in its
own task (its own context), so nothing leaks from one request to the next.
"""

from __future__ import annotations

from fastapi import Request

from meshfl import logcontext

__all__ = ["bind_request_context"]


async def bind_request_context(request: Request) -> None:
    """Set the log context's ``job`` and ``device`` from the request's path parameters.

    Async on purpose: a sync dependency runs in a worker thread, whose context changes
    the endpoint would not see.
    """
    params = request.path_params
    job, device = params.get("job_id"), params.get("device_id")
    logcontext.set_values(
        job=None if job is None else str(job), device=None if device is None else str(device)
    )
