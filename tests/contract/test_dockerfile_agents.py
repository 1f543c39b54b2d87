"""Dockerfile and AGENTS.md parsers: pins, stages, labels, markers, policy; fail-closed errors."""

from __future__ import annotations

import pytest

from domain.contract import ContractError, parse_agents, parse_dockerfile

from .helpers import DF_AMD, DF_ARM, HARBOR, contract, edited, fixture_files, line_of


def test_pins_and_missing_donor_on_arm64():
    files = fixture_files()
    amd = parse_dockerfile(files[DF_AMD], DF_AMD)
    arm = parse_dockerfile(files[DF_ARM], DF_ARM)
    assert amd.pins["HARBOR_COMMIT"] == HARBOR and arm.pins["HARBOR_COMMIT"] == HARBOR
    assert amd.pins["FLASH_ATTN_VERSION"] == "2.8.3" and amd.pins["TORCH_VERSION"] == "2.11.0"
    assert "VLLM_NATIVE_DONOR_COMMIT" in amd.pins and "VLLM_NATIVE_DONOR_COMMIT" not in arm.pins


def test_stages_labels_and_layers():
    df = parse_dockerfile(fixture_files()[DF_AMD], DF_AMD)
    assert [s.name for s in df.stages] == ["base", "wheel-builder", "rl"]
    assert [s.name for s in df.chain()] == ["base", "rl"]
    assert [s.name for s in df.chain("wheel-builder")] == ["base", "wheel-builder"]
    assert df.labels() == {
        "org.opencontainers.image.source": "https://github.com/marin-community/MarinSkyRL",
        "org.opencontainers.image.revision": "${GITSHA}",
        "org.marin.harbor-commit": "${HARBOR_COMMIT}",
    }
    # with 3 synthetic base layers for the external FROM the image has >= the ops minimum of 20
    assert df.layer_steps() + 3 >= contract().ops.layer_ceiling.min_layers


def test_variant_markers_carry_their_branch():
    df = parse_dockerfile(fixture_files()[DF_ARM], DF_ARM)
    echoes = {e.template: e for s in df.chain() for e in s.echoes}
    meg = echoes["transformer_engine.pytorch + megatron.bridge AutoBridge import OK"]
    std = echoes["megatron backend not installed (INSTALL_MEGATRON=0)"]
    assert meg.guards[0].holds({"INSTALL_MEGATRON": "1"}) is True
    assert std.guards[0].holds({"INSTALL_MEGATRON": "1"}) is False
    assert std.guards[0].holds({"INSTALL_MEGATRON": "0"}) is True
    assert echoes["baked harbor commit: ${HARBOR_COMMIT}"].guards == []
    assert any(e.in_loop for e in echoes.values())  # the pip-check loop lines are not plain markers


def test_dockerfile_without_a_pin_blocks_its_architecture_only():
    files = edited(DF_AMD, lambda t: t.replace("ARG TORCH_VERSION=2.11.0\n", ""))
    c = contract(files)
    blocked = c.script.arches["amd64"].blocked
    assert blocked and DF_AMD in blocked and "ARG TORCH_VERSION" in blocked and "exit 2" in blocked
    assert c.script.arches["arm64"].blocked is None


def test_unknown_instruction_fails_and_from_without_as_is_a_numbered_stage():
    text = fixture_files()[DF_AMD].replace("WORKDIR /opt/skyrl", "FROBNICATE /opt/skyrl")
    with pytest.raises(ContractError) as e:
        parse_dockerfile(text, DF_AMD)
    assert e.value.line == line_of(text, "FROBNICATE") and "FROBNICATE" in str(e.value)
    text = fixture_files()[DF_AMD].replace("FROM base AS rl", "FROM base")
    df = parse_dockerfile(text, DF_AMD)
    assert [s.name for s in df.stages] == ["base", "wheel-builder", "2"]
    assert [s.name for s in df.chain()] == ["base", "2"]


def test_agents_policy_lines():
    policy = parse_agents(fixture_files()["AGENTS.md"])
    texts = [p.text for p in policy.policy]
    assert any("kaniko cache" in t for t in texts)
    assert any("iris cluster restart" in t for t in texts)
    assert any("uv run infra/pre-commit.py --all-files --fix" in t for t in texts)
    assert any("Merge only with explicit user authorization" in t for t in texts)
    assert policy.do_not_touch == ["cloud/iris/launch_rl_iris.py"]


def test_agents_without_policy_section_is_an_empty_policy_not_a_refusal():
    policy = parse_agents("# Notes\n\nNothing here.\n")
    assert policy.policy == [] and policy.do_not_touch == []
    assert parse_agents(None).policy == []


def test_agents_policy_is_read_under_any_heading_that_says_policy():
    text = "# X\n\n## Agent skill policy\n\nSkills must not contain run identifiers.\n\n## Other\n\n" \
           "Never edit `cloud/iris/launch_rl_iris.py` by hand.\n"
    policy = parse_agents(text)
    assert [(p.text, p.line) for p in policy.policy] == [("Skills must not contain run identifiers.", 5)]
    assert policy.do_not_touch == ["cloud/iris/launch_rl_iris.py"]



BUILDKIT_SHAPES = """\
# syntax=docker/dockerfile:1.7
ARG A=1 B="two words"
FROM ubuntu:22.04 AS base
RUN --mount=type=cache,target=/root/.cache \\
    apt-get update && \\
    # a comment inside a continued RUN (BuildKit drops it)
    echo "cache mount ${A} OK"
RUN <<EOF
set -e
echo "from a heredoc"
EOF
RUN ["echo", "exec form prints no shell marker"]
RUN python3 -c "import sys; print('python', sys.version_info[0])" > /dev/null || true
RUN python3 -c "import json; print('json', json.__name__, f'ok {json.__name__}')"
"""


def test_buildkit_shapes_read_as_buildkit_reads_them():
    df = parse_dockerfile(BUILDKIT_SHAPES, "docker/Dockerfile.shapes")
    assert df.pins == {"A": "1", "B": "two words"} and df.pin_lines == {"A": 2, "B": 2}
    (stage,) = df.stages
    assert stage.layer_steps == 5
    echoes = [(e.template, e.line) for e in stage.echoes]
    assert echoes == [("cache mount ${A} OK", 7), ("from a heredoc", 10), ("json $(…) ok $(…)", 14)]
