"""Harbor manifest parsing and diffing on real pyproject texts (the fixture Harbor history)."""

from __future__ import annotations

import pytest

from domain.harbor_manifest import (
    ManifestError,
    diff_manifests,
    extras_installed_by_dockerfile,
    parse_harbor_manifest,
    parse_requirement,
)
from tests.source.repos import DOCKERFILE_AMD64, HARBOR_V1, HARBOR_V2, HARBOR_V3

INSTALLED = ["analysis", "datasets", "daytona"]


def test_parse_normalises_names_and_keeps_specs():
    m = parse_harbor_manifest(HARBOR_V1)
    assert m.name == "harbor"
    assert m.dependencies["typer"] == ">=0.12"
    assert m.dependencies["rich"] == ""
    assert m.extras["datasets"] == {"huggingface-hub": ">=0.23"}
    assert set(m.extras) == {"analysis", "datasets", "daytona", "dev"}


@pytest.mark.parametrize(
    ("req", "name", "spec"),
    [
        ("Foo_Bar.baz >= 1.0", "foo-bar-baz", ">= 1.0"),
        ("torch[cuda]==2.11; sys_platform == 'linux'", "torch", "[cuda]==2.11; sys_platform == 'linux'"),
        ("pkg @ git+https://x/y.git@abc", "pkg", "@ git+https://x/y.git@abc"),
    ],
)
def test_parse_requirement(req, name, spec):
    assert parse_requirement(req) == (name, spec)


def test_parse_rejects_non_pep621():
    with pytest.raises(ManifestError, match=r"\[project\]"):
        parse_harbor_manifest("[tool.poetry]\nname='x'\n")
    with pytest.raises(ManifestError, match="package name"):
        parse_harbor_manifest('[project]\nname="x"\ndependencies=["  >=1"]\n')


def test_dependency_moved_into_extra_added_removed_changed():
    diff = diff_manifests(parse_harbor_manifest(HARBOR_V1), parse_harbor_manifest(HARBOR_V2), INSTALLED)
    moved = {(m.name, m.from_location, m.to_location, m.in_image) for m in diff.moved}
    assert moved == {
        ("datasets", "dependencies", "extra:datasets", True),
        ("claude-agent-sdk", "dependencies", "extra:agents", True),
    }
    assert [(a.name, a.location, a.spec) for a in diff.added] == [("httpx", "dependencies", ">=0.27")]
    assert [(c.name, c.old_spec, c.new_spec) for c in diff.changed] == [("pydantic", ">=2.6", ">=2.8")]
    assert diff.removed == []
    assert diff.extras_changed == ["agents", "datasets"]
    assert diff.affects_image
    # datasets stays in the image (its extra is installed); claude-agent-sdk leaves it (agents is not).
    assert "image loses claude-agent-sdk ==0.1.4" in diff.image_changes
    assert not any("datasets" in line for line in diff.image_changes)
    assert any(line.startswith("moved datasets from dependencies to extra:datasets") for line in diff.summary_lines)
    assert diff.summary_lines[-1].strip() != ""


def test_removed_and_reverse_direction():
    diff = diff_manifests(parse_harbor_manifest(HARBOR_V2), parse_harbor_manifest(HARBOR_V1), INSTALLED)
    assert [(r.name, r.location) for r in diff.removed] == [("httpx", "dependencies")]
    assert {m.name for m in diff.moved} == {"datasets", "claude-agent-sdk"}
    assert any("image gains claude-agent-sdk" in line for line in diff.image_changes)


def test_change_only_in_uninstalled_extra_does_not_affect_image():
    diff = diff_manifests(parse_harbor_manifest(HARBOR_V2), parse_harbor_manifest(HARBOR_V3), INSTALLED)
    assert not diff.empty
    assert diff.extras_changed == ["dev"]
    assert [(a.name, a.in_image) for a in diff.added] == [("ruff", False)]
    assert not diff.affects_image
    assert "affects image: no" in diff.summary_lines
    # ...but it does when the Dockerfile installs that extra.
    assert diff_manifests(parse_harbor_manifest(HARBOR_V2), parse_harbor_manifest(HARBOR_V3),
                          [*INSTALLED, "dev"]).affects_image


def test_identical_manifests_have_empty_diff():
    diff = diff_manifests(parse_harbor_manifest(HARBOR_V1), parse_harbor_manifest(HARBOR_V1), INSTALLED)
    assert diff.empty and not diff.affects_image


def test_self_referencing_extra_is_expanded():
    text = HARBOR_V2.replace('dev = ["pytest>=8"]', 'dev = ["pytest>=8"]\nall = ["harbor[agents]"]')
    m = parse_harbor_manifest(text)
    assert "claude-agent-sdk" in m.image_requirements(["all"])
    assert "harbor" not in m.image_requirements(["all"])


def test_extras_installed_by_dockerfile():
    assert extras_installed_by_dockerfile(DOCKERFILE_AMD64) == ["analysis", "datasets", "daytona"]
    two = 'RUN pip install "harbor[analysis] @ git+https://x"\nRUN pip install harbor[ Daytona ]@git+https://y'
    assert extras_installed_by_dockerfile(two) == ["analysis", "daytona"]
    assert extras_installed_by_dockerfile("RUN pip install harbor==1.0") == []
