"""`scalebench plot -o`: a path ending in a separator is a directory (made when missing), not the PNG's name."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from cli.client import ApiClient
from cli.main import app as cli
from cli.plot import PNG_MAGIC

PNG = PNG_MAGIC + b"fake png body"


@pytest.fixture
def api_answers_png(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """ApiClient.request answers every GET with a PNG (no server); the paths asked for are recorded."""
    asked: list[str] = []

    def request(self, method, path, **kwargs):
        asked.append(path)
        return httpx.Response(200, content=PNG, headers={"content-type": "image/png"})

    monkeypatch.setattr(ApiClient, "request", request)
    return asked


def _plot(*args: str):
    return CliRunner().invoke(cli, ["plot", "7", *args, "--server", "http://127.0.0.1:9"])


def test_trailing_separator_makes_the_directory_and_writes_the_default_name(tmp_path, api_answers_png) -> None:
    target = tmp_path / "newdir" / "sub"
    result = _plot("-o", f"{target}/")
    assert result.exit_code == 0, result.output
    assert target.is_dir(), "the directory was not made (or a file took its name)"
    png = target / "experiment-7-curves.png"
    assert png.read_bytes() == PNG and f"wrote {png}" in result.stdout
    assert api_answers_png == ["/experiments/7/scaling.png"]


def test_existing_directory_and_plain_file_names(tmp_path, api_answers_png) -> None:
    assert _plot("-o", str(tmp_path)).exit_code == 0
    assert (tmp_path / "experiment-7-curves.png").read_bytes() == PNG
    named = tmp_path / "deeper" / "mine.png"
    assert _plot("-o", str(named)).exit_code == 0 and named.read_bytes() == PNG


def test_output_path_rule(tmp_path: Path) -> None:
    from cli.plot import output_path

    assert output_path("a/b/", 3) == Path("a/b/experiment-3-curves.png")
    assert output_path("a/b", 3) == Path("a/b")  # no separator, not a directory: the file's name
    assert output_path(str(tmp_path), 3) == tmp_path / "experiment-3-curves.png"
    assert output_path("curves.png", 3) == Path("curves.png")
