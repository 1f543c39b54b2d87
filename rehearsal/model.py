"""Rehearsal of a planned job (pure part): what it runs with, and what the script asked kaniko for.

Why: parsing cannot tell whether the script will actually run as launched (a script that finds its
siblings from its own path, run from a copy in /tmp, dies after minutes of downloads on a 48-core
host). The rehearsal runs the exact planned command in an isolated root (rehearsal/runner.py) with
stand-ins for the network tools; this module decides, without I/O, what that run is given (env with
credential placeholders, the task's Iris variables, the expected kaniko call) and what its records
mean (the failing script line, every difference between the kaniko argv and the plan).
"""

from __future__ import annotations

import difflib
import fnmatch
import os.path
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from domain.redact import encoded_forms
from rehearsal.result import Difference, ImageRead, KanikoCall, RehearsalResult

if TYPE_CHECKING:
    from domain.buildset import TargetSpec
    from domain.contract.models import DockerfileContract, Stage

# What a credential becomes in the rehearsal: never a real value, recognizable in any record.
PLACEHOLDER = "rehearsal-placeholder-{secret}"
IRIS_WORKDIR = "/app"  # where Iris unpacks the workspace bundle (reference/iris.md §5)
KANIKO_EXECUTOR = "/kaniko/executor"
PIN_OVERRIDE = "the pin the PR records"  # how a build arg overriding a Dockerfile pin is named (outcome.py)
STANDIN_TOOLS = ("apt-get", "apt", "curl", "wget", "crane", "uv", "pip", "pip3", "python3", "python", "git", "hf",
                 "huggingface-cli", "aws", "gsutil", "uname")
_UNAME = {"amd64": "x86_64", "arm64": "aarch64"}


class StandinCall(BaseModel):
    tool: str
    cwd: str
    argv: list[str]
    # "source:line" of the statement that ran the tool in every bash process above it, outermost first
    # (the BASH_ENV trap exports it), so a call and a failure name the build script's own line.
    lines: list[str] = Field(default_factory=list)
    # kaniko only: False when the script exited (or its launching process ended) while the call still
    # ran, as a backgrounded `/kaniko/executor … &` never waited for; on the cluster it dies with the task.
    finished: bool = True
    not_waited: str = ""  # kaniko without /proc: why the statement trace shows the script did not wait for it


class RehearsalPlan(BaseModel):
    """Everything one rehearsal run gets: the planned argv and env, the host it pretends to be."""

    key: str
    argv: list[str]
    env: dict[str, str]
    uname_m: str
    script_path: str  # repo path of the build script (for naming the failing line)
    script_env_var: str | None = None
    script_text: str = ""  # the build script (to name a continued statement by its first line)


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

# kaniko executor's own flag set (cmd/executor/cmd/root.go, cobra/pflag): long name -> takes a value.
# pflag reads `--name value`, `--name=value`, `-d value`, `-dvalue`, `-d=value`; a boolean takes no separate
# value (`--cache=false`, never `--cache false`); an unknown flag or a missing value ends kaniko at once.
_KANIKO_FLAGS: dict[str, bool] = {
    **dict.fromkeys((
        "context", "context-sub-path", "bucket", "dockerfile", "destination", "snapshot-mode", "custom-platform",
        "build-arg", "push-retry", "image-fs-extract-retry", "image-download-retry", "kaniko-dir", "tar-path",
        "target", "cache-repo", "cache-dir", "digest-file", "image-name-with-digest-file",
        "image-name-tag-with-digest-file", "oci-layout-path", "compression", "compression-level", "cache-ttl",
        "insecure-registry", "skip-tls-verify-registry", "registry-certificate", "registry-client-cert",
        "registry-map", "registry-mirror", "label", "git", "ignore-path", "verbosity", "log-format",
        "snapshotMode", "customPlatform", "tarPath"), True),
    **dict.fromkeys((
        "insecure", "skip-tls-verify", "insecure-pull", "skip-tls-verify-pull", "push-ignore-immutable-tag-errors",
        "single-snapshot", "reproducible", "no-push", "no-push-cache", "cache", "compressed-caching", "cleanup",
        "skip-default-registry-fallback", "ignore-var-run", "skip-unused-stages", "use-new-run",
        "cache-copy-layers", "cache-run-layers", "force-build-metadata", "skip-push-permission-check",
        "log-timestamp", "force", "help"), False),
}
_KANIKO_SHORT = {"c": "context", "f": "dockerfile", "d": "destination", "b": "bucket", "v": "verbosity", "h": "help"}
_BOOL_VALUES = {"1": True, "t": True, "T": True, "true": True, "TRUE": True, "True": True,
                "0": False, "f": False, "F": False, "false": False, "FALSE": False, "False": False}


