"""HTTP client of the CLI: server URL and token resolution, problem+json errors shown readably.

Errors become `CliError` with a one-paragraph message; the commands print it and exit 1 (no traceback).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import httpx

logging.getLogger("httpx").setLevel(logging.WARNING)  # no request lines in the CLI's output

DEFAULT_URL = "http://127.0.0.1:8000"
TOKEN_FILE_NAME = "token"  # written by `scalebench up` under the data dir


class CliError(Exception):
    """A failure to show the user as is (bad spec, unreachable server, unknown id)."""


def default_server() -> str:
    return os.environ.get("SCALEBENCH_URL") or DEFAULT_URL


def default_token(data_dir: str | None = None) -> str | None:
    """SCALEBENCH_TOKEN, else the token `scalebench up` saved in <data dir>/token."""
    if token := os.environ.get("SCALEBENCH_TOKEN"):
        return token
    path = Path(data_dir or os.environ.get("SCALEBENCH_DATA_DIR", ".scalebench")) / TOKEN_FILE_NAME
    return path.read_text().strip() if path.is_file() else None


def format_problem(response: httpx.Response) -> str:
    """'HTTP 422 Unprocessable Content: detail' and one line per field error: `field: message (allowed: ...)`."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text.strip()[:500]}"
    if not isinstance(body, dict):
        return f"HTTP {response.status_code}: {body}"
    title = body.get("title") or response.reason_phrase
    errors = body.get("errors") or []
    # With field errors the detail repeats them: show the fields, one per line.
    head = f"HTTP {response.status_code} {title}"
    lines = [f"{head}:" if errors else f"{head}: {body.get('detail') or ''}".rstrip(": ")]
    for err in errors:
        line = f"  {err.get('field', '?')}: {err.get('message', '')}"
        if err.get("allowed"):
            line += f" (allowed: {', '.join(str(a) for a in err['allowed'])})"
        lines.append(line)
    return "\n".join(lines)


def problem_line(response: httpx.Response) -> str:
    """A problem+json answer on one line: its detail, else the formatted problem joined."""
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    return " ".join(str(detail).split()) if detail else " ".join(format_problem(response).split())


class ApiClient:
    def __init__(self, server: str | None = None, token: str | None = None, timeout_s: float = 15.0):
        self.server = (server or default_server()).rstrip("/")
        self.token = token if token is not None else default_token()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            raise CliError(
                f"cannot reach the scalebench API at {self.server} ({exc}).\n"
                "Start it with `scalebench up`, or point --server / SCALEBENCH_URL at a running one."
            ) from None
        except httpx.TimeoutException:
            raise CliError(f"the scalebench API at {self.server} did not answer in time ({method} {path})") from None

    def _raise_for_status(self, response: httpx.Response) -> None:
        if response.status_code == 401 and not self.token:
            raise CliError(
                f"{format_problem(response)}\nPass --token or set SCALEBENCH_TOKEN "
                "(create one with `scalebench token create`)."
            )
        if response.status_code >= 400:
            raise CliError(format_problem(response))

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._send(method, path, **kwargs)
        self._raise_for_status(response)
        return response

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).json()

    def post(self, path: str, json: Any = None, headers: dict[str, str] | None = None) -> Any:
        return self.request("POST", path, json=json, headers=headers).json()

    def text(self, path: str, **params: Any) -> str:
        return self.request("GET", path, params=params).text

    def text_or_missing(self, path: str, **params: Any) -> tuple[str | None, str | None]:
        """GET text: (text, None), or (None, the 404's problem on one line) for a missing resource (e.g. a log not
        stored); any other error raises CliError."""
        response = self._send("GET", path, params=params)
        if response.status_code == 404:
            return None, problem_line(response)
        self._raise_for_status(response)
        return response.text, None

    def get_or_problem(self, path: str, **params: Any) -> tuple[Any, str | None]:
        """GET that answers (body, None), or (None, the problem on one line) when the server answers an error
        status (a part of a page that may be refused, e.g. a projection without a network); an unreachable server
        still raises CliError."""
        response = self._send("GET", path, params={k: v for k, v in params.items() if v is not None})
        if response.status_code < 400:
            return response.json(), None
        return None, problem_line(response)

    def get_optional(self, path: str) -> Any | None:
        """GET that answers None on 404 (an endpoint or resource that may not exist)."""
        try:
            response = self._http.get(path)
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    def all_runs(self, experiment_id: int) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = self.get(f"/experiments/{experiment_id}/runs", limit=500, cursor=cursor)
            runs.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                return runs
