"""The prose of the real MarinSkyRL trees (ops doc, AGENTS.md) and the plans built from them, with provenance.

Expected values and line numbers were read from ../shared/real-marinskyrl by eye (``line_in`` names the
text it means); configuration values are ``BuildSettings()`` defaults. The ops doc is prose: a
missing or reshaped part must fall back to configuration, be reported, and never refuse a build.
"""

from __future__ import annotations

import pytest

from domain.boundary import BoundaryRule, decide
from domain.buildset import BuildRequest, BuildSetError, CompatibilityRequest, plan_targets
from domain.config import BuildSettings
from domain.contract import ContractError, corrected_ops_doc, load_contract

from .helpers import COMMIT, fixture_files
from .helpers import HARBOR as FIXTURE_HARBOR
from .real import DF_AMD, DF_ARM, SCRIPT, line_in, real_contract

OPS = ".agents/ops/gpu-rl-image-build.md"
ASK = CompatibilityRequest(requested_by="alice", reason="real-tree plan test")
REPO = "ghcr.io/marin-community/marinskyrl"
CFG = BuildSettings()


def plan(c, archs=("amd64", "arm64"), variants=("standard", "megatron")):
    harbor = c.dockerfiles[c.script.arches[archs[0]].dockerfile].pins["HARBOR_COMMIT"]
    req = BuildRequest(architectures=list(archs), variants=list(variants), compatibility_request=ASK)
    return {t.key: t for t in plan_targets(c, req, build_commit=c.commit, harbor_commit=harbor,
                                           cluster_archs=None, image_repository_override=None)}


def at(era: str, needle: str, path: str = OPS) -> str:
    return f"{path}:{line_in(era, path, needle)}"


def repin(text: str) -> str:
    """Era C's Dockerfiles already agree on HARBOR_COMMIT; era B's do not (the service re-pins both)."""
    return text.replace("1ffb4003f202daadcb7e407f449bd62278b5e8e1", "ad6e612d385379d3168638f6bfb2cf4a56cedbf9")


# ----------------------------------------------------------------------------- era C


