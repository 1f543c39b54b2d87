"""Run one planned job's command in an isolated root with no network, with stand-ins for the network tools.

Why bubblewrap (Debian package ``bubblewrap``, the ``bwrap`` binary): it builds a throwaway root from
bind mounts in new user, mount, PID, network and IPC namespaces without a daemon, root or setuid on
hosts that allow unprivileged user namespaces, and it dies with its parent — what a worker pod can
run in seconds. A container runtime would need a daemon and privileges the worker does not have;
chroot/unshare need root. Where the host cannot create the namespaces (Pod Security baseline or
restricted keep the runtime's default seccomp and AppArmor, which refuse them), the same root is built
by proot under Landlock and seccomp instead (rehearsal/proot.py; ``policy.rehearsal_isolation``, default
``auto``). Where neither runs (``isolation_unavailable``): ``policy.rehearsal = "required"`` refuses the
plan naming what the host lacks, ``"best_effort"`` says "rehearsal skipped: <reason>".

The root is laid out as Iris lays out a task. Its userland is the planned task image's own
(rehearsal/task_image.py: unpacked once per manifest digest, shared read-only): ``/usr`` and the other
top-level directories bound read-only, with per-run writable copies of the small ones a script may
write (``/etc``, ``/var``, ``/root``, ``/home``, ``/opt``, ``/run``, ``/srv``, ``/mnt``, ``/usr/local``),
a private ``/tmp`` and writable ``/kaniko``; nothing of the worker's own ``/usr`` is visible, so a tool
the image lacks is missing here as on the cluster. The build commit's bundle is unpacked at ``/app``
(``IRIS_WORKDIR``, also the working directory) exactly as Iris extracts it (``_unpack_bundle``). The
stand-ins (rehearsal/standins/standin) are first on ``PATH`` under ``/.rehearsal/bin``, with
their records; a stand-in whose tool neither the image has nor an earlier stood-in install provided
answers "command not found" (127) as the task would, and ``apt-get install``/``pip install`` leave
stand-ins for the commands they would install in ``/.rehearsal/installed`` (last on ``PATH``).
``BASH_ENV`` installs a DEBUG/EXIT trap that records the last script line each bash process ran, so a
failure names the line. Everything lives in one temporary directory removed afterwards; no real
credential is ever given.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from domain.buildset import TargetSpec
from domain.contract import BuildContract
from domain.markers import variant_env
from rehearsal import emulation, proot
from rehearsal.model import (
    IRIS_WORKDIR,
    KANIKO_EXECUTOR,
    STANDIN_TOOLS,
    RehearsalPlan,
    RehearsalResult,
    StandinCall,
    context_dir,
    differing_files,
    evaluate,
    expected_build_args,
    find_placeholder,
    parse_kaniko_argv,
    placeholder_forms,
    read_record,
    refusal,
    rehearsal_placeholders,
    rehearsal_plan,
    with_other_placeholders,
    writer_line,
)
from rehearsal.task_image import TaskImageError, TaskImageRoot, TaskImages, host_platform

STANDIN = Path(__file__).with_name("standins") / "standin"
TIMEOUT_S = 60.0
STDERR_LINES = 12
PATH = "/.rehearsal/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/.rehearsal/installed"
# Top-level directories of the image each run gets a writable copy of (small in a task image; the rest,
# /usr above all, is bound read-only from the shared cache). /usr/local is copied too (crane goes there).
WRITABLE = ("etc", "var", "root", "home", "opt", "run", "srv", "mnt", "media")
OWN = {"proc", "dev", "sys", "tmp", "app", "kaniko", ".rehearsal"}
Mode = Literal["required", "best_effort"]
Isolation = Literal["auto", "bwrap", "proot"]
# A login shell's /etc/profile may reset PATH (Debian's does for root); every bash the script starts puts
# the stand-ins back in front (and the stood-in installs at the end), as the image's tools stay in between.
PATH_GUARD = """case ":$PATH:" in *:/.rehearsal/bin:*) ;; *) PATH="/.rehearsal/bin:$PATH:/.rehearsal/installed" ;; esac
"""
# Records "<rc>\t<source>:<line>" for every bash process that exits: the DEBUG trap keeps the last
# statement (skipping the trap's own firings while the EXIT trap runs, which report line 1).
# __RH_LINES (exported) is the chain of calling lines down to this statement, read by the stand-ins.
# Both traps send their own xtrace to /dev/null (a script under `set -x` shows bash's own last words, e.g.
# "NOPE: unbound variable", not the trap's), and the EXIT trap forks nothing (no `$(mktemp)`: a command
# substitution while bash exits on an error could report "wait_for: No record of process N" and change the
# exit status); its file is named by time and PID, so the records sort in the order the processes ended.
# It adds the process's background jobs still running (`jobs -r`, a builtin): killed with the task there.
# The DEBUG trap also appends "<time>\t<lines>\t<$!>\t<w if a `wait`/`wait $!`, a:NAME for `NAME=$!`, v:NAME for
# `wait $NAME`>" to /.rehearsal/trace/<pid>:
# without /proc (proot) the statements, $! and __RH_PIDS (exported: the chain of bash PIDs above the
# statement, each process appends its $BASHPID once, subshells included) tell whether the script waited for
# a kaniko call (_not_waited); and when a context file differs between two runs with different credentials,
# its mtime names the statement that wrote it (_run_twice). ``trace="full"`` writes every statement's row;
# ``"wait"`` (the default) only those _not_waited reads, each statement once ``$!`` is set in the process
# (the first row that names a background job, and the next) and each process's first statement of its own
# (a traced bash is above the call, or exec'd it). Each row costs about a dozen system calls, which proot
# stops at twice each; the full trace is taken only by the run that names a writer line.
_TRACE_ROW = ('printf "%s\\t%s\\t%s\\t%s\\n" "${EPOCHREALTIME-}" "$__RH_LINES" "${!-}" "$__rh_w" '
              '>> "/.rehearsal/trace/$__rh_p"')
_TRACE_WRITE = {
    "full": _TRACE_ROW,
    "wait": ('[[ -z ${!-} && ( ${__rh_wrote-} == "$__rh_p" || ${BASH_SOURCE[0]:-} == /.rehearsal/* ) ]] || '
             '{ ' + _TRACE_ROW + '; __rh_wrote=$__rh_p; }'),
}
Trace = Literal["full", "wait"]


def line_trap(trace: Trace = "wait") -> str:
    """The BASH_ENV text after PATH_GUARD: the DEBUG and EXIT traps (``trace`` as above).

    The DEBUG trap's commands must not show in a ``set -x`` script's stderr, so it ran under ``2>/dev/null``,
    a redirection of about ten system calls on every statement (twenty ptrace stops under proot). It comes
    in two forms now, with the same body: "quiet" (redirected) and "fast" (not), each switching to the
    other. Fast runs while xtrace is off; a statement that may turn it on (its text names ``set`` or
    ``shopt``, ``eval``'d or not) runs the quiet form and leaves it in place, and the quiet form switches
    back only while xtrace is off and has never been on in this process (``local -`` can turn it back on
    without a ``set``). A script that turns xtrace on by another spelling (``$cmd -x``) shows one line of
    the fast form's test (``[[ … ]]``) before the switch; nothing else changes."""
    body = (r"""[[ $LINENO == 1 && $BASH_COMMAND == "${__rh_cmd-}" ]] || { __rh_cmd=$BASH_COMMAND; __rh_p=$BASHPID; __rh_line="${BASH_SOURCE[0]:-}:$LINENO"; export __RH_LINES="$__rh_outer$__rh_line"; [[ ${__RH_PIDS##*,} == "$__rh_p" ]] || export __RH_PIDS="${__RH_PIDS:+$__RH_PIDS,}$__rh_p"; case $BASH_COMMAND in wait|"wait \$!"|"wait \"\$!\""|"wait \${!}") __rh_w=w ;; [A-Za-z_]*=\$!|[A-Za-z_]*=\"\$!\"|[A-Za-z_]*=\${!}) __rh_w="a:${BASH_COMMAND%%=*}" ;; "wait \$"[A-Za-z_]*|"wait \"\$"[A-Za-z_]*\"|"wait \${"[A-Za-z_]*"}") __rh_n=${BASH_COMMAND#wait }; __rh_w="v:${__rh_n//[^A-Za-z0-9_]/}" ;; *) __rh_w="" ;; esac; """
            + _TRACE_WRITE[trace] + "; }")
    # (no single quote in body: each form is kept in a single-quoted shell variable)
    may_set = '$BASH_COMMAND == *set* || $BASH_COMMAND == *shopt*'
    quiet = ("{ " + body + "; case $- in *x*) __rh_x=1 ;; esac; [[ -n ${__rh_x-} || " + may_set
             + ' ]] || trap -- "$__rh_fast" DEBUG; } 2>/dev/null')
    fast = ("if [[ $- != *x* && ! ( " + may_set + " ) ]]; then " + body + "; else { " + body
            + '; trap -- "$__rh_quiet" DEBUG; } 2>/dev/null; fi')
    return (r"""set -o functrace
__rh_outer=${__RH_LINES:+$__RH_LINES|}
__rh_quiet='""" + quiet + """'
__rh_fast='""" + fast + """'
trap -- "$__rh_quiet" DEBUG
""" + r"""trap '{ __rh_rc=$?; { printf "%s\t%s\n" "$__rh_rc" "${__rh_line-}"; jobs -r; } > "/.rehearsal/exits/${EPOCHREALTIME-0}.$BASHPID"; } 2>/dev/null' EXIT
""")


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _ns_args() -> list[str]:
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if os.geteuid() != 0:
        args[1:1] = ["--unshare-user", "--uid", "0", "--gid", "0"]
    return args


def _root_args(top: Path, image: Path) -> list[str]:
    """bwrap mounts: the image read-only, the per-run writable copies, the rehearsal's own directories."""
    args = _ns_args()
    for entry in sorted(os.listdir(image)):
        src = image / entry
        if entry in OWN:
            continue
        if src.is_symlink():
            args += ["--symlink", os.readlink(src), f"/{entry}"]
        elif (top / "rw" / entry).is_dir():
            args += ["--bind", str(top / "rw" / entry), f"/{entry}"]
        else:
            args += ["--ro-bind", str(src), f"/{entry}"]
    if (top / "rw" / "usr-local").is_dir():
        args += ["--bind", str(top / "rw" / "usr-local"), "/usr/local"]
    args += _usr_bin_args(image)
    # /tmp is a private directory of this run (not a tmpfs) so that a build context the script assembles
    # there can still be read after the run.
    return args + ["--proc", "/proc", "--dev", "/dev", "--bind", str(top / "tmp"), "/tmp",
                   "--ro-bind", str(top / "rehearsal"), "/.rehearsal",
                   "--bind", str(top / "rehearsal" / "records"), "/.rehearsal/records",
                   "--bind", str(top / "rehearsal" / "exits"), "/.rehearsal/exits",
                   "--bind", str(top / "rehearsal" / "trace"), "/.rehearsal/trace",
                   "--bind", str(top / "rehearsal" / "installed"), "/.rehearsal/installed",
                   "--bind", str(top / "app"), "/app", "--bind", str(top / "kaniko"), "/kaniko", "--chdir", "/app"]


def _usr_bin_args(image: Path) -> list[str]:
    """/usr/bin as a per-run directory (a tmpfs) holding each of the image's entries bound read-only: a
    stood-in `apt-get install curl` can then put its stand-in at /usr/bin/curl, where the package would, so a
    script calling `/usr/bin/curl` runs as on the cluster. Binding each file (not a symlink farm) keeps a
    program's own path (/proc/self/exe) what it is in the image. About 0.3 ms per entry."""
    usr_bin = image / "usr" / "bin"
    if (image / "usr").is_symlink() or usr_bin.is_symlink() or not usr_bin.is_dir():
        return []
    args = ["--tmpfs", "/usr/bin"]
    for entry in sorted(os.listdir(usr_bin)):
        src = usr_bin / entry
        if src.is_symlink():
            args += ["--symlink", os.readlink(src), f"/usr/bin/{entry}"]
        else:
            args += ["--ro-bind", str(src), f"/usr/bin/{entry}"]
    return args


def _unpack_bundle(bundle_zip: Path, dest: Path) -> None:
    """The bundle as Iris extracts it: ``zipfile`` ``extractall``/``extract`` (iris.cluster.bundle
    ``BundleStore.extract_bundle_to``; the k8s task's ``iris.cluster.backends.k8s.bundle_fetch.fetch_bundle``),
    which keeps no zip mode bits: every file is created 0666 less the task's umask (022: 0644) and every
    directory 0777 less it (0755). So a sibling script the build runs directly (``"$DIR/x.sh"``) is not
    executable there (exit 126), and here neither; ``bash "$DIR/x.sh"`` works in both."""
    with zipfile.ZipFile(bundle_zip) as z:
        for member in z.namelist():
            if not (dest / member).resolve().is_relative_to(dest.resolve()):
                raise ValueError(f"Zip slip detected: {member} attempts to write outside extract path")
        z.extractall(dest)
    for d, dirs, files in os.walk(dest):
        for name in dirs:
            os.chmod(os.path.join(d, name), 0o755)
        for name in files:
            os.chmod(os.path.join(d, name), 0o644)


@functools.cache
def _standin_text(native: bool = False) -> bytes:
    """The stand-in; ``native``: with the worker's static bash as its interpreter (an emulated run,
    rehearsal/emulation.py), else the image's own ``/bin/bash``."""
    data = STANDIN.read_bytes()
    if not native:
        return data
    first, _, rest = data.partition(b"\n")
    assert first.startswith(b"#!/bin/bash -p"), first
    return f"#!{emulation.HOST_DIR}/bash -p".encode() + first[len(b"#!/bin/bash -p"):] + b"\n" + rest


@functools.cache
def _standin_archives(native: bool = False) -> tuple[bytes, bytes]:
    """(crane.tar.gz, kaniko.tar): the stand-in as GNU tar would pack it inside the root (root-owned, 0755)."""
    data = _standin_text(native)
    now = int(time.time())

    def pack(entries: list[tuple[str, bytes | None]], mode: str) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode=mode, format=tarfile.GNU_FORMAT) as tar:
            for name, content in entries:
                info = tarfile.TarInfo(name)
                info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = now, 0, 0, "root", "root", 0o755
                if content is None:
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                else:
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
        return buf.getvalue()

    return pack([("crane", data)], "w:gz"), pack([("kaniko/", None), ("kaniko/executor", data)], "w")


