"""Rehearsal of a planned job (pure part): what it runs with, and what the script asked kaniko for.

Why: parsing cannot tell whether the script will actually run as launched (a script that finds its
siblings from its own path, run from a copy in /tmp, dies after minutes of downloads on a 48-core
host). The rehearsal runs the exact planned command in an isolated root (clients/rehearsal.py) with
stand-ins for the network tools; this module decides, without I/O, what that run is given (env with
credential placeholders, the task's Iris variables, the expected kaniko call) and what its records
mean (the failing script line, every difference between the kaniko argv and the plan).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from domain.buildset import TargetSpec

# What a credential becomes in the rehearsal: never a real value, recognizable in any record.
PLACEHOLDER = "rehearsal-placeholder-{secret}"
IRIS_WORKDIR = "/app"  # where Iris unpacks the workspace bundle (reference/iris.md §5)
KANIKO_EXECUTOR = "/kaniko/executor"
STANDIN_TOOLS = ("apt-get", "apt", "curl", "wget", "crane", "uv", "pip", "pip3", "python3", "python", "git", "hf",
                 "huggingface-cli", "aws", "gsutil", "uname")
_UNAME = {"amd64": "x86_64", "arm64": "aarch64"}


class StandinCall(BaseModel):
    tool: str
    cwd: str
    argv: list[str]


class KanikoCall(BaseModel):
    """The kaniko executor flags a build script passed (both `--flag value` and `--flag=value`)."""

    destinations: list[str] = Field(default_factory=list)
    cache_repo: str | None = None
    cache: bool | None = None
    build_args: dict[str, str] = Field(default_factory=dict)
    dockerfile: str | None = None
    context: str | None = None
    platform: str | None = None  # --custom-platform (None: kaniko builds for its host)
    target: str | None = None


class Difference(BaseModel):
    field: str
    planned: str
    script: str
    planned_source: str = ""

    def describe(self) -> str:
        src = f" ({self.planned_source})" if self.planned_source else ""
        return f"{self.field}: the plan has {self.planned}{src}, the script asked kaniko for {self.script}"


class RehearsalResult(BaseModel):
    """How one target's rehearsal ended; ``status`` "passed", "failed" or "skipped" (with ``reason``)."""

    status: Literal["passed", "failed", "skipped"]
    reason: str = ""
    seconds: float = 0.0
    line: str | None = None  # "file:line" of the script statement that failed
    exit_code: int | None = None
    stderr_tail: list[str] = Field(default_factory=list)
    kaniko: KanikoCall | None = None
    differences: list[Difference] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)  # stand-ins the script called, in order, once each

    def describe(self) -> str:
        if self.status == "passed":
            return f"rehearsal passed in {self.seconds:.1f} s (stand-ins: {', '.join(self.tools) or 'none'})"
        if self.status == "skipped":
            return f"rehearsal skipped: {self.reason}"
        return f"rehearsal failed: {self.reason}"


class RehearsalPlan(BaseModel):
    """Everything one rehearsal run gets: the planned argv and env, the host it pretends to be."""

    key: str
    argv: list[str]
    env: dict[str, str]
    uname_m: str
    script_path: str  # repo path of the build script (for naming the failing line)
    script_env_var: str | None = None


def rehearsal_plan(target: TargetSpec, *, bundle_sha256: str, script_b64: str | None,
                   cluster_env: dict[str, str]) -> RehearsalPlan:
    """The job as Iris would start it: planned env (credentials as placeholders), the script carrier,
    the cluster's job env and the task variables Iris adds (IRIS_TASK_ID, IRIS_WORKDIR, ...)."""
    job = target.job
    env: dict[str, str] = {}
    for e in job.env:
        env[e.name] = PLACEHOLDER.format(secret=e.secret) if e.secret else (e.value or "")
    if job.script_env_var and script_b64 is not None:
        env[job.script_env_var] = script_b64
    env.update(cluster_env)
    task = f"/rehearsal/{job.job_name}/0"
    env.update({"IRIS_TASK_ID": task, "IRIS_NUM_TASKS": "1", "IRIS_BUNDLE_ID": bundle_sha256,
                "IRIS_CONTROLLER_URL": "http://iris-controller.rehearsal.invalid", "IRIS_WORKDIR": IRIS_WORKDIR,
                "IRIS_JOB_ENV": "{}", "PYTHONPATH": ".", "PYTHONUNBUFFERED": "1"})
    return RehearsalPlan(key=target.key, argv=list(job.command), env=env,
                         uname_m=_UNAME.get(target.architecture, target.architecture),
                         script_path=job.script_path, script_env_var=job.script_env_var)


# ----------------------------------------------------------------------------- reading the records