def test_era_c_four_targets_from_the_ops_doc_code_blocks_with_provenance(tmp_path):
    t = plan(real_contract(tmp_path, "era-c"))
    assert sorted(t) == ["amd64-megatron", "amd64-standard", "arm64-megatron", "arm64-standard"]
    amd, arm = t["amd64-standard"], t["arm64-megatron"]
    # Image variants table (lines 19-20) and the "Current build resources" block (lines 25-26).
    assert (amd.cluster, arm.cluster) == ("cw-rno2a", "cw-us-east-08a")
    assert amd.provenance["cluster"] == at("era-c", "| amd64 | `cw-rno2a`")
    assert arm.provenance["cluster"] == at("era-c", "| arm64 | `cw-us-east-08a`")
    r = amd.job.resources
    assert (r.cpu, r.memory_bytes, r.disk_bytes, r.gpu) == (48, 512 * 2**30, 400 * 2**30, None)
    assert (amd.job.priority, amd.job.max_retries_failure, amd.job.timeout_s) == ("interactive", 0, 18000)
    r = arm.job.resources
    assert (r.cpu, r.memory_bytes, r.disk_bytes, r.gpu) == (96, 640 * 2**30, 500 * 2**30, "GB200x1")
    assert (arm.job.priority, arm.job.max_retries_failure, arm.job.timeout_s) == ("interactive", 3, 28800)
    amd_line, arm_line = at("era-c", "amd64: --cpu 48"), at("era-c", "arm64: --gpu GB200x1")
    for field in ("resources.cpu", "resources.memory", "resources.disk", "priority", "max_retries", "timeout"):
        assert amd.provenance[field] == amd_line and arm.provenance[field] == arm_line, field
    # "Every job uses `docker.io/library/ubuntu:22.04`, `--no-sync`, ..." and the `-e` block (lines 77-82).
    assert amd.job.task_image == "docker.io/library/ubuntu:22.04" and amd.job.no_sync
    assert amd.provenance["task_image"] == at("era-c", "Every job uses")
    # The script finds write_registry_auth.sh beside itself (SCRIPT_DIR, line 20): the stale template's
    # decoded copy in /tmp cannot; the job runs the bundle's script instead, without BUILD_B64 (#18).
    assert amd.job.command == ["bash", "-lc", 'exec bash "${IRIS_WORKDIR:-/app}/docker/build_gpu_rl_kaniko.sh"']
    assert amd.provenance["command"].startswith(f"{SCRIPT}:20 (the script finds files beside itself")
    assert at("era-c", "-- bash -lc") in amd.provenance["command"]
    assert amd.job.script_env_var is None and "env.BUILD_B64" not in amd.provenance
    # The script wins: its credential names, from its lines 18-19, values from configuration.
    env = {e.name: e for e in amd.job.env}
    assert set(env) == {"GITSHA", "REGISTRY_USER", "REGISTRY_TOKEN", "WHEEL_SOURCE"}
    assert (env["REGISTRY_USER"].secret, env["REGISTRY_TOKEN"].secret) == ("registry_user", "registry_token")
    assert amd.provenance["env.REGISTRY_USER"] == f"{SCRIPT}:18; value config:registry.user"
    assert amd.provenance["env.REGISTRY_TOKEN"] == f"{SCRIPT}:19; value config:registry.token"
    assert amd.provenance["env.GITSHA"] == f"{SCRIPT}:17"
    # Megatron add-on (line 88).
    menv = {e.name: e.value for e in arm.job.env}
    assert (menv["INSTALL_MEGATRON"], menv["TAG_PREFIX"]) == ("1", "gpu-rl-megatron")
    assert arm.provenance["env.TAG_PREFIX"] == at("era-c", "-e INSTALL_MEGATRON 1")
    # Executable side: Dockerfile per host from the table (lines 38, 42), repository (49), tag (151).
    assert (amd.dockerfile, arm.dockerfile) == (DF_AMD, DF_ARM)
    assert amd.provenance["dockerfile"] == f"{SCRIPT}:38" and arm.provenance["dockerfile"] == f"{SCRIPT}:42"
    assert amd.image_repository == REPO and amd.provenance["image_repository"] == f"{SCRIPT}:49"
    sha = t["amd64-standard"].job.env[[e.name for e in amd.job.env].index("GITSHA")].value
    assert (amd.tag, arm.tag) == (f"gpu-rl-{sha}", f"gpu-rl-megatron-{sha}-arm64")
    assert amd.provenance["tag"] == f"{SCRIPT}:151"
    # Layer ceiling: the sentence "approximately 8 GB" (line 100); the rest from configuration.
    assert amd.layer_ceiling.max_layer_bytes == 8 * 10**9
    assert amd.provenance["layer_ceiling.max_layer_bytes"] == at("era-c", "approximately 8 GB")
    assert amd.provenance["layer_ceiling.min_layers"] == "config:build.min_layers"
    assert amd.layer_ceiling.min_layers == CFG.min_layers
    assert amd.expected_markers and amd.provenance["markers"]


def test_era_c_stale_credential_rows_are_reported_and_corrected(tmp_path):
    c = real_contract(tmp_path, "era-c")
    stale = {d.field: d for d in c.disagreements if d.against == "script"}
    user, token = stale["build contract: DOCKER_USER_ID"], stale["build contract: GHCR_TOKEN"]
    assert user.prose_source == at("era-c", "| `DOCKER_USER_ID` | always |")
    assert token.prose_source == at("era-c", "| `GHCR_TOKEN` | always;")
    assert "REGISTRY_USER" in user.resolution and "REGISTRY_TOKEN" in token.resolution
    fixed = corrected_ops_doc(c)
    assert "DOCKER_USER_ID" not in fixed and "GHCR_TOKEN" not in fixed
    assert "| `REGISTRY_USER` | always |" in fixed and '-e REGISTRY_TOKEN "$REGISTRY_TOKEN"' in fixed
    assert "REGISTRY_TOKEN=$(gh auth token)" in fixed
    assert "| `HF_TOKEN` |" in fixed  # the script's conditional requirement gets its row
    # The corrected doc agrees with the script: nothing left to report or correct.
    again = real_contract(tmp_path / "again", "era-c", {OPS: lambda _: fixed})
    assert [d for d in again.disagreements if d.against == "script"] == []
    assert corrected_ops_doc(again) is None


