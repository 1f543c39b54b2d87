"""``build --plan --json`` against the real MarinSkyRL trees (era B, era C), through Temporal and a worker.

The plan reads the contract at the new build commit of a remote seeded with the real files; every
expected value below was read from ../shared/real-marinskyrl by eye. Nothing is submitted or pushed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from domain.config import safe_name
from domain.models import PipelineReport
from tests.cli.starter_cli import starter
from tests.cli.test_cli_plan import _refs, _terminate_running
from tests.real_tree_stack import real_tree_service

pytestmark = pytest.mark.stack

OPS = ".agents/ops/gpu-rl-image-build.md"
SCRIPT = "docker/build_gpu_rl_kaniko.sh"
ASK = ("--requested-by", "tester", "--reason", "real-tree plan")


def _report(stdout: str) -> PipelineReport:
    return PipelineReport.model_validate(json.loads(stdout[stdout.index("{"):]))


async def _plan(s, *args: str):
    refs = _refs(s.remotes.marinskyrl_url)
    try:
        ran = await starter(s.config_path, "build", *args, *ASK, "--plan", "--json", timeout=180)
    finally:
        await _terminate_running(s.client, s.task_queue)
    assert _refs(s.remotes.marinskyrl_url) == refs, "a plan pushes nothing"
    return ran


async def test_plan_era_c_four_targets_with_provenance_and_corrected_credentials(service_config, request):
    async with real_tree_service(service_config, "era-c", request.node.nodeid) as s:
        ran = await _plan(s, "--arch", "amd64", "--arch", "arm64", "--variant", "standard", "--variant", "megatron",
                          "--cluster", "amd64=sandbox-amd64", "--cluster", "arm64=sandbox-arm64")
        assert ran.code == 0, ran.text
        rep = _report(ran.out)
        base = subprocess.run(["git", "-C", s.remotes.marinskyrl_url.removeprefix("file://"), "show", f"{rep.source.base_commit}:{OPS}"],
                              capture_output=True, text=True, check=True).stdout
        shown = await starter(s.config_path, "report", rep.workflow_id)
    # A plan leaves nothing behind: its worktrees (prepared, rehearsal) and bundles are gone.
    work = Path(s.config.work_dir).expanduser()
    assert not [p.name for p in (work / "worktrees").glob(f"{safe_name(rep.workflow_id)}*")]
    assert not (work / "bundles" / safe_name(rep.workflow_id)).exists()
    targets = {t.key: t for t in rep.plan}
    assert sorted(targets) == ["amd64-megatron", "amd64-standard", "arm64-megatron", "arm64-standard"]

    def at(needle: str) -> str:
        """Plan mode pushes nothing: provenance is file:line at the base commit, the one an operator can open."""
        return f"{OPS}:{next(i for i, t in enumerate(base.splitlines(), 1) if needle in t)}"

    # The launch runs the script from the bundle (it finds write_registry_auth.sh beside itself), and the
    # rehearsal ran that command for every target up to the kaniko executor with the planned destinations.
    for t in targets.values():
        assert t.lines_at == rep.source.base_commit
        assert t.job.command == ["bash", "-lc", f'exec bash "${{IRIS_WORKDIR:-/app}}/{SCRIPT}"']
        assert t.provenance["command"].startswith(f"{SCRIPT}:20 ") and at("-- bash -lc") in t.provenance["command"]
        assert t.rehearsal.status == "passed", t.rehearsal.describe()
        assert t.rehearsal.kaniko.destinations == [f"{t.image_repository}:{t.tag}"]
        assert t.rehearsal.tools[-1] == "/kaniko/executor"
    assert any(d.startswith(f"{OPS}: launch command: prose") and f"{OPS}:82" in d and f"{SCRIPT}:20" in d
               for d in rep.state.disagreements)
    # (the corrected text itself: tests/contract/test_real_prose.py; the build commit is not kept by a plan)

    registry = s.config.registry.image_repository
    for t in targets.values():
        p = t.provenance
        assert t.cluster == f"sandbox-{t.architecture}" and p["cluster"] == "flag:--cluster"
        assert t.image_repository == registry and p["image_repository"] == "config:registry.image_repository"
        assert {e.name: e.value for e in t.job.env}["IMAGE_REPOSITORY"] == registry
        assert rep.source.build_commit in t.tag
        assert {e.name for e in t.job.env if e.secret} == {"REGISTRY_USER", "REGISTRY_TOKEN"}
        assert not {"DOCKER_USER_ID", "GHCR_TOKEN"} & {e.name for e in t.job.env}
        assert p["env.REGISTRY_TOKEN"] == f"{SCRIPT}:19; value config:registry.token"
        assert p["layer_ceiling.max_layer_bytes"] == at("approximately 8 GB") and t.layer_ceiling.max_layer_bytes == 8 * 10**9
        assert p["task_image"] == at("Every job uses") and t.job.task_image == "docker.io/library/ubuntu:22.04"
    amd, arm = targets["amd64-standard"], targets["arm64-megatron"]
    assert (amd.job.resources.cpu, amd.job.timeout_s, amd.job.resources.gpu) == (48, 18000, None)
    assert (arm.job.resources.cpu, arm.job.timeout_s, arm.job.resources.gpu) == (96, 28800, "GB200x1")
    assert amd.provenance["resources.memory"] == at("amd64: --cpu 48") == f"{OPS}:25"
    assert arm.provenance["resources.memory"] == at("arm64: --gpu GB200x1") == f"{OPS}:26"
    assert (amd.dockerfile, amd.provenance["dockerfile"]) == ("docker/Dockerfile.gpu-rl", f"{SCRIPT}:38")
    assert (arm.dockerfile, arm.provenance["dockerfile"]) == ("docker/Dockerfile.gpu-rl-arm64", f"{SCRIPT}:42")
    assert arm.tag.endswith("-arm64") and arm.tag.startswith("gpu-rl-megatron-")
    assert arm.provenance["env.INSTALL_MEGATRON"] == at("-e INSTALL_MEGATRON 1")
    # The stale credential rows are reported (at the base commit: line 49), and corrected in the build commit.
    assert any("DOCKER_USER_ID" in d and f"{OPS}:49" in d and "REGISTRY_USER" in d for d in rep.state.disagreements)
    assert any("min_layers" in f and "config:build.min_layers" in f for f in rep.state.fallbacks)
    assert rep.source.ops_doc_corrected and OPS in rep.source.changed_files
    # What the build commit corrects, line by line (issue 39): the unread BUILD_B64 and the launcher sentence.
    fixed = "\n".join(rep.source.ops_corrections)
    assert f"{OPS}:{at('BUILD_B64=$(base64').rsplit(':', 1)[1]}: removed" in fixed
    assert f"{at('digests are pinned in')}: " in fixed and "training launcher" in fixed
    # No cloud/iris/gpu_rl_images.py in era C: the plan says the digests go in the PR body and the issue.
    assert (rep.source.digests_in, rep.source.pin_table) == ("pr_body", None)
    # The plan text shows where each value comes from.
    assert shown.code == 0, shown.text
    assert "where each value comes from" in shown.out and f"| resources.cpu | `48` | {OPS}:25 |" in shown.out
    assert f"file:line at `{rep.source.base_commit[:12]}`" in shown.out and "rehearsal passed in" in shown.out
    assert "digests go in: the PR body and the issue (no pin table)" in shown.out
    assert "nothing reads BUILD\\_B64" in shown.out or "nothing reads BUILD_B64" in shown.out


async def test_pin_table_that_is_the_training_launcher_refuses_before_anything_is_built(service_config, request):
    launcher = "cloud/iris/launch_rl_iris.py"
    async with real_tree_service(service_config, "era-c", request.node.nodeid,
                                 config_update={"github": {"pin_table_path": launcher}}) as s:
        refs = _refs(s.remotes.marinskyrl_url)
        try:
            ran = await starter(s.config_path, "build", "--arch", "amd64", "--variant", "standard",
                                "--cluster", "amd64=sandbox-amd64", *ASK, timeout=180)
        finally:
            await _terminate_running(s.client, s.task_queue)
        assert _refs(s.remotes.marinskyrl_url) == refs, "nothing pushed"
    assert ran.code == 2, ran.text
    assert f"github.pin_table_path {launcher} is protected" in ran.text and "nothing was built" in ran.text


async def test_plan_era_b_amd64_falls_back_to_configuration_and_says_so(service_config, request):
    async with real_tree_service(service_config, "era-b", request.node.nodeid) as s:
        ran = await _plan(s, "--arch", "amd64", "--variant", "standard", "--variant", "megatron",
                          "--cluster", "amd64=sandbox-amd64")
    assert ran.code == 0, ran.text
    rep = _report(ran.out)
    targets = {t.key: t for t in rep.plan}
    assert sorted(targets) == ["amd64-megatron", "amd64-standard"]
    std, meg = targets["amd64-standard"], targets["amd64-megatron"]
    build = s.config.build.architectures["amd64"]
    assert (std.job.resources.cpu, std.job.timeout_s) == (build.cpu, build.timeout_s)
    assert std.provenance["resources.cpu"] == "config:build.architectures.amd64.cpu"
    assert std.provenance["no_sync"] == f"{OPS}:47"
    assert {e.name for e in std.job.env if e.secret} == {"DOCKER_USER_ID", "GHCR_TOKEN"}
    assert std.provenance["env.GHCR_TOKEN"] == f"{SCRIPT}:16; value config:registry.token"
    assert meg.provenance["env.TAG_PREFIX"] == f"{OPS}:135" and meg.tag.startswith("gpu-rl-megatron-")
    assert any("amd64.cpu: config:build.architectures.amd64.cpu" in f for f in rep.state.fallbacks)
    assert any("arm64.priority" in d and "'batch'" in d for d in rep.state.disagreements)


async def test_plan_without_ops_doc_uses_configuration_and_reports_it(service_config, request):
    async with real_tree_service(service_config, "era-c", request.node.nodeid, edits={OPS: None}) as s:
        ran = await _plan(s, "--arch", "arm64", "--variant", "standard", "--cluster", "arm64=sandbox-arm64")
    assert ran.code == 0, ran.text
    rep = _report(ran.out)
    (t,) = rep.plan
    build = s.config.build.architectures["arm64"]
    assert (t.job.resources.gpu, t.job.max_retries_failure) == (build.gpu, build.max_retries)
    assert t.provenance["resources.gpu"] == "config:build.architectures.arm64.gpu"
    # The configured command would run a decoded copy; era C needs its siblings, so the bundle's script runs.
    assert "config:build.command" in t.provenance["command"] and t.job.script_env_var is None
    assert t.rehearsal.status == "passed", t.rehearsal.describe()
    assert any(f"no {OPS} at the build commit" in f for f in rep.state.fallbacks)
    assert not rep.source.ops_doc_corrected


async def test_plan_refusal_says_where_the_fix_belongs_and_repeats_the_flags_with_plan(service_config, request):
    """`--memory 512 GB` (a space) once planned 512 bytes; now the plan refuses naming the ops-doc line (#18)."""
    edit = {OPS: lambda t: t.replace("amd64: --cpu 48 --memory 512GB", "amd64: --cpu 48 --memory 512 GB")}
    async with real_tree_service(service_config, "era-c", request.node.nodeid, edits=edit) as s:
        ran = await _plan(s, "--arch", "amd64", "--variant", "standard", "--cluster", "amd64=sandbox-amd64")
    assert ran.code == 2, ran.text
    rep = _report(ran.out)
    f = rep.failure
    assert f.failure_class == "input" and f"{OPS}:25: expected a resource size such as 512GB" in f.message
    assert "write it without the space, `512GB`" in f.message
    assert f.next_step.startswith(f"fix `{OPS}:25` in the MarinSkyRL repository")
    assert f.next_step.endswith("--arch amd64 --variant standard --cluster amd64=sandbox-amd64 --requested-by tester "
                                "--reason 'real-tree plan' --plan`")


async def test_plan_refused_while_preparing_source_leaves_nothing_on_disk(service_config, request):
    """A wheel committed into the bundle is refused by prepare_source: the plan's worktree and bundle go too."""
    wheel = "docker/wheelhouse/vllm-0.0.0-cp312-cp312-linux_x86_64.whl"
    async with real_tree_service(service_config, "era-c", request.node.nodeid, edits={wheel: lambda _: "x"}) as s:
        ran = await _plan(s, "--arch", "amd64", "--variant", "standard", "--cluster", "amd64=sandbox-amd64")
    assert ran.code == 2, ran.text
    rep = _report(ran.out)
    assert "refused before submission" in rep.failure.message and wheel in rep.failure.message
    work = Path(s.config.work_dir).expanduser()
    assert not [p.name for p in (work / "worktrees").glob(f"{safe_name(rep.workflow_id)}*")]
    assert not (work / "bundles" / safe_name(rep.workflow_id)).exists()
