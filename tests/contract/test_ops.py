"""Ops runbook parser: tables, launch templates, ceiling, artifact; disagreements and the correction."""

from __future__ import annotations

from domain.contract import corrected_ops_doc, parse_ops

from .helpers import OPS, contract, edited, fixture_files, line_of


def ops():
    return parse_ops(fixture_files()[OPS], uri_schemes=["s3://", "file://"])


def test_launch_templates():
    o = ops()
    amd, arm = o.templates["amd64"], o.templates["arm64"]
    assert amd.cluster == "cw-rno2a" and arm.cluster == "cw-us-east-08a"
    assert amd.task_image == "docker.io/library/ubuntu:22.04"
    assert amd.no_sync and amd.enable_extra_resources and amd.no_wait
    assert (amd.cpu, amd.memory, amd.disk, amd.gpu) == (48.0, "512GB", "400GB", None)
    assert (arm.cpu, arm.memory, arm.disk, arm.gpu) == (96.0, "640GB", "500GB", "GB200x1")
    assert (amd.priority, amd.max_retries, amd.timeout_s) == ("interactive", 0, 18000)
    assert (arm.max_retries, arm.timeout_s) == (3, 28800)
    assert [(e.name, e.value) for e in amd.env] == [
        ("BUILD_B64", "$BUILD_B64"), ("GITSHA", "$GITSHA"), ("DOCKER_USER_ID", "$DOCKER_USER_ID"),
        ("GHCR_TOKEN", "$GHCR_TOKEN"), ("WHEEL_SOURCE", "wheel-builder")]
    assert amd.command[:2] == ["bash", "-lc"] and "mktemp" in amd.command[2]
    assert amd.job_name == "gpurl-kaniko-amd64-${VARIANT}-${SHORT_SHA}"
    assert [(e.name, e.value) for e in o.megatron_env] == [("INSTALL_MEGATRON", "1"), ("TAG_PREFIX", "gpu-rl-megatron")]


def test_tables():
    o = ops()
    assert {a: p.cluster for a, p in o.placements.items()} == {"amd64": "cw-rno2a", "arm64": "cw-us-east-08a"}
    c = o.layer_ceiling
    assert (c.max_layer_bytes, c.warn_layer_bytes, c.min_layers) == (8 * 10**9, 4 * 10**9, 20)
    rules = {r.glob: r.rebuild for r in o.deploy_boundary}
    assert rules["skyrl-train/**"] is True and rules["cloud/iris/**"] is False
    art = o.wheel_artifact
    assert art.uri.startswith("s3://marin-us-east-02a/") and len(art.sha256) == 64
    assert art.usable is False and "not usable" in art.reason


def test_artifact_truncated_sha_is_unusable_even_if_marked_usable():
    text = fixture_files()[OPS].replace("| usable | no |", "| usable | yes |")
    assert parse_ops(text).wheel_artifact.usable is True
    sha = parse_ops(text).wheel_artifact.sha256
    short = parse_ops(text.replace(sha, sha[:12])).wheel_artifact
    assert short.usable is False and "64-hex" in short.reason


def test_unknown_flag_is_skipped_with_its_line_not_refused():
    text = fixture_files()[OPS].replace("  --no-wait \\\n", "  --no-wait \\\n  --frobnicate \\\n", 1)
    o = parse_ops(text)
    assert any(f"line {line_of(text, '--frobnicate')}:" in s and "--frobnicate" in s for s in o.skipped)
    assert o.templates["amd64"].cpu == 48.0 and o.templates["amd64"].command[:2] == ["bash", "-lc"]


def test_key_equals_value_env_is_not_an_env_pair():
    text = fixture_files()[OPS].replace('-e GITSHA "$GITSHA"', '-e GITSHA="$GITSHA" -e X', 1)
    o = parse_ops(text)
    assert "GITSHA" not in {e.name for e in o.templates["amd64"].env}
    assert any("two arguments" in s for s in o.skipped)


def test_reshaped_tables_are_read_by_header_meaning():
    text = fixture_files()[OPS]
    renamed = (text.replace("| architecture | cluster | priority |", "| host arch | build cluster | priority |")
               .replace("## Layer ceiling", "## Layers").replace("## Cluster placements", "## Where builds run"))
    o = parse_ops(renamed)
    assert {a: (p.cluster, p.line) for a, p in o.placements.items()} == {
        "amd64": ("cw-rno2a", line_of(text, "| amd64 | cw-rno2a |")),
        "arm64": ("cw-us-east-08a", line_of(text, "| arm64 | cw-us-east-08a |"))}
    assert o.layer_ceiling.max_layer_bytes == 8 * 10**9


def test_missing_sections_fall_back_to_configuration_and_are_reported():
    from domain.config import BuildSettings

    text = fixture_files()[OPS]
    start, end = text.index("## Layer ceiling"), text.index("## Prebuilt wheel artifact")
    files = edited(OPS, lambda t: t[:start] + t[end:])
    c = contract(files)
    assert c.layer_ceiling.max_layer_bytes == BuildSettings().max_layer_bytes
    assert c.provenance["layer_ceiling.max_layer_bytes"] == "config:build.max_layer_bytes"
    assert {f.field for f in c.fallbacks} >= {"layer_ceiling.max_layer_bytes", "layer_ceiling.min_layers"}


