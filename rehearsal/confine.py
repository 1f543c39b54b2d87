"""Confine a command without namespaces, then exec it: what the rehearsal runs under proot where bwrap cannot.

Why: a pod admitted by Pod Security "baseline" or "restricted" keeps the runtime's default seccomp and
AppArmor profiles, which refuse the user/mount namespaces bwrap needs. Three unprivileged kernel
mechanisms those profiles allow take their place, each doing what proot alone cannot:

- **Landlock** (Linux >= 6.12, ABI 6): writes only under the rehearsal's own temporary directory, reads
  only under it, the task image root and the few host files proot itself runs from; no TCP bind or
  connect (ABI 4); no signal to, and no abstract unix socket of, any process outside (ABI 6), so the
  script cannot kill or talk to the worker. Enforced by the kernel whatever the traced program does.
- **seccomp** (pyseccomp, a ctypes binding to the system's libseccomp): ``socket()`` of any family but
  AF_UNIX fails with EACCES (no UDP, no raw sockets, no netlink), ``io_uring_setup`` fails (it would do
  file I/O past ptrace); syscalls of another ABI (i386 on amd64) fail with ENOSYS.
- **proot** (Debian package ``proot``, run by the caller after this exec): ptrace path translation shows
  the task image as ``/``, so nothing of the worker's own ``/usr``, ``/etc`` or ``/proc`` is visible.

The PyPI ``landlock`` package covers filesystem rules only (no network or scope fields), so the three
Landlock syscalls are called here through ctypes with the structures the kernel documents
(include/uapi/linux/landlock.h). Run as a script (``python -I confine.py …``) so it needs nothing from
the service on ``sys.path``; exits 125 naming what the kernel refused. It starts once per rehearsal run,
so its start is kept short: ``python -I -S`` (no site: the venv's .pth import hooks cost about 50 ms) with
``--path`` naming the directory pyseccomp is in, and the two shared libraries pyseccomp looks up with
``ctypes.util.find_library`` (which runs ``ldconfig -p`` in a subprocess, about 0.2 s, for each) are
found by their sonames first.

``--cpu N`` runs the command on that one CPU (``sched_setaffinity``, which needs no privilege): proot
stops every system call of every traced process and waits for it in wait4, so a rehearsal is thousands
of hand-offs between the tracer and a tracee, each a wake-up on another CPU when the two may run
anywhere; on one CPU each hand-off is a plain switch (the real era-C run under proot at load 20-30: 1.1-3.3
s pinned against 4.5-9 s not, with the same CPU time). Not a confinement: a CPU the kernel refuses is
left unset.

    confine.py [--path DIR] [--cpu N] --read DIR … --write DIR … --dev FILE … -- PROGRAM ARG…
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import sys

LANDLOCK_ABI_NEEDED = 6  # signal and abstract-socket scoping (Linux 6.12); TCP rules came with ABI 4
_SYS = {"create": 444, "add_rule": 445, "restrict": 446}  # the same numbers on every architecture
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
# Filesystem rights (landlock.h LANDLOCK_ACCESS_FS_*), by the ABI that introduced them.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1, 2, 4, 8
_DIR_WRITES = sum(1 << b for b in range(4, 13))  # REMOVE_DIR … MAKE_SYM
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_ALL = 1 | 2  # BIND_TCP, CONNECT_TCP
_SCOPE_ALL = 1 | 2  # ABSTRACT_UNIX_SOCKET, SIGNAL
EXIT_CONFINE = 125


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class ConfineError(Exception):
    pass


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _call(name: str, *args: object) -> int:
    r = _libc.syscall(_SYS[name], *args)
    if r < 0:
        e = ctypes.get_errno()
        raise ConfineError(f"landlock {name}: {os.strerror(e)} (errno {errno.errorcode.get(e, e)})")
    return r


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (not built in or not enabled at boot)."""
    r = _libc.syscall(_SYS["create"], None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(r), 0)


