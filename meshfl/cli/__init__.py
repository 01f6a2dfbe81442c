"""The ``meshfl`` command line (typer + rich): the composition root.

Sub-commands import their application package lazily, so ``meshfl coordinator serve``
works in an install without torch and ``meshfl agent run`` in one without FastAPI.
A :class:`~meshfl.errors.MeshflError` ends the command with its one-line message and
a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from meshfl.cli.agent import agent_app
from meshfl.cli.bench import bench_app
from meshfl.cli.data import data_app
from meshfl.cli.export import export_app
from meshfl.cli.fleet import fleet_app
from meshfl.cli.job import job_app
from meshfl.cli.local import local
from meshfl.cli.model import model_app
from meshfl.cli.predict import predict
from meshfl.cli.servers import broker_app, coordinator_app
from meshfl.cli.topology import topology_app
from meshfl.errors import MeshflError

__all__ = ["app", "main"]

app = typer.Typer(
    name="meshfl",
    help="Decentralized, compressed, private federated learning over MQTT.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(agent_app, name="agent")
app.add_typer(coordinator_app, name="coordinator")
app.add_typer(broker_app, name="broker")
app.add_typer(job_app, name="job")
app.add_typer(fleet_app, name="fleet")
app.add_typer(data_app, name="data")
app.add_typer(bench_app, name="bench")
app.add_typer(topology_app, name="topology")
app.add_typer(model_app, name="model")
app.add_typer(export_app, name="export")
app.command("local")(local)
app.command("predict")(predict)


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
