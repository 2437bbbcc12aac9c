"""`scalebench up`: the embedded stack in the foreground (registered by cli/main.py)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from cli.stack import Stack, serve_forever

log = logging.getLogger(__name__)


def register(app: typer.Typer) -> None:
    @app.command("up")
    def up(
        host: Annotated[str, typer.Option(help="Address the API listens on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="API port, 1-65535.")] = 8000,
        worker: Annotated[bool, typer.Option("--worker/--no-worker", help="Start a local worker.")] = True,
        token: Annotated[bool, typer.Option("--token/--no-token", help="Create an API token.")] = True,
    ) -> None:
        """Start the API, a worker and the scheduler (SQLite + filesystem broker unless DATABASE_URL/REDIS_URL).

        Children that die are restarted (with back-off); Ctrl-C / SIGTERM stops everything, requeueing a run
        in progress. The token saved in <data dir>/token is reused while the API accepts it."""
        stack = Stack(host=host, port=port, with_worker=worker, with_token=token)
        try:
            stack.start()
        except (RuntimeError, OSError) as exc:
            stack.stop()
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        s = stack.settings
        typer.echo(f"scalebench is up: API {stack.url} (docs {stack.url}/docs)")
        typer.echo(
            f"  database {s.database_url.split('@')[-1]}, broker {s.broker_url.split('@')[-1]}, "
            f"queues {', '.join(stack.queues)}, logs {stack.log_dir}"
        )
        if token:
            value, reused = stack.ensure_token()
            how = f"reused from {stack.token_path}" if reused else f"new, saved to {stack.token_path}"
            typer.echo(f"  token ({how}): {value}")
        typer.echo("Ctrl-C stops everything.")
        code = serve_forever(stack)
        typer.echo("stopping ...")
        stack.stop()
        typer.echo("stopped.")
        raise typer.Exit(code)