def _layout(top: Path, bundle_zip: Path | None, uname_m: str, image: Path, trace: Trace = "wait",
            native: bool = False) -> None:
    """The run's directory; ``native``: an emulated run whose stand-ins run on the worker's static bash and
    busybox (``/.rehearsal/bin/standin-host``, rehearsal/emulation.py), but for GUEST_STANDINS."""
    r = top / "rehearsal"
    for d in (r / "bin", r / "records", r / "exits", r / "trace", r / "installed", top / "app", top / "kaniko",
              top / "rw", top / "tmp"):
        d.mkdir(parents=True)
    shutil.copy2(STANDIN, r / "bin" / "standin")
    (r / "bin" / "standin").chmod(0o755)
    if native:
        (r / "bin" / "standin-host").write_bytes(_standin_text(True))
        (r / "bin" / "standin-host").chmod(0o755)
        emulation.lay_out_host_tools(r / "host")
    # What the stand-ins hand out as downloads, made here once rather than by tar, gzip, cp and mktemp inside
    # the root on every call (each exec costs hundreds of ptrace stops under proot): the crane release asset
    # (a tar.gz holding the stand-in as `crane`) and the kaniko executor image's files (kaniko/executor).
    (r / "crane.tar.gz").write_bytes(_standin_archives(native)[0])
    (r / "kaniko.tar").write_bytes(_standin_archives(native)[1])
    for name in STANDIN_TOOLS:
        (r / "bin" / name).symlink_to("standin-host" if native and name not in emulation.GUEST_STANDINS else "standin")
    # The kaniko image is where its executor lives; scripts that fetch it with crane unpack the same file.
    (top / "kaniko" / "executor").write_bytes(_standin_text(native))
    (top / "kaniko" / "executor").chmod(0o755)
    (r / "uname-m").write_text(uname_m + "\n")
    (r / "bash_env").write_text(PATH_GUARD + line_trap(trace))
    for name in WRITABLE:
        src = image / name
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, top / "rw" / name, symlinks=True)
    if (image / "usr" / "local").is_dir() and not (image / "usr").is_symlink():
        shutil.copytree(image / "usr" / "local", top / "rw" / "usr-local", symlinks=True)
    if bundle_zip is not None:
        _unpack_bundle(bundle_zip, top / "app")