_MULTI = {"destination", "build-arg"}
_VALUED = {"destination", "build-arg", "cache-repo", "dockerfile", "context", "custom-platform", "target",
           "digest-file", "cache-dir", "cache-ttl", "image-name-with-digest-file", "label", "registry-mirror",
           "insecure-registry", "snapshot-mode", "verbosity", "push-retry", "image-fs-extract-retry",
           "image-download-retry", "tar-path", "kaniko-dir", "git", "registry-certificate", "ignore-path"}


def parse_kaniko_argv(argv: list[str]) -> KanikoCall:
    call = KanikoCall()
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("--"):
            continue
        name, eq, value = a[2:].partition("=")
        if not eq:
            if name in _VALUED and i < len(argv):
                value = argv[i]
                i += 1
            elif name == "cache":
                value = "true"
            else:
                continue
        if name == "destination":
            call.destinations.append(value)
        elif name == "build-arg":
            k, _, v = value.partition("=")
            call.build_args[k] = v
        elif name == "cache-repo":
            call.cache_repo = value
        elif name == "cache":
            call.cache = value.lower() != "false"
        elif name == "dockerfile":
            call.dockerfile = value
        elif name == "context":
            call.context = value
        elif name == "custom-platform":
            call.platform = value
        elif name == "target":
            call.target = value
    return call


def read_record(data: bytes) -> StandinCall | None:
    parts = data.decode("utf-8", "replace").split("\0")
    if parts and parts[-1] == "":
        parts.pop()
    if len(parts) < 2:
        return None
    return StandinCall(tool=parts[0], cwd=parts[1], argv=parts[2:])


def _context_dir(context: str | None) -> str:
    c = (context or "").removeprefix("dir://")
    return c.rstrip("/") or IRIS_WORKDIR


def _relative_dockerfile(call: KanikoCall) -> str | None:
    if call.dockerfile is None:
        return None
    ctx = _context_dir(call.context) + "/"
    return call.dockerfile[len(ctx):] if call.dockerfile.startswith(ctx) else call.dockerfile


def compare_kaniko(call: KanikoCall, target: TargetSpec, *, uname_m: str,
                   expected_build_args: dict[str, tuple[str, str]],
                   dockerfile_defaults: dict[str, str | None]) -> list[Difference]:
    """Every way the final kaniko call differs from the plan (an empty list: it builds what was planned).

    ``expected_build_args``: name -> (value, provenance) the plan bakes; a build arg the script does not
    pass is fine only when the Dockerfile's own default is that value (``dockerfile_defaults``)."""
    out: list[Difference] = []
    p = target.provenance
    planned = [f"{target.image_repository}:{target.tag}"]
    if target.floating_tag:
        planned.append(f"{target.image_repository}:{target.floating_tag}")
    if sorted(call.destinations) != sorted(planned):
        src = ", ".join(x for x in (p.get("tag"), p.get("floating_tag")) if x)
        out.append(Difference(field="destinations", planned=", ".join(planned),
                              script=", ".join(call.destinations) or "none", planned_source=src))
    if target.cache_repo is not None and call.cache is not False and call.cache_repo != target.cache_repo:
        out.append(Difference(field="cache repo", planned=target.cache_repo, script=call.cache_repo or "none",
                              planned_source=p.get("cache_repo", "")))
    dockerfile = _relative_dockerfile(call)
    if dockerfile != target.dockerfile:
        out.append(Difference(field="dockerfile", planned=target.dockerfile, script=dockerfile or "none",
                              planned_source=p.get("dockerfile", "")))
    host = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}.get(uname_m, uname_m)
    platform = call.platform or host
    if platform != target.kaniko_platform:
        out.append(Difference(field="platform", planned=target.kaniko_platform,
                              script=platform if call.platform else f"{platform} (its host)",
                              planned_source=p.get("kaniko_platform", "")))
    for name, (value, src) in expected_build_args.items():
        got = call.build_args.get(name)
        if got is None:
            default = dockerfile_defaults.get(name)
            if default is not None and default != value:
                out.append(Difference(field=f"--build-arg {name}", planned=value, planned_source=src,
                                      script=f"not passed (the Dockerfile default {default})"))
        elif got != value:
            out.append(Difference(field=f"--build-arg {name}", planned=value, script=got, planned_source=src))
    return out


