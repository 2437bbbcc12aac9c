"""Schemas and query parsing of the projection and plan endpoints (api.routers.projection)."""

from __future__ import annotations

import csv
import io

from api.problems import FieldError, ProblemError
from core.contracts.specs import LAYOUT_FORMS, check_layout
from core.contracts.stacks import STACK_FORM, StackValue, parse_stack
from core.projection.model import NetworkUsed, ProjectedPoint, ProjectionReport
from core.projection.plan import Plan, parse_token_count

MAX_GPU_COUNTS = 32
MAX_NUM_DEVICES = 1 << 20
DEFAULT_GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512, 1024)


class ProjectionRead(ProjectionReport):
    experiment_id: int


class PlanRead(Plan):
    experiment_id: int
    network: NetworkUsed
    assumptions: list[str]
    stacks: list[str]  # the projection's: one line per stack charged


def bad_query(param: str, message: str, allowed: list | None = None) -> ProblemError:
    field = f"query.{param}"
    return ProblemError(422, f"{field}: {message}", [FieldError(field=field, message=message, allowed=allowed)])


def parse_gpu_counts(raw: str | None) -> list[int]:
    """'8,64,512' -> [8, 64, 512]; None -> the default ladder; 422 naming the parameter otherwise."""
    if raw is None:
        return list(DEFAULT_GPU_COUNTS)
    allowed = [f"1 to {MAX_GPU_COUNTS} comma-separated device counts, each 1..{MAX_NUM_DEVICES}, e.g. 8,64,512,1024"]
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not parts or any(not p.isdigit() or not 0 < int(p) <= MAX_NUM_DEVICES for p in parts):
        raise bad_query("gpu_counts", f"{raw!r} is not a list of positive device counts", allowed)
    counts = sorted({int(p) for p in parts})
    if len(counts) > MAX_GPU_COUNTS:
        raise bad_query("gpu_counts", f"{len(counts)} counts given; at most {MAX_GPU_COUNTS}", allowed)
    return counts


MAX_EXTRA_LAYOUTS = 8


def parse_layouts(raw: str | None) -> list[str]:
    """'pp=4+tp=2+fsdp,cp=2+fsdp' -> the normalized templates; a '+' a URL decoded as a space is taken back; 422
    naming the parameter and the allowed forms otherwise."""
    if not raw:
        return []
    parts = [p.strip().replace(" ", "+") for p in raw.split(",") if p.strip()]
    allowed = [f"at most {MAX_EXTRA_LAYOUTS} comma-separated layout templates: {LAYOUT_FORMS}"]
    if len(parts) > MAX_EXTRA_LAYOUTS:
        raise bad_query("layouts", f"{len(parts)} layouts given; at most {MAX_EXTRA_LAYOUTS}", allowed)
    out = []
    for part in parts:
        try:
            out.append(check_layout(part))
        except ValueError as exc:
            raise bad_query("layouts", str(exc), allowed) from exc
    return list(dict.fromkeys(out))


def parse_stack_query(raw: str | None) -> dict[str, StackValue]:
    """The `stack` query: field=value pairs (core.projection.stack); 422 naming the parameter, the field and the
    allowed values otherwise."""
    try:
        return parse_stack(raw)
    except ValueError as exc:
        raise bad_query("stack", str(exc), [STACK_FORM]) from exc


def parse_tokens(raw: str) -> float:
    try:
        return parse_token_count(raw)
    except ValueError as exc:
        raise bad_query(
            "tokens",
            str(exc).removeprefix("tokens: "),
            ["a positive number, optionally with K, M, B, T or P: 1T, 500B, 1e12"],
        ) from exc


CSV_SERIES_COLUMNS = ("engine", "model", "num_layers", "precision", "layout", "scaling", "cluster")
CSV_POINT_COLUMNS = tuple(k for k in ProjectedPoint.model_fields if k != "beyond_cluster") + ("beyond_cluster",)


def projection_csv(report: ProjectionReport) -> str:
    """One row per projected point: the series key, then the point (projected, measured beside it, error)."""
    buf = io.StringIO()
    writer = csv.DictWriter(
        buf, fieldnames=(*CSV_SERIES_COLUMNS, *CSV_POINT_COLUMNS, "projection_cluster"), lineterminator="\n"
    )
    writer.writeheader()
    for s in report.series:
        for p in s.points:
            writer.writerow({**s.key.model_dump(), **p.model_dump(), "projection_cluster": report.network.cluster})
    return buf.getvalue()
