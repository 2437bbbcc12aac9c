"""The dashboard: static files (plain JS, vendored Chart.js; no CDN, no build step) served at / and /static/.

One page (index.html) with hash routes: #/ experiments, #/experiments/ID one experiment, #/compare?ids=A,B.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
router = APIRouter(include_in_schema=False)
_static = StaticFiles(directory=STATIC_DIR)  # path checks (no escaping the folder), ETag/304, content types


@router.get("/")
def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/static/{path:path}")
async def static_file(path: str, request: Request) -> Response:
    return await _static.get_response(path, request.scope)
