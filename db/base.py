"""The declarative Base every table module builds on: one MetaData with a constraint naming convention,
UTC timestamps on every dialect, JSON that is JSONB on PostgreSQL, and the enum CHECK helper.

Table modules (db.models, db.models) import from here and never from each other's bottoms;
`db.tables` imports them all for Alembic.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase

# Constraint names are deterministic so that migrations (and `alembic check`) agree on every dialect.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(sa.TypeDecorator[datetime]):
    """DateTime(timezone=True) that always hands back aware UTC datetimes (SQLite drops the zone)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        assert value.tzinfo is not None, "timestamps must be timezone-aware (UTC)"
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def enum_check(column: str, allowed: tuple[str, ...]) -> sa.CheckConstraint:
    values = ", ".join(f"'{v}'" for v in allowed)
    return sa.CheckConstraint(f"{column} IN ({values})", name=f"{column}_allowed")


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime(), dict[str, Any]: JsonType, list[Any]: JsonType}
