"""The rehearsal's second isolation: proot under Landlock and seccomp, for a pod bwrap cannot run in.

Why: Pod Security "baseline" and "restricted" keep the runtime's default seccomp and AppArmor profiles,
which refuse the namespaces bwrap creates. proot (Debian package ``proot``) builds the same root by
ptrace path translation, which those profiles allow; rehearsal/confine.py adds what path translation
alone does not give: the kernel refuses every write outside the run's temporary directory, every network
socket, and every signal to a process outside (Landlock, seccomp). Same layout as bwrap's root
(runner.py): the task image read-only (Landlock grants it no write), per-run writable copies, the
bundle at ``/app``, the stand-ins at ``/.rehearsal``. Differences, said where they matter: no ``/proc``
(there is no PID namespace, and the pod's own ``/proc`` would let the script read the environment and
descriptors of the worker and its git helpers: same UID, and Landlock does not guard those reads), so
the kaniko stand-in cannot read its parents: the runner judges whether the script waited for it from the
statement trace, as under bwrap (runner._not_waited: ``$!``, ``wait``, the bash processes above the call), and a
good script rehearses fully under ``policy.rehearsal = "required"``; and ``/dev`` holds only null, zero,
full, random and urandom.

Debian's proot 5.1 extracts its loader to a fixed ``/tmp`` and builds "glue" directories there for bind
targets missing from the root; the run's root is therefore a skeleton with every target present, and the
loader is the ELF proot carries inside itself, written into the run's directory (``PROOT_LOADER``).
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

CONFINE = Path(__file__).with_name("confine.py")
DEVICES = ("null", "zero", "full", "random", "urandom")
# Host paths proot itself runs from (its binary and libraries, the dynamic loader's cache). The script
# never sees them: proot shows it the task image as "/"; Landlock lets them be read, never written.
HOST_READ = ("/usr/lib", "/lib", "/lib64", "/usr/lib64", "/etc/ld.so.cache")


def proot_path() -> str | None:
    return shutil.which("proot")


def _elf_machine(b: bytes, off: int) -> tuple[int, int, int] | None:
    """(class, machine, size) of the ELF at ``off`` (size from its section headers), None if not one."""
    h = b[off:off + 64]
    if len(h) < 64 or h[:4] != b"\x7fELF" or h[5] != 1:
        return None
    if h[4] == 2:
        (machine,) = struct.unpack_from("<H", h, 18)
        (shoff,) = struct.unpack_from("<Q", h, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", h, 0x3A)
    elif h[4] == 1:
        (machine,) = struct.unpack_from("<H", h, 18)
        (shoff,) = struct.unpack_from("<I", h, 0x20)
        shentsize, shnum = struct.unpack_from("<HH", h, 0x2E)
    else:
        return None
    return h[4], machine, shoff + shentsize * shnum


def loader_bytes(exe: str) -> bytes:
    """proot's own loader: the embedded ELF of proot's class and machine (its 32-bit one is left out)."""
    b = Path(exe).read_bytes()
    own = _elf_machine(b, 0)
    if own is None:
        raise OSError(f"{exe} is not an ELF file")
    off = b.find(b"\x7fELF", 1)
    while off > 0:
        e = _elf_machine(b, off)
        if e is not None and e[:2] == own[:2] and 0 < e[2] <= len(b) - off:
            return b[off:off + e[2]]
        off = b.find(b"\x7fELF", off + 1)
    raise OSError(f"no embedded loader found in {exe}")


@functools.lru_cache(maxsize=4)
def _loader(exe: str) -> bytes:
    return loader_bytes(exe)


@functools.lru_cache(maxsize=64)
def _listing(directory: str) -> tuple[tuple[str, str, str], ...]:
    """(name, "link"/"dir"/"file", link target) of each entry, sorted: read once per directory of a task image
    root, which never changes once unpacked (rehearsal/task_image.py: one root per manifest digest)."""
    out = []
    for entry in sorted(os.listdir(directory)):
        full = os.path.join(directory, entry)
        if os.path.islink(full):
            out.append((entry, "link", os.readlink(full)))
        else:
            out.append((entry, "dir" if os.path.isdir(full) else "file", ""))
    return tuple(out)


def _host_read() -> list[str]:
    return [p for p in HOST_READ if os.path.exists(p)]


@functools.cache
def _pyseccomp_dir() -> list[str]:
    spec = importlib.util.find_spec("pyseccomp")
    return ["--path", os.path.dirname(spec.origin)] if spec is not None and spec.origin else []


_CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
_NEXT_CPU = itertools.count()


def next_cpu() -> int | None:
    """The CPU the next proot run is kept on (confine.py --cpu: tracer and tracees on one CPU), in turn over
    the CPUs this worker may use, so the two runs of a target started together go to two CPUs."""
    return _CPUS[next(_NEXT_CPU) % len(_CPUS)] if _CPUS else None


def _confine_argv(read: list[str], write: list[str], cpu: int | None = None) -> list[str]:
    argv = [sys.executable, "-I", "-S", str(CONFINE), *_pyseccomp_dir(), *([] if cpu is None else ["--cpu", str(cpu)])]
    for p in read:
        argv += ["--read", p]
    for p in write:
        argv += ["--write", p]
    for d in DEVICES:
        if os.path.exists(f"/dev/{d}"):
            argv += ["--dev", f"/dev/{d}"]
    return argv + ["--"]


def unavailable() -> str | None:
    """None when proot runs confined here, else why not. The probe confines, traces and runs ``true``."""
    exe = proot_path()
    if exe is None:
        return "proot is not installed on this worker (Debian package proot)"
    true = shutil.which("true") or "/bin/true"
    with tempfile.TemporaryDirectory(prefix="gpu-rl-rehearsal-probe-") as tmp:
        try:
            (Path(tmp) / "loader").write_bytes(loader_bytes(exe))
        except OSError as e:
            return f"proot's loader: {e}"
        (Path(tmp) / "loader").chmod(0o755)
        env = {"PATH": "/usr/bin:/bin", "PROOT_LOADER": f"{tmp}/loader"}
        argv = [*_confine_argv(["/"], [tmp]), exe, "-r", "/", "-w", "/", true]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=20, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"proot could not start: {e}"
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        return f"proot under Landlock and seccomp cannot run here: {err}"
    return None


def command(top: Path, image: Path, own: set[str], argv: list[str], *, qemu: str | None = None
            ) -> tuple[list[str], dict[str, str]]:
    """(argv, extra env) running ``argv`` in the run's root under ``top`` (laid out by runner._layout:
    ``top/rw`` holds the per-run writable copies); ``own`` are the image's top-level names the rehearsal
    provides itself; ``qemu``: the image is another architecture's, every program runs through this
    user-mode emulator (``proot -q``, rehearsal/emulation.py), which Landlock lets be read and run."""
    exe = proot_path()
    if exe is None:
        raise RuntimeError("proot is not installed")
    skel = top / "root"
    skel.mkdir()
    (top / "loader").write_bytes(_loader(exe))
    (top / "loader").chmod(0o755)
    binds: list[tuple[str, str]] = []
    usr_local, usr_bin = top / "rw" / "usr-local", top / "usr-bin"

    def mirror(src_dir: Path, into: Path, guest: str, skip: set[str]) -> None:
        for entry, kind, target in _listing(str(src_dir)):
            src = src_dir / entry
            if entry in skip:
                continue
            if kind == "link":
                os.symlink(target, into / entry)
            elif guest == "" and entry == "usr" and kind == "dir":
                # /usr as a skeleton of its entries' bindings: /usr/local is the per-run copy, and /usr/bin a
                # per-run directory holding each image entry bound (as runner._usr_bin_args does for bwrap), so
                # a stood-in install can put its stand-in at /usr/bin/<tool>.
                os.mkdir(into / entry)
                mirror(src, into / entry, "/usr", {"local", "bin"} if usr_local.is_dir() else {"bin"})
                if usr_local.is_dir():
                    os.mkdir(into / entry / "local")
                    binds.append((str(usr_local), "/usr/local"))
                bin_kind = next((k for e, k, _ in _listing(str(src)) if e == "bin"), None)
                if bin_kind == "dir":
                    os.mkdir(into / entry / "bin")
                    os.mkdir(usr_bin)
                    binds.append((str(usr_bin), "/usr/bin"))
                    for name, k, t in _listing(str(src / "bin")):
                        if k == "link":
                            os.symlink(t, usr_bin / name)
                        else:
                            os.close(os.open(usr_bin / name, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
                            binds.append((f"{src}/bin/{name}", f"/usr/bin/{name}"))
                elif bin_kind == "link":
                    os.symlink(next(t for e, _, t in _listing(str(src)) if e == "bin"), into / entry / "bin")
            elif kind == "dir":
                os.mkdir(into / entry)
                rw = top / "rw" / entry
                binds.append((str(rw if guest == "" and rw.is_dir() else src), f"{guest}/{entry}"))
            else:
                os.close(os.open(into / entry, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
                binds.append((str(src), f"{guest}/{entry}"))

    mirror(image, skel, "", set(own))
    for d in ("proc", "dev", "sys", "tmp", "app", "kaniko", ".rehearsal"):
        (skel / d).mkdir(exist_ok=True)
    (top / "tmp").mkdir(exist_ok=True)
    for d in DEVICES:
        if os.path.exists(f"/dev/{d}"):
            (skel / "dev" / d).touch()
            binds.append((f"/dev/{d}", f"/dev/{d}"))
    binds += [(str(top / "tmp"), "/tmp"), (str(top / "rehearsal"), "/.rehearsal"), (str(top / "app"), "/app"),
              (str(top / "kaniko"), "/kaniko")]
    # Landlock: the image and the stand-ins read-only; the per-run copies, /usr/bin's directory, /tmp, /app,
    # /kaniko and the stand-ins' record directories writable; nothing else of the worker.
    r = top / "rehearsal"
    write = [str(skel), str(top / "rw"), str(top / "tmp"), str(top / "app"), str(top / "kaniko"),
             str(r / "records"), str(r / "exits"), str(r / "trace"), str(r / "installed")]
    if usr_bin.is_dir():
        write.append(str(usr_bin))
    read = [str(image), str(top), exe, *_host_read(), *([qemu] if qemu else [])]
    out = [*_confine_argv(read, write, next_cpu()), exe, "-0", *(["-q", qemu] if qemu else []), "-r", str(skel)]
    for src, dst in binds:
        out += ["-b", f"{src}:{dst}"]
    if argv and argv[0].startswith("-"):
        raise ValueError(f"the planned command starts with an option: {argv[0]!r}")
    return out + ["-w", "/app", *argv], {"PROOT_LOADER": str(top / "loader")}
