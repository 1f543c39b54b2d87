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
"""

from __future__ import annotations

import os
import shutil

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
