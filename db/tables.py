"""Every table module, imported for their side effect on `Base.metadata` (Alembic, test databases)."""

import db.models  # noqa: F401  (every table registers itself on Base.metadata)
from db.base import Base

__all__ = ["Base"]
