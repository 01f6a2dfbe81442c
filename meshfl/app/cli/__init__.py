"""The ``meshfl`` command line (typer + rich): the composition root.

Sub-commands import their application package lazily, so ``meshfl coordinator serve``
works in an install without torch and ``meshfl agent run`` in one without FastAPI.
A :class:`~meshfl.errors.MeshflError` ends the command with its one-line message and
a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

from meshfl.errors import MeshflError

if TYPE_CHECKING:  # typer vendors click: its own Command and Context classes
    from typer._click.core import Command, Context

__all__ = ["COMMANDS", "app", "load_command", "main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("meshfl.app.cli.agent", "agent_app"),
    "coordinator": ("meshfl.app.cli.servers", "coordinator_app"),
    "broker": ("meshfl.app.cli.servers", "broker_app"),
    "job": ("meshfl.app.cli.job", "job_app"),
    "fleet": ("meshfl.app.cli.fleet", "fleet_app"),
    "data": ("meshfl.app.cli.data", "data_app"),
    "bench": ("meshfl.app.cli.bench", "bench_app"),
    "topology": ("meshfl.app.cli.topology", "topology_app"),
    "model": ("meshfl.app.cli.model", "model_app"),
    "export": ("meshfl.app.cli.export", "export_app"),
    "local": ("meshfl.app.cli.local", "local"),
    "predict": ("meshfl.app.cli.predict", "predict"),
}
"""Sub-command name → (module, attribute): a ``typer.Typer`` group or a command function.

A sub-command's module is imported only when that sub-command runs (issue 21, item 2):
``meshfl agent run`` imports no launcher, lab, coordinator, broker or FastAPI module
(``tests/unit/test_cli_lazy.py``). ``meshfl --help`` imports them all to list their help.
"""

_LOADED: dict[str, Command] = {}


def load_command(name: str) -> Command:
    """Import sub-command ``name``'s module and build its click command (cached).

    Raises
    ------
    KeyError
        ``name`` is not in :data:`COMMANDS`.

    """
    if name not in _LOADED:
        module, attribute = COMMANDS[name]
        target: Any = getattr(importlib.import_module(module), attribute)
        if isinstance(target, typer.Typer):
            command: Command = typer.main.get_group(target)
        else:
            single = typer.Typer()
            single.command(name)(target)
            command = typer.main.get_command(single)
        command.name = name
        _LOADED[name] = command
    return _LOADED[name]


class _LazyCommands(dict[str, "Command"]):
    """The root group's ``commands``: ``commands[name]`` builds a sub-command on first use."""

    def __missing__(self, name: str) -> Command:
        if name not in COMMANDS:
            raise KeyError(name)
        command = self[name] = load_command(name)
        return command


class _LazyGroup(TyperGroup):
    """The root group: lists :data:`COMMANDS`, builds one only when it is asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(self.commands)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None


app = typer.Typer(
    name="meshfl",
    cls=_LazyGroup,
    help="Decentralized, compressed, private federated learning over MQTT.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Decentralized, compressed, private federated learning over MQTT."""


# An optional dependency missing from this install, and the extra that brings it.
_EXTRAS = {
    "torch": "agent", "paho": "agent", "sklearn": "agent", "psutil": "agent",
    "fastapi": "coordinator", "uvicorn": "coordinator", "sqlalchemy": "coordinator",
    "alembic": "coordinator", "pydantic_settings": "coordinator", "amqtt": "broker",
    "matplotlib": "local", "onnxruntime": "infer",
}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``meshfl`` console script.

    Usage errors are click's (usage line, exit code 2); a :class:`MeshflError` prints
    ``meshfl: error: <one line>`` and exits with its code; Ctrl-C exits with 130.
    """
    try:
        app(args=argv, prog_name="meshfl")
    except MeshflError as exc:
        print(f"meshfl: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("meshfl: interrupted", file=sys.stderr)
        sys.exit(130)
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root not in _EXTRAS:
            raise
        extra = _EXTRAS[root]
        print(
            f"meshfl: error: this command needs {root}, which comes with the '{extra}' extra:"
            f' pip install "meshfl[{extra}]" (or ".[{extra}]" from a checkout)',
            file=sys.stderr,
        )
        sys.exit(2)
