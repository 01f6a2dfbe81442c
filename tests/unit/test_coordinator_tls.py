"""The control plane over TLS (issue 23 item 2).

A real uvicorn server on a loopback port serves the coordinator over HTTPS from
``meshfl coordinator tls`` material; the agent's client and the operator client verify
it against the CA, refuse another CA, and refuse plain HTTP to a host that is not
loopback unless told ``--insecure-http``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from broker.ports import free_port
from broker.tls import write_tls_dir
from coordinator import CoordinatorSettings, create_app
from coordinator.server import check_tls, tls_arguments
from edge_agent.rest import CoordinatorClient
from meshfl.app.cli import app as cli
from meshfl.app.local.admin import AdminClient
from meshfl.coordinator_url import http_verify, is_loopback
from meshfl.errors import ConfigError

ENROL, ADMIN = "enrol-secret", "admin-secret"


@pytest.fixture
def tls_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """The coordinator's material (CA + coordinator.crt) and an unrelated CA."""
    ours, other = tmp_path / "tls", tmp_path / "other"
    write_tls_dir(ours, ["localhost", "127.0.0.1"], server="coordinator")
    write_tls_dir(other, ["localhost", "127.0.0.1"])
    return ours, other


@pytest.fixture
def https_url(tmp_path: Path, tls_dirs: tuple[Path, Path]) -> Iterator[str]:
    """The coordinator served over HTTPS by uvicorn in a thread, until the test ends."""
    ours, _ = tls_dirs
    settings = CoordinatorSettings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}", enrol_token=ENROL, admin_token=ADMIN
    )
    tls = check_tls(ours / "coordinator.crt", ours / "coordinator.key")
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=port, log_level="warning",
        **tls_arguments(tls),
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = threading.Event()
    while thread.is_alive() and not server.started:
        started.wait(0.02)  # uvicorn has no start callback; its flag is set once bound
    assert server.started, "uvicorn did not start"
    yield f"https://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_https_with_the_coordinators_ca_works_for_agents_and_operators(
    https_url: str, tls_dirs: tuple[Path, Path]
) -> None:
    ca = tls_dirs[0] / "ca.crt"
    device = CoordinatorClient(https_url, ca_file=ca, retry_s=0.0)
    reply = device.enrol(ENROL, "pi", {})
    assert reply["device_id"].startswith("dev-")
    with AdminClient(https_url, ADMIN, ca_file=ca) as operator:
        assert [d["device_id"] for d in operator.devices()] == [reply["device_id"]]
    device.close()


def test_a_certificate_from_another_ca_is_refused_at_once(
    https_url: str, tls_dirs: tuple[Path, Path]
) -> None:
    wrong = tls_dirs[1] / "ca.crt"
    device = CoordinatorClient(https_url, ca_file=wrong, retry_s=30.0)
    with pytest.raises(ConfigError, match=r"not trusted .*--coordinator-ca"):
        device.enrol(ENROL, "pi", {})  # not retried for 30 s: a refusal, not an outage
    with pytest.raises(ConfigError, match="not trusted"):
        AdminClient(https_url, ADMIN, ca_file=wrong).devices()
    with pytest.raises(ConfigError, match="not trusted"):  # no CA: the system store
        AdminClient(https_url, ADMIN, insecure_http=False).devices()


@pytest.mark.parametrize(
    "url", ["http://10.0.0.5:8080", "http://coordinator.lan:8080", "http://[2001:db8::1]:80"]
)
def test_plain_http_to_another_host_is_refused_unless_insecure(url: str) -> None:
    for make in (
        lambda: CoordinatorClient(url),
        lambda: AdminClient(url, ADMIN, insecure_http=False),
    ):
        with pytest.raises(ConfigError, match=r"plain HTTP to another host.*--insecure-http"):
            make()
    assert http_verify(url, insecure_http=True) is True
    CoordinatorClient(url, insecure_http=True).close()


def test_loopback_is_allowed_plain_http() -> None:
    for host in ("localhost", "127.0.0.1", "127.3.2.1", "[::1]", "LOCALHOST"):
        assert http_verify(f"http://{host}:8080") is True
    assert not is_loopback("10.0.0.1") and not is_loopback("localhost.example.com")
    with pytest.raises(ConfigError, match="must be https://"):
        http_verify("ftp://127.0.0.1/")


def test_the_cli_refuses_plain_http_to_another_host_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MESHFL_INSECURE_HTTP", "")  # restored after the test
    monkeypatch.setenv("MESHFL_COORDINATOR_CA", "")
    runner = CliRunner()
    url = "http://192.0.2.7:8080"  # TEST-NET-1: refused before anything is dialled
    fleet = runner.invoke(cli, ["fleet", "ls", "--coordinator", url, "--token", "t"])
    assert isinstance(fleet.exception, ConfigError)
    assert "plain HTTP to another host" in str(fleet.exception)
    job = runner.invoke(cli, ["job", "list", "--coordinator", url, "--admin-token", "t"])
    assert "plain HTTP to another host" in str(job.exception)
    runner.invoke(cli, ["fleet", "--insecure-http", "ls", "--coordinator", url, "--token", ""])
    assert http_verify(url, insecure_http=True) is True
    import os

    assert os.environ["MESHFL_INSECURE_HTTP"] == "1"  # what every client of the command reads


def test_tls_options_are_checked_before_serving(tls_dirs: tuple[Path, Path]) -> None:
    ours, other = tls_dirs
    assert check_tls(None, None) is None
    with pytest.raises(ConfigError, match="go together"):
        check_tls(ours / "coordinator.crt", None)
    with pytest.raises(ConfigError, match="matching key"):
        check_tls(ours / "coordinator.crt", other / "server.key")  # not its key
    with pytest.raises(ConfigError, match="matching key"):
        check_tls(ours / "missing.crt", ours / "coordinator.key")
