"""RFC 9457 problem details: every error the coordinator answers, and their OpenAPI.

An error is ``Content-Type: application/problem+json`` with the body::

    {"type": "about:blank", "title": "Not Found", "status": 404,
     "detail": "job 'job-1' does not exist; list jobs with GET /api/v1/jobs",
     "instance": "/api/v1/jobs/job-1"}

``type`` is ``about:blank`` (the status says it all, RFC 9457 §4.2.1), ``title`` the
status phrase, ``detail`` the one line that names the problem and the fix (what clients
already read) and ``instance`` the request path. :func:`install` maps meshfl errors,
FastAPI's ``HTTPException`` (404 for an unknown path, 405 with ``Allow``), request
validation (422), a database too busy to answer in time (503 with ``Retry-After``: SQLite's
"database is locked", PostgreSQL's lock timeouts and serialization failures; the request's
transaction is rolled back, clients retry) and unexpected exceptions (500, no internals
shown) to such a body; the
body-size (413) and rate-limit (429) middlewares answer one with :func:`send_problem`.
:func:`document` declares the problem statuses each route can return in the OpenAPI.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException

from coordinator.errors import Conflict, Forbidden, NotFound, Unauthorized
from meshfl.contract import API_PREFIX
from meshfl.errors import ConfigError, MeshflError

__all__ = [
    "PROBLEM_MEDIA_TYPE",
    "PROBLEM_SCHEMA",
    "database_busy",
    "document",
    "install",
    "problem",
    "problem_body",
    "send_problem",
]

PROBLEM_MEDIA_TYPE = "application/problem+json"

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details; `detail` names the problem and the fix.",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "description": "about:blank"},
        "title": {"type": "string", "description": "the HTTP status phrase"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string", "description": "one line: the problem and the fix"},
        "instance": {"type": "string", "description": "the request path"},
    },
}
"""JSON schema of a problem body, as the OpenAPI documents it."""

_STATUS: list[tuple[type[MeshflError], int]] = [
    (NotFound, 404),
    (Conflict, 409),
    (Forbidden, 403),
    (Unauthorized, 401),
    (ConfigError, 422),
]
_INVALID_TOKEN = 'Bearer error="invalid_token"'
_BUSY_SQLSTATES = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock timeout
BUSY_RETRY_AFTER_S = 1
"""``Retry-After`` of a 503 answered while the database was too busy (seconds)."""

log = logging.getLogger(__name__)


def problem_body(status: int, detail: str, instance: str) -> dict[str, Any]:
    """The problem document for ``status`` (an HTTP error code) and a ``detail`` line."""
    return {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": " ".join(str(detail).split()),
        "instance": instance,
    }


def problem(
    status: int, detail: str, instance: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """A problem-details response (``application/problem+json``)."""
    return JSONResponse(
        problem_body(status, detail, instance),
        status_code=status,
        headers=headers,
        media_type=PROBLEM_MEDIA_TYPE,
    )


async def send_problem(
    send: Any, status: int, detail: str, instance: str, headers: Iterable[tuple[str, str]] = ()
) -> None:
    """Answer a problem from raw ASGI middleware (``send`` is the ASGI send callable)."""
    body = json.dumps(problem_body(status, detail, instance)).encode()
    raw = [(b"content-type", PROBLEM_MEDIA_TYPE.encode()), (b"content-length", b"%d" % len(body))]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _meshfl_error(request: Request, exc: Exception) -> Response:
    code = next((c for kind, c in _STATUS if isinstance(exc, kind)), 500)
    headers = None
    if isinstance(exc, Unauthorized) and "authorization" in request.headers:
        headers = {"WWW-Authenticate": _INVALID_TOKEN}
    return problem(code, str(exc), request.url.path, headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):  # registered for HTTPException only
        return await _server_error(request, exc)
    if exc.status_code < 400:  # 204, 304: no body allowed
        return Response(status_code=exc.status_code, headers=exc.headers)
    if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        # FastAPI's 400 for a JSON body that is not UTF-8: malformed JSON, like any other.
        detail = "invalid request: the body is not UTF-8 JSON (send a UTF-8 JSON document)"
        return problem(422, detail, request.url.path)
    return problem(exc.status_code, str(exc.detail), request.url.path, exc.headers)


async def _validation_error(request: Request, exc: Exception) -> Response:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.get("loc", ()))
        if error.get("type") == "extra_forbidden":
            parts.append(f"{where}: unknown field")
        else:
            parts.append(f"{where}: {error.get('msg', 'invalid')}")
    detail = "invalid request: " + "; ".join(parts) + " (fix these fields and retry)"
    return problem(422, detail, request.url.path)


def database_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is the database refusing for contention, not for a fault.

    SQLite's "database is locked" (a writer held the lock past the busy timeout),
    PostgreSQL's SQLSTATE 40001, 40P01 and 55P03, and SQLAlchemy's pool timing out with
    every connection in use; retrying the request can succeed.
    """
    if isinstance(exc, PoolTimeoutError):  # every connection busy past the pool's timeout
        return True
    if not isinstance(exc, OperationalError):
        return False
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    if code in _BUSY_SQLSTATES:  # psycopg 3 (sqlstate) or psycopg2 (pgcode)
        return True
    return "database is locked" in str(exc.orig) or "database table is locked" in str(exc.orig)


