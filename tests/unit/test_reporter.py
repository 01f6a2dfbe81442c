"""The agent's reporter: round reports leave in order, off the round loop; polls."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from edge_agent.reporter import Reporter
from edge_agent.rest import CoordinatorClient
from meshfl.errors import CoordinatorError


def _metrics(round_: int) -> dict[str, object]:
    return {
        "round": round_, "accuracy": 0.5, "loss": 1.0, "bytes_sent": 1, "bytes_received": 1,
        "missing": [], "sketch": [], "train_s": 0.0, "round_s": 0.0,
    }  # fmt: skip


class Coordinator:
    """A mock coordinator that answers slowly and records what it got."""

    def __init__(self, delay_s: float = 0.0, refuse: bool = False) -> None:
        self.delay_s, self.refuse = delay_s, refuse
        self.rounds: list[int] = []
        self.polls = 0
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        time.sleep(self.delay_s)
        if request.method == "GET":
            with self.lock:
                self.polls += 1
            return httpx.Response(200, json={"job_id": "job-1", "status": "stopped"})
        if self.refuse:
            return httpx.Response(422, json={"detail": "round 99 is out of range"})
        with self.lock:
            self.rounds.append(json.loads(request.content)["round"])
        return httpx.Response(204)


def _client(coordinator: Coordinator) -> CoordinatorClient:
    client = CoordinatorClient("http://coordinator", transport=httpx.MockTransport(coordinator))
    client.device_token = "t"
    return client


def test_reports_are_queued_without_waiting_and_sent_in_order() -> None:
    coordinator = Coordinator(delay_s=0.05)
    reporter = Reporter(_client(coordinator), "dev-1", "job-1", poll_s=0.2, max_backlog=20)
    started = time.monotonic()
    for r in range(1, 11):
        reporter.post_metrics(_metrics(r))  # type: ignore[arg-type]
    queued_in = time.monotonic() - started
    reporter.close()
    assert coordinator.rounds == list(range(1, 11))
    assert queued_in < 10 * coordinator.delay_s  # the caller never waited for a reply


def test_the_assignment_is_polled_in_the_background() -> None:
    coordinator = Coordinator()
    reporter = Reporter(_client(coordinator), "dev-1", "job-1", poll_s=0.05)
    deadline = time.monotonic() + 5
    while not reporter.assignment()[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    polled, latest = reporter.assignment()
    reporter.close()
    assert polled and latest is not None and latest["status"] == "stopped"
    assert coordinator.polls >= 1


def test_a_refused_report_fails_the_job_on_the_callers_thread() -> None:
    reporter = Reporter(_client(Coordinator(refuse=True)), "dev-1", "job-1", poll_s=10)
    reporter.post_metrics(_metrics(99))  # type: ignore[arg-type]
    with pytest.raises(CoordinatorError, match="out of range"):
        reporter.close()


def test_a_slow_coordinator_applies_backpressure() -> None:
    coordinator = Coordinator(delay_s=0.1)
    reporter = Reporter(_client(coordinator), "dev-1", "job-1", poll_s=10, max_backlog=2)
    started = time.monotonic()
    for r in range(1, 7):
        reporter.post_metrics(_metrics(r))  # type: ignore[arg-type]
    waited = time.monotonic() - started
    reporter.close()
    # Six reports, two may wait: the caller waited for at least three replies (0.1 s each).
    assert waited >= 0.3
    assert coordinator.rounds == list(range(1, 7))


def test_a_rate_limited_request_is_retried_after_retry_after() -> None:
    answers = [httpx.Response(429, headers={"Retry-After": "0.2"}, json={"detail": "slow down"})]

    def coordinator(request: httpx.Request) -> httpx.Response:
        return answers.pop() if answers else httpx.Response(204)

    client = CoordinatorClient("http://c", retry_s=5.0, transport=httpx.MockTransport(coordinator))
    started = time.monotonic()
    client.post_metrics("job-1", _metrics(1))  # type: ignore[arg-type]
    assert answers == [] and time.monotonic() - started >= 0.2


def test_a_rate_limit_longer_than_the_retry_budget_is_a_refusal() -> None:
    def coordinator(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "30"}, json={"detail": "slow down"})

    client = CoordinatorClient("http://c", retry_s=1.0, transport=httpx.MockTransport(coordinator))
    with pytest.raises(CoordinatorError, match="slow down") as caught:
        client.post_metrics("job-1", _metrics(1))  # type: ignore[arg-type]
    assert caught.value.status == 429
