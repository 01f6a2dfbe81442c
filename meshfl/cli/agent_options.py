"""Options that ``meshfl agent run`` and ``meshfl agent fleet`` share (typer annotations)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["CoordinatorOption", "KeepaliveOption", "OfflineGraceOption", "TokenOption"]

CoordinatorOption = Annotated[
    str,
    typer.Option(envvar="MESHFL_COORDINATOR", help="Coordinator URL, e.g. http://10.0.0.5:8080."),
]
TokenOption = Annotated[
    str, typer.Option(envvar="MESHFL_TOKEN", help="The fleet's enrolment token.")
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
