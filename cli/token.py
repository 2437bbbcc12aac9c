"""`scalebench token create`: a new API token, printed once; only its sha256 is stored.

The first token cannot be asked of the API (there is nothing to authenticate with), so this command runs
the server-side `python -m db.admin create-token` against the configured database.
"""

from __future__ import annotations

from typing import Annotated

import typer

from cli.stack import create_local_token

app = typer.Typer(help="API tokens (writes need `Authorization: Bearer <token>`).", no_args_is_help=True)


@app.command("create")
def create(name: Annotated[str, typer.Option(help="A label for the token (who or what uses it).")] = "default"
           ) -> None:
    """Create a token on the configured database (SCALEBENCH_DATABASE_URL) and print it once."""
    try:
        token = create_local_token(name)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(token)  # the only output on stdout, so that `TOKEN=$(scalebench token create)` works