async def _database_error(request: Request, exc: Exception) -> Response:
    if not database_busy(exc):  # a real fault: logged with its traceback, like any 500
        log.error("database error on %s %s", request.method, request.url.path, exc_info=exc)
        return await _server_error(request, exc)
    reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
    log.warning("database busy on %s %s (%s): answered 503", request.method,
                request.url.path, reason)  # fmt: skip
    return problem(
        503,
        f"the coordinator's database is busy ({reason}); retry in {BUSY_RETRY_AFTER_S} s",
        request.url.path,
        {"Retry-After": str(BUSY_RETRY_AFTER_S)},
    )


async def _server_error(request: Request, exc: Exception) -> Response:
    # The exception propagates on to the server, which logs it with its traceback.
    return problem(
        500,
        "internal error in the coordinator; it is logged there, report it with this request's"
        " time and path",
        request.url.path,
    )


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` as problem details (see the module docstring)."""
    app.add_exception_handler(MeshflError, _meshfl_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(OperationalError, _database_error)
    app.add_exception_handler(PoolTimeoutError, _database_error)
    app.add_exception_handler(Exception, _server_error)


_DESCRIPTIONS = {
    400: "Bad request: a required header is missing or wrong",
    401: "Missing, unknown, expired, revoked or used-up credential",
    403: "This credential may not do this",
    404: "No such resource",
    409: "The request conflicts with the resource's current state",
    413: "Request body too large",
    422: "Invalid request: a wrong type, an out-of-range value or an unknown field",
    429: "Rate limit of this identity exceeded; retry after Retry-After seconds",
    503: "The database is too busy to answer now; retry after Retry-After seconds",
}


def _response(code: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _DESCRIPTIONS[code],
        "content": {PROBLEM_MEDIA_TYPE: {"schema": PROBLEM_SCHEMA}},
    }
    if code in (429, 503):
        response["headers"] = {
            "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
        }
    return response


def _error_statuses(path: str, method: str, operation: dict[str, Any]) -> set[int]:
    where = {param.get("in") for param in operation.get("parameters", [])}
    codes: set[int] = set()
    if operation.get("security"):  # a bearer token (HTTPBearer)
        codes |= {401, 403}
    if path.startswith(API_PREFIX + "/"):
        codes |= {401, 429, 503}  # a credential, a rate limit, a database that can be busy
    if "path" in where:
        codes |= {404, 409}
    if method not in ("get", "head", "options"):
        codes |= {409, 413, 422}
    if where or "requestBody" in operation:
        codes.add(422)
    if "header" in where:
        codes.add(400)
    return codes


def _document_schema(schema: dict[str, Any]) -> None:
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for code in sorted(_error_statuses(path, method, operation)):
                responses.setdefault(str(code), _response(code))
            for code, response in responses.items():
                if code[:1] in ("4", "5"):  # every error is a problem document
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": PROBLEM_SCHEMA}}


def document(app: FastAPI) -> None:
    """Declare in ``app``'s OpenAPI the problem statuses each operation can return.

    Derived from each operation once the schema is generated: one with a bearer security
    requirement gets 401 and 403; every ``/api/v1`` operation 401, 429 and 503; one with a
    path parameter 404 and 409; a writing method 409, 413 and 422; any parameter or
    body 422; a header parameter 400. A status the route declares itself keeps its own
    description. Every 4xx and 5xx response is documented as ``application/problem+json``
    (:data:`PROBLEM_SCHEMA`), FastAPI's default 422 (``HTTPValidationError``) included.
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _document_schema(generate())  # generate() caches it in app.openapi_schema
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