def kaniko_flags(argv: list[str]) -> tuple[list[tuple[str, str]], str | None]:
    """(long name, value) of every flag in ``argv`` as pflag reads it, and kaniko's error if it would refuse
    the command line (then the flags are those read before it). Positional words are skipped."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if a == "--":
            break
        if not a.startswith("-") or a == "-":
            continue
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            if name not in _KANIKO_FLAGS:
                return out, f"unknown flag: --{name}"
        else:
            short, eq, value = a[1], "", a[2:]
            if value.startswith("="):
                eq, value = "=", value[1:]
            elif value:
                eq = "=" if _KANIKO_FLAGS.get(_KANIKO_SHORT.get(short, ""), False) else ""
                if not eq:  # combined boolean shorthands (`-h`): kaniko has one; anything else is unknown
                    return out, f"unknown shorthand flag: {value[0]!r} in {a}"
            if short not in _KANIKO_SHORT:
                return out, f"unknown shorthand flag: {short!r} in {a}"
            name = _KANIKO_SHORT[short]
        if _KANIKO_FLAGS[name]:
            if not eq:
                if i >= len(argv):
                    return out, f"flag needs an argument: --{name}"
                value = argv[i]
                i += 1
        elif eq:
            if value not in _BOOL_VALUES:
                return out, f'invalid argument "{value}" for "--{name}" flag: strconv.ParseBool: parsing {value!r}'
        else:
            value = "true"
        out.append((name, value))
    return out, None


def parse_kaniko_argv(argv: list[str]) -> KanikoCall:
    flags, error = kaniko_flags(argv)
    call = KanikoCall(error=error)
    for name, value in flags:
        if name == "destination":
            call.destinations.append(value)
        elif name == "build-arg":
            k, _, v = value.partition("=")
            call.build_args[k] = v
        elif name == "cache-repo":
            call.cache_repo = value
        elif name == "cache":
            call.cache = _BOOL_VALUES.get(value, True)
        elif name == "dockerfile":
            call.dockerfile = value
        elif name == "context":
            call.context = value
        elif name == "context-sub-path":
            call.context_sub_path = value
        elif name in ("custom-platform", "customPlatform"):
            call.platform = value
        elif name == "target":
            call.target = value
        elif name == "skip-unused-stages":
            call.skip_unused_stages = _BOOL_VALUES.get(value, True)
        elif name == "no-push":
            call.no_push = _BOOL_VALUES.get(value, True)
    return call


def read_record(data: bytes) -> StandinCall | None:
    """A stand-in record: tool, cwd, the calling lines ("|"-joined), then the argv, NUL-separated."""
    parts = data.decode("utf-8", "replace").split("\0")
    if parts and parts[-1] == "":
        parts.pop()
    if len(parts) < 3:
        return None
    lines = [x for x in parts[2].split("|") if x.rpartition(":")[0]]
    return StandinCall(tool=parts[0], cwd=parts[1], lines=lines, argv=parts[3:])


KANIKO_DEFAULT_CONTEXT = "/workspace"  # kaniko's --context when none is given


def context_dir(context: str | None, sub_path: str | None = None) -> str:
    """The directory kaniko builds from: ``dir://`` or a plain path (its default /workspace/), with
    --context-sub-path below it."""
    c = (context if context is not None else KANIKO_DEFAULT_CONTEXT).removeprefix("dir://").rstrip("/") or "/"
    if sub_path:
        c = c.rstrip("/") + "/" + sub_path.strip("/")
    return os.path.normpath(c)


def _relative_dockerfile(call: KanikoCall) -> str | None:
    if call.dockerfile is None:
        return None
    ctx = context_dir(call.context, call.context_sub_path).rstrip("/") + "/"
    return call.dockerfile[len(ctx):] if call.dockerfile.startswith(ctx) else call.dockerfile


def compare_kaniko(call: KanikoCall, target: TargetSpec, *, uname_m: str,
                   expected_build_args: dict[str, tuple[str, str]],
                   dockerfile_defaults: dict[str, str | None],
                   dockerfile: DockerfileContract | None = None) -> list[Difference]:
    """Every way the final kaniko call differs from the plan (an empty list: it builds what was planned).

    ``expected_build_args``: name -> (value, provenance) the plan bakes; a build arg the script does not
    pass is fine only when the default in force is that value: the Dockerfile's global ARG
    (``dockerfile_defaults``) and, in each stage the call builds that declares it, that stage's ARG."""
    out: list[Difference] = []
    p = target.provenance
    contract_df = dockerfile
    if call.error:
        out.append(Difference(field="kaniko argv", planned="kaniko's own flags", script=call.error,
                              text=f"kaniko exits at once on its command line ({call.error}) at "
                                   f"{call.line or 'an unknown line'}: kaniko's flag set has no such flag"))
    ctx = context_dir(call.context, call.context_sub_path)
    if ctx != IRIS_WORKDIR:
        given = (call.context if call.context is not None else f"none (kaniko's default {KANIKO_DEFAULT_CONTEXT}/)")
        out.append(Difference(field="context", planned=f"dir://{IRIS_WORKDIR} (the build commit's bundle, where Iris "
                              "unpacks it)", script=given + (f" with --context-sub-path {call.context_sub_path}"
                                                             if call.context_sub_path else ""),
                              planned_source="the Iris bundle (IRIS_WORKDIR)"))
    planned = [f"{target.image_repository}:{target.tag}"]
    if target.floating_tag:
        planned.append(f"{target.image_repository}:{target.floating_tag}")
    if call.no_push:
        out.append(Difference(field="push", planned=", ".join(planned), script="--no-push (nothing is pushed)",
                              planned_source=p.get("tag", "")))
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
                continue
            for st, _ in used_stages(contract_df, call) if contract_df is not None else []:
                if name not in st.args:
                    continue
                in_force = st.args[name] if st.args[name] is not None else default
                if in_force != value:
                    unused = sorted(set(call.build_args) - _declared_args(contract_df))
                    hint = f"; the call passes {', '.join(unused)}, which no stage declares" if unused else ""
                    shown = "unset (empty)" if in_force is None else in_force
                    out.append(Difference(
                        field=f"--build-arg {name}", planned=value, planned_source=src,
                        script=f"not passed (in stage {st.name}, {contract_df.path}:{st.line}, ARG {name} is "
                               f"{shown}{hint})"))
                    break
        elif got != value:
            out.append(Difference(field=f"--build-arg {name}", planned=value, script=got, planned_source=src))
    return out


def _declared_args(df: DockerfileContract) -> set[str]:
    out = set(df.global_args)
    for st in df.stages:
        out |= set(st.args)
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


def _statement_start(text: str, line: str) -> str:
    """bash's LINENO of a command continued over lines (`cmd \\`) is not always its first line: walk back."""
    if not text or not line.isdigit():
        return line
    lines, n = text.splitlines(), int(line)
    while 1 < n <= len(lines) + 1 and lines[n - 2].rstrip().endswith("\\"):
        n -= 1
    return str(n)


def script_line(source: str, line: str, plan: RehearsalPlan) -> str:
    """The repo file:line for a bash source path inside the rehearsal root."""
    prefix = IRIS_WORKDIR + "/"
    own = source == prefix + plan.script_path or (plan.script_env_var and not source.startswith(prefix))
    if own:
        line = _statement_start(plan.script_text, line)
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


def call_line(call: StandinCall, plan: RehearsalPlan) -> str | None:
    """The build script's file:line that ran ``call`` (through any function or child process), else the
    innermost line recorded."""
    own = f"{IRIS_WORKDIR}/{plan.script_path}"
    for where in call.lines:
        source, _, line = where.rpartition(":")
        if source == own or (plan.script_env_var and not source.startswith(IRIS_WORKDIR + "/")):
            return script_line(source, line, plan)
    if call.lines:
        source, _, line = call.lines[-1].rpartition(":")
        return script_line(source, line, plan)
    return None


