"""Running another architecture's task image in the rehearsal: qemu user mode driven by proot, no privileges.

Why: an arm64 target's build script runs on an aarch64 host; its arch-specific steps (``uname -m``,
``dpkg --print-architecture``, ``/usr/lib/aarch64-linux-gnu`` checks) are proven only in the arm64
userland. The kernel runs a foreign ELF only through a binfmt_misc handler, and registering one needs
privileges a worker pod does not have. proot's ``-q`` runs every foreign program it execs through a
user-mode emulator instead (Debian's ``qemu-user-static``: ``qemu-aarch64-static`` is a static x86_64
program, so it needs nothing from the image), which is why an emulated target always runs under proot
(rehearsal/proot.py), confined by Landlock and seccomp (rehearsal/confine.py) as any proot run is:

- seccomp still holds: qemu translates the guest's aarch64 syscalls into the host's own x86_64 ones,
  which are what the filter (and proot) see; a guest ``socket(AF_INET)`` is a host ``socket(AF_INET)``
  and fails with EACCES, a guest ``statx`` is a host ``statx`` and gets ENOSYS (glibc falls back to
  ``newfstatat``, which proot translates). tests/rehearsal/test_arm64_emulation.py refuses the TCP connect
  of an emulated script; the statx fallback is exercised by every emulated run (its `test -d`, `ls`, `tar`).
- Landlock lists the emulator as read-only (it is exec'd from the worker's /usr/bin).
- bwrap cannot do it: inside its namespaces a foreign program still needs binfmt_misc, and proot inside
  bwrap would need the worker's proot and its libraries bound into the task image's root. So with
  ``policy.rehearsal_isolation = "auto"`` an emulated target runs under proot even where bwrap runs
  (the others keep bwrap); with ``"bwrap"`` it is rehearsed in the worker's own architecture's variant
  and an arch-specific step is "unrehearsed", saying why.

Where no emulator is found (``policy.rehearsal_emulators``: architecture -> program or path), the same
fallback applies: the worker's own variant, and the arch-specific step unrehearsed, not refused.

What is emulated is the task image's userland, the script's own programs; not the rehearsal's stand-ins
(rehearsal/standins/standin), which are this service's machinery, not the image's, and answer the same on any
architecture. qemu user mode starts afresh at every exec (no translation is kept between processes): about
50-90 ms of CPU for each small program against 1-2 ms natively, and the stand-ins were 22 of the 58 programs
an era-C run executed (8 emulated bash starts, each parsing the stand-in, and the cat/cp/ln/tar/sha256sum/
sleep they ran). So they run natively (``host_tools``): proot -q runs a program of the worker's own
architecture without qemu ("mixed mode", proot(1) -q), so the stand-in's interpreter is the worker's static
bash (Debian bash-static) and its helpers are the worker's static busybox (busybox-static), copied into
the run's ``/.rehearsal/host``, under the same proot, Landlock and seccomp. Static, so nothing of the
worker's ``/usr/lib`` is loaded. Not for the stand-ins that may run the image's own program (``uname`` for
flags other than -m/-p/-i, ``python3``, ``git``: GUEST_STANDINS): proot hands a native program an
LD_LIBRARY_PATH of the worker's library directories and, when the script had none, passes it on to the
guest programs it runs, so those keep the image's bash. Where either static program is missing, every
stand-in runs in the image's bash, as before.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
from pathlib import Path

# The emulator of each architecture a worker may not run natively: Debian's qemu-user-static programs.
DEFAULT_EMULATORS = {"arm64": "qemu-aarch64-static", "amd64": "qemu-x86_64-static"}
CONFIG_KEY = "policy.rehearsal_emulators"
# An emulated run's bound against a hang is this many times the native one (runner.TIMEOUT_S): qemu 7.2 user
# mode spends 5-6x the CPU of a native proot run on the real era-C script (docs/benchmarks.md).
SLOWDOWN = 5


def emulator(architecture: str, configured: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """(the emulator's absolute path, None) for ``architecture``, or (None, why there is none)."""
    table = DEFAULT_EMULATORS if configured is None else {**DEFAULT_EMULATORS, **configured}
    name = table.get(architecture, "")
    if not name:
        return None, f"no emulator configured for {architecture} ({CONFIG_KEY})"
    path = name if os.path.isabs(name) else shutil.which(name)
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        where = f"{CONFIG_KEY}.{architecture} = {name!r}"
        return None, (f"the {architecture} emulator {name} is not installed on this worker ({where}; Debian "
                      "package qemu-user-static)")
    return path, None


def choose(architecture: str, backend: str, isolation: str, configured: dict[str, str] | None,
           proot_unavailable) -> tuple[str, str | None, str | None]:
    """(the isolation this target runs under, its emulator or None, why none) for a target the worker does
    not run natively; ``proot_unavailable()`` is rehearsal.proot.unavailable (called only when needed)."""
    path, why = emulator(architecture, configured)
    if path is None:
        return backend, None, why
    if backend == "proot":
        return backend, path, None
    if isolation != "auto":
        return backend, None, (f"policy.rehearsal_isolation = \"{isolation}\": {isolation} cannot run "
                               f"{architecture} programs without a binfmt_misc handler, which needs privileges; "
                               "\"auto\" or \"proot\" runs them through proot -q " + os.path.basename(path))
    why_proot = proot_unavailable()
    if why_proot is not None:
        return backend, None, f"emulating {architecture} needs proot: {why_proot}"
    return "proot", path, None


# The stand-ins' interpreter and helpers inside the root of an emulated run, and where they come from.
HOST_DIR = "/.rehearsal/host"
HOST_PROGRAMS = {"bash": "bash-static", "busybox": "busybox"}  # Debian bash-static, busybox-static
# What the stand-in runs with busybox then (every program it runs itself: rehearsal/standins/standin).
BUSYBOX_APPLETS = ("cat", "cp", "ln", "mkdir", "rm", "sha256sum", "sleep", "tar")
# Stand-ins that may exec the image's own program: they stay on the image's bash (see above).
GUEST_STANDINS = frozenset({"uname", "python3", "python", "git"})
_EM = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}  # ELF e_machine of the worker's architecture
_PT_INTERP = 3


