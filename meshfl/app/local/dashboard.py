"""``meshfl local --dashboard``: a login link to the coordinator's web dashboard.

The coordinator of a local run serves the dashboard at ``/ui`` (docs/dashboard.md). With
``--dashboard`` the launcher creates a *read-only* API token through the admin API and
prints ``dashboard: http://127.0.0.1:PORT/ui#token=mfa_…``: the token travels in the
URL's fragment, which a browser never sends to a server; the dashboard's login page
posts it to ``/ui/session`` and drops it from the address bar. After the job, the
launcher keeps the broker and the coordinator up for ``--dashboard-linger`` seconds so
the finished run can still be browsed (:func:`linger`).
"""

from __future__ import annotations

import math
import time
import webbrowser
from collections.abc import Callable

from meshfl.app.local.admin import AdminClient
from meshfl.app.local.processes import Supervisor

__all__ = ["DASHBOARD_PATH", "dashboard_link", "linger", "open_in_browser", "start_dashboard"]

DASHBOARD_PATH = "/ui"
"""Where the coordinator serves its dashboard (the contract's ``GET /ui``)."""

TOKEN_NAME = "meshfl local dashboard"
"""The ``name`` of the read-only API token a local run creates for its dashboard."""

_POLL_S = 0.5
"""How often (seconds) :func:`linger` checks that the coordinator still runs."""


def dashboard_link(admin: AdminClient) -> tuple[str, str]:
    """Create a read-only API token and return the dashboard's URL, without and with it.

    Parameters
    ----------
    admin
        A client of the run's coordinator with an admin token (``POST /tokens``).

    Returns
    -------
    tuple of str
        ``(url, login_url)``: ``http://HOST:PORT/ui`` (safe to write down, e.g. in
        ``report.json``) and the same with ``#token=SECRET`` (the one-click login).

    Raises
    ------
    meshfl.errors.CoordinatorError
        The coordinator refused to create the token.

    """
    created = admin.create_api_token("read-only", name=TOKEN_NAME)
    url = admin.url + DASHBOARD_PATH
    return url, f"{url}#token={created['token']}"


def start_dashboard(admin: AdminClient, open_browser: bool, say: Callable[[str], None]) -> str:
    """Say the dashboard's login link (``dashboard: URL#token=…``), open it if asked.

    Returns the URL without the token; errors as :func:`dashboard_link`.
    """
    url, login_url = dashboard_link(admin)
    say(f"dashboard: {login_url}")
    if open_browser:
        open_in_browser(login_url, say)
    return url


def open_in_browser(login_url: str, say: Callable[[str], None]) -> None:
    """Open ``login_url`` in the user's browser (stdlib :mod:`webbrowser`); say if none."""
    try:
        opened = webbrowser.open(login_url)
    except webbrowser.Error:
        opened = False
    if not opened:
        say("no browser could be opened here: open the dashboard URL above yourself")


def linger(
    seconds: float | None, url: str, supervisor: Supervisor, say: Callable[[str], None]
) -> None:
    """Keep the fleet's servers up after the job so its dashboard can still be browsed.

    Returns after ``seconds`` (``math.inf``: never; ``None`` or 0: at once), on Ctrl-C
    (``KeyboardInterrupt``, which is caught: stopping the dashboard is not an error), or
    as soon as the coordinator exits. The caller stops the processes.

    Parameters
    ----------
    seconds
        How long to wait (seconds, ≥ 0); ``math.inf`` until Ctrl-C; ``None`` (not
        given) as 0.
    url
        The dashboard's URL without its token, for the message.
    supervisor
        Holds the ``coordinator`` child, checked every 0.5 s.
    say
        Prints one line.

    """
    if not seconds:
        return
    forever = math.isinf(seconds)
    span = "until Ctrl-C" if forever else f"for {seconds:g} s (Ctrl-C to stop)"
    say(f"dashboard still up at {url} {span}")
    coordinator = next(c for c in supervisor.children if c.name == "coordinator")
    deadline = None if forever else time.monotonic() + seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            if coordinator.returncode is not None:
                say(f"the coordinator exited ({coordinator.describe_exit()}); dashboard down")
                return
            left = _POLL_S if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(_POLL_S, left)))
    except KeyboardInterrupt:
        say("stopping the dashboard")
