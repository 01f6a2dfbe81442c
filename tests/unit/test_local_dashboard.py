"""``meshfl local --dashboard``: options, the login link, the linger after the job."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from meshfl.app.cli.local import _linger
from meshfl.app.local import dashboard as dashboard_module
from meshfl.app.local.admin import AdminClient
from meshfl.app.local.dashboard import dashboard_link, linger, open_in_browser, start_dashboard
from meshfl.app.local.fleet import Churn
from meshfl.app.local.processes import Supervisor
from meshfl.app.local.report import build_report
from meshfl.app.local.run import LocalConfig, _interrupted, validate


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"dashboard": True, "dashboard_linger_s": -1.0}, "--dashboard-linger must be"),
        ({"dashboard": True, "dashboard_linger_s": float("nan")}, "--dashboard-linger must be"),
        ({"dashboard_linger_s": 30.0}, "--dashboard-linger needs --dashboard"),
        ({"dashboard_linger_s": 0.0}, "--dashboard-linger needs --dashboard"),  # given at all
        ({"dashboard_linger_s": math.inf}, "--dashboard-linger needs --dashboard"),
        ({"open_browser": True}, "--open needs --dashboard"),
    ],
)
def test_validate_refuses_dashboard_options_in_one_line(
    overrides: dict[str, Any], fragment: str
) -> None:
    from meshfl.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        validate(replace(LocalConfig(agents=4, rounds=5), **overrides))

    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("seconds", [None, 0.0, 2.5, math.inf])
def test_validate_accepts_a_dashboard_linger_of_any_length(seconds: float | None) -> None:
    validate(LocalConfig(agents=4, rounds=5, dashboard=True, dashboard_linger_s=seconds))


def test_the_cli_refuses_open_without_dashboard(capsys: pytest.CaptureFixture[str]) -> None:
    from meshfl.app.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["local", "--agents", "2", "--open"])

    assert exit_info.value.code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == ["meshfl: error: --open needs --dashboard"]


def test_the_cli_refuses_a_zero_linger_without_dashboard(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from meshfl.app.cli import main

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run must not start")

    monkeypatch.setattr("meshfl.app.local.run.run_local", no_run)
    with pytest.raises(SystemExit) as exit_info:
        main(["local", "--agents", "2", "--dashboard-linger", "0"])

    assert exit_info.value.code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == ["meshfl: error: --dashboard-linger needs --dashboard"]


@pytest.mark.parametrize(
    ("dashboard", "given", "tty", "expected"),
    [
        (True, None, True, math.inf),  # on a terminal: until Ctrl-C
        (True, None, False, None),  # in a script: not given, stop at once
        (True, 12.5, True, 12.5),
        (False, None, True, None),
        (False, 3.0, False, 3.0),  # kept, for validate() to refuse
        (False, 0.0, True, 0.0),  # given: kept too
    ],
)
def test_linger_default_depends_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
    dashboard: bool,
    given: float | None,
    tty: bool,
    expected: float | None,
) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: tty)

    assert _linger(dashboard, given) == expected


def _admin(requests: list[httpx.Request]) -> AdminClient:
    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(201, json={"token_id": "tok-1", "token": "mfa_secret"})

    admin = AdminClient("http://127.0.0.1:8123", "admin-token")
    admin._http = httpx.Client(
        base_url=str(admin._http.base_url),
        headers=admin._http.headers,
        transport=httpx.MockTransport(answer),
    )
    return admin


def test_the_link_carries_a_new_read_only_token_in_its_fragment() -> None:
    requests: list[httpx.Request] = []

    url, login_url = dashboard_link(_admin(requests))

    assert url == "http://127.0.0.1:8123/ui"
    assert login_url == "http://127.0.0.1:8123/ui#token=mfa_secret"
    [request] = requests
    assert (request.method, request.url.path) == ("POST", "/api/v1/tokens")
    assert request.headers["authorization"] == "Bearer admin-token"
    assert json.loads(request.content)["role"] == "read-only"


def test_start_dashboard_says_the_link_and_opens_it_only_if_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    lines: list[str] = []

    url = start_dashboard(_admin([]), False, lines.append)
    start_dashboard(_admin([]), True, lines.append)

    assert url == "http://127.0.0.1:8123/ui"
    assert lines == ["dashboard: http://127.0.0.1:8123/ui#token=mfa_secret"] * 2
    assert opened == ["http://127.0.0.1:8123/ui#token=mfa_secret"]


def test_no_browser_is_said_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("webbrowser.open", lambda url: False)
    lines: list[str] = []

    open_in_browser("http://127.0.0.1:1/ui#token=t", lines.append)

    assert len(lines) == 1 and "open the dashboard URL above yourself" in lines[0]


@dataclass
class _Coordinator:
    name: str = "coordinator"
    returncode: int | None = None

    def describe_exit(self) -> str:
        return f"exit code {self.returncode}: boom"


def _supervisor(tmp_path: Path, coordinator: _Coordinator) -> Supervisor:
    supervisor = Supervisor(tmp_path)
    supervisor.children.append(coordinator)  # type: ignore[arg-type]
    return supervisor


@pytest.mark.parametrize("seconds", [None, 0.0])
def test_no_linger_returns_at_once_and_says_nothing(tmp_path: Path, seconds: float | None) -> None:
    lines: list[str] = []

    linger(seconds, "http://h/ui", _supervisor(tmp_path, _Coordinator()), lines.append)

    assert lines == []


def test_linger_waits_its_seconds(tmp_path: Path) -> None:
    lines: list[str] = []
    began = time.monotonic()

    linger(0.3, "http://h/ui", _supervisor(tmp_path, _Coordinator()), lines.append)

    assert time.monotonic() - began >= 0.3
    assert lines == ["dashboard still up at http://h/ui for 0.3 s (Ctrl-C to stop)"]


def test_linger_ends_on_ctrl_c_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dashboard_module.time, "sleep", interrupt)
    lines: list[str] = []

    linger(math.inf, "http://h/ui", _supervisor(tmp_path, _Coordinator()), lines.append)

    assert lines == ["dashboard still up at http://h/ui until Ctrl-C", "stopping the dashboard"]


def test_linger_ends_when_the_coordinator_exits(tmp_path: Path) -> None:
    lines: list[str] = []

    coordinator = _Coordinator(returncode=1)
    linger(math.inf, "http://h/ui", _supervisor(tmp_path, coordinator), lines.append)

    assert lines[-1] == "the coordinator exited (exit code 1: boom); dashboard down"


_JOB: Any = {"job_id": "j1", "status": "running", "devices": []}


def test_a_report_without_a_dashboard_says_null() -> None:
    report = build_report(LocalConfig(), _JOB, [], 1.0, {})

    assert report["dashboard_url"] is None


class _StoppingAdmin:
    """The admin calls :func:`_interrupted` makes, answered for a job with no round."""

    def stop_job(self, job_id: str) -> Any:
        return {**_JOB, "status": "stopped"}

    def rounds(self, job_id: str) -> list[Any]:
        return []

    def topology(self, job_id: str) -> None:
        return None

    def ledger(self, job_id: str) -> Any:
        from meshfl.errors import TransportError

        raise TransportError("the coordinator went away")  # the report is written anyway


def test_an_interrupted_run_s_report_records_its_dashboard_url(tmp_path: Path) -> None:
    config = LocalConfig(out=tmp_path, dashboard=True)
    churn = Churn(config, lambda name: None)

    error = _interrupted(
        config, _StoppingAdmin(), _JOB, time.monotonic(), churn, {},  # type: ignore[arg-type]
        "http://127.0.0.1:8123/ui",
    )  # fmt: skip

    report = json.loads((tmp_path / "report.json").read_text())
    assert "partial report in" in str(error)
    assert report["status"] == "interrupted"
    assert report["dashboard_url"] == "http://127.0.0.1:8123/ui"
    # the same sections as a finished run's, as far as they got
    assert report["chaos"] is None and report["ledger"] == {"error": "the coordinator went away"}
