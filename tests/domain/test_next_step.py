"""Refusals say where the fix belongs and repeat the operator's own flags, --plan included (#18)."""

from __future__ import annotations

from domain.buildset import BuildRequest, CompatibilityRequest
from domain.contract.errors import ParserNeedsAttention
from domain.outcome import build_command, input_failure, step_failure


def _req() -> BuildRequest:
    return BuildRequest(architectures=["amd64"], variants=["standard"], clusters={"amd64": "cw-rno2a"},
                        compatibility_request=CompatibilityRequest(requested_by="alice", reason="gate"))


def test_parser_trouble_points_at_the_parser_not_the_upstream_file():
    msg = str(ParserNeedsAttention("docker/build_gpu_rl_kaniko.sh", 31, "image tag", "no destination",
                                   "domain/contract/script.py"))
    f = input_failure("ContractError", f"build contract at abc: {msg}", _req(), plan=True)
    assert f.next_step.startswith("the upstream file is probably fine: gpu-rl-builder's parser "
                                  "(domain/contract/script.py) cannot read `docker/build_gpu_rl_kaniko.sh:31`")
    assert "file an issue against gpu-rl-builder" in f.next_step and "fix `docker" not in f.next_step
    assert f.next_step.endswith(f"then run `{build_command(_req(), plan=True)}`")


def test_upstream_file_configuration_and_flag_each_named_as_the_place_to_fix():
    f = input_failure("InputError", ".agents/ops/gpu-rl-image-build.md:25: expected a resource size", _req())
    assert f.next_step.startswith("fix `.agents/ops/gpu-rl-image-build.md:25` in the MarinSkyRL repository")
    f = input_failure("ContractError", ".agents/ops/x.md: expected cpu for amd64 in the ops doc or in config "
                                       "[build.architectures.amd64]", _req())
    assert f.next_step.startswith("fix the service configuration `build.architectures.amd64`")
    f = input_failure("InputError", "--cluster amd64=x: cluster 'x' is not configured", _req())
    assert f.next_step.startswith("fix `--cluster`")


def test_rehearsal_difference_names_both_places():
    f = input_failure("InputError", "rehearsal of the planned job failed before anything was submitted: amd64-standard: "
                                    "destinations: the plan has r:a (docker/build_gpu_rl_kaniko.sh:151), the "
                                    "script asked kaniko for r:b", _req())
    assert "file an issue against gpu-rl-builder (domain/contract/script.py)" in f.next_step
    assert "fix the script in the MarinSkyRL repository" in f.next_step


def test_the_suggested_command_repeats_the_operators_flags_including_plan():
    cmd = build_command(_req(), plan=True)
    assert cmd == ("python starter.py build --arch amd64 --variant standard --cluster amd64=cw-rno2a "
                   "--requested-by alice --reason gate --plan")
    assert "--plan" not in build_command(_req())
    f = step_failure("InputError", "docker/x.sh:3: bad", step="planning", request=_req(), plan=True)
    assert f.next_step.endswith(f"`{cmd}`")
    f = step_failure("Boom", "it broke", step="planning", request=_req(), plan=True)
    assert f.next_step.endswith(f"`{cmd}`")
