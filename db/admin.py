"""Server-side administration that needs the database itself, for the machine that hosts it:

    python -m db.admin create-token [--name NAME] [--role admin|submit]
        # a new API token, printed once (only its sha256 is stored); role admin unless asked otherwise

The `scalebench` CLI speaks HTTP only; for the first token (there is none to authenticate with yet) it runs
this program against the configured database (SCALEBENCH_DATABASE_URL / DATABASE_URL).
"""

from __future__ import annotations

import argparse
import sys

from core.settings import Settings
from db.models import TOKEN_ROLES
from db.session import make_engine, make_session_factory, session_scope
from db.tokens import create_token


def create_token_on(database_url: str, name: str, role: str = "admin") -> str:
    """A token made on the server: the operator's, admin unless asked otherwise (the first token has to be)."""
    engine = make_engine(database_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            token, _row = create_token(session, name, role)
    finally:
        engine.dispose()
    return token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m db.admin", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create-token", help="Create an API token and print it once.")
    create.add_argument("--name", default="default", help="A label for the token (who or what uses it).")
    create.add_argument(
        "--role",
        choices=TOKEN_ROLES,
        default="admin",
        help="admin: also tokens and webhooks; submit: experiments, suites, imports, regressions.",
    )
    args = parser.parse_args(argv)
    if args.command == "create-token":
        sys.stdout.write(create_token_on(Settings.from_env().database_url, args.name, args.role) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
