"""``meshfl fleet tokens``: enrolment tokens, and ``tokens api`` for API tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import typer

from meshfl.app.cli.fleet_common import (
    Api,
    console,
    parse_ttl,
    show_time,
    with_api,
    with_api_no_json,
)
from meshfl.app.cli.fleet_enrol_token import enrol_app

__all__ = ["tokens_app"]

tokens_app = typer.Typer(
    help="Enrolment tokens (devices join with them); `tokens api` for API tokens.",
    no_args_is_help=True,
)
api_app = typer.Typer(
    help="API tokens of operators and scripts (admin role needed).", no_args_is_help=True
)
tokens_app.add_typer(api_app, name="api")
tokens_app.add_typer(enrol_app, name="enrol")  # the fleet's shared token

TokenId = Annotated[str, typer.Argument(help="The token's id (from `ls`).", show_default=False)]
Name = Annotated[str | None, typer.Option(help="A name to recognise the token by.")]


def _table(rows: Sequence[Mapping[str, Any]], columns: list[tuple[str, Any]]) -> None:
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for title, _ in columns:
        table.add_column(title, overflow="fold")
    for row in rows:
        table.add_row(*(str(cell(row)) for _, cell in columns))
    console().print(table)


@tokens_app.command("ls")
@with_api
def ls(api: Api) -> None:
    """List enrolment tokens (never their secrets): uses left, expiry, tags, state."""
    with api.client() as fleet:
        rows = fleet.enrolment_tokens()
    if api.printed_json(rows):
        return
    if not rows:
        console().print("no enrolment tokens; create one with `meshfl fleet tokens create`")
        return
    _table(
        rows,
        [
            ("ID", lambda r: r["token_id"]),
            ("NAME", lambda r: r["name"] or "-"),
            ("USES LEFT", lambda r: f"{r['uses_left']}/{r['uses']}"),
            ("EXPIRES", lambda r: show_time(r["expires_at"])),
            ("TAGS", lambda r: ",".join(r["tags"]) or "-"),
            ("STATUS", lambda r: r["status"]),
        ],
    )


@tokens_app.command("create")
@with_api
def create(
    api: Api,
    uses: Annotated[
        int, typer.Option(min=1, help="How many devices may enrol with it (1: one-time).")
    ] = 1,
    ttl: Annotated[str, typer.Option(help="Valid for this long: 90s, 30m, 1h, 7d.")] = "1h",
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", help="Tag given to every device enrolled with it (repeatable)."),
    ] = None,
    name: Name = None,
) -> None:
    """Create an enrolment token and print its secret (shown only this once)."""
    ttl_s = parse_ttl(ttl)
    with api.client() as fleet:
        created = fleet.create_enrolment_token(uses=uses, ttl_s=ttl_s, tags=tag or (), name=name)
    if api.printed_json(created):
        return
    typer.echo(
        f"enrolment token {created['token_id']}: {created['uses']} use(s), expires"
        f" {show_time(created['expires_at'])}, tags {', '.join(created['tags']) or 'none'}\n"
        f"secret (shown only now): {created['token']}\n"
        "a device joins with:\n"
        f"  meshfl agent run --coordinator {api.url} --token {created['token']} --data PATH"
    )


@tokens_app.command("revoke")
@with_api_no_json
def revoke(
    api: Api,
    token_id: TokenId,
) -> None:
    """Revoke an enrolment token: no device can enrol with it any more."""
    with api.client() as fleet:
        fleet.revoke_enrolment_token(token_id)
    typer.echo(f"enrolment token {token_id}: revoked")


@api_app.command("ls")
@with_api
def api_ls(api: Api) -> None:
    """List API tokens (never their secrets): role, name, expiry, state."""
    with api.client() as fleet:
        rows = fleet.api_tokens()
    if api.printed_json(rows):
        return
    if not rows:
        console().print("no API tokens; create one with `meshfl fleet tokens api create`")
        return
    _table(
        rows,
        [
            ("ID", lambda r: r["token_id"]),
            ("ROLE", lambda r: r["role"]),
            ("NAME", lambda r: r["name"] or "-"),
            ("EXPIRES", lambda r: show_time(r["expires_at"])),
            ("STATUS", lambda r: r["status"]),
        ],
    )


@api_app.command("create")
@with_api
def api_create(
    api: Api,
    role: Annotated[
        str, typer.Option(help="admin (everything), operator (reads and changes), read-only.")
    ] = "read-only",
    name: Name = None,
    ttl: Annotated[
        str | None, typer.Option(help="Valid for this long: 30m, 12h, 90d (default: no expiry).")
    ] = None,
) -> None:
    """Create an API token and print its secret (shown only this once)."""
    ttl_s = None if ttl is None else parse_ttl(ttl)
    with api.client() as fleet:
        created = fleet.create_api_token(role, name=name, ttl_s=ttl_s)
    if api.printed_json(created):
        return
    typer.echo(
        f"API token {created['token_id']}: role {created['role']}, expires"
        f" {show_time(created['expires_at'])}\n"
        f"secret (shown only now): {created['token']}\n"
        "use it with:\n"
        f"  export MESHFL_API_TOKEN={created['token']}   # then: meshfl fleet ls\n"
        f"  curl -H 'Authorization: Bearer {created['token']}' {api.url}/api/v1/devices"
    )


@api_app.command("revoke")
@with_api_no_json
def api_revoke(
    api: Api,
    token_id: TokenId,
) -> None:
    """Revoke an API token: its next request is refused (401)."""
    with api.client() as fleet:
        fleet.revoke_api_token(token_id)
    typer.echo(f"API token {token_id}: revoked")
