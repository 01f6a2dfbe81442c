"""meshfl local's operator client: a busy coordinator (503) is waited for, a refusal is not."""

from __future__ import annotations

import httpx
import pytest

from meshfl.app.local import admin as admin_module
from meshfl.app.local.admin import BUSY_RETRIES, AdminClient
from meshfl.errors import CoordinatorError


def _client(answers: list[httpx.Response], monkeypatch: pytest.MonkeyPatch) -> AdminClient:
    """An AdminClient whose requests get ``answers`` in turn; its waits are recorded."""
    client = AdminClient("http://127.0.0.1:9", "admin")  # never dialled: _http is replaced
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.method)
        return answers[min(len(asked), len(answers)) - 1]

    client._http = httpx.Client(
        base_url="http://coordinator.test/api/v1", transport=httpx.MockTransport(answer)
    )
    waits: list[float] = []
    monkeypatch.setattr(admin_module.time, "sleep", waits.append)
    client.asked, client.waits = asked, waits  # type: ignore[attr-defined]
    return client


def busy(retry_after: str = "2") -> httpx.Response:
    body = {"detail": "the coordinator's database is busy (database is locked); retry in 1 s"}
    return httpx.Response(503, headers={"Retry-After": retry_after}, json=body)


def test_a_busy_database_is_retried_after_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _client([busy(), busy("0.5"), httpx.Response(200, json=[])], monkeypatch)
    assert client.jobs() == []
    assert client.asked == ["GET", "GET", "GET"]  # type: ignore[attr-defined]
    assert client.waits == [2.0, 0.5]  # type: ignore[attr-defined]


def test_a_coordinator_busy_past_the_retries_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _client([busy("junk")], monkeypatch)
    with pytest.raises(CoordinatorError, match=r"\(503\): the coordinator's database is busy"):
        client.create_job({})  # type: ignore[typeddict-item]
    assert len(client.asked) == BUSY_RETRIES + 1  # type: ignore[attr-defined]
    assert client.waits == [1.0] * BUSY_RETRIES  # type: ignore[attr-defined]


def test_other_refusals_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _client([httpx.Response(409, json={"detail": "already completed"})], monkeypatch)
    with pytest.raises(CoordinatorError) as refused:
        client.stop_job("job-1")
    assert refused.value.status == 409 and len(client.asked) == 1  # type: ignore[attr-defined]
