"""docker/compose.yaml's fleet, run outside containers with the very same commands.

There is no Docker engine here. This test reads the compose file and runs what each
container would run — Mosquitto with the generated configuration, the coordinator with
the compose environment, three agents with their compose arguments, their health checks —
on loopback, then starts the job the compose file's header documents and follows it to the
end. Host names, ports and paths are the only things substituted.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from broker.mosquitto import MosquittoProcess
from broker.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.mqtt]

DOCKER = Path(__file__).resolve().parents[2] / "docker"
MESHFL = [sys.executable, "-m", "meshfl"]


def _entrypoint(dockerfile: str) -> list[str]:
    for line in (DOCKER / dockerfile).read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            return list(yaml.safe_load(line.removeprefix("ENTRYPOINT")))
    raise AssertionError(f"{dockerfile} has no ENTRYPOINT")


def _wait(check: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    stop(started)


def stop(started: list[subprocess.Popen[bytes]]) -> None:
    for proc in started:
        proc.terminate()
    for proc in started:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    started.clear()


def test_the_compose_fleet_runs_a_job(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    data, out = tmp_path / "data", tmp_path / "out"
    t0 = time.monotonic()

    # broker: the generated configuration (docker/mosquitto.conf is its output)
    with MosquittoProcess(workdir=tmp_path / "broker") as broker:
        check = services["broker"]["healthcheck"]["test"][1:]  # in the container: port 1883
        assert check[0] == "mosquitto_sub", check
        healthy = subprocess.run([*check, "-p", str(broker.port)], capture_output=True, timeout=10)
        assert healthy.returncode == 0, healthy.stderr
        # the compose header's first step
        subprocess.run([*MESHFL, "data", "partition", "--out", str(data), "--devices", "3"],
                       check=True, capture_output=True)  # fmt: skip

        # the compose header's TLS step: the coordinator's HTTPS certificate and its CA
        tls = tmp_path / "tls"
        subprocess.run([*MESHFL, "coordinator", "tls", "--out", str(tls), "--host", "localhost",
                        "--host", "127.0.0.1"], check=True, capture_output=True)  # fmt: skip

        port = free_port()
        coordinator_url = f"https://127.0.0.1:{port}"
        env = {**os.environ, **services["coordinator"]["environment"]}
        env["MESHFL_COORDINATOR_DB_URL"] = f"sqlite:///{tmp_path / 'fleet.db'}"
        env["MESHFL_COORDINATOR_BROKER_URL"] = broker.url
        for name in ("MESHFL_COORDINATOR_TLS_CERT", "MESHFL_COORDINATOR_TLS_KEY"):
            env[name] = env[name].replace("/tls/", f"{tls}/")
        serve = _entrypoint("coordinator.Dockerfile")
        assert serve[:3] == ["meshfl", "coordinator", "serve"]
        serve = [*serve[1:3], "--host", "127.0.0.1", "--port", str(port)]
        processes.append(subprocess.Popen([*MESHFL, *serve], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))  # fmt: skip

        def coordinator_healthy() -> bool:  # the coordinator image's HEALTHCHECK
            trust = ssl.create_default_context(cafile=str(tls / "ca.crt"))
            try:
                url = f"{coordinator_url}/healthz"
                with urllib.request.urlopen(url, timeout=2, context=trust) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        _wait(coordinator_healthy, "the coordinator's /healthz")
        print(f"{time.monotonic() - t0:.1f} s: coordinator healthy")

        def substitute(arg: str) -> str:
            arg = arg.replace("https://coordinator:8080", coordinator_url)
            arg = arg.replace("/tls/", f"{tls}/")
            arg = arg.replace("/home/meshfl/out", str(out))
            return arg.replace("/data/", f"{data}/")

        agent = _entrypoint("agent.Dockerfile")
        assert agent == ["meshfl", "agent", "run"]
        names = [name for name in services if name.startswith("agent-")]
        for name in names:
            command = [substitute(a) for a in services[name]["command"]]
            processes.append(subprocess.Popen([*MESHFL, *agent[1:], *command],
                                              stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))  # fmt: skip
        for name in names:
            health = [substitute(a) for a in services[name]["healthcheck"]["test"][1:]]
            assert health[0] == "meshfl"

            def healthy(health: list[str] = health) -> bool:
                return subprocess.run([*MESHFL, *health[1:]], capture_output=True).returncode == 0

            _wait(healthy, f"{name}'s health check")
            print(f"{time.monotonic() - t0:.1f} s: {name} healthy")

        job = subprocess.run(
            [*MESHFL, "job", "--coordinator-ca", str(tls / "ca.crt"), "start",
             "--coordinator", coordinator_url, "--admin-token",
             env["MESHFL_COORDINATOR_ADMIN_TOKEN"], "--devices", "3", "--rounds", "3",
             "--follow"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip

        print(f"{time.monotonic() - t0:.1f} s: job done")
        assert job.returncode == 0, job.stdout + job.stderr
        assert "completed" in job.stdout + job.stderr, job.stdout
        models = sorted(p.parent.name for p in out.glob("*/*/model.pt"))
        assert models == names
        stop(processes)  # while the broker still runs: agents say "offline" and leave
