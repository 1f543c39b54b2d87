"""The sandbox's stand-in task image: a small userland made of this host's own files, in a local registry.

Why: the rehearsal runs each planned command in the planned task image's userland
(docker.io/library/ubuntu:22.04), and the sandbox and tests reach no public registry. So the stack
pushes this image to its open local registry as ``library/ubuntu:22.04`` and names that registry the
rehearsal's ``docker.io`` mirror (``policy.rehearsal_registry_mirrors``). Like the real image it has
bash, sh, coreutils, sed, grep, awk, tar, gzip, find, cmp/diff, which and apt-get/apt (present, as in
ubuntu, never run: the rehearsal stands in for apt), with their shared libraries, and deliberately
NOT jq, python3, curl, wget or git: the real ubuntu:22.04 lacks them until the build script installs
them, and the rehearsal must notice a script that uses one first.

Like the real image it is multi-platform: the linux/<host arch> variant from this host's files, and the
other architecture's (linux/arm64 on an amd64 host) from Debian's own packages of that architecture, so an
arm64 target rehearses in an arm64 userland through qemu user mode (rehearsal/emulation.py). Those
packages are fetched with apt (``apt-get install --download-only`` for the foreign architecture, with a
private apt state: no ``dpkg --add-architecture``, no root, nothing of the host's apt changed) into
``$XDG_CACHE_HOME/gpu-rl-builder/task-image-<arch>/`` (scripts/bootstrap fills it once; a machine without
it fetches it on first use). The same files are taken as from the host: the packages' programs, apt-get/apt,
and their architecture's shared libraries. Where the packages cannot be fetched (offline, not Debian) the
image has the host variant only (``FOREIGN_UNAVAILABLE`` says why; ``GPU_RL_SANDBOX_FOREIGN_IMAGE=0`` leaves it
out on purpose), and an arm64 target rehearses in the host variant, its arch-specific steps unrehearsed.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import httpx

from rehearsal.task_image import TaskImages, host_platform

REPOSITORY = "library/ubuntu"
TAG = "22.04"
MIRRORED = "docker.io"  # the registry the sandbox's local one stands in for
PACKAGES = ("bash", "dash", "coreutils", "sed", "grep", "tar", "gzip", "findutils", "diffutils", "debianutils",
            "mawk", "dpkg")
PRESENT_NOT_RUN = ("/usr/bin/apt-get", "/usr/bin/apt")
ABSENT = ("jq", "python3", "python", "curl", "wget", "git", "crane", "pip", "pip3")
_MERGED = (("bin/", "usr/bin/"), ("sbin/", "usr/sbin/"), ("lib/", "usr/lib/"), ("lib64/", "usr/lib64/"))
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def _in_image(path: str) -> str:
    rel = path.lstrip("/")
    for old, new in _MERGED:
        if rel.startswith(old):
            return new + rel[len(old):]
    return rel


def host_files() -> dict[str, str]:
    """Image path -> host path: the packages' programs, apt-get/apt, and every shared library they load."""
    files: dict[str, str] = {}
    for pkg in PACKAGES:
        listed = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True, check=True).stdout.split()
        for p in listed:
            if "/bin/" in p and (os.path.isfile(p) or os.path.islink(p)):
                files[_in_image(p)] = p
    for p in PRESENT_NOT_RUN:
        files[_in_image(p)] = p
    for name in ABSENT:
        assert not any(k.endswith(f"bin/{name}") for k in files), f"the stand-in task image must not have {name}"
    elfs = sorted({os.path.realpath(p) for p in files.values()})
    out = subprocess.run(["ldd", *elfs], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        for p in parts:
            if p.startswith("/") and os.path.exists(p) and not p.endswith(":"):
                files[_in_image(p)] = p
    return files


# A file of the image: (bytes, mode) for a regular file, or a str for a symlink's target.
Entry = tuple[bytes, int] | str


def _host_entries() -> dict[str, Entry]:
    return {name: (Path(host).read_bytes(), os.stat(host).st_mode & 0o7777) for name, host in host_files().items()}


FOREIGN = {"amd64": "arm64", "arm64": "amd64"}  # the other architecture of a host (the one it emulates)
_LIB = re.compile(r"^usr/lib(64)?/([a-z0-9_]+-linux-gnu[a-z0-9_]*/)?(ld-linux[^/]*|[^/]*\.so(\.[0-9.]+)?)$")
FOREIGN_UNAVAILABLE: dict[str, str] = {}  # arch -> why its variant could not be built (set by foreign_debs)


def foreign_cache(arch: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "gpu-rl-builder" / f"task-image-{arch}"


def foreign_debs(arch: str) -> list[Path]:
    """The Debian packages of ``arch`` the variant is made of (fetched with apt once, then cached); [] with
    the reason in FOREIGN_UNAVAILABLE when they cannot be had here."""
    cache = foreign_cache(arch)
    done = cache / "debs.txt"
    if done.is_file():
        debs = [cache / "archives" / n for n in done.read_text().split()]
        if debs and all(d.is_file() for d in debs):
            return debs
    apt = shutil.which("apt-get")
    if apt is None or shutil.which("dpkg-deb") is None:
        FOREIGN_UNAVAILABLE[arch] = "apt-get and dpkg-deb are needed to fetch its Debian packages"
        return []
    for d in (cache / "state" / "lists" / "partial", cache / "archives" / "partial"):
        d.mkdir(parents=True, exist_ok=True)
    (cache / "status").touch()
    opts = [f"-oDir::State={cache / 'state'}", f"-oDir::State::status={cache / 'status'}",
            f"-oDir::Cache={cache}", f"-oDir::Cache::archives={cache / 'archives'}", f"-oAPT::Architecture={arch}",
            f"-oAPT::Architectures={arch}", "-oDebug::NoLocking=1", "-oAPT::Sandbox::User=root", "-qq"]
    try:
        for argv in ([apt, *opts, "update"], [apt, *opts, "install", "--download-only", "-y",
                                              "--no-install-recommends", *PACKAGES, "apt"]):
            p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                err = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
                FOREIGN_UNAVAILABLE[arch] = f"`apt-get {argv[-1] if argv[-1] == 'update' else 'install -d'}` " \
                                            f"for {arch} failed: {err}"
                return []
    except (OSError, subprocess.TimeoutExpired) as e:
        FOREIGN_UNAVAILABLE[arch] = f"apt-get for {arch}: {e}"
        return []
    debs = sorted((cache / "archives").glob("*.deb"))
    done.write_text("\n".join(d.name for d in debs) + "\n")
    return debs


def _deb_package(deb: Path) -> str:
    return deb.name.split("_", 1)[0]


def foreign_entries(arch: str) -> dict[str, Entry]:
    """The ``arch`` variant's files, chosen as host_files() chooses the host's: the packages' programs,
    apt-get/apt, and (in place of ldd, which cannot read another architecture's programs) every shared
    library the packages' dependency closure ships for that architecture."""
    out: dict[str, Entry] = {}
    for deb in foreign_debs(arch):
        pkg = _deb_package(deb)
        tar_bytes = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            for m in tar:
                name = _in_image("/" + os.path.normpath(m.name).lstrip("./"))
                program = pkg in PACKAGES and "/bin/" in "/" + name
                wanted = program or "/" + name in PRESENT_NOT_RUN or _LIB.match(name)
                if not wanted or not (m.isfile() or m.issym()):
                    continue
                if m.issym():
                    out[name] = m.linkname
                else:
                    f = tar.extractfile(m)
                    out[name] = (f.read() if f else b"", m.mode & 0o7777)
    for name in ABSENT:
        assert not any(k.endswith(f"bin/{name}") for k in out), f"the stand-in task image must not have {name}"
    return out


def _build(files: dict[str, Entry]) -> tuple[bytes, str]:
    """(gzip blob, diff_id) of a one-layer image of ``files``; reproducible (mtime 0, sorted)."""
    buf = io.BytesIO()
    dirs = {"etc", "root", "tmp", "var", "var/tmp", "home", "usr", "usr/local", "usr/local/bin", "usr/bin",
            "usr/sbin", "usr/lib", "usr/lib64", "opt", "run", "srv", "mnt", "media", "proc", "sys", "dev",
            "var/lib/dpkg"}
    for path in files:
        parent = os.path.dirname(path)
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)

    def entry(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = kind, mode, 0
        return info

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            tar.addfile(entry(d, tarfile.DIRTYPE, {"tmp": 0o1777, "var/tmp": 0o1777, "root": 0o700}.get(d, 0o755)))
        for name, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"),
                             ("usr/bin/awk", "mawk"), ("usr/bin/sh", "dash")):
            link = entry(name, tarfile.SYMTYPE, 0o777)
            link.linkname = target
            tar.addfile(link)
        etc = {"etc/passwd": b"root:x:0:0:root:/root:/bin/bash\n", "etc/group": b"root:x:0:\n",
               "etc/profile": b"# stand-in task image: like ubuntu's, it leaves PATH alone\n",
               "root/.profile": b"", "etc/os-release": b'NAME="gpu-rl-builder sandbox stand-in for ubuntu:22.04"\n',
               "var/lib/dpkg/status": b""}
        for name, data in sorted(etc.items()):
            info = entry(name, tarfile.REGTYPE, 0o644)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, content in sorted(files.items()):
            if name in ("usr/bin/awk", "usr/bin/sh") or name in dirs:
                continue
            if isinstance(content, str):
                link = entry(name, tarfile.SYMTYPE, 0o777)
                link.linkname = content
                tar.addfile(link)
                continue
            data, mode = content
            info = entry(name, tarfile.REGTYPE, mode)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return gzip.compress(raw, compresslevel=1, mtime=0), "sha256:" + hashlib.sha256(raw).hexdigest()


@functools.lru_cache(maxsize=2)
def build_layer(arch: str | None = None) -> tuple[bytes, str]:
    """(gzip blob, diff_id) of the ``arch`` variant's one layer (default: the host's); reproducible."""
    host = host_platform().split("/")[1]
    if arch in (None, host):
        return _build(_host_entries())
    files = foreign_entries(arch)
    if not files:
        raise LookupError(FOREIGN_UNAVAILABLE.get(arch, f"no {arch} packages"))
    return _build(files)


def platforms() -> list[str]:
    """The architectures the stand-in is pushed for: the host's, and the other one when its packages can be had."""
    host = host_platform().split("/")[1]
    out = [host]
    other = FOREIGN.get(host)
    if other and other not in FOREIGN_UNAVAILABLE and os.environ.get("GPU_RL_SANDBOX_FOREIGN_IMAGE", "1") != "0":
        try:
            build_layer(other)
            out.append(other)
        except LookupError:
            pass
    return out


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push_manifest(http: httpx.Client, base: str, repo: str, blob: bytes, config: bytes,
                  tag: str | None = None) -> bytes:
    """Push one single-layer OCI image (its layer, config and manifest) and return the manifest's bytes; the
    manifest goes to ``tag`` if given, else to its own digest (an index entry). Shared by the stand-in task
    image and the stand-in bases (sandbox/base_images.py)."""
    layer = _put_blob(http, base, repo, blob)
    cfg = _put_blob(http, base, repo, config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": OCI_CONFIG, "digest": cfg, "size": len(config)},
                           "layers": [{"mediaType": OCI_LAYER, "digest": layer, "size": len(blob)}]}).encode()
    http.put(f"{base}/v2/{repo}/manifests/{tag or _digest(manifest)}", content=manifest,
             headers={"Content-Type": OCI_MANIFEST}).raise_for_status()
    return manifest