def static_host_elf(path: str) -> bool:
    """Whether ``path`` is a statically linked ELF of the worker's own architecture (no PT_INTERP): one proot -q
    runs natively and that needs nothing of the worker's libraries."""
    try:
        with open(path, "rb") as f:
            h = f.read(64)
            if len(h) < 64 or h[:4] != b"\x7fELF" or h[4] != 2 or h[5] != 1:
                return False
            (machine,) = struct.unpack_from("<H", h, 18)
            (phoff,) = struct.unpack_from("<Q", h, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", h, 0x36)
            if machine != _EM.get(os.uname().machine.lower()) or phentsize < 4 or phnum > 512:
                return False
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    return len(table) == phentsize * phnum and all(
        struct.unpack_from("<I", table, i * phentsize)[0] != _PT_INTERP for i in range(phnum))


@functools.cache
def host_tools() -> dict[str, str] | None:
    """{"bash": path, "busybox": path} of the worker's static programs the stand-ins run on natively in an
    emulated run; None (every stand-in in the image's bash) when either is missing or not static."""
    out = {}
    for name, program in HOST_PROGRAMS.items():
        path = shutil.which(program)
        if path is None or not static_host_elf(path):
            return None
        out[name] = path
    return out


def lay_out_host_tools(directory: Path) -> None:
    """Copy the static programs into the run's ``/.rehearsal/host`` (readable and executable there under
    Landlock, as the rest of the run's directory)."""
    tools = host_tools()
    if tools is None:
        raise RuntimeError("the static host programs are missing")
    directory.mkdir()
    for name, path in tools.items():
        shutil.copyfile(path, directory / name)
        (directory / name).chmod(0o755)
