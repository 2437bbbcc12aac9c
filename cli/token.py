"""`scalebench token create | list | revoke`: API tokens. Only a token's sha256 is stored; it is shown once.

The first token cannot be asked of the API (there is nothing to authenticate with), so `create` runs the
server-side `python -m db.admin create-token` against the configured database. `list` and `revoke` talk
HTTP (GET /tokens, DELETE /tokens/{id}) with a token of their own.
"""

from __future__ import annotations

import enum
from typing import Annotated

import typer
from rich.table import Table

from cli.client import ApiClient
from cli.runs import ServerOpt, TokenOpt, cli_errors, console, utc_time
from cli.stack import create_local_token


class TokenRole(enum.StrEnum):
    """db.models.TOKEN_ROLES, for typer's choices."""

    submit = "submit"
    admin = "admin"


app = typer.Typer(help="API tokens (writes need `Authorization: Bearer <token>`).", no_args_is_help=True)


@app.command("create")
def create(
    name: Annotated[str, typer.Option(help="A label for the token (who or what uses it).")] = "default",
    role: Annotated[
        TokenRole,
        typer.Option(help="admin: also tokens and webhooks; submit: experiments, suites, imports, regressions."),
    ] = TokenRole.admin,
) -> None:
    """Create a token on the configured database (SCALEBENCH_DATABASE_URL) and print it once."""
    try:
        token = create_local_token(name, role=role.value)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(token)  # the only output on stdout, so that `TOKEN=$(scalebench token create)` works


@app.command("list")
@cli_errors
def list_tokens(server: ServerOpt = None, token: TokenOpt = None) -> None:
    """Tokens that still authenticate: id, name, prefix, created, last used (never the token itself)."""
    with ApiClient(server, token) as client:
        rows = client.get("/tokens")
    table = Table("id", "name", "role", "prefix", "created (UTC)", "last used (UTC)")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["name"],
            r.get("role") or "-",
            f"{r['prefix']}…" if r["prefix"] else "-",
            utc_time(r["created_at"]),
            utc_time(r["last_used_at"], "never"),
        )
    console.print(table)


@app.command("revoke")
@cli_errors
def revoke(
    token_id: Annotated[int, typer.Argument(help="Token id (from `scalebench token list`).")],
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Revoke a token: it gets 401 from then on (an admin token revokes any token, a submit token only itself; a
    revoked token stays revoked)."""
    with ApiClient(server, token) as client:
        row = client.request("DELETE", f"/tokens/{token_id}").json()
    console.print(f"token {row['id']} ({row['name']}) is revoked, since {utc_time(row['revoked_at'])}", highlight=False)