# ----------------------------------------------------------------------------- every step compared

_EXECUTOR_IMAGE = re.compile(r"(^|/)kaniko-project/executor([:@]|$)|/kaniko/executor([:@]|$)")
# crane verbs that only ask whether an image exists (the stand-in says yes): a later read of what a probe
# found is the script's own check, not a guess.
_CRANE_PROBES = {"digest", "manifest", "config", "ls", "validate"}
_CRANE_VALUED = {"--platform", "-t", "--tag", "--new_tag", "-b", "--base", "-f", "--new_layer", "--format",
                 "-o", "--output", "--old_base", "--new_base", "--remote", "--tarball", "--annotation",
                 "-a", "--label", "-l", "--entrypoint", "--cmd", "--env", "-e", "--user", "--workdir"}


def _repository(ref: str) -> str:
    ref = ref.partition("@")[0]
    head, colon, tag = ref.rpartition(":")
    return head if colon and "/" not in tag else ref


def _same_image(a: str, b: str) -> bool:
    def norm(r: str) -> str:
        return r if "@" in r or ":" in r.rpartition("/")[2] else r + ":latest"
    return norm(a) == norm(b) or ("@" in a and _repository(a) == _repository(b))


CRANE_DEFAULT_PLATFORM = "linux/amd64"  # what crane picks out of a multi-arch index when --platform is not given


def crane_platform(argv: list[str]) -> str | None:
    """crane's --platform (a global flag: before or after the verb, `--platform X` or `--platform=X`)."""
    found = None
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a == "--platform" and i + 1 < len(argv):
            found = argv[i + 1]
        elif a.startswith("--platform="):
            found = a.partition("=")[2]
    return found


