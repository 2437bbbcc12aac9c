"""Import rules (DESIGN.md): each package is imported in a fresh interpreter and sys.modules inspected.

core -> nothing of ours; db -> core; api -> core, db, worker; worker -> core, db; runner -> core.
No torch in the api or worker processes: the worker starts the runner as a program.
"""

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("core", "db", "api", "worker", "runner")
ALLOWED = {
    "core": {"core"},
    "db": {"core", "db"},
    "api": {"core", "db", "api", "worker"},
    "worker": {"core", "db", "worker"},
    "runner": {"core", "runner"},
}
NO_TORCH = {"core", "db", "api", "worker"}


def _modules(package: str) -> list[str]:
    path = ROOT / package
    names = [package]
    for info in pkgutil.walk_packages([str(path)], prefix=f"{package}."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


@pytest.mark.parametrize("package", OURS)
def test_package_imports_only_what_it_may(package):
    code = (
        "import importlib, json, sys\n"
        f"for m in {_modules(package)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    ours = loaded & set(OURS)
    assert ours <= ALLOWED[package], f"{package} imports {sorted(ours - ALLOWED[package])}"
    if package in NO_TORCH:
        assert "torch" not in loaded, f"{package} pulls in torch"
