"""The web dashboard in a real browser, fed by a real ``meshfl local --dashboard`` run.

One run for the module: 4 agents on a ring, 12 paced rounds on digits, device-3 killed
after round 6, the servers kept up 60 s after the job. Headless Chromium (Debian's
``/usr/bin/chromium``, which ``.ci/run`` installs; no ``playwright install``) logs in
with the printed link and watches the fleet table, the topology graph and the charts
fill in over server-sent events. Screenshots go to ``$MESHFL_TEST_ARTIFACTS/dashboard``
(default ``test-artifacts/dashboard`` at the repository root).

The module's tests share the run and are ordered: the browser test ends it (Ctrl-C).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
AGENTS, ROUNDS = 4, 12
KILLED, KILL_ROUND = "device-3", 6
SLOWDOWN = 100.0
"""Every agent trains this many times slower (sleeping): a round takes ~0.5 s, so the
page sees the curves grow and the kill lands mid-run (W1 rounds are ~0.05 s)."""
LINGER_S = 60
START_TIMEOUT_S = 90.0
STEP_MS = 30_000
"""Bound of each wait in the page (milliseconds)."""


@dataclass
class LocalProcess:
    """A ``meshfl local`` child and its stdout, read line by line by a thread."""

    process: subprocess.Popen[str]
    out: Path
    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, prefix: str, timeout_s: float) -> str:
        """The first stdout line starting with ``prefix``; fails on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                found = next((line for line in self.lines if line.startswith(prefix)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    pytest.fail(f"no {prefix!r} line from meshfl local:\n{self.output()}")
                self.changed.wait(min(left, 0.5))

    def said(self, prefix: str) -> bool:
        """Whether a stdout line so far starts with ``prefix``."""
        with self.changed:
            return any(line.startswith(prefix) for line in self.lines)

    def output(self) -> str:
        return "\n".join(self.lines[-60:])


@dataclass(frozen=True)
class Dashboard:
    run: LocalProcess
    base: str  # http://127.0.0.1:PORT
    login_url: str  # BASE/ui#token=...
    token: str


def _ctrl_c_default() -> None:
    """Give the child SIGINT's default action before it starts: a suite run from a
    background script inherits an ignored SIGINT, and Python then never raises Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    out = tmp_path_factory.mktemp("dashboard") / "run"
    slow = [arg for i in range(AGENTS) for arg in ("--slow", f"{i}:{SLOWDOWN:g}")]
    process = subprocess.Popen(
        [
            sys.executable, "-m", "meshfl", "local", "--agents", str(AGENTS),
            "--rounds", str(ROUNDS), "--topology", "ring", "--dataset", "digits",
            "--kill", f"{KILLED}@{KILL_ROUND}", "--deadline", "10", *slow,
            "--dashboard", "--dashboard-linger", str(LINGER_S), "--out", str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=_ctrl_c_default,  # the test presses Ctrl-C (SIGINT) at the end
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    run = LocalProcess(process, out)
    reader = threading.Thread(target=run.read, daemon=True)
    reader.start()
    try:
        line = run.wait_for("dashboard: ", START_TIMEOUT_S)
        login_url = line.removeprefix("dashboard: ").strip()
        base, _, fragment = login_url.partition("/ui#token=")
        assert base.startswith("http://127.0.0.1:") and fragment.startswith("mfa_"), line
        yield Dashboard(run, base, login_url, fragment)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(timeout=5)
        assert process.stdout is not None
        process.stdout.close()
        print(f"meshfl local said (shown when a test fails):\n{run.output()}")


def test_the_dashboard_refuses_a_request_without_a_session(dashboard: Dashboard) -> None:
    page = httpx.get(f"{dashboard.base}/ui", timeout=10)
    snapshot = httpx.get(f"{dashboard.base}/ui/api/snapshot", timeout=10)
    forged = httpx.get(
        f"{dashboard.base}/ui/api/snapshot", cookies={"meshfl_session": "forged"}, timeout=10
    )

    assert page.status_code == 401
    assert page.headers["content-type"].startswith("text/html")
    assert snapshot.status_code == 401
    assert forged.status_code == 401


def test_a_local_run_unfolds_live_in_the_browser(dashboard: Dashboard) -> None:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.is_file(), (
        f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium;"
        " .ci/run does it)"
    )
    shots = _artifacts_dir()
    run = dashboard.run
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(dashboard.login_url)
            page.wait_for_function("() => document.body.dataset.live === 'sse'", timeout=STEP_MS)
            assert "#token" not in page.url  # the login page dropped the secret

            # Every agent enrols and shows online; the job's ring has 4 nodes and 4 edges
            # (read in one look, before the kill makes the coordinator re-plan on 3).
            page.wait_for_function(
                """n => {
                    const rows = [...document.querySelectorAll('#fleet tbody tr[data-device]')];
                    return rows.length === n && rows.every(r => r.dataset.online === 'true');
                }""",
                arg=AGENTS,
                timeout=60_000,
            )
            page.wait_for_function(
                """n => document.querySelectorAll('#graph circle.node').length === n
                    && document.querySelectorAll('#graph line.edge').length === n""",
                arg=AGENTS,
                timeout=STEP_MS,
            )
            page.screenshot(path=shots / "1-ring.png", full_page=True)

            # The accuracy chart grows round by round.
            first = page.wait_for_function(
                """() => {
                    const n = Number(document.querySelector('#chart-accuracy svg')
                        ?.getAttribute('data-points') ?? 0);
                    return n > 0 ? n : null;
                }""",
                timeout=STEP_MS,
            ).json_value()
            page.wait_for_function(
                """n => Number(document.querySelector('#chart-accuracy svg')
                    .getAttribute('data-points')) > n""",
                arg=first,
                timeout=STEP_MS,
            )
            assert first < ROUNDS

            # The killed agent goes offline at once (its Last Will), while the others train.
            snapshot = page.request.get(f"{dashboard.base}/ui/api/snapshot").json()
            ids = {d["name"]: d["device_id"] for d in snapshot["devices"]}
            assert set(ids) == {f"device-{i}" for i in range(AGENTS)}
            run.wait_for(f"after round {KILL_ROUND}: {KILLED} killed", STEP_MS / 1000)
            page.wait_for_function(
                """([killed, n]) => {
                    const rows = [...document.querySelectorAll('#fleet tbody tr[data-device]')];
                    return rows.length === n && rows.every(r =>
                        r.dataset.online === (r.dataset.device === killed ? 'false' : 'true'));
                }""",
                arg=[ids[KILLED], AGENTS],
                timeout=STEP_MS,
            )
            ended = run.said("job ended")
            assert not ended, "the killed agent showed offline only after the job ended"
            snapshot = page.request.get(f"{dashboard.base}/ui/api/snapshot").json()
            killed = next(d for d in snapshot["devices"] if d["name"] == KILLED)
            assert (killed["online"], killed["online_source"]) == (False, "last_will")
            page.screenshot(path=shots / "2-killed.png", full_page=True)

            # The job ends; report.json is written while the servers linger.
            run.wait_for("dashboard still up at ", 120.0)
            report = json.loads((run.out / "report.json").read_text())
            final = report["final"]
            assert report["dashboard_url"] == f"{dashboard.base}/ui"
            assert dashboard.token not in (run.out / "report.json").read_text()
            page.wait_for_function(
                """n => Number(document.querySelector('#chart-accuracy svg')
                    .getAttribute('data-points')) === n""",
                arg=final["rounds_completed"],
                timeout=STEP_MS,
            )
            points = page.locator("#chart-accuracy svg circle.point").count()
            assert points == final["rounds_completed"] == ROUNDS
            ledger = page.locator("#ledger-table tbody tr")  # one row per round, as text
            assert ledger.count() == ROUNDS
            assert ledger.first.locator("td").all_inner_texts()[:2] == ["1", str(AGENTS)]
            assert page.evaluate("() => document.body.dataset.live") == "sse"
            page.screenshot(path=shots / "3-finished.png", full_page=True)

            # A ?job= naming no job says so and falls back to the current job, live.
            page.goto(f"{dashboard.base}/ui?job=job-nope")
            page.wait_for_function(
                """() => !document.getElementById('notice').hidden
                    && document.body.dataset.live === 'sse'
                    && document.querySelectorAll('#graph circle.node').length > 0""",
                timeout=STEP_MS,
            )
            assert "job-nope not found" in page.locator("#notice").inner_text()

            # A login link pasted into a tab already on the login page (only the fragment
            # changes, so no reload) still logs in and leaves the address bar.
            fresh = browser.new_page()
            fresh.goto(f"{dashboard.base}/ui")
            assert fresh.locator("#login-form").count() == 1
            fresh.goto(dashboard.login_url)
            fresh.wait_for_function("() => document.body.dataset.live === 'sse'", timeout=STEP_MS)
            assert "#token" not in fresh.url
        finally:
            browser.close()

    counters = _job_counters(dashboard, report["job_id"])
    assert counters == {
        "meshfl_job_rounds_completed": final["rounds_completed"],
        "meshfl_job_bytes_sent": final["bytes_sent_total"],
        "meshfl_job_bytes_received": final["bytes_received_total"],
    }

    run.process.send_signal(signal.SIGINT)  # Ctrl-C during the linger: a clean stop
    assert run.process.wait(timeout=30) == 0, run.output()
    run.wait_for("stopping the dashboard", 5.0)


def _job_counters(dashboard: Dashboard, job_id: str) -> dict[str, float]:
    """The per-job counters of ``/metrics`` (read with the dashboard's read-only token)."""
    response = httpx.get(
        f"{dashboard.base}/metrics",
        headers={"Authorization": f"Bearer {dashboard.token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    wanted = ("meshfl_job_rounds_completed", "meshfl_job_bytes_sent", "meshfl_job_bytes_received")
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        if family.name not in wanted:  # the parser names a counter without "_total"
            continue
        for sample in family.samples:
            if sample.labels.get("job") == job_id and not sample.name.endswith("_created"):
                found[family.name] = sample.value
    return found


def _artifacts_dir() -> Path:
    root = os.environ.get("MESHFL_TEST_ARTIFACTS")
    base = Path(root) if root else Path(__file__).resolve().parents[2] / "test-artifacts"
    path = base / "dashboard"
    path.mkdir(parents=True, exist_ok=True)
    return path
