"""`scalebench up` writes the token file before its API answers /healthz (a script that waits for /healthz and
then reads .scalebench/token finds it), and `scalebench` installed without the `cli` extra says which extra to
install instead of ending in a traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.cli.test_up_supervisor import REPO, Up, _free_port


@pytest.mark.parametrize("module", ["typer", "rich", "yaml"])
def test_without_the_cli_extra_the_command_names_the_extra(module: str) -> None:
    code = (
        f"import sys; sys.modules[{module!r}] = None; sys.argv = ['scalebench', 'ls']; "
        "from cli.main import main; main()"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "pip install 'scalebench[cli]'" in proc.stderr and f"({module} is not installed)" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_the_token_file_exists_when_healthz_first_answers(tmp_path: Path) -> None:
    port = _free_port()
    up = Up(tmp_path, port, "--no-worker")
    try:
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline and up.proc.poll() is None, up.log()
            try:
                if httpx.get(f"{up.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.02)
        token = (tmp_path / "data" / "token").read_text().strip()  # already there, in one piece
        assert token.startswith("sb_") and len(token) > 40
        up.wait_up()
        line = next(line for line in up.log().splitlines() if "token (" in line)
        assert line.endswith(token) and "new, saved to" in line, line
        assert up.stop() < 5
    finally:
        up.kill()
