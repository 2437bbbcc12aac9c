"""docker-compose.yml validates with a compose CLI (`config`), with the services and devices the issue names.

No Docker engine runs here: `config` parses, interpolates and validates the file without one.
scripts/test-deps.sh installs Debian's docker-compose (v1.29); a Compose v2 plugin is used when present.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"


def _compose_commands() -> list[list[str]]:
    cmds = []
    if shutil.which("docker-compose"):
        cmds.append(["docker-compose"])
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        cmds.append(["docker", "compose"])
    return cmds


COMMANDS = _compose_commands()
pytestmark = pytest.mark.skipif(
    not COMMANDS,
    reason="no compose CLI: `apt-get install docker-compose` (scripts/test-deps.sh does) or a Compose v2 plugin",
)


def _config(cmd: list[str], *extra: str) -> dict:
    proc = subprocess.run(
        [*cmd, "-f", str(COMPOSE_FILE), *extra, "config"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"{' '.join(cmd)} config failed:\n{proc.stderr}"
    return yaml.safe_load(proc.stdout)


@pytest.mark.parametrize("cmd", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_compose_config_is_valid_with_the_services(cmd: list[str]) -> None:
    services = _config(cmd)["services"]
    assert {"postgres", "redis", "migrate", "api", "worker", "scheduler"} <= set(services)
    assert services["worker-amd"]["profiles"] == ["amd"]  # started only with `--profile amd`
    for name in ("postgres", "redis"):
        assert services[name]["healthcheck"]["test"], f"{name} needs a healthcheck"
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["command"] == ["alembic", "upgrade", "head"]
    assert services["scheduler"]["command"] == ["python", "-m", "worker.scheduler"]


@pytest.mark.parametrize("cmd", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_api_has_no_access_to_run_directories(cmd: list[str]) -> None:
    """The API serves logs from the database: it mounts only the clusters file, never the runs volume."""
    services = _config(cmd)["services"]
    mounts = [
        v if isinstance(v, str) else f"{v.get('source', '')}:{v.get('target', '')}"
        for v in services["api"].get("volumes", [])
    ]
    assert mounts and all("clusters.toml" in m for m in mounts), mounts
    assert all("/data" not in m.split(":")[-1] for m in mounts)
    worker_mounts = [v if isinstance(v, str) else v.get("target", "") for v in services["worker"]["volumes"]]
    assert any("/data" in m for m in worker_mounts)  # the worker does have them


@pytest.mark.parametrize("cmd", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_gpu_workers_get_their_devices(cmd: list[str]) -> None:
    services = _config(cmd, "--profile", "amd")["services"]
    nvidia = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert nvidia["driver"] == "nvidia" and "gpu" in nvidia["capabilities"]
    amd = services["worker-amd"]
    devices = [d if isinstance(d, str) else d.get("source", "") for d in amd["devices"]]
    assert any("/dev/kfd" in d for d in devices) and any("/dev/dri" in d for d in devices)
    assert {"video", "render"} <= set(amd["group_add"])
    for name in ("worker", "worker-amd"):
        command = services[name]["command"]
        assert "--pool" in command and command[command.index("--concurrency") + 1] == "1"


def test_no_top_level_name_key() -> None:
    # docker-compose v1.29 rejects a top-level `name:`; keep the file valid for both v1 and v2.
    assert "name" not in yaml.safe_load(COMPOSE_FILE.read_text())
