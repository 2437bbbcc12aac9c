"""The `scalebench` command. Command groups live in their own modules of cli/ and are registered here in
GROUPS, one line each. The CLI talks to the service over HTTP; it imports core (validation, tables) only."""

from __future__ import annotations

import logging

import typer

from cli import plan, plot, token, webhook
from cli import runs as cli_runs
from cli import up as cli_up

app = typer.Typer(name="scalebench", help="scalebench: scaling-efficiency experiments for FP8 training.",
                  no_args_is_help=True)

GROUPS: list[tuple[str, typer.Typer]] = [
    ("token", token.app),
    ("webhook", webhook.app),
]
for _name, _group in GROUPS:
    app.add_typer(_group, name=_name)
for _commands in (cli_up, cli_runs, plot, plan):  # top-level: up, submit, ls, show, cancel, logs, plot, plan
    _commands.register(app)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()
