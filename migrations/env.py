"""Alembic environment: URL from Settings (or `-x url=...`), batch mode on SQLite, type comparison on."""

from __future__ import annotations

import logging.config

from alembic import context

from core.settings import Settings
from db.session import make_engine
from db.tables import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    # Precedence: `alembic -x url=...`, a URL set programmatically on the Config, then the environment.
    return (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.attributes.get("url")
        or Settings.from_env().database_url
    )


def _configure(**kwargs) -> None:
    url = kwargs.pop("url", None) or _url()
    context.configure(
        target_metadata=target_metadata,
        render_as_batch=url.startswith("sqlite"),  # SQLite cannot ALTER most things: copy-and-move
        compare_type=True,
        url=url if "connection" not in kwargs else None,
        **kwargs,
    )


def run_migrations_offline() -> None:
    _configure(literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = _url()
    engine = make_engine(url)
    with engine.connect() as connection:
        _configure(connection=connection, url=url)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