def test_era_c_without_an_ops_doc_plans_from_configuration_and_says_so(tmp_path):
    c = real_contract(tmp_path, "era-c", {OPS: None})
    t = plan(c)
    amd, arm = t["amd64-standard"], t["arm64-standard"]
    a = CFG.architectures
    assert (amd.cluster, amd.job.resources.cpu, amd.job.timeout_s) == (a["amd64"].cluster, a["amd64"].cpu,
                                                                       a["amd64"].timeout_s)
    assert (arm.job.resources.gpu, arm.job.max_retries_failure) == (a["arm64"].gpu, a["arm64"].max_retries)
    assert amd.provenance["cluster"] == "config:build.architectures.amd64.cluster"
    assert amd.provenance["resources.cpu"] == "config:build.architectures.amd64.cpu"
    # The configured command decodes a copy into a scratch file; this script needs its siblings (line 20).
    assert amd.provenance["command"].startswith(f"{SCRIPT}:20 ") and "config:build.command" in amd.provenance["command"]
    assert amd.job.command == ["bash", "-lc", f'exec bash "${{IRIS_WORKDIR:-/app}}/{SCRIPT}"']
    assert amd.job.script_env_var is None
    assert t["amd64-megatron"].provenance["env.TAG_PREFIX"] == "config:build.megatron_env"
    assert amd.provenance["layer_ceiling.max_layer_bytes"] == "config:build.max_layer_bytes"
    # Still the script's own values where the script states them.
    assert {e.name for e in amd.job.env} >= {"GITSHA", "REGISTRY_USER", "REGISTRY_TOKEN"}
    assert CFG.script_env_var not in {e.name for e in amd.job.env}
    reasons = {f.field: f.reason for f in c.fallbacks}
    assert f"no {OPS} at the build commit" in reasons["amd64.cpu"]
    assert "deploy_boundary" in reasons and corrected_ops_doc(c) is None


def test_utf16_ops_doc_fails_at_once_naming_the_file(tmp_path):
    files = _era_bytes("era-c")
    files[OPS] = files[OPS].decode().encode("utf-16")
    with pytest.raises(ContractError) as e:
        load_contract(files, COMMIT)
    assert e.value.file == OPS and "UTF-16" in str(e.value) and "UTF-8" in str(e.value)
    files[OPS] = b"# ops\n\xff\xfe\x00bad"
    with pytest.raises(ContractError) as e:
        load_contract(files, COMMIT)
    assert e.value.file == OPS and "undecodable" in str(e.value)


def _era_bytes(era: str) -> dict[str, bytes]:
    from .real import real_tree

    root = real_tree(era)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ----------------------------------------------------------------------------- era B


