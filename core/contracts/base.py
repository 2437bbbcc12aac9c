"""The two pydantic bases every model of core builds on: `Frozen` for answers (reports, projections, plans) and
`Strict` for what arrives from outside (specs, results, clusters files), which also refuses unknown fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Strict(Frozen):
    model_config = ConfigDict(extra="forbid", frozen=True)
