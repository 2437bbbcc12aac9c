"""`scalebench token create`: a new API token, printed once; only its sha256 is stored."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from core.settings import Settings
from db.session import make_engine, make_session_factory, session_scope
from db.tokens import create_token

app = typer.Typer(help="API tokens (writes need `Authorization: Bearer <token>`).", no_args_is_help=True)
log = logging.getLogger(__name__)


@app.command("create")
def create(name: Annotated[str, typer.Option(help="A label for the token (who or what uses it).")] = "default"
           ) -> None:
    """Create a token on the configured database (SCALEBENCH_DATABASE_URL) and print it once."""
    settings = Settings.from_env()
    engine = make_engine(settings.database_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            token, row = create_token(session, name)
    finally:
        engine.dispose()
    log.info("created token %d (%s)", row.id, name)
    typer.echo(token)  # the only output on stdout, so that `TOKEN=$(scalebench token create)` works