def test_unrecognized_required_when_is_kept_but_not_compared():
    text = fixture_files()[OPS].replace("| `GITSHA` | always |", "| `GITSHA` | sometimes |")
    rows = {r.variable: r for r in parse_ops(text).contract_rows}
    assert rows["GITSHA"].understood is False and rows["GITSHA"].line == line_of(text, "sometimes")
    assert any(s.startswith(f"line {line_of(text, 'sometimes')}: the condition of GITSHA") for s in parse_ops(text).skipped)
    c = contract(edited(OPS, lambda _: text))
    assert "build contract: GITSHA" not in {d.field for d in c.disagreements}


def test_disagreement_and_correction():
    c = contract()
    assert [(d.field, d.prose_value, d.script_value, d.prose_source) for d in c.disagreements] == [
        ("build contract: HF_TOKEN", "required always", "not required by the script",
         f"{OPS}:{line_of(fixture_files()[OPS], '| `HF_TOKEN` | always |')}")]
    fixed = corrected_ops_doc(c)
    assert fixed is not None and "HF_TOKEN" not in fixed
    again = contract(edited(OPS, lambda _: fixed))
    assert again.disagreements == [] and corrected_ops_doc(again) is None


def test_disagreement_on_default_and_missing_row():
    files = edited(OPS, lambda t: t.replace("optional (default: gpu-rl)", "optional (default: gpu-rl-image)")
                   .replace("| `GITSHA` | always | the full 40-hex committed revision the bundle was cut from |\n", ""))
    c = contract(files)
    fields = {d.field: d for d in c.disagreements}
    assert fields["build contract: TAG_PREFIX"].script_value == "default gpu-rl"
    assert fields["build contract: GITSHA"].prose_value == "absent"
    fixed = corrected_ops_doc(c)
    assert "optional (default: gpu-rl)" in fixed and "| `GITSHA` | always |" in fixed


def test_template_named_only_by_cluster_is_placed_by_the_placements_table():
    text = (fixture_files()[OPS].replace("### amd64", "### First template").replace("### arm64", "### Second template")
            .replace("gpurl-kaniko-amd64-", "gpurl-kaniko-a-").replace("gpurl-kaniko-arm64-", "gpurl-kaniko-b-"))
    o = parse_ops(text)
    assert (o.templates["amd64"].cpu, o.templates["arm64"].cpu) == (48.0, 96.0)
    assert o.templates["arm64"].lines["gpu"] == line_of(text, "--gpu GB200x1")
    assert "*" not in o.templates or o.templates["*"].cpu is None


def test_resource_table_and_a_conflicting_later_statement_is_reported():
    text = fixture_files()[OPS].replace(
        "| architecture | cluster | priority |\n|---|---|---|\n| amd64 | cw-rno2a | interactive |",
        "| architecture | cluster | priority | cpu | memory |\n|---|---|---|---|---|\n| amd64 | cw-rno2a | interactive | 12 | 64GB |")
    text = text.replace("| arm64 | cw-us-east-08a | interactive |", "| arm64 | cw-us-east-08a | interactive | 96 | 640GB |")
    o = parse_ops(text)
    row = line_of(text, "| amd64 | cw-rno2a | interactive | 12 |")
    assert (o.templates["amd64"].cpu, o.templates["amd64"].lines["cpu"]) == (12.0, row)
    assert f"line {line_of(text, '--cpu 48')}: cpu 48.0 ignored; line {row} states 12.0" in o.skipped
    assert not [s for s in o.skipped if "cpu 96" in s]  # the same value stated twice is no conflict


PROSE_SHAPES = """# GPU-RL image

## Shapes

For arm64 add `--gpu GB200x1 --cpu 96 --memory 640GB`; amd64 needs `--cpu 48 --memory 512GB`.
Both take `--timeout 100`.

## Wheels

Cut the wheel artifact with its own job:

```bash
iris --cluster=cw-us-east-02a job run --cpu 8 --memory 16GB -- python cut_wheels.py
```
"""


def test_flags_in_inline_code_go_to_the_architecture_the_sentence_names():
    o = parse_ops(PROSE_SHAPES)
    arm, amd = o.templates["arm64"], o.templates["amd64"]
    assert (arm.gpu, arm.cpu, arm.memory, arm.lines["cpu"]) == ("GB200x1", 96.0, "640GB", 5)
    assert (amd.cpu, amd.memory, amd.timeout_s) == (48.0, "512GB", None)
    assert "line 6: launch flags in a sentence that names no single architecture" in o.skipped


def test_an_iris_job_for_another_command_is_not_a_build_template():
    o = parse_ops(PROSE_SHAPES)
    assert all(t.cpu != 8.0 for t in o.templates.values())
    assert any("cut_wheels.py" in s and "not the image build" in s for s in o.skipped)