def crane_images(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """(verb, images it reads, images it writes) of a crane command line."""
    i = 0  # global flags may come before the verb (`crane --platform linux/arm64 export ...`)
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if "=" not in argv[i] and argv[i] in _CRANE_VALUED else 1
    if i >= len(argv):
        return "", [], []
    verb, words, flags = argv[i], [], {}
    i += 1
    while i < len(argv):
        a = argv[i]
        i += 1
        if a.startswith("-"):
            name, eq, value = a.partition("=")
            if not eq and name in _CRANE_VALUED and i < len(argv):
                value = argv[i]
                i += 1
            flags.setdefault(name, []).append(value)
            continue
        words.append(a)
    reads: list[str] = []
    writes: list[str] = []
    if verb in ("export", "digest", "manifest", "config", "ls", "flatten", "mutate", "tag", "blob", "rebase"):
        reads += words[:1]
    elif verb == "pull":
        reads += words[:-1]
    elif verb in ("copy", "cp"):
        reads += words[:1]
        writes += words[1:2]
    elif verb == "push":
        writes += words[1:2]
    elif verb == "append":
        reads += flags.get("-b", []) + flags.get("--base", [])
    elif verb == "validate":
        reads += flags.get("--remote", [])
    if verb == "tag" and len(words) >= 2:
        writes.append(f"{_repository(words[0])}:{words[1]}")
    for f in ("-t", "--tag", "--new_tag"):
        writes += flags.get(f, []) if verb in ("append", "flatten", "mutate", "rebase") else []
    return verb, reads, writes


def _substitute(text: str, values: dict[str, str | None]) -> str | None:
    """``text`` with $X / ${X} replaced from ``values``; None when a variable has no value."""
    missing = False

    def one(m: re.Match) -> str:
        nonlocal missing
        v = values.get(m.group(1) or m.group(2))
        if v is None:
            missing = True
            return ""
        return v
    out = re.sub(r"\$\{(\w+)\}|\$(\w+)", one, text)
    return None if missing else out


def _global_values(df: DockerfileContract, build_args: dict[str, str]) -> dict[str, str | None]:
    return {**df.global_args, **{k: v for k, v in build_args.items() if k in df.global_args}}


def _stage_of(df: DockerfileContract, ref: str) -> int | None:
    for i, st in enumerate(df.stages):
        if st.name == ref or str(i) == ref:
            return i
    return None


def used_stages(df: DockerfileContract, call: KanikoCall) -> list[tuple[Stage, str | None]]:
    """The stages a kaniko call builds (with --skip-unused-stages: what the target derives from or copies
    from; else every stage up to the target), each with its resolved base (None when it is a stage)."""
    values = _global_values(df, call.build_args)
    target = _stage_of(df, call.target) if call.target else len(df.stages) - 1
    if target is None:
        return []

    def base(i: int) -> str | None:
        return _substitute(df.stages[i].base, values)

    if call.skip_unused_stages:
        want, todo = set(), [target]
        while todo:
            i = todo.pop()
            if i in want:
                continue
            want.add(i)
            deps = [base(i)] + [c.from_ for c in df.stages[i].copies if c.from_]
            todo += [j for d in deps if d is not None and (j := _stage_of(df, d)) is not None and j < i]
        order = sorted(want)
    else:
        order = list(range(target + 1))
    out = []
    for i in order:
        b = base(i)
        out.append((df.stages[i], None if b is not None and _stage_of(df, b) is not None else b))
    return out


_REFERENCE = re.compile(  # Docker's reference grammar (distribution/reference), lower-case path components
    r"^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


def image_references(df: DockerfileContract, call: KanikoCall) -> list[tuple[str, str, str]]:
    """(reference, "FROM"/"COPY --from", file:line) of every image the stages this call builds pull, after
    substituting the planned build args (only ARGs declared before the first FROM reach a FROM)."""
    values = _global_values(df, call.build_args)
    out = []
    for st, base in used_stages(df, call):
        if base is not None and base != "scratch":
            out.append((base, "FROM", f"{df.path}:{st.line}"))
        for c in st.copies:
            if c.from_ and _stage_of(df, c.from_) is None:
                out.append((_substitute(c.from_, values) or c.from_, "COPY --from", f"{df.path}:{c.line}"))
    return out


def reference_problems(df: DockerfileContract, call: KanikoCall, platform: str | None = None) -> list[Difference]:
    """Each FROM of the stages this call builds that does not expand to a stage or an image reference with
    the planned build args (an ARG declared inside a stage never reaches a FROM: BuildKit's and kaniko's
    scoping; the automatic platform ARGs of ``platform`` do), and each `COPY --from` that names neither a
    stage nor a full image reference (a registry path, a tag or a digest): kaniko would fail on them at its
    first pull, after the job was scheduled."""
    out: list[Difference] = []
    values = {**(_platform_args(platform) if platform else {}), **_global_values(df, call.build_args)}
    stage_args = {k: st.name for st in df.stages for k in st.args}
    names = [st.name for st in df.stages if st.name]
    for st, _ in used_stages(df, call):
        raw = st.base
        resolved = _substitute(raw, values)
        if resolved is not None and (_stage_of(df, resolved) is not None or resolved == "scratch"):
            continue
        if resolved is None or not resolved or not _REFERENCE.match(resolved):
            unset = [m.group(1) or m.group(2) for m in re.finditer(r"\$\{(\w+)\}|\$(\w+)", raw)
                     if values.get(m.group(1) or m.group(2)) is None]
            why = "; ".join(
                f"{v} is declared only inside stage {stage_args[v]}, which a FROM cannot read (only ARGs before "
                "the first FROM reach it)" if v in stage_args else f"{v} has no value (no ARG before the first "
                "FROM and no build arg)" for v in unset) or f"{resolved!r} is not an image reference"
            out.append(Difference(field="FROM", planned="an image reference or a stage", script=resolved or "",
                                  planned_source=f"{df.path}:{st.line}",
                                  text=f"{df.path}:{st.line}: `FROM {raw}` expands to {resolved or 'nothing'!r} "
                                       f"with the planned build args: {why}; kaniko fails there"))
        for c in st.copies:
            ref = c.from_
            if not ref or _stage_of(df, ref) is not None:
                continue
            full = _substitute(ref, values)
            if full and _REFERENCE.match(full) and ("/" in full or ":" in full or "@" in full):
                continue
            near = difflib.get_close_matches(ref, names, n=1)
            out.append(Difference(
                field="COPY --from", planned="a stage or a full image reference", script=ref,
                planned_source=f"{df.path}:{c.line}",
                text=f"{df.path}:{c.line}: `COPY --from={ref}` names no stage of {df.path} and is not a full image "
                     f"reference (kaniko would pull docker.io/library/{ref})"
                     + (f"; did you mean stage {near[0]}?" if near else "")))
    return out


def dockerignore(text: str) -> Callable[[str], bool]:
    """Whether a context path (relative, "/"-separated) is left out of the build by this .dockerignore, as
    Docker's patternmatcher reads it (kaniko uses the same): one pattern a line, `#` comments, a leading `/`
    ignored, `*` and `?` within a path element, `**` across elements, `!` re-including, the last matching
    pattern winning, and a path excluded when it or a directory above it matches."""
    rules: list[tuple[re.Pattern[str], bool]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pat = os.path.normpath(line[1:].strip() if keep else line).lstrip("/")
        if pat in ("", "."):
            continue
        rx, i = "", 0
        while i < len(pat):
            if pat.startswith("**", i):
                rx += ".*"
                i += 2
                if pat.startswith("/", i):
                    rx, i = rx + "(?:/|$)" if i == len(pat) - 1 else rx[:-2] + "(?:.*/)?", i + 1
                continue
            c = pat[i]
            rx += "[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c)
            i += 1
        rules.append((re.compile(f"^{rx}$"), keep))

    def excluded(path: str) -> bool:
        parts = path.strip("/").split("/")
        out = False
        for rx, keep in rules:
            if any(rx.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
                out = not keep
        return out
    return excluded


def _known_images(dockerfiles: dict[str, DockerfileContract]) -> set[str]:
    """Images the plan knows without a push: every base a Dockerfile names by its own defaults."""
    known: set[str] = set()
    for df in dockerfiles.values():
        values = dict(df.global_args)
        for st in df.stages:
            b = _substitute(st.base, values)
            if b and _stage_of(df, b) is None and b != "scratch":
                known.add(b)
            for c in st.copies:
                if c.from_ and _stage_of(df, c.from_) is None:
                    known.add(c.from_)
    return known


def _missing_sources(df: DockerfileContract, call: KanikoCall, context: Iterable[str]) -> list[Difference]:
    """COPY/ADD sources of the stages this call builds that are not in the build context (one difference
    per instruction)."""
    paths = set(context)
    dirs = {p.rstrip("/") for p in paths if p.endswith("/")}
    files = {p for p in paths if not p.endswith("/")}
    ctx = context_dir(call.context, call.context_sub_path)
    out: list[Difference] = []
    globals_ = _global_values(df, call.build_args)
    for st, _ in used_stages(df, call):
        values = {**globals_, **{k: call.build_args.get(k, v if v is not None else globals_.get(k))
                                 for k, v in st.args.items()}}
        for c in st.copies:
            if c.from_:
                continue
            missing = []
            env = {k: _substitute(v, values) for k, v in c.env.items()}  # ENV values may use ARGs themselves
            for src in c.sources:
                resolved = _substitute(src, {**values, **env})
                if resolved is None or re.match(r"^(https?|git)://|^git@", resolved):
                    continue
                rel = resolved.strip("/")
                while rel.startswith("./"):
                    rel = rel[2:]
                if rel in ("", "."):
                    continue
                if any(ch in rel for ch in "*?["):
                    found = any(fnmatch.fnmatchcase(p, rel) for p in files | dirs)
                else:
                    found = rel in files or rel in dirs
                if not found:
                    missing.append(src)
            if missing:
                what = ", ".join(missing)
                out.append(Difference(
                    field="COPY source", planned=f"{df.path}:{c.line}", script=what, script_source=call.line or "",
                    text=f"{df.path}:{c.line}: `{c.instruction}` of {what}: not in the build context ({ctx} as the "
                         f"script leaves it for the kaniko call at {call.line or 'an unknown line'}); kaniko fails "
                         "there after the job started: commit the path (the bundle holds what git tracks) or fix it"))
    return out


def _nearest(ref: str, pushed: dict[str, str | None]) -> tuple[str, str | None] | None:
    if not pushed:
        return None
    same = [p for p in pushed if _repository(p) == _repository(ref)] or list(pushed)
    best = difflib.get_close_matches(ref, same, n=1, cutoff=0) or same[:1]
    return best[0], pushed[best[0]]


def compare_steps(calls: list[StandinCall], plan: RehearsalPlan, target: TargetSpec, *,
                  expected_args: dict[str, tuple[str, str]], dockerfiles: dict[str, DockerfileContract],
                  context: Iterable[str] | None) -> list[Difference]:
    """Every kaniko and crane call in order, not only the final build: each build arg against the plan or
    the Dockerfile pin, each platform against the plan, each image read against what an earlier step
    pushed (or a probe found, or the plan knows), each COPY source against the build context."""
    out: list[Difference] = []
    pushed: dict[str, str | None] = {}  # image -> the line that pushed it
    probed: set[str] = set()
    known = _known_images(dockerfiles)
    context = list(context) if context is not None else None
    host = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}.get(plan.uname_m, plan.uname_m)
    final = next((c for c in reversed(calls) if c.tool == "executor" and parse_kaniko_argv(c.argv).target is None),
                 None)

    def check_read(image: str, what: str, line: str | None, via: str = "") -> None:
        if (_EXECUTOR_IMAGE.search(_repository(image)) or image in known
                or any(_same_image(image, p) for p in [*pushed, *probed])):
            return
        near = _nearest(image, pushed)
        earlier = (f"; the nearest earlier push is {near[0]}" + (f" (at {near[1]})" if near[1] else "")
                   if near else "; no earlier step pushed any image")
        out.append(Difference(
            field="image read", planned=near[0] if near else "none", script=image, script_source=line or "",
            text=f"{what} at {line or 'an unknown line'}{via} reads {image}, which no earlier step of the job pushed "
                 f"and the plan does not know{earlier}: on the cluster it fails there, after every step before it "
                 "(hours of compile) ran"))

    for c in calls:
        line = call_line(c, plan)
        if c.tool == "crane":
            verb, reads, writes = crane_images(c.argv)
            if verb in ("export", "pull") and reads:
                want = crane_platform(c.argv)
                got = want or f"{CRANE_DEFAULT_PLATFORM} (crane's default)"
                if (want or CRANE_DEFAULT_PLATFORM) != target.kaniko_platform:
                    out.append(Difference(
                        field="crane platform", planned=target.kaniko_platform, script=got, script_source=line or "",
                        planned_source=target.provenance.get("kaniko_platform", ""),
                        text=f"`crane {verb}` at {line or 'an unknown line'} reads {', '.join(reads)} for {got}; the "
                             f"plan builds {target.kaniko_platform}: the build unpacks the other architecture's "
                             "files (or crane finds no such platform)"))
            for image in reads:
                if verb in _CRANE_PROBES:
                    probed.add(image)
                else:
                    check_read(image, f"`crane {verb}`", line)
            for image in writes:
                pushed.setdefault(image, line)
            continue
        if c.tool != "executor":
            continue
        k = parse_kaniko_argv(c.argv)
        k.line = line
        at = line or ""
        earlier = c is not final  # the final call's planned values are compare_kaniko's
        if earlier and k.error:
            out.append(Difference(field="kaniko argv", planned="kaniko's own flags", script=k.error, script_source=at,
                                  text=f"kaniko exits at once on its command line ({k.error}) at "
                                       f"{at or 'an unknown line'}: kaniko's flag set has no such flag"))
        if earlier and context_dir(k.context, k.context_sub_path) != IRIS_WORKDIR:
            out.append(Difference(field="context", planned=f"dir://{IRIS_WORKDIR} (the build commit's bundle)",
                                  script=k.context or f"none (kaniko's default {KANIKO_DEFAULT_CONTEXT}/)",
                                  script_source=at, planned_source="the Iris bundle (IRIS_WORKDIR)"))
        for name, value in k.build_args.items():
            if name in expected_args:
                if earlier and value != expected_args[name][0]:
                    out.append(Difference(field=f"--build-arg {name}", planned=expected_args[name][0], script=value,
                                          planned_source=expected_args[name][1], script_source=at))
                continue
            df = dockerfiles.get(_relative_dockerfile(k) or "")
            if df is not None and name in df.pins and value != df.pins[name]:
                out.append(Difference(
                    field=f"--build-arg {name}", planned=df.pins[name], script=value, script_source=at,
                    planned_source=f"{df.path}:{df.pin_lines.get(name, 0)}, {PIN_OVERRIDE}"))
        if earlier and k.platform is not None and k.platform != target.kaniko_platform:
            out.append(Difference(field="platform", planned=target.kaniko_platform, script=k.platform,
                                  planned_source=target.provenance.get("kaniko_platform", ""), script_source=at))
        elif earlier and k.platform is None and host != target.kaniko_platform:
            out.append(Difference(field="platform", planned=target.kaniko_platform, script=f"{host} (its host)",
                                  planned_source=target.provenance.get("kaniko_platform", ""), script_source=at))
        df = dockerfiles.get(_relative_dockerfile(k) or "")
        if df is not None:
            out += reference_problems(df, k, k.platform or target.kaniko_platform)
            for st, base in used_stages(df, k):
                if base is not None and base != "scratch":
                    check_read(base, "the kaniko call", line, via=f" (FROM at {df.path}:{st.line})")
                for cp in st.copies:
                    if cp.from_ and _stage_of(df, cp.from_) is None:
                        check_read(cp.from_, "the kaniko call", line, via=f" (COPY --from at {df.path}:{cp.line})")
            if context is not None and context_dir(k.context, k.context_sub_path) == IRIS_WORKDIR:  # the context the run kept
                out += _missing_sources(df, k, context)
        for d in [] if k.no_push else k.destinations:
            pushed.setdefault(d, line)
    kept: list[Difference] = []
    for d in out:  # a COPY that two kaniko calls build is named once
        key = d.planned_source if d.field in ("FROM", "COPY --from") else d.planned
        if d.field not in ("COPY source", "FROM", "COPY --from") or not any(
                (k.field, k.planned_source if k.field in ("FROM", "COPY --from") else k.planned) == (d.field, key)
                for k in kept):
            kept.append(d)
    return kept


# ----------------------------------------------------------------------------- images the build pulls

# Crane verbs that resolve one platform's image out of an index (crane's default linux/amd64 unless --platform),
# and those that read the reference as it is (an index is fine): existence only.
_CRANE_PLATFORM_VERBS = {"export", "pull", "config", "flatten", "mutate", "append", "rebase"}
_CRANE_ANY_PLATFORM_VERBS = {"digest", "manifest", "copy", "cp", "tag", "validate", "blob"}


def _platform_args(platform: str) -> dict[str, str | None]:
    """The automatic platform ARGs a FROM may use (BuildKit and kaniko define them in the global scope); the
    build runs on the target's own architecture, so BUILD* and TARGET* are the same platform."""
    os_, _, rest = platform.partition("/")
    arch, _, variant = rest.partition("/")
    out: dict[str, str | None] = {}
    for side in ("TARGET", "BUILD"):
        out |= {f"{side}PLATFORM": platform, f"{side}OS": os_, f"{side}ARCH": arch, f"{side}VARIANT": variant}
    return out


def _pullable(ref: str | None) -> bool:
    return bool(ref) and "$" not in ref and bool(_REFERENCE.match(ref))


def kaniko_image_reads(df: DockerfileContract, call: KanikoCall, default_platform: str,
                       at: str | None = None) -> list[ImageRead]:
    """Every image the stages ``call`` builds pull: each FROM that is no stage (after the planned build args
    and the automatic platform ARGs; ``FROM --platform=`` wins over the call's platform) and each full
    `COPY --from` reference. What does not expand to a reference is reference_problems' to refuse."""
    platform = call.platform or default_platform
    values = {**_platform_args(platform), **_global_values(df, call.build_args)}
    via = f" (the kaniko call at {at})" if at else ""
    out: list[ImageRead] = []
    for st, _ in used_stages(df, call):
        plat = _substitute(st.platform, values) if st.platform else platform
        base = _substitute(st.base, values)
        if base is not None and base != "scratch" and _pullable(base) and _stage_of(df, base) is None:
            out.append(ImageRead(reference=base, platform=plat or platform, source=f"{df.path}:{st.line}{via}",
                                 what="FROM"))
        for c in st.copies:
            ref = _substitute(c.from_, values) if c.from_ else None
            if ref and _stage_of(df, c.from_ or "") is None and _pullable(ref) and (
                    "/" in ref or ":" in ref or "@" in ref):
                out.append(ImageRead(reference=ref, platform=platform, source=f"{df.path}:{c.line}{via}",
                                     what="COPY --from"))
    return out


def image_reads(calls: list[StandinCall], plan: RehearsalPlan, target: TargetSpec,
                dockerfiles: dict[str, DockerfileContract]) -> list[ImageRead]:
    """Every image the recorded build pulls from a registry, in order, each with the platform it must exist
    for and the line that names it: the bases and full `COPY --from` references of every kaniko call, and
    what each crane call reads. An image an earlier step of the job pushes is left out (it does not exist
    before the job runs; compare_steps checks the job pushes it first)."""
    pushed: list[str] = []
    out: list[ImageRead] = []

    def add(r: ImageRead) -> None:
        if any(_same_image(r.reference, p) for p in pushed):
            return
        if not any((x.reference, x.platform) == (r.reference, r.platform) for x in out):
            out.append(r)

    for c in calls:
        line = call_line(c, plan)
        if c.tool == "crane":
            verb, reads, writes = crane_images(c.argv)
            want = crane_platform(c.argv)
            for ref in reads:
                if not _pullable(ref) or verb not in _CRANE_PLATFORM_VERBS | _CRANE_ANY_PLATFORM_VERBS:
                    continue
                plat = want or (CRANE_DEFAULT_PLATFORM if verb in _CRANE_PLATFORM_VERBS else None)
                add(ImageRead(reference=ref, platform=plat, source=line or plan.script_path, what=f"crane {verb}",
                              probe=verb in _CRANE_PROBES))
            pushed += writes
            continue
        if c.tool != "executor":
            continue
        k = parse_kaniko_argv(c.argv)
        df = dockerfiles.get(_relative_dockerfile(k) or "")
        if df is not None and not k.error:
            for r in kaniko_image_reads(df, k, target.kaniko_platform, line):
                add(r)
        pushed += [] if k.no_push else k.destinations
    return out


def planned_image_reads(target: TargetSpec, df: DockerfileContract, build_args: dict[str, str]) -> list[ImageRead]:
    """The images the planned final build pulls when no rehearsal recorded the build (it could not run): the
    stages the final target derives from, with the plan's build args."""
    call = KanikoCall(build_args=build_args, skip_unused_stages=True, platform=target.kaniko_platform)
    return kaniko_image_reads(df, call, target.kaniko_platform)


def image_refusal(targets: list[TargetSpec], *, mode: str, accept_unrehearsed: bool) -> str | None:
    """The plan's refusal from the registry answers (``t.rehearsal.image_checks``), else None.

    A reference the registry answers is not there (no such tag, digest or repository, no manifest for the
    target's platform, or refused to the credentials the job has for that host) refuses: kaniko or crane
    fails there on the cluster. A registry that did not answer leaves the reference "unchecked", never
    passed: under ``required`` that refuses unless the operator passes --accept-unrehearsed (recorded in the
    result, as for an unrehearsed step); ``best_effort`` plans on with it named in the report. So does a
    crane probe (digest/manifest/config) of a missing image: the script asks itself, and the rehearsal's
    stand-in answered "it exists", so what the script did next is unproven."""
    bad: dict[str, list[str]] = {}
    unproven: dict[str, list[str]] = {}
    for t in targets:
        r = t.rehearsal
        for c in r.image_checks if r is not None else []:
            if c.status in ("missing", "no_platform", "unauthorized") and not c.read.probe:
                bad.setdefault(c.describe(), []).append(t.key)
            elif c.status != "found":
                why = c.describe() + (" — the rehearsal's crane stand-in answered that it exists, so the steps "
                                      "after it are unproven" if c.status != "unchecked" else "")
                unproven.setdefault(why, []).append(t.key)
    if bad:
        return ("an image the build pulls is not in its registry for the planned platform (checked before "
                "anything was submitted; kaniko or crane would fail there on the cluster): " + " | ".join(
                    f"{', '.join(keys)}: {why}" for why, keys in bad.items())
                + ". Next: fix the reference (or push the image) and plan again")
    if not unproven:
        return None
    for t in targets:
        if t.rehearsal is not None and any(c.status != "found" for c in t.rehearsal.image_checks):
            t.rehearsal.unrehearsed_accepted = accept_unrehearsed
    if mode == "required" and not accept_unrehearsed:
        return ("rehearsal is required (config policy.rehearsal = \"required\") and an image the build pulls "
                "could not be checked in its registry, so nothing was submitted: " + " | ".join(
                    f"{', '.join(keys)}: {why}" for why, keys in unproven.items())
                + ". Next: plan again when the registry answers, or pass --accept-unrehearsed to plan with it "
                  "unchecked (the report records it)")
    return None


# ----------------------------------------------------------------------------- credentials in the context

def placeholder_forms(placeholders: Iterable[str]) -> list[tuple[bytes, str]]:
    """Every form a placeholder can take in a file (raw, URL-encoded, base64 at any alignment (redact's own
    encoder list), hex), each with what it is: a build context holding any of them bakes the credential."""
    out: list[tuple[bytes, str]] = []
    for p in placeholders:
        for f in encoded_forms(p):
            kind = "raw" if f == p else "URL-encoded" if "%" in f else "base64"
            out.append((f.encode(), f"{p} ({kind})"))
        out += [(p.encode().hex().encode(), f"{p} (hex)"), (p.encode().hex().upper().encode(), f"{p} (hex)")]
    return sorted(out, key=lambda x: len(x[0]), reverse=True)


def find_placeholder(data: bytes, forms: list[tuple[bytes, str]]) -> str | None:
    return next((what for form, what in forms if form in data), None)


def rehearsal_placeholders(env: dict[str, str]) -> list[str]:
    prefix = PLACEHOLDER.partition("{")[0]
    return sorted({v for v in env.values() if v.startswith(prefix)})


def other_placeholder(p: str) -> str:
    """``p`` with every letter and digit changed (same length, case and character classes): a second run
    with it tells which context file follows the credential, whatever the encoding (base32, gzip, ROT13,
    split over files): every byte-range of the value differs."""
    def shift(c: str) -> str:
        if "a" <= c <= "z":
            return chr((ord(c) - 97 + 7) % 26 + 97)
        if "A" <= c <= "Z":
            return chr((ord(c) - 65 + 7) % 26 + 65)
        if c.isdigit():
            return str((int(c) + 3) % 10)
        return c
    return "".join(shift(c) for c in p)


def with_other_placeholders(env: dict[str, str]) -> dict[str, str]:
    placeholders = set(rehearsal_placeholders(env))
    return {k: other_placeholder(v) if v in placeholders else v for k, v in env.items()}


def differing_files(a: dict[str, tuple[str, int]], b: dict[str, tuple[str, int]]) -> list[str]:
    """Files whose content (or presence) differs between two runs' build contexts."""
    return sorted(p for p in set(a) | set(b) if (a.get(p) or ("",))[0] != (b.get(p) or ("",))[0])


TIMESTAMP_TICK_NS = 10_000_000  # a file mtime comes from the kernel's coarse clock: up to one tick (HZ=100) behind


def writer_line(mtime_ns: int, traces: list[tuple[int, int, str]], plan: RehearsalPlan, path: str = "") -> str | None:
    """The build script's line whose statement ran when a file got ``mtime_ns`` (the write happened within a
    clock tick after it): the one line running then, or among several the one whose text names the file;
    None when that is not a single line (the file is still named, without a line)."""
    def lines(selected) -> list[str]:
        out: list[str] = []
        for _, _, chain in selected:
            line = call_line(StandinCall(tool="", cwd="", argv=[], lines=[x for x in chain.split("|") if x]), plan)
            if line and line not in out:
                out.append(line)
        return out
    at = lines(t for t in traces if t[0] <= mtime_ns + TIMESTAMP_TICK_NS and t[1] >= mtime_ns)
    if len(at) > 1 and path:
        text = plan.script_text.splitlines()
        # the path as the line would spell it below the context (cloud/a), or a distinctive file name
        name = path if "/" in path or len(path) > 2 else "\0"

        def says(line: str) -> bool:
            file, _, n = line.partition(" ")[0].rpartition(":")
            return file == plan.script_path and n.isdigit() and 0 < int(n) <= len(text) and name in text[int(n) - 1]
        at = [line for line in at if says(line)]
    return at[0] if len(at) == 1 else None


# ----------------------------------------------------------------------------- the verdict

_ARCH_WORDS = {"aarch64": ("aarch64", "arm64"), "x86_64": ("x86_64", "amd64", "x86-64")}


def _arch_specific(plan: RehearsalPlan, line: str | None) -> str | None:
    """The architecture the build script's failing line names (e.g. /usr/lib/aarch64-linux-gnu), if it is
    the planned one: a step that only the target architecture's own userland can answer."""
    if not line:
        return None
    file, _, n = line.partition(" ")[0].rpartition(":")
    text = plan.script_text.splitlines()
    if file != plan.script_path or not n.isdigit() or not 0 < int(n) <= len(text):
        return None
    words = _ARCH_WORDS.get(plan.uname_m, (plan.uname_m,))
    return words[1] if any(w in text[int(n) - 1] for w in words) else None


def _unrehearsable_here(unrehearsable: list, failing: str | None) -> str | None:
    """What the failing statement could not have (a stood-in download at that very line), else None."""
    for u in unrehearsable:
        if isinstance(u, str):  # a record without lines: cannot be matched to the failing statement
            continue
        if failing is not None and failing in u.lines:
            return " ".join(u.argv)
    return None


def evaluate(plan: RehearsalPlan, target: TargetSpec, **kw) -> RehearsalResult:
    """One rehearsal's verdict (``_evaluate``), carrying every image the recorded build pulls (``image_reads``)
    for the registry look-up that follows (rehearsal/images.py)."""
    if kw.get("script_text"):
        plan = plan.model_copy(update={"script_text": kw["script_text"]})
    result = _evaluate(plan, target, **kw)
    result.images = image_reads(kw.get("calls") or [], plan, target, kw.get("dockerfiles") or {})
    return result


def _evaluate(plan: RehearsalPlan, target: TargetSpec, *, exit_code: int, stderr: str, calls: list[StandinCall],
             exits: list[tuple[int, str]], unrehearsable: list, seconds: float, timed_out: bool,
             timeout_s: float, expected_args: dict[str, tuple[str, str]],
             dockerfile_defaults: dict[str, str | None], dockerfiles: dict[str, DockerfileContract] | None = None,
             context: Iterable[str] | None = None, leaks: list[tuple[str, str]] | None = None,
             script_text: str = "", background: list[tuple[str, str]] | None = None,
             credential_files: list[tuple[str, str | None]] | None = None,
             foreign_userland: str | None = None, dockerignore_text: str = "") -> RehearsalResult:
    """One rehearsal's verdict from what the run recorded.

    ``unrehearsable``: stood-in downloads (StandinCall records); the run is "skipped" only when the
    failing statement is one of them. ``context``: the build context's paths after the run (directories
    end with "/"); ``leaks``: (file, what) for every credential placeholder found in it."""
    if script_text:
        plan = plan.model_copy(update={"script_text": script_text})
    tail = [s for s in stderr.splitlines() if "__rh_" not in s and "__RH_" not in s][-12:]
    tools = summarize_tools(calls)
    kaniko = [c for c in calls if c.tool == "executor"]
    if timed_out:
        return RehearsalResult(status="failed", seconds=seconds, stderr_tail=tail, tools=tools,
                               reason=f"the script did not finish within {timeout_s:.0f} s with every network "
                                      "tool stood in (it waits for something the job would wait for too)")
    final_call = next((c for c in reversed(kaniko) if parse_kaniko_argv(c.argv).target is None), None)
    final = parse_kaniko_argv(final_call.argv) if final_call else None
    if final is not None and final_call is not None:
        final.line = call_line(final_call, plan)
    if dockerignore_text:  # what .dockerignore leaves out is not in the image: not a leak, not a COPY source
        left_out = dockerignore(dockerignore_text)
        ctx_dir = context_dir(final.context, final.context_sub_path) if final else IRIS_WORKDIR
        leaks = [(f, w) for f, w in leaks or [] if not left_out(f)]
        credential_files = [(f, w) for f, w in credential_files or []
                            if not left_out(os.path.relpath(f, ctx_dir))]
        context = [p for p in context if not left_out(p)] if context is not None else None
    if leaks or credential_files:
        ctx = context_dir(final.context, final.context_sub_path) if final else IRIS_WORKDIR
        found = [f"{IRIS_WORKDIR}/{f} holds {what}" for f, what in leaks or []]
        found += [f"{f} changes with the credential (rehearsed twice with different placeholder credentials)"
                  + (f", written at {line}" if line else "") for f, line in credential_files or []]
        return RehearsalResult(
            status="failed", seconds=seconds, exit_code=exit_code, stderr_tail=tail, tools=tools, kaniko=final,
            line=next((line for _, line in credential_files or [] if line), None),
            reason=f"the script leaves a credential in the build context ({ctx}), which the image bakes (COPY): "
                   + "; ".join(found) + " — write credentials outside the context (e.g. /kaniko/.docker)")
    if exit_code != 0:
        rec = _script_exit(plan, exits)
        line = script_line(rec[1], rec[2], plan) if rec else None
        needs = _unrehearsable_here(unrehearsable, f"{rec[1]}:{rec[2]}" if rec else None)
        if needs is not None:
            return RehearsalResult(status="skipped", seconds=seconds, line=line, exit_code=exit_code,
                                   stderr_tail=tail, tools=tools, unrehearsed_from=line,
                                   reason=f"the script needs {needs}" + (f" at {line}" if line else "")
                                   + "; the steps after it were not rehearsed")
        arch = _arch_specific(plan, line) if foreign_userland else None
        if arch is not None:  # it fails on files of the other architecture's userland: unproven, not wrong
            return RehearsalResult(
                status="skipped", seconds=seconds, line=line, exit_code=exit_code, stderr_tail=tail, tools=tools,
                unrehearsed_from=line,
                reason=f"the step at {line} concerns {arch} files, and this worker rehearses in the "
                       f"{foreign_userland}; it and the steps after it were not rehearsed "
                       f"({failure_reason(line, exit_code, tail)})")
        return RehearsalResult(status="failed", seconds=seconds, line=line, exit_code=exit_code, stderr_tail=tail,
                               tools=tools, kaniko=final, reason=failure_reason(line, exit_code, tail))
    left = [c for c in kaniko if not c.finished]
    if left:
        at = ", ".join(call_line(c, plan) or "an unknown line" for c in left)
        return RehearsalResult(
            status="failed", seconds=seconds, exit_code=exit_code, stderr_tail=tail, tools=tools, kaniko=final,
            line=call_line(left[0], plan),
            reason=f"the kaniko call at {at} was still running when the script exited (started in the background "
                   "and never waited for): on the cluster the task ends with the script and kaniko is killed "
                   "before it pushes; run it in the foreground (or `wait` for it)"
                   + "".join(f" ({c.not_waited})" for c in left if c.not_waited))
    if final is None:
        own = [j for where, j in background or [] if _script_exit(plan, [(0, where)]) is not None]
        left_running = ("; it exited with background jobs still running, killed with the task on the cluster: "
                        + " | ".join(" ".join(j.split()) for j in own)) if own else ""
        return RehearsalResult(status="failed", seconds=seconds, exit_code=0, stderr_tail=tail, tools=tools,
                               reason=f"the script exits 0 without running the kaniko executor ({KANIKO_EXECUTOR})"
                                      + left_running)
    diffs = compare_kaniko(final, target, uname_m=plan.uname_m, expected_build_args=expected_args,
                           dockerfile_defaults=dockerfile_defaults,
                           dockerfile=(dockerfiles or {}).get(_relative_dockerfile(final) or ""))
    for d in diffs:
        d.script_source = d.script_source or final.line or ""
    diffs += compare_steps(calls, plan, target, expected_args=expected_args, dockerfiles=dockerfiles or {},
                           context=context)
    if diffs:
        return RehearsalResult(status="failed", seconds=seconds, exit_code=0, tools=tools, kaniko=final,
                               differences=diffs, reason="; ".join(d.describe() for d in diffs))
    unrun = [u for u in unrehearsable if not isinstance(u, str)]
    if unrun:  # the script went on past a step that was not run: its outcome there was made up
        line = call_line(unrun[0], plan)
        what = " ".join(unrun[0].argv)
        return RehearsalResult(
            status="skipped", seconds=seconds, exit_code=0, tools=tools, kaniko=final, line=line,
            unrehearsed_from=line, stderr_tail=tail,
            reason=f"the script went on past {what} at {line or 'an unknown line'}, which the rehearsal could not "
                   "run (it answered with a failure); what followed depended on it and is not proven")
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
