"""The `scalebench` command. Command groups live in their own modules of cli/ and are registered here in
GROUPS, one line each. The CLI talks to the service over HTTP; it imports core (validation, tables) only.

Its own dependencies are the `cli` extra (CLI_EXTRA_MODULES): installed without it, `scalebench` says which
extra to install instead of ending in a traceback."""

from __future__ import annotations

import logging
import sys

CLI_EXTRA_MODULES = ("typer", "rich", "yaml")  # typer, rich, pyyaml: pyproject's `cli` extra
MISSING_EXTRA = (
    "scalebench: the command line needs the `cli` extra ({module} is not installed):\n  pip install 'scalebench[cli]'"
)

try:
    import typer

    from cli import imports, plan, plot, token, webhook
    from cli import runs as cli_runs
    from cli import up as cli_up
except ModuleNotFoundError as exc:
    if (exc.name or "").split(".")[0] not in CLI_EXTRA_MODULES:
        raise
    _missing: str | None = (exc.name or "").split(".")[0]
else:
    _missing = None
    app = typer.Typer(
        name="scalebench", help="scalebench: scaling-efficiency experiments for FP8 training.", no_args_is_help=True
    )

    GROUPS: list[tuple[str, typer.Typer]] = [
        ("token", token.app),
        ("webhook", webhook.app),
    ]
    for _name, _group in GROUPS:
        app.add_typer(_group, name=_name)
    # top-level: up, submit, ls, show, cancel, logs, plot, plan, import
    for _commands in (cli_up, cli_runs, plot, plan, imports):
        _commands.register(app)


def main() -> None:
    if _missing is not None:
        sys.stderr.write(MISSING_EXTRA.format(module=_missing) + "\n")
        raise SystemExit(1)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()
