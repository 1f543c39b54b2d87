"""Worker version A for the upgrade test: today's worker as released before the evidence-memo patch.

Run like ``worker.py`` (same flags). Version A's target workflow is the current source of
workflows/target.py with the patched memo upsert taken out, i.e. exactly the code the previous
release ran; it is written to a private directory and imported from there (the workflow sandbox
re-imports a workflow's module by name, so it must be a real file)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATCHED_BRANCH = ("        if workflow.patched(patches.EVIDENCE_MEMO):\n"
                  "            workflow.upsert_memo({\"evidence\": dict(self._evidence)})\n")


def version_a_target_workflow():
    source = (ROOT / "workflows" / "target.py").read_text()
    assert PATCHED_BRANCH in source, "the evidence-memo patch moved; update tests/versioning/worker_a.py"
    copy_dir = Path(tempfile.mkdtemp(prefix="worker-version-a-"))
    (copy_dir / "target_version_a.py").write_text(source.replace(PATCHED_BRANCH, "        pass\n"))
    sys.path.insert(0, str(copy_dir))
    import target_version_a

    return target_version_a.TargetBuildWorkflow


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    import worker
    from workflows.target import TargetBuildWorkflow

    worker.WORKFLOWS[worker.WORKFLOWS.index(TargetBuildWorkflow)] = version_a_target_workflow()
    worker.main()