def _put_blob(http: httpx.Client, base: str, repo: str, data: bytes) -> str:
    digest = _digest(data)
    if http.head(f"{base}/v2/{repo}/blobs/{digest}").status_code == 200:
        return digest
    start = http.post(f"{base}/v2/{repo}/blobs/uploads/")
    start.raise_for_status()
    location = httpx.URL(base).join(start.headers["location"])
    http.put(location.copy_merge_params({"digest": digest}), content=data,
             headers={"Content-Type": "application/octet-stream"}).raise_for_status()
    return digest


def push_task_image(registry_host: str, *, repository: str = REPOSITORY, tag: str = TAG, note: str = "") -> str:
    """Push the stand-in to ``http://registry_host`` (an open registry) as ``repository:tag``, one manifest per
    platform (platforms()); its index digest."""
    base = f"http://{registry_host}"
    entries = []
    with httpx.Client(timeout=60, trust_env=False) as http:
        for arch in platforms():
            blob, diff_id = build_layer(arch)
            source = "host files" if arch == host_platform().split("/")[1] else f"Debian {arch} packages"
            config = json.dumps({"architecture": arch, "os": "linux",
                                 "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                                 "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                                            "Cmd": ["/bin/bash"],
                                            "Labels": {"org.opencontainers.image.description":
                                                       f"gpu-rl-builder sandbox stand-in task image ({source}; no "
                                                       "jq, python3, curl, git)" + (f"; {note}" if note else "")}}},
                                sort_keys=True).encode()
            manifest = push_manifest(http, base, repository, blob, config)
            entries.append({"mediaType": OCI_MANIFEST, "digest": _digest(manifest), "size": len(manifest),
                            "platform": {"os": "linux", "architecture": arch}})
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        http.put(f"{base}/v2/{repository}/manifests/{tag}", content=index,
                 headers={"Content-Type": OCI_INDEX}).raise_for_status()
    return _digest(index)