def test_era_b_amd64_falls_back_to_configuration_arm64_prose_is_read(tmp_path):
    c = real_contract(tmp_path, "era-b", {DF_AMD: repin})
    t = plan(c, archs=("amd64",))
    amd = t["amd64-standard"]
    # Era B's ops doc gives no amd64 launch shape ("48 cores and 512 GB" is a sentence, not flags).
    assert amd.provenance["resources.cpu"] == "config:build.architectures.amd64.cpu"
    assert amd.provenance["cluster"] == "config:build.architectures.amd64.cluster"
    assert (amd.job.resources.cpu, amd.job.resources.memory_bytes) == (48, 512 * 2**30)
    # "`--no-sync` is required on the `iris job run` line." (line 47)
    assert amd.job.no_sync and amd.provenance["no_sync"] == at("era-b", "`--no-sync` is required")
    # Era B's credentials are the script's (lines 15-16), the image repository its line 41.
    env = {e.name: e for e in amd.job.env}
    assert {n for n, e in env.items() if e.secret} == {"DOCKER_USER_ID", "GHCR_TOKEN"}
    assert amd.image_repository == REPO and amd.provenance["image_repository"] == f"{SCRIPT}:41"
    # The Megatron pair sits in the arm64 launch block (line 135); it is the add-on for every arch.
    meg = t["amd64-megatron"]
    assert meg.provenance["env.INSTALL_MEGATRON"] == at("era-b", "-e INSTALL_MEGATRON 1")
    assert meg.tag.startswith("gpu-rl-megatron-")
    # No layer-ceiling sentence in era B: all three values from configuration.
    assert amd.layer_ceiling.model_dump() == {"max_layer_bytes": CFG.max_layer_bytes,
                                              "warn_layer_bytes": CFG.warn_layer_bytes, "min_layers": CFG.min_layers}
    # The recorded artifact (line 81) is never stated usable: wheel-builder.
    assert c.ops.wheel_artifact.line == line_in("era-b", OPS, "PREBUILT_WHEEL_ARTIFACT_URI=s3://")
    assert not c.ops.wheel_artifact.usable and amd.wheel_source == "wheel-builder"


def test_era_b_arm64_launch_block_with_the_pin_declared(tmp_path):
    donor = "ARG VLLM_FORK_COMMIT=8672c71e311cb76a81154589cb60498b41dd59f7\n"
    c = real_contract(tmp_path, "era-b", {DF_ARM: lambda t: t.replace(
        donor, donor + "ARG VLLM_NATIVE_DONOR_COMMIT=8672c71e311cb76a81154589cb60498b41dd59f7\n", 1), DF_AMD: repin})
    arm = plan(c, archs=("arm64",))["arm64-standard"]
    block = at("era-b", "--gpu GB200x1 --cpu 96")
    r = arm.job.resources
    assert (r.gpu, r.cpu, r.memory_bytes, r.disk_bytes) == ("GB200x1", 96, 640 * 2**30, 500 * 2**30)
    assert (arm.job.priority, arm.job.max_retries_failure, arm.job.timeout_s) == ("batch", 3, 28800)
    assert arm.provenance["priority"] == block and arm.provenance["resources.gpu"] == block
    assert arm.provenance["task_image"] == at("era-b", "--task-image docker.io/library/ubuntu:22.04")
    # The arm64 Dockerfile is passed explicitly (the script's default is the amd64 file on every host).
    assert {e.name: e.value for e in arm.job.env}["DOCKERFILE"] == DF_ARM
    assert arm.provenance["env.DOCKERFILE"].startswith(SCRIPT)
    # Prose and configuration disagree on the arm64 priority: prose wins, and it is reported.
    d = next(d for d in c.disagreements if d.field == "arm64.priority")
    assert (d.against, d.prose_value, d.script_value, d.prose_source) == ("configuration", "batch", "interactive",
                                                                           block)


def test_era_b_arm64_is_refused_with_the_scripts_reason(tmp_path):
    c = real_contract(tmp_path, "era-b", {DF_AMD: repin})
    with pytest.raises(BuildSetError) as e:
        plan(c, archs=("amd64", "arm64"))
    assert DF_ARM in str(e.value) and "VLLM_NATIVE_DONOR_COMMIT" in str(e.value)


