"""The service's own import graph: no circle, and the pure modules import no I/O.

Why a static graph (``ast`` + ``graphlib`` from the standard library) and not ``import`` at run time: an
import inside ``if TYPE_CHECKING:`` or a function never runs in a test yet still ties two modules
together for a reader and for the next refactor (``domain/buildset.py`` ↔ ``domain/rehearsal.py`` was such
a circle). Every ``import``/``from … import`` anywhere in a module counts. Anyone can run it:

    PYTHONPATH=$PWD .venv/bin/python -m pytest -p no:cacheprovider -n 0 -q tests/test_import_graph.py
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domain", "clients", "rehearsal", "activities", "workflows", "runtime")
TOP_MODULES = ("worker", "starter")
# Pure: decides without I/O. May import only each other, pydantic and the standard library's pure parts.
PURE = ("domain", "rehearsal.model", "rehearsal.result")
IO_FIRST_PARTY = ("clients", "activities", "workflows", "runtime", "sandbox", "rehearsal.runner", "rehearsal.images",
                  "rehearsal.task_image", "worker", "starter")
IO_THIRD_PARTY = ("subprocess", "socket", "httpx", "git", "temporalio", "fsspec", "shutil", "tempfile")
# The one known edge back: a target child signals its parent workflow by class, imported inside the method
# that sends it (workflows/target.py, "deferred: pipeline imports this module"). Any other circle fails.
KNOWN_BACK_EDGES = {("workflows.target", "workflows.pipeline")}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    out = {name: root / f"{name}.py" for name in TOP_MODULES}
    for pkg in PACKAGES:
        for f in (root / pkg).rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """First-party and third-party modules ``name`` imports, resolved to the longest known module."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            parts = t.split(".")
            hit = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in known),
                       None)
            found.add(hit or t)
    found.discard(name)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {n: imports(n, f, known) for n, f in files.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    own = {n: {d for d in deps if d in g and (n, d) not in KNOWN_BACK_EDGES} for n, deps in g.items()}
    try:
        tuple(graphlib.TopologicalSorter(own).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def _pure(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in PURE)


def impure_imports(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for n, deps in sorted(g.items()):
        if not _pure(n):
            continue
        for d in sorted(deps):
            if any(d == p or d.startswith(p + ".") for p in IO_FIRST_PARTY + IO_THIRD_PARTY):
                bad.append(f"{n} imports {d}")
    return bad


def test_no_import_circle():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_pure_modules_import_no_io():
    assert impure_imports(graph()) == []


def test_checks_fail_on_a_circle_and_on_io(tmp_path):
    """The checks can fail: the old buildset ↔ rehearsal circle, and a pure module importing a client."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    for m in TOP_MODULES:
        (tmp_path / f"{m}.py").write_text("")
    (tmp_path / "domain" / "buildset.py").write_text("from domain.rehearsal import RehearsalResult\n")
    (tmp_path / "domain" / "rehearsal.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from domain.buildset import TargetSpec\n")
    (tmp_path / "rehearsal" / "model.py").write_text("from ..clients import registry\nimport subprocess\n")
    (tmp_path / "clients" / "registry.py").write_text("")
    g = graph(tmp_path)
    assert set(find_cycle(g) or []) == {"domain.buildset", "domain.rehearsal"}
    assert impure_imports(g) == ["rehearsal.model imports clients.registry", "rehearsal.model imports subprocess"]
