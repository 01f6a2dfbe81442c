"""Options that ``meshfl agent run``, ``fleet`` and ``serve`` share (Typer annotations).

:func:`with_agent_options` gives ``run`` and ``fleet`` the options every agent has, as
the :class:`~edge_agent.daemon.AgentConfig` fields they set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from meshfl.app.cli.option_group import option_group
from meshfl.app.cli.secret_files import read_secret

__all__ = [
    "AllowModelOption",
    "CoordinatorCaOption",
    "CoordinatorOption",
    "DataDirOption",
    "InsecureHttpOption",
    "KeepaliveOption",
    "OfflineGraceOption",
    "TokenFileOption",
    "TokenOption",
    "with_agent_options",
]

CoordinatorOption = Annotated[
    str,
    typer.Option(envvar="MESHFL_COORDINATOR", help="Coordinator URL, e.g. https://10.0.0.5:8443."),
]
CoordinatorCaOption = Annotated[
    Path | None,
    typer.Option(
        envvar="MESHFL_COORDINATOR_CA",
        help="CA (PEM) that signed the coordinator's HTTPS certificate (default: the"
        " system's CA store).",
        show_default=False,
    ),
]
InsecureHttpOption = Annotated[
    bool,
    typer.Option(
        "--insecure-http",
        envvar="MESHFL_INSECURE_HTTP",
        help="Allow a plain http:// coordinator that is not on this machine (tokens and"
        " keys then cross the network unencrypted).",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        envvar="MESHFL_TOKEN",
        help="The fleet's enrolment token (better: MESHFL_TOKEN or --token-file, which"
        " other users cannot read in the process list).",
    ),
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(
        envvar="MESHFL_TOKEN_FILE",
        help="Read the enrolment token from this file (its first line) instead of --token.",
    ),
]
AllowModelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-model",
        envvar="MESHFL_ALLOW_MODEL",
        metavar="PKG.MOD:FN",
        help="A custom model factory jobs may run on this device (repeatable; the env"
        " variable takes a space-separated list). Without it only the model zoo runs; the"
        " Python standard library is never allowed.",
    ),
]
DataDirOption = Annotated[
    Path | None,
    typer.Option(
        envvar="MESHFL_DATA_DIR",
        help="The only folder a job's test data path may point into (default: the folder"
        " holding --data).",
    ),
]
KeepaliveOption = Annotated[
    int,
    typer.Option(
        envvar="MESHFL_KEEPALIVE",
        min=5,
        max=65535,
        metavar="SECONDS",
        help="MQTT keepalive: the broker declares an agent gone (its Last Will)"
        " after 1.5x this without a packet.",
    ),
]
OfflineGraceOption = Annotated[
    float,
    typer.Option(
        envvar="MESHFL_OFFLINE_GRACE",
        min=1.0,
        metavar="SECONDS",
        help="How long a round keeps waiting for a neighbour whose connection dropped"
        " (its Last Will) before mixing without it, at most the round deadline; set it"
        " to your devices' restart time to have a rebooting neighbour waited for.",
    ),
]


def _agent(
    coordinator: CoordinatorOption,
    token: TokenOption = None,
    token_file: TokenFileOption = None,
    allow_model: AllowModelOption = None,
    data_dir: DataDirOption = None,
    test_data: Annotated[
        Path | None, typer.Option(help="Test data to evaluate on (overrides the job's).")
    ] = None,
    label_column: Annotated[str, typer.Option(help="Label column of CSV files.")] = "label",
    keepalive: KeepaliveOption = 30,
    offline_grace: OfflineGraceOption = 1.0,
    coordinator_ca: CoordinatorCaOption = None,
    insecure_http: InsecureHttpOption = False,
) -> dict[str, Any]:
    """The :class:`~edge_agent.daemon.AgentConfig` fields of the options every agent has.

    Raises
    ------
    meshfl.errors.ConfigError
        No token or an unreadable token file; a malformed or never-allowed
        ``--allow-model`` entry.

    """
    from meshfl.modelspec.allow import check_allow_list

    return {
        "coordinator": coordinator,
        "token": read_secret(token, token_file, "--token"),
        "allowed_models": check_allow_list(allow_model or ()),
        "data_dir": data_dir,
        "test_data": test_data,
        "label_column": label_column,
        "keepalive_s": keepalive,
        "offline_grace_s": offline_grace,
        "coordinator_ca": coordinator_ca,
        "insecure_http": insecure_http,
    }


with_agent_options = option_group(_agent, into="agent")
"""Give a Typer command the options of every agent; its ``agent: dict[str, Any]``
parameter receives them as ``AgentConfig`` fields."""