def mirrors_for(registry_host: str) -> dict[str, str]:
    """The ``policy.rehearsal_registry_mirrors`` value that makes ``registry_host`` the task images' source."""
    return {MIRRORED: registry_host}


@contextlib.contextmanager
def local_task_images(state_dir: Path):
    """For benches: an open local registry holding the stand-in as the docker.io mirror, and TaskImages
    using it (cache under ``state_dir``); the registry stops on exit."""
    from sandbox.registry import start_registry

    with start_registry(Path(state_dir) / "registry", "open") as registry:
        push_task_image(registry.host)
        yield TaskImages(Path(state_dir) / "rehearsal-images", mirrors=mirrors_for(registry.host),
                         insecure_hosts=[registry.host])


if __name__ == "__main__":  # scripts/bootstrap: fetch the other architecture's packages once
    import sys

    arch = FOREIGN.get(host_platform().split("/")[1], "")
    if len(sys.argv) > 1 and sys.argv[1] == "fetch-foreign":
        if not arch or not foreign_debs(arch):
            print(f"sandbox task image: no {arch or 'foreign'} variant: {FOREIGN_UNAVAILABLE.get(arch, 'unknown host')}",
                  file=sys.stderr)
            sys.exit(1)
        print(f"sandbox task image: {len(foreign_debs(arch))} {arch} packages in {foreign_cache(arch)}")