def test_era_b_deploy_boundary_table_then_configuration(tmp_path):
    c = real_contract(tmp_path, "era-b")
    rules = [BoundaryRule(glob=r.glob, rebuild=r.rebuild, reaches=r.reaches, source=r.source)
             for r in c.deploy_boundary]
    assert [(r.glob, r.rebuild, r.source) for r in rules[:2]] == [
        ("skyrl-train/**", True, at("era-b", "| `skyrl-train/**`")),
        ("cloud/iris/**", False, at("era-b", "| `cloud/iris/**`"))]
    v = decide(rules, {}, ["skyrl-train/x.py", "cloud/iris/run_rl.py", "uv.lock"], harbor_moved=False)
    assert v.needed
    assert any(at("era-b", "| `skyrl-train/**`") in r for r in v.reasons)
    assert any("uv.lock" in r and "config:build.deploy_boundary" in r for r in v.reasons)


# ----------------------------------------------------------------------------- fixture shapes no longer required


def _fixture_plan(files):
    c = load_contract(files, COMMIT)
    req = BuildRequest(architectures=["amd64", "arm64"], compatibility_request=ASK)
    return c, plan_targets(c, req, build_commit=COMMIT, harbor_commit=FIXTURE_HARBOR, cluster_archs=None,
                           image_repository_override=None)


def test_fixture_agents_without_policy_section_still_plans_and_reports_it():
    files = fixture_files()
    text = files["AGENTS.md"]
    files["AGENTS.md"] = text[:text.index("## Policy")] + text[text.index("## Style"):]
    c, targets = _fixture_plan(files)
    assert len(targets) == 4 and c.agents.policy == []
    assert any(f.field == "policy" and f.config_key == "github.do_not_touch" for f in c.fallbacks)


def test_fixture_ops_without_deploy_boundary_table_still_plans_and_the_boundary_falls_back():
    files = fixture_files()
    text = files[OPS]
    files[OPS] = text[:text.index("## Deploy boundary")] + text[text.index("## Build contract"):]
    c, targets = _fixture_plan(files)
    assert len(targets) == 4
    assert any(f.field == "deploy_boundary" for f in c.fallbacks)
    assert [r.source for r in c.deploy_boundary] == [f"config:build.deploy_boundary[{i}]"
                                                     for i in range(len(CFG.deploy_boundary))]
    rules = [BoundaryRule(**r.model_dump(include={"glob", "rebuild", "reaches", "source"})) for r in c.deploy_boundary]
    assert decide(rules, {}, ["skyrl-train/a.py"], harbor_moved=False).needed
    assert not decide(rules, {}, ["cloud/iris/run_rl.py"], harbor_moved=False).needed


def test_fixture_plan_provenance_points_at_the_template_lines():
    files = fixture_files()
    _, targets = _fixture_plan(files)
    amd = targets[0]
    lines = files[OPS].splitlines()
    assert lines[int(amd.provenance["resources.cpu"].rsplit(":", 1)[1]) - 1].strip().startswith("--cpu 48")
    assert lines[int(amd.provenance["timeout"].rsplit(":", 1)[1]) - 1].strip() == "--timeout 18000 \\"
    assert amd.provenance["cluster"].startswith(f"{OPS}:")
    assert all(v.startswith((f"{OPS}:", f"{SCRIPT}", "config:", "docker/", "kaniko", "service:", "flag:")) or ";" in v
               for v in amd.provenance.values()), amd.provenance


def test_era_c_tag_forms_column_is_checked_against_the_script(tmp_path):
    c = real_contract(tmp_path, "era-c")
    assert c.ops.placements["arm64"].tag_forms == ["gpu-rl-<sha>-arm64", "gpu-rl-megatron-<sha>-arm64"]
    assert not [d for d in c.disagreements if d.field.startswith("tag forms")]
    swapped = real_contract(tmp_path / "swapped", "era-c", {OPS: lambda t: t.replace(
        "`gpu-rl-<sha>-arm64`", "`gpu-rl-arm64-<sha>`")})
    (d,) = [d for d in swapped.disagreements if d.field == "tag forms: arm64"]
    assert d.prose_source == at("era-c", "| arm64 | `cw-us-east-08a`") and d.other_source == f"{SCRIPT}:151"
    assert "gpu-rl-<sha>-arm64" in d.script_value and "gpu-rl-arm64-<sha>" in d.prose_value
