"""Import rules: each package is imported in a fresh interpreter and sys.modules inspected, against an
explicit allow-list; and the module-level import graph of our code has no circle.

    core   -> nothing of ours (stdlib + pydantic); inside it, contracts and catalog -> no analysis or projection
              module except the network table, and analysis -> no projection
    osutil -> nothing of ours (process and name-resolution helpers: not pure, so not in core)
    db     -> core
    runner -> core, osutil
    worker -> core, db, osutil
    api    -> core, db, osutil, and of worker only worker.queue (publish a run, ping the broker)
    cli    -> core, osutil (it talks to the service over HTTP; server-side programs run as subprocesses)

No torch in the api, worker, cli or db processes: the worker starts the runner as a program.
"""

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("core", "osutil", "db", "api", "worker", "runner", "cli")
ALLOWED: dict[str, set[str]] = {  # a package name allows all its modules; a dotted name allows that module only
    "core": {"core"},
    "osutil": {"osutil"},
    "db": {"core", "db"},
    "runner": {"core", "osutil", "runner"},
    "worker": {"core", "db", "osutil", "worker"},
    "api": {"core", "db", "osutil", "api", "worker.queue"},
    "cli": {"core", "osutil", "cli"},
}
NO_TORCH = {"core", "osutil", "db", "api", "worker", "cli"}


def _modules(package: str) -> list[str]:
    names = [package]
    for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


def _allowed(module: str, allowed: set[str]) -> bool:
    if module.split(".")[0] in allowed or module in allowed:
        return True
    return any(a.startswith(module + ".") for a in allowed)  # the parent package of an allowed module


def test_allow_list_names_no_whole_package_it_does_not_mean():
    assert "worker" not in ALLOWED["api"] and "db" not in ALLOWED["cli"] and "api" not in ALLOWED["cli"]


@pytest.mark.parametrize("package", OURS)
def test_package_imports_only_what_it_may(package):
    code = (
        "import importlib, json, sys\n"
        f"for m in {_modules(package)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    ours = {m for m in loaded if m.split(".")[0] in OURS}
    forbidden = sorted(m for m in ours if not _allowed(m, ALLOWED[package]))
    assert not forbidden, f"{package} imports {forbidden}"
    if package in NO_TORCH:
        assert "torch" not in {m.split(".")[0] for m in loaded}, f"{package} pulls in torch"


def _module_imports(path: Path, name: str) -> set[str]:
    """Our modules that `name` imports at module level, `if TYPE_CHECKING:` blocks included (imports inside
    functions are not edges)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    body = list(tree.body)
    body += [n for node in tree.body if isinstance(node, ast.If) for n in node.body]
    for node in body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in OURS and m != name}


def _graph() -> dict[str, set[str]]:
    files = {}
    for package in OURS:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            files[".".join(parts)] = path
    return {name: {m for m in _module_imports(path, name) if m in files} for name, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    graph = _graph()
    assert len(graph) > 50  # the walk found our modules
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
