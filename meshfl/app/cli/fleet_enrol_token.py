"""``meshfl fleet tokens enrol``: the fleet's shared enrolment token — show, rotate, disable.

The coordinator keeps it off unless it was started with ``--enrol-token`` or an operator
rotates one in (docs/security.md, "Control plane TLS, tokens, rate limits, secure
aggregation").
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from meshfl.app.cli.fleet_common import (
    Api,
    parse_ttl,
    show_time,
    with_api,
    with_api_no_json,
)

__all__ = ["enrol_app"]

enrol_app = typer.Typer(
    help="The fleet's shared enrolment token: show, rotate (a new secret), disable.",
    no_args_is_help=True,
)


def _describe(state: Any) -> str:
    uses = "unlimited" if state["uses"] is None else f"{state['uses_left']}/{state['uses']} left"
    expires = "never" if state["expires_at"] is None else show_time(state["expires_at"])
    return f"fleet enrolment token: {state['status']}, uses {uses}, expires {expires}"


@enrol_app.command("show")
@with_api
def show(api: Api) -> None:
    """Show the fleet token's status (off, active, disabled, expired, used up)."""
    with api.client() as fleet:
        state = fleet.fleet_token()
    if api.printed_json(state):
        return
    typer.echo(_describe(state))


@enrol_app.command("rotate")
@with_api
def rotate(
    api: Api,
    uses: Annotated[
        int | None, typer.Option(min=1, help="Devices it may enrol (default: unlimited).")
    ] = None,
    ttl: Annotated[
        str | None, typer.Option(help="Valid for this long: 30m, 12h, 7d (default: no expiry).")
    ] = None,
) -> None:
    """Replace the fleet token with a new secret (printed once); the old one stops at once."""
    ttl_s = None if ttl is None else parse_ttl(ttl)
    with api.client() as fleet:
        rotated = fleet.rotate_fleet_token(uses=uses, ttl_s=ttl_s)
    if api.printed_json(rotated):
        return
    typer.echo(
        f"{_describe(rotated)}\nsecret (shown only now): {rotated['token']}\n"
        "devices join with:\n"
        f"  meshfl agent run --coordinator {api.url} --token {rotated['token']} --data PATH"
    )


@enrol_app.command("disable")
@with_api_no_json
def disable(api: Api) -> None:
    """Refuse the fleet token from now on; enrolled devices keep working."""
    with api.client() as fleet:
        state = fleet.disable_fleet_token()
    typer.echo(_describe(state))
