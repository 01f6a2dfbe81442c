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

    def __init__(self, delay_s: float = 0.0, refuse: bool = False, batches: bool = True) -> None:
        self.delay_s, self.refuse, self.batches = delay_s, refuse, batches
        self.rounds: list[int] = []
        self.posts: list[int] = []  # reports per POST
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
        body = json.loads(request.content)
        if request.url.path.endswith("/batch"):
            if not self.batches:  # a coordinator from before the batch route
                return httpx.Response(404, json={"detail": "Not Found"})
            assert 1 <= len(body) <= 64
        reports = body if isinstance(body, list) else [body]
        with self.lock:
            self.rounds.extend(r["round"] for r in reports)
            self.posts.append(len(reports))
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
    # Six reports, at most two unsent or in flight: four were answered before the sixth was
    # queued, by requests of at most two reports each, so two replies (0.1 s each) at least.
    assert waited >= 0.2
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


def test_reports_that_queue_up_behind_a_request_leave_as_one_batch() -> None:
    coordinator = Coordinator(delay_s=0.05)
    reporter = Reporter(_client(coordinator), "dev-1", "job-1", poll_s=10, max_backlog=8)
    for r in range(1, 41):
        reporter.post_metrics(_metrics(r))  # type: ignore[arg-type]
    reporter.close()

    assert coordinator.rounds == list(range(1, 41))
    assert len(coordinator.posts) < 20 and max(coordinator.posts) > 1


def test_a_coordinator_without_the_batch_route_gets_one_report_at_a_time() -> None:
    coordinator = Coordinator(delay_s=0.05, batches=False)
    reporter = Reporter(_client(coordinator), "dev-1", "job-1", poll_s=10, max_backlog=8)
    for r in range(1, 21):
        reporter.post_metrics(_metrics(r))  # type: ignore[arg-type]
    reporter.close()

    assert coordinator.rounds == list(range(1, 21))
    assert set(coordinator.posts) == {1}


@pytest.mark.parametrize("backlog", [0, 65])
def test_a_backlog_beyond_the_coordinators_batch_limit_is_refused(backlog: int) -> None:
    with pytest.raises(ValueError, match="max_backlog"):
        Reporter(_client(Coordinator()), "dev-1", "job-1", max_backlog=backlog)


def test_fast_rounds_against_a_fast_coordinator_go_out_a_few_reports_a_request() -> None:
    coordinator = Coordinator()  # answers at once: nothing queues up behind a request
    reporter = Reporter(
        _client(coordinator), "dev-1", "job-1", poll_s=10, max_backlog=8, coalesce_s=30.0
    )
    for r in range(1, 42):
        reporter.post_metrics(_metrics(r))  # type: ignore[arg-type]
    reporter.close()

    assert coordinator.rounds == list(range(1, 42))
    *batches, last = coordinator.posts
    assert all(4 <= n <= 8 for n in batches) and 1 <= last <= 8  # close sends the rest


def test_a_lone_report_waits_coalesce_s_for_company_and_close_sends_what_waits() -> None:
    coordinator = Coordinator()
    reporter = Reporter(_client(coordinator), "dev-1", "job-1", poll_s=10, coalesce_s=0.3)
    queued = time.monotonic()
    reporter.post_metrics(_metrics(1))  # type: ignore[arg-type]
    deadline = queued + 10.0
    while not coordinator.rounds and time.monotonic() < deadline:
        time.sleep(0.01)
    waited = time.monotonic() - queued
    reporter.post_metrics(_metrics(2))  # type: ignore[arg-type]
    reporter.close()  # round 2 waits no longer: it goes out now

    assert coordinator.rounds == [1, 2] and coordinator.posts == [1, 1]
    assert waited >= 0.3


def test_with_coalesce_s_0_each_report_goes_out_at_once() -> None:
    coordinator = Coordinator()
    reporter = Reporter(_client(coordinator), "dev-1", "job-1", poll_s=10, coalesce_s=0.0)
    for r in range(1, 6):
        reporter.post_metrics(_metrics(r))  # type: ignore[arg-type]
        deadline = time.monotonic() + 10.0
        while len(coordinator.rounds) < r and time.monotonic() < deadline:
            time.sleep(0.005)
    reporter.close()

    assert coordinator.rounds == [1, 2, 3, 4, 5] and coordinator.posts == [1] * 5
