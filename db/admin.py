"""Server-side administration that needs the database itself, for the machine that hosts it:

    python -m db.admin create-token [--name NAME]    # prints a new API token (only its sha256 is stored)

The `scalebench` CLI speaks HTTP only; for the first token (there is none to authenticate with yet) it runs
this program against the configured database (SCALEBENCH_DATABASE_URL / DATABASE_URL).
"""

from __future__ import annotations

import argparse
import sys

from core.settings import Settings
from db.session import make_engine, make_session_factory, session_scope
from db.tokens import create_token


def create_token_on(database_url: str, name: str) -> str:
    engine = make_engine(database_url)
    try:
        with session_scope(make_session_factory(engine)) as session:
            token, _row = create_token(session, name)
    finally:
        engine.dispose()
    return token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m db.admin", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create-token", help="Create an API token and print it once.")
    create.add_argument("--name", default="default", help="A label for the token (who or what uses it).")
    args = parser.parse_args(argv)
    if args.command == "create-token":
        sys.stdout.write(create_token_on(Settings.from_env().database_url, args.name) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
