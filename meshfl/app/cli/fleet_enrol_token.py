"""``meshfl fleet tokens enrol``: the fleet's shared enrolment token — show, rotate, disable.

The coordinator keeps it off unless it was started with ``--enrol-token`` or an operator
rotates one in (docs/security.md, "Control plane TLS, tokens, rate limits, secure
aggregation").
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from meshfl.app.cli.fleet_common import (
    DEFAULT_COORDINATOR,
    CoordinatorUrl,
    JsonFlag,
    Token,
    client,
    parse_ttl,
    print_json,
    show_time,
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
def show(
    coordinator: CoordinatorUrl = DEFAULT_COORDINATOR,
    token: Token = None,
    as_json: JsonFlag = False,
) -> None:
    """Show the fleet token's status (off, active, disabled, expired, used up)."""
    with client(coordinator, token) as fleet:
        state = fleet.fleet_token()
    if as_json:
        print_json(state)
        return
    typer.echo(_describe(state))


@enrol_app.command("rotate")
def rotate(
    uses: Annotated[
        int | None, typer.Option(min=1, help="Devices it may enrol (default: unlimited).")
    ] = None,
    ttl: Annotated[
        str | None, typer.Option(help="Valid for this long: 30m, 12h, 7d (default: no expiry).")
    ] = None,
    coordinator: CoordinatorUrl = DEFAULT_COORDINATOR,
    token: Token = None,
    as_json: JsonFlag = False,
) -> None:
    """Replace the fleet token with a new secret (printed once); the old one stops at once."""
    ttl_s = None if ttl is None else parse_ttl(ttl)
    with client(coordinator, token) as fleet:
        rotated = fleet.rotate_fleet_token(uses=uses, ttl_s=ttl_s)
    if as_json:
        print_json(rotated)
        return
    typer.echo(
        f"{_describe(rotated)}\nsecret (shown only now): {rotated['token']}\n"
        "devices join with:\n"
        f"  meshfl agent run --coordinator {coordinator} --token {rotated['token']} --data PATH"
    )


@enrol_app.command("disable")
def disable(
    coordinator: CoordinatorUrl = DEFAULT_COORDINATOR,
    token: Token = None,
) -> None:
    """Refuse the fleet token from now on; enrolled devices keep working."""
    with client(coordinator, token) as fleet:
        state = fleet.disable_fleet_token()
    typer.echo(_describe(state))
