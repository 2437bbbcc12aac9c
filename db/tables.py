"""Every table module, imported for their side effect on `Base.metadata` (Alembic, test databases)."""

from db import models, models_nightly  # noqa: F401
from db.base import Base

__all__ = ["Base"]
