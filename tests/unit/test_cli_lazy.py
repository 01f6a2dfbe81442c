"""The CLI loads a sub-command only when it runs (issue 21, item 2; issue 24, item 5)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from meshfl.app.cli import COMMANDS, app, load_command

# What ``meshfl agent run`` must never import on a device.
FORBIDDEN = (
    "meshfl.app.local", "meshfl.app.bench",
    "meshfl.app.cli.local", "meshfl.app.cli.job", "meshfl.app.cli.bench",
    "coordinator", "broker", "fastapi", "starlette", "uvicorn", "sqlalchemy", "amqtt",
)  # fmt: skip

AGENT_RUN = """
import json, sys
from meshfl.app.cli import main
try:
    main(["agent", "run", "--help"])
except SystemExit:
    pass
# What the command's body and a job import, as run_agent does.
import edge_agent.daemon, edge_agent.job, edge_agent.trainer, edge_agent.transport.mqtt
print(json.dumps(sorted(sys.modules)))
"""


def test_meshfl_agent_run_imports_no_launcher_lab_coordinator_broker_or_web_module() -> None:
    out = subprocess.run(
        [sys.executable, "-c", AGENT_RUN], capture_output=True, text=True, check=True
    ).stdout
    modules = json.loads(out.strip().splitlines()[-1])
    loaded = [m for m in modules if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN)]
    assert loaded == []
    assert "meshfl.app.cli.agent" in modules and "edge_agent.daemon" in modules


def test_meshfl_help_lists_every_sub_command_with_its_help() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for name in COMMANDS:
        command = load_command(name)
        first_line = (command.help or "").strip().splitlines()[0]
        assert any(name in line and first_line[:40] in line for line in result.output.splitlines())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_sub_command_loads_and_answers_help(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert load_command(name).name == name


def test_an_unknown_sub_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["no-such-command"])
    assert result.exit_code == 2
    assert isinstance(app, typer.Typer)
