"""The build script must parse as bash before anything is submitted (tree-sitter-bash)."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.contract.bash_syntax import bash_syntax_errors

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "sandbox/fixtures/marinskyrl/docker/build_gpu_rl_kaniko.sh",
           *sorted(Path("/work/shared/real-marinskyrl").glob("era-*/docker/build_gpu_rl_kaniko.sh"))]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.parent.parent.name))
def test_real_and_fixture_scripts_parse(path):
    assert bash_syntax_errors(path.read_text()) == []


def test_an_unterminated_required_variable_guard_is_reported_on_its_line():
    text = '#!/bin/bash\nset -euo pipefail\n: "${GITSHA:?set GITSHA"\necho ok\n'
    errors = bash_syntax_errors(text)
    assert errors and errors[0][0] == 3 and "GITSHA" in errors[0][1]


def test_an_unclosed_if_is_reported():
    assert bash_syntax_errors("if [ -n \"$A\" ]; then\n  echo a\n")