def expected_build_args(target: TargetSpec, *, harbor_commit: str, build_commit: str,
                        wheel_source_var: str, megatron: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The build args whose value the plan decides (what the image must bake)."""
    p = target.provenance
    out = {"GITSHA": (build_commit, "the build commit"),
           "HARBOR_COMMIT": (harbor_commit, "the Harbor pin baked into every Dockerfile"),
           wheel_source_var: (target.wheel_source, p.get("wheel_source", ""))}
    for k, v in megatron.items():
        if k != "TAG_PREFIX":
            out[k] = (v, p.get(f"env.{k}", ""))
    return out


def script_line(source: str, line: str, plan: RehearsalPlan) -> str:
    """The repo file:line for a bash source path inside the rehearsal root."""
    prefix = IRIS_WORKDIR + "/"
    if source.startswith(prefix):
        return f"{source[len(prefix):]}:{line}"
    if plan.script_env_var:  # the script decoded from its env carrier into a scratch file
        return f"{plan.script_path}:{line} (run as {source})"
    return f"{source}:{line}"


def summarize_tools(calls: list[StandinCall]) -> list[str]:
    seen: list[str] = []
    for c in calls:
        name = KANIKO_EXECUTOR if c.tool == "executor" else c.tool
        if name not in seen:
            seen.append(name)
    return seen


def failure_reason(line: str | None, exit_code: int, stderr_tail: list[str]) -> str:
    last = next((s for s in reversed(stderr_tail) if s.strip()), "")
    where = f" at {line}" if line else ""
    return f"the script exits {exit_code}{where}" + (f": {last}" if last else "")


def _script_exit(plan: RehearsalPlan, exits: list[tuple[int, str]]) -> tuple[int, str, str] | None:
    """(exit code, source, line) of the build script's own bash process: not a child script's, nor the
    launching `bash -lc` (which has no source file). A script decoded from its env carrier runs from a
    scratch path outside the bundle."""
    own: list[tuple[int, str, str]] = []
    for rc, where in exits:
        source, _, line = where.rpartition(":")
        if not source:
            continue
        if source == f"{IRIS_WORKDIR}/{plan.script_path}" or (
                plan.script_env_var and not source.startswith(IRIS_WORKDIR + "/")):
            own.append((rc, source, line))
    failed = [x for x in own if x[0] != 0]
    return (failed or own)[-1] if own else None


def evaluate(plan: RehearsalPlan, target: TargetSpec, *, exit_code: int, stderr: str, calls: list[StandinCall],
             exits: list[tuple[int, str]], unrehearsable: list[str], seconds: float, timed_out: bool,
             timeout_s: float, expected_args: dict[str, tuple[str, str]],
             dockerfile_defaults: dict[str, str | None]) -> RehearsalResult:
    """One rehearsal's verdict from what the run recorded."""
    tail = [s for s in stderr.splitlines() if "__rh_" not in s][-12:]
    tools = summarize_tools(calls)
    kaniko = [c for c in calls if c.tool == "executor"]
    if timed_out:
        return RehearsalResult(status="failed", seconds=seconds, stderr_tail=tail, tools=tools,
                               reason=f"the script did not finish within {timeout_s:.0f} s with every network "
                                      "tool stood in (it waits for something the job would wait for too)")
    final = next((parse_kaniko_argv(c.argv) for c in reversed(kaniko) if parse_kaniko_argv(c.argv).target is None),
                 None)
    if exit_code != 0:
        rec = _script_exit(plan, exits)
        line = script_line(rec[1], rec[2], plan) if rec else None
        if unrehearsable:
            return RehearsalResult(status="skipped", seconds=seconds, line=line, exit_code=exit_code,
                                   stderr_tail=tail, tools=tools,
                                   reason=f"the script needs {unrehearsable[0]}" + (f" at {line}" if line else "")
                                   + "; the steps after it were not rehearsed")
        return RehearsalResult(status="failed", seconds=seconds, line=line, exit_code=exit_code, stderr_tail=tail,
                               tools=tools, kaniko=final, reason=failure_reason(line, exit_code, tail))
    if final is None:
        return RehearsalResult(status="failed", seconds=seconds, exit_code=0, stderr_tail=tail, tools=tools,
                               reason=f"the script exits 0 without running the kaniko executor ({KANIKO_EXECUTOR})")
    diffs = compare_kaniko(final, target, uname_m=plan.uname_m, expected_build_args=expected_args,
                           dockerfile_defaults=dockerfile_defaults)
    if diffs:
        return RehearsalResult(status="failed", seconds=seconds, exit_code=0, tools=tools, kaniko=final,
                               differences=diffs, reason="; ".join(d.describe() for d in diffs))
    return RehearsalResult(status="passed", seconds=seconds, exit_code=0, tools=tools, kaniko=final)


def refusal(targets: list[TargetSpec]) -> str | None:
    """One line naming every failed rehearsal (targets with the same cause grouped), or None."""
    groups: dict[str, list[str]] = {}
    for t in targets:
        r = t.rehearsal
        if r is not None and r.status == "failed":
            cmd = " ".join(t.job.command)
            groups.setdefault(f"{r.reason} (planned command `{cmd}` from {t.provenance.get('command', '?')})",
                              []).append(t.key)
    if not groups:
        return None
    return "rehearsal of the planned job failed before anything was submitted: " + " | ".join(
        f"{', '.join(keys)}: {why}" for why, keys in groups.items())