def _fs_rights(abi: int) -> tuple[int, int]:
    """(every right this ABI handles, the read-only subset)."""
    every = _EXECUTE | _WRITE_FILE | _READ_FILE | _READ_DIR | _DIR_WRITES
    every |= (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0) | (_IOCTL_DEV if abi >= 5 else 0)
    return every, _EXECUTE | _READ_FILE | _READ_DIR


def apply_landlock(read: list[str], write: list[str], dev: list[str]) -> None:
    abi = landlock_abi()
    if abi < LANDLOCK_ABI_NEEDED:
        raise ConfineError(f"the kernel's Landlock ABI is {abi or 'absent'}, the rehearsal needs "
                           f"{LANDLOCK_ABI_NEEDED} (Linux >= 6.12 with landlock in its LSM list)")
    every, read_only = _fs_rights(abi)
    file_rights = _EXECUTE | _WRITE_FILE | _READ_FILE | (_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(every, _NET_ALL, _SCOPE_ALL)
    fd = _call("create", ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    try:
        for rights, paths in ((read_only, read), (every, write), (_READ_FILE | _WRITE_FILE, dev)):
            for path in paths:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    allowed = rights if os.path.isdir(path) else rights & file_rights
                    rule = _PathBeneath(allowed, pfd)
                    _call("add_rule", ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                          ctypes.c_uint32(0))
                finally:
                    os.close(pfd)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise ConfineError(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
        _call("restrict", ctypes.c_int(fd), ctypes.c_uint32(0))
    finally:
        os.close(fd)


_SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}  # glibc's and Debian libseccomp2's


def _import_pyseccomp():
    """pyseccomp, with its find_library("c"/"seccomp") answered by the soname when the loader knows it."""
    import ctypes.util

    slow = ctypes.util.find_library

    def find_library(name: str) -> str | None:
        soname = _SONAMES.get(name)
        if soname is not None:
            try:
                ctypes.CDLL(soname)
                return soname
            except OSError:
                pass
        return slow(name)

    ctypes.util.find_library = find_library
    try:
        import pyseccomp
    finally:
        ctypes.util.find_library = slow
    return pyseccomp


def apply_seccomp() -> None:
    seccomp = _import_pyseccomp()

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    # A syscall of another ABI (i386's socketcall, x32) fails with ENOSYS. Not "kill": proot cancels a
    # syscall by rewriting its number to -1, which the filter sees as a foreign ABI after the rewrite.
    f.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.ERRNO(errno.ENOSYS))
    f.add_rule(seccomp.ERRNO(errno.EACCES), "socket", seccomp.Arg(0, seccomp.NE, 1))  # 1 = AF_UNIX
    f.add_rule(seccomp.ERRNO(errno.EACCES), "io_uring_setup")
    # Path syscalls newer than Debian's proot 5.1 (2014) that it would pass through untranslated, to the
    # worker's own paths: ENOSYS makes glibc fall back to the ones proot translates (newfstatat, faccessat).
    for name in ("statx", "faccessat2", "openat2"):
        f.add_rule(seccomp.ERRNO(errno.ENOSYS), name)
    f.load()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--read", action="append", default=[])
    ap.add_argument("--write", action="append", default=[])
    ap.add_argument("--dev", action="append", default=[])
    ap.add_argument("--path", action="append", default=[], help="a directory to import pyseccomp from")
    ap.add_argument("--cpu", type=int, help="run the command on this CPU only (speed, not confinement)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command after --")
    sys.path.extend(a.path)
    try:
        apply_seccomp()  # first: Landlock would then refuse reading libseccomp
        apply_landlock(a.read, a.write, a.dev)
    except (ConfineError, OSError) as e:
        print(f"confine: {e}", file=sys.stderr)
        return EXIT_CONFINE
    if a.cpu is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {a.cpu})
    os.execvp(cmd[0], cmd)
    return EXIT_CONFINE  # not reached


if __name__ == "__main__":
    sys.exit(main())