def isolation_unavailable(isolation: Isolation = "auto") -> str | None:
    """None when this worker can build an isolated root (``choose_isolation``), else what it lacks."""
    return choose_isolation(isolation)[1]


def choose_isolation(isolation: Isolation = "auto") -> tuple[str | None, str | None]:
    """(the isolation to run, None) or (None, what the host lacks, for the refusal or "rehearsal skipped:
    …"). ``auto``: bwrap where it runs (namespaces: the stronger), else proot (rehearsal/proot.py), which
    runs where Pod Security baseline/restricted keep the runtime's default seccomp and AppArmor."""
    if isolation in ("auto", "bwrap"):
        why = bwrap_unavailable()
        if why is None:
            return "bwrap", None
        if isolation == "bwrap":
            return None, why
    why_proot = proot.unavailable()
    if why_proot is None:
        return "proot", None
    return None, why_proot if isolation == "proot" else f"{why}; and {why_proot}"


def bwrap_unavailable() -> str | None:
    """None when bwrap can build an isolated root here, else what the host lacks. The probe asks for the
    same namespaces and mounts a rehearsal does."""
    exe = bwrap_path()
    if exe is None:
        return "bwrap is not installed on this worker (Debian package bubblewrap; see deploy/README.md)"
    true = shutil.which("true") or "/bin/true"
    try:
        p = subprocess.run([exe, *_ns_args(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                            "--tmpfs", "/tmp", "--", true], capture_output=True, text=True, timeout=20,
                           env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start: {e}"
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        return (f"this host cannot create an isolated root (user, mount and PID namespaces with a fresh /proc; "
                f"deploy/README.md says what a pod needs): bwrap: {err}")
    return None


class Rehearsal:
    """The outcome of one run: exit code, stderr tail, the stand-in calls and per-process last lines."""

    def __init__(self, exit_code: int, stderr: str, calls: list[StandinCall], exits: list[tuple[int, str]],
                 unrehearsable: list[str], seconds: float, timed_out: bool):
        self.exit_code, self.stderr, self.calls, self.exits = exit_code, stderr, calls, exits
        self.unrehearsable, self.seconds, self.timed_out = unrehearsable, seconds, timed_out

    context: list[str] = []  # the build context's paths after the run ("dir/" for directories)
    leaks: list[tuple[str, str]] = []  # (file, placeholder form) found in the build context
    background: list[tuple[str, str]] = []  # (exit record's "source:line", `jobs -r` line) left running
    context_dir: str = ""  # the final kaniko call's build context inside the root
    fingerprints: dict[str, tuple[str, int]] = {}  # its files: relative path -> (content hash, mtime ns)
    traces: list[tuple[int, int, str]] = []  # statements the run started: (start ns, end ns, calling lines)
    dockerignore: str = ""  # the final context's .dockerignore (kaniko leaves out what it names)
    compared_with: str = ""  # where the run with the other placeholders ran, when not where this one did

    def kaniko_calls(self) -> list[StandinCall]:
        return [c for c in self.calls if c.tool == "executor"]


def run(plan: RehearsalPlan, bundle_zip: Path, image: TaskImageRoot, *, timeout_s: float = TIMEOUT_S,
        isolation: str = "bwrap", emulator: str | None = None, trace: Trace = "wait") -> Rehearsal:
    """One run of the planned command in a fresh root; ``trace="full"`` also records every statement's time
    (``Rehearsal.traces``, for writer_line), at a cost under proot."""
    exe = bwrap_path()
    if isolation == "bwrap" and exe is None:
        raise RuntimeError("bwrap is not installed")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-rl-rehearsal-") as tmp:
        top = Path(tmp)
        _layout(top, bundle_zip, plan.uname_m, image.path, trace,
                native=emulator is not None and emulation.host_tools() is not None)
        unpacked = _stats(top / "app")  # the bundle as unpacked: the scan below reads only what the script wrote
        env = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", **plan.env, "BASH_ENV": "/.rehearsal/bash_env"}
        timed_out = False
        if isolation == "proot":
            argv, extra = proot.command(top, image.path, OWN, plan.argv, qemu=emulator)
            env.update(extra)
        elif emulator is not None:
            raise ValueError("an emulated target runs under proot (rehearsal/emulation.py)")
        else:
            argv = [exe, *_root_args(top, image.path), "--", *plan.argv]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
        calls: list[StandinCall] = []
        unrehearsable: list[StandinCall] = []
        for f in sorted((top / "rehearsal" / "records").iterdir()):
            if f.name.endswith(".done"):
                continue
            rec = read_record(f.read_bytes())
            if rec is None:
                continue
            if rec.tool == "executor":  # the stand-in marks a call done only when the script waited for it
                rec.finished = f.with_name(f.name + ".done").exists()
                waited = f.with_name(f.name + ".wait")
                if rec.finished:  # and the statement trace shows the script waited for it
                    rec.not_waited = _not_waited(waited.read_text() if waited.exists() else "",
                                                 top / "rehearsal" / "trace", top / "rehearsal" / "exits",
                                                 wrapper=_waiting_wrapper(rec, top, image.path)) or ""
                    rec.finished = not rec.not_waited
            (unrehearsable if f.name.endswith(".unrehearsable") else calls).append(rec)
        exits: list[tuple[int, str]] = []
        background: list[tuple[str, str]] = []
        for f in sorted((top / "rehearsal" / "exits").iterdir()):
            first, *jobs = f.read_text().strip().splitlines() or [""]
            rc, _, where = first.partition("\t")
            if rc.isdigit():
                exits.append((int(rc), where))
                background += [(where, j) for j in jobs if j.strip()]
        # The build context as kaniko sees it (before the temp dir goes): its paths, and any placeholder in it.
        context, leaks = read_context(top / "app", placeholder_forms(rehearsal_placeholders(plan.env)), unpacked)
        final = next((c for c in reversed(calls) if c.tool == "executor" and parse_kaniko_argv(c.argv).target is None),
                     None)
        k = parse_kaniko_argv(final.argv) if final else None
        real_ctx = context_dir(k.context, k.context_sub_path) if k else IRIS_WORKDIR
        ctx_host = _host_path(top, image.path, real_ctx)
        fingerprints = _fingerprints(ctx_host)
        ignore = ctx_host / ".dockerignore" if ctx_host is not None else None
        dockerignore_text = ignore.read_text(errors="replace") if ignore is not None and ignore.is_file() else ""
        traces = _traces(top / "rehearsal" / "trace", top / "rehearsal" / "exits") if fingerprints and trace == "full" else []
    r = Rehearsal(proc.returncode, err.decode("utf-8", "replace"), calls, exits, unrehearsable,
                  time.monotonic() - started, timed_out)
    r.context, r.leaks, r.background = context, leaks, background
    r.context_dir, r.fingerprints, r.traces = real_ctx, fingerprints, traces
    r.dockerignore = dockerignore_text
    return r


def _host_path(top: Path, image: Path, path: str) -> Path | None:
    """Where a path of the rehearsal root lives on the worker (None: outside anything the run could write)."""
    norm = os.path.normpath("/" + path.lstrip("/"))
    mounts = [("/app", top / "app"), ("/tmp", top / "tmp"), ("/kaniko", top / "kaniko"),
              ("/usr/local", top / "rw" / "usr-local")] + [(f"/{n}", top / "rw" / n) for n in WRITABLE]
    for inside, outside in mounts:
        if (norm == inside or norm.startswith(inside + "/")) and outside.is_dir():
            return outside / os.path.relpath(norm, inside)
    return image / norm.lstrip("/")


def _fingerprints(root: Path | None) -> dict[str, tuple[str, int]]:
    """relative path -> (sha256 of the content or "link:<target>", mtime ns) of every file under ``root``."""
    out: dict[str, tuple[str, int]] = {}
    if root is None or not root.is_dir():
        return out
    for d, _, files in os.walk(root):
        for name in files:
            full = os.path.join(d, name)
            rel = os.path.relpath(full, root)
            try:
                st = os.lstat(full)
                if os.path.islink(full):
                    out[rel] = ("link:" + os.readlink(full), st.st_mtime_ns)
                elif os.path.isfile(full):
                    with open(full, "rb") as fh:
                        out[rel] = (hashlib.file_digest(fh, "sha256").hexdigest(), st.st_mtime_ns)
            except OSError:
                continue
    return out


# `timeout [options] DURATION /kaniko/executor …` (coreutils): timeout waits for its one child and exits with
# it, so the call's parent is timeout, itself the script's foreground (or `$!`-tracked) child.
_TIMEOUT = re.compile(r"^\s*(?:exec\s+)?timeout(?:\s+(?:-[sk]\s*\S+|--(?:signal|kill-after)=\S+|--preserve-status"
                      r"|--foreground|-v|--verbose))*\s+\d+(?:\.\d+)?[smhd]?\s+/kaniko/executor(?:\s|\\?$)")


def _waiting_wrapper(call: StandinCall, top: Path, image: Path) -> bool:
    """Whether the statement that ran ``call`` starts it under a program known to wait for it (timeout)."""
    own = [w for w in call.lines if not w.startswith("/.rehearsal/") and
           os.path.basename(w.rpartition(":")[0]) != "executor"]  # the stand-in's own BASH_ENV line
    if not own:
        return False
    source, _, n = own[-1].rpartition(":")
    path = _host_path(top, image, source)
    try:
        text = path.read_text(errors="replace").splitlines() if path is not None else []
    except OSError:
        return False
    return n.isdigit() and 0 < int(n) <= len(text) and _TIMEOUT.match(text[int(n) - 1]) is not None


def _not_waited(record: str, trace: Path, exits: Path, wrapper: bool = False) -> str | None:
    """Why the script did not wait for a kaniko call, from the stand-in's ``.wait`` record (start, end, its
    PID, its parent's, the bash PIDs above it, those gone at its end) and the statement trace; None when it
    waited. The one mechanism under bwrap and proot (which has no /proc; under bwrap, reading each parent's
    wchan could not tell which child it waits for: `kaniko & sleep 5` looked waited, a false pass).

    Sound by cause, not by timing: a call (or a subshell holding it) put in the background sets ``$!`` in
    the process that launched it, so that process's first statement seeing it must be ``wait`` or
    ``wait $!`` and its next one must start after the call ended; a process above the call (or its parent:
    ``setsid -f``, ``(… &)``) that ended before the call did was not waiting for it. A foreground call, a
    pipeline (``| tee``) and ``$(…)`` set no ``$!`` and keep every process above alive: waited. A call
    started by another program (``sh -c '… & sleep 5'``) is not seen waited for: refused, unless that program
    is ``timeout`` run by the script's statement itself (``wrapper``: it waits for its child). ``NAME=$!``
    right after the launch followed at once by ``wait $NAME`` is the same wait as ``wait $!``."""
    fields = record.rstrip("\n").split("\t")
    if len(fields) < 6:
        return "its wait record is incomplete"
    start, end, own, ppid, chain, gone = fields[:6]
    pids = {own, *(p for p in chain.split(",") if p)} | ({ppid} if ppid else set())
    end_ns = int(end.replace(".", "")) * 1000 if end.replace(".", "").isdigit() else 0
    if gone.split():
        return f"the process that started it (PID {gone.split()[0]}) ended while it still ran"
    # rows of its own PID before it became the stand-in (a traced bash that exec'd it), not the stand-in's own
    own_rows = [r.split("\t")[1].split("|")[-1] for r in (trace / own).read_text(errors="replace").splitlines()
                if r.count("\t") >= 3] if (trace / own).is_file() else []
    own_rows = [w for w in own_rows if not w.startswith("/.rehearsal/")
                and os.path.basename(w.rpartition(":")[0]) != "executor"]
    if not wrapper and not (trace / ppid).is_file() and not own_rows:  # not a traced bash's child nor exec'd by it
        return f"it was started by a program that is not the script's bash (PID {ppid}), whose waiting is not seen"
    for f in exits.iterdir():
        t, _, pid = f.name.rpartition(".")
        if pid in pids and pid != own and t.replace(".", "").isdigit() and int(t.replace(".", "")) * 1000 < end_ns:
            return f"bash PID {pid} above it exited while it still ran"
    for f in trace.iterdir():
        rows = [r.split("\t") for r in f.read_text(errors="replace").splitlines()]
        rows = [r for r in rows if len(r) >= 4]
        first = next((i for i, r in enumerate(rows) if r[2] in pids and r[2] != ""), None)
        if first is None:
            continue
        row = rows[first]
        name = row[3][2:] if row[3].startswith("a:") else ""
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and first + 1 < len(rows) and rows[first + 1][3] == f"v:{name}":
            first += 1  # `NAME=$!` then at once `wait $NAME`
        elif row[3] != "w":
            return f"it was put in the background and the script went on to {row[1].split('|')[-1]}"
        if first + 1 < len(rows) and rows[first + 1][0].replace(".", "").isdigit() and \
                int(rows[first + 1][0].replace(".", "")) * 1000 < end_ns:
            return f"the script went on to {rows[first + 1][1].split('|')[-1]} before it ended"
    return None


def _traces(d: Path, exits: Path) -> list[tuple[int, int, str]]:
    """(start ns, end ns, "|"-joined calling lines) of every statement a bash process of the run started; a
    process's last statement ends when it exited (its exit record's time), or is a point when unknown (a
    subshell, which runs no EXIT trap)."""
    ended: dict[str, int] = {}
    for f in exits.iterdir():
        t, _, pid = f.name.rpartition(".")
        with contextlib.suppress(ValueError):
            ended[pid] = int(t.replace(".", "")) * 1000
    out: list[tuple[int, int, str]] = []
    for f in d.iterdir():
        rows = []
        for row in f.read_text(errors="replace").splitlines():
            t, _, rest = row.partition("\t")
            lines = rest.split("\t")[0]
            with contextlib.suppress(ValueError):
                rows.append((int(t.replace(".", "")) * 1000, lines))
        for i, (t, lines) in enumerate(rows):
            out.append((t, rows[i + 1][0] if i + 1 < len(rows) else max(t, ended.get(f.name, t)), lines))
    return out


def _run_twice(plan: RehearsalPlan, bundle: Path, image: TaskImageRoot, timeout_s: float, isolation: str = "bwrap",
               emulator: str | None = None, native: tuple[TaskImageRoot, str, float] | None = None
               ) -> tuple[Rehearsal, list[tuple[str, str | None]]]:
    """The run, and the files of its final kaniko context that follow the credential: two runs at once, one
    with every credential placeholder changed; a file that differs between them (content or presence) is
    run a third time with the first placeholders, and counts only when that run matches the first (a file
    that differs run to run by itself, a timestamp, cannot be judged by difference; the scan still reads it).
    The first two runs trace only what the wait check reads; the third, and a fourth with the second's
    placeholders when a differing file is in the second run only (named after the credential), trace every
    statement, from which and the file's mtime in that same run writer_line names the line that wrote it.

    ``native`` (an emulated target: the worker's own variant of the task image, its isolation and bound): the
    second run goes there, natively, at a fifth of the CPU. Only "no difference" is taken from it: when it
    ends as the emulated first run did (same exit code, same context) with the same context files, no file
    follows the credential in either userland (for one to follow it in the emulated one only, the two
    architectures' branches would have to write, from two different placeholders, the same bytes). Any
    difference, or another path, may be the architecture's (``dpkg --print-architecture``, a library
    path): the second run is then made again emulated and judged as always, so what is refused or named
    comes from emulated runs only. The verdict is always the first (emulated) run's."""
    other = plan.model_copy(update={"env": with_other_placeholders(plan.env)})
    kw = {"timeout_s": timeout_s, "isolation": isolation, "emulator": emulator}
    if other.env == plan.env:
        return run(plan, bundle, image, **kw), []
    with ThreadPoolExecutor(max_workers=2) as pool:
        fa = pool.submit(run, plan, bundle, image, **kw)
        if emulator is not None and native is not None:
            fb = pool.submit(run, other, bundle, native[0], timeout_s=native[2], isolation=native[1])
        else:
            fb = pool.submit(run, other, bundle, image, **kw)
        a, b = fa.result(), fb.result()
    if emulator is not None and native is not None:
        if a.context_dir != b.context_dir or a.exit_code != b.exit_code or differing_files(a.fingerprints,
                                                                                            b.fingerprints):
            b = run(other, bundle, image, **kw)  # not the same in the worker's userland: again, emulated
        else:
            a.compared_with = f"{native[0].platform}, natively"
    if a.context_dir != b.context_dir or a.exit_code != b.exit_code:
        return a, []  # the runs took different paths: the verdict of the first stands, nothing to compare
    differ = differing_files(a.fingerprints, b.fingerprints)
    if not differ:
        return a, []
    with ThreadPoolExecutor(max_workers=2) as pool:
        fa = pool.submit(run, plan, bundle, image, **kw, trace="full")
        fb = pool.submit(run, other, bundle, image, **kw, trace="full") \
            if any(f not in a.fingerprints for f in differ) else None
        again, again_other = fa.result(), fb.result() if fb is not None else None
    differ = [f for f in differ if a.fingerprints.get(f, ("",))[0] == again.fingerprints.get(f, ("",))[0]]
    out = []
    for f in differ:
        # a file named after the credential is in the second placeholders' runs only
        run_of = again if f in again.fingerprints else again_other
        line = None
        if run_of is not None and run_of.context_dir == a.context_dir and f in run_of.fingerprints:
            line = writer_line(run_of.fingerprints[f][1], run_of.traces, plan, f)
        out.append((f"{a.context_dir.rstrip('/')}/{f}", line))
    return a, out


def _stats(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(d, name))
            out[os.path.join(d, name)] = (st.st_size, st.st_mtime_ns)
    return out


def read_context(root: Path, forms: list[tuple[bytes, str]], unchanged: dict[str, tuple[int, int]] | None = None
                 ) -> tuple[list[str], list[tuple[str, str]]]:
    """Every path under ``root`` (directories with a trailing "/"), and (file, what) for each regular
    file holding one of ``forms``; a file still as ``unchanged`` records it (the bundle from git) is not
    read. Links are listed, never followed."""
    unchanged = unchanged or {}
    paths: list[str] = []
    leaks: list[tuple[str, str]] = []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        prefix = "" if rel == "." else rel + "/"
        paths += [f"{prefix}{x}/" for x in dirs]
        for name in files:
            paths.append(prefix + name)
            full = os.path.join(d, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            st = os.stat(full)
            if unchanged.get(full) == (st.st_size, st.st_mtime_ns):
                continue
            try:
                with open(full, "rb") as fh:
                    what = find_placeholder(fh.read(), forms)
            except OSError:
                continue
            if what is not None:
                leaks.append((prefix + name, what))
    return sorted(paths), leaks


def script_b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


__all__ = ["KANIKO_EXECUTOR", "Mode", "Rehearsal", "RehearsalResult", "TIMEOUT_S", "TaskImageError", "TaskImages",
           "choose_isolation", "isolation_unavailable", "required_refusal", "rehearse_targets", "run", "script_b64"]


def required_refusal(reason: str, fix: str = "give the worker what it lacks (deploy/README.md)") -> str:
    return (f"rehearsal is required (config policy.rehearsal = \"required\") and could not run, so nothing was "
            f"submitted: {reason}. Next: {fix}, or set policy.rehearsal = \"best_effort\" to plan without one")


def rehearse_targets(contract: BuildContract, targets: list[TargetSpec], *, bundle_path: Path, bundle_sha256: str,
                     script_text: str, harbor_commit: str, cluster_env: dict[str, dict[str, str]],
                     images: TaskImages, mode: Mode = "required", timeout_s: float = TIMEOUT_S,
                     accept_unrehearsed: bool = False, isolation: Isolation = "auto",
                     emulators: dict[str, str] | None = None) -> str | None:
    """Rehearse every target (setting ``target.rehearsal``); the refusal message when one failed, else None.

    Where the host cannot isolate or the task image cannot be laid out, ``mode`` decides: ``required``
    refuses the plan naming the setting and the cause, ``best_effort`` marks the target "rehearsal
    skipped: <reason>". A transient registry error (5xx, 429, network) raises TaskImageError for the
    caller's bounded retry. A step the rehearsal could not run leaves the rest "unrehearsed from file:line";
    under ``required`` that refuses the plan unless ``accept_unrehearsed`` (the CLI's --accept-unrehearsed),
    which each such target's result records. A target of another architecture than the worker's runs in
    that architecture's variant of the task image through its emulator (``emulators``, the config's
    policy.rehearsal_emulators; rehearsal/emulation.py), else in the worker's own variant, where a step
    that concerns the target's architecture is unrehearsed, with the reason."""
    backend, reason = choose_isolation(isolation)
    if backend is None:
        reason = reason or "no isolation"
        if mode == "required":
            return required_refusal(reason)
        for t in targets:
            t.rehearsal = RehearsalResult(status="skipped", reason=reason)
        return None
    b64 = script_b64(script_text)
    roots: dict[tuple[str, str, str | None], TaskImageRoot] = {}
    host = host_platform()
    proot_probe: list[str | None] = []

    def proot_unavailable() -> str | None:  # probed once per planning, and only for an emulated target
        if not proot_probe:
            proot_probe.append(proot.unavailable())
        return proot_probe[0]

    for t in targets:
        image = t.job.task_image
        plat = f"linux/{t.architecture}"
        run_backend, qemu, why_not = backend, None, None
        if plat != host:
            run_backend, qemu, why_not = emulation.choose(t.architecture, backend, isolation, emulators,
                                                          proot_unavailable)
        key = (image or "", plat, qemu)
        try:
            if not image:
                raise TaskImageError("the plan names no task image")
            if key not in roots:
                roots[key] = images.root(image, plat, emulator=qemu, why_not=why_not)
        except TaskImageError as e:
            if e.transient:
                raise
            why = f"{e} (task_image from {t.provenance.get('task_image', '?')})"
            if mode == "required":
                return required_refusal(why, "make the task image pullable from this worker (or configure "
                                             "policy.rehearsal_registry_mirrors)")
            t.rehearsal = RehearsalResult(status="skipped", reason=why)
            continue
        plan = rehearsal_plan(t, bundle_sha256=bundle_sha256, script_b64=b64 if t.job.script_env_var else None,
                              cluster_env=cluster_env.get(t.cluster, {}))
        plan.script_text = script_text
        emulate = qemu if roots[key].platform == plat else None
        if emulate is None:
            run_backend = backend
        # an emulated run takes several times the CPU: its bound against a hang grows with it
        run_timeout = timeout_s * emulation.SLOWDOWN if emulate else timeout_s
        native = None
        if emulate:  # the run with the other placeholders first goes to the worker's own variant (_run_twice)
            own = (image, host, None)
            if own not in roots:
                with contextlib.suppress(TaskImageError):  # none (or not now): that run is emulated too
                    roots[own] = images.root(image, host)
            if own in roots and roots[own].platform == host:
                native = (roots[own], backend, timeout_s)
        r, credential_files = _run_twice(plan, bundle_path, roots[key], run_timeout, run_backend, emulate, native)
        df = contract.dockerfiles.get(t.dockerfile)
        t.rehearsal = evaluate(
            plan, t, exit_code=r.exit_code, stderr=r.stderr, calls=r.calls, exits=r.exits,
            unrehearsable=r.unrehearsable, seconds=round(r.seconds, 3), timed_out=r.timed_out, timeout_s=run_timeout,
            expected_args=expected_build_args(t, harbor_commit=harbor_commit, build_commit=contract.commit,
                                              wheel_source_var=contract.script.wheel_source_var,
                                              megatron=variant_env(contract, t.variant)),
            dockerfile_defaults=dict(df.global_args) if df else {}, dockerfiles=contract.dockerfiles,
            context=r.context, leaks=r.leaks, script_text=script_text, background=r.background,
            credential_files=credential_files, foreign_userland=roots[key].note, dockerignore_text=r.dockerignore)
        t.rehearsal.root = f"{roots[key].describe()} under {run_backend}" + (
            f" -q {os.path.basename(emulate)} (the {t.architecture} userland, emulated)" if emulate else "") + (
            f"; the run with other placeholders ({r.compared_with}) left the same context" if r.compared_with else "")
    failed = refusal(targets)
    if failed:
        return failed
    unrun = [t for t in targets if t.rehearsal is not None and t.rehearsal.unrehearsed_from]
    for t in unrun:
        t.rehearsal.unrehearsed_accepted = accept_unrehearsed
    if unrun and mode == "required" and not accept_unrehearsed:
        return required_refusal(
            "part of the planned job could not be rehearsed: " + "; ".join(
                f"{t.key}: unrehearsed from {t.rehearsal.unrehearsed_from} ({t.rehearsal.reason})" for t in unrun),
            "make that step rehearsable (a program python3 runs needs the image's own python3 and packages), "
            "or pass --accept-unrehearsed to plan with it unrehearsed (the report records it)")
    return None
