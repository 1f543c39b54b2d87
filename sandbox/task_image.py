"""The sandbox's stand-in task image: a small userland made of this host's own files, in a local registry.

Why: the rehearsal runs each planned command in the planned task image's userland
(docker.io/library/ubuntu:22.04), and the sandbox and tests reach no public registry. So the stack
pushes this image to its open local registry as ``library/ubuntu:22.04`` and names that registry the
rehearsal's ``docker.io`` mirror (``policy.rehearsal_registry_mirrors``). Like the real image it has
bash, sh, coreutils, sed, grep, awk, tar, gzip, find, cmp/diff, which and apt-get/apt (present, as in
ubuntu, never run: the rehearsal stands in for apt), with their shared libraries, and deliberately
NOT jq, python3, curl, wget or git: the real ubuntu:22.04 lacks them until the build script installs
them, and the rehearsal must notice a script that uses one first. One linux/<host arch> image (an
arm64 target on an amd64 worker rehearses in the host variant, as rehearsal/task_image.py says).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import httpx

from rehearsal.task_image import TaskImages, host_platform

REPOSITORY = "library/ubuntu"
TAG = "22.04"
MIRRORED = "docker.io"  # the registry the sandbox's local one stands in for
PACKAGES = ("bash", "dash", "coreutils", "sed", "grep", "tar", "gzip", "findutils", "diffutils", "debianutils",
            "mawk")
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


@functools.lru_cache(maxsize=1)
def build_layer() -> tuple[bytes, str]:
    """(gzip blob, diff_id) of the image's one layer; reproducible (mtime 0, sorted)."""
    buf = io.BytesIO()
    dirs = {"etc", "root", "tmp", "var", "var/tmp", "home", "usr", "usr/local", "usr/local/bin", "usr/bin",
            "usr/sbin", "usr/lib", "usr/lib64", "opt", "run", "srv", "mnt", "media", "proc", "sys", "dev"}
    files = host_files()
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
               "root/.profile": b"", "etc/os-release": b'NAME="gpu-rl-builder sandbox stand-in for ubuntu:22.04"\n'}
        for name, data in sorted(etc.items()):
            info = entry(name, tarfile.REGTYPE, 0o644)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, host in sorted(files.items()):
            if name in ("usr/bin/awk", "usr/bin/sh"):
                continue
            data = Path(host).read_bytes()
            info = entry(name, tarfile.REGTYPE, os.stat(host).st_mode & 0o7777)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return gzip.compress(raw, compresslevel=1, mtime=0), "sha256:" + hashlib.sha256(raw).hexdigest()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


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
    """Push the stand-in to ``http://registry_host`` (an open registry) as ``repository:tag``; its index digest."""
    blob, diff_id = build_layer()
    plat = host_platform()
    os_, arch = plat.split("/")
    config = json.dumps({"architecture": arch, "os": os_, "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                         "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                                    "Cmd": ["/bin/bash"],
                                    "Labels": {"org.opencontainers.image.description":
                                               "gpu-rl-builder sandbox stand-in task image (host files; no jq, "
                                               "python3, curl, git)" + (f"; {note}" if note else "")}}},
                        sort_keys=True).encode()
    base = f"http://{registry_host}"
    with httpx.Client(timeout=60, trust_env=False) as http:
        layer = _put_blob(http, base, repository, blob)
        cfg = _put_blob(http, base, repository, config)
        manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                               "config": {"mediaType": OCI_CONFIG, "digest": cfg, "size": len(config)},
                               "layers": [{"mediaType": OCI_LAYER, "digest": layer, "size": len(blob)}]}).encode()
        http.put(f"{base}/v2/{repository}/manifests/{_digest(manifest)}", content=manifest,
                 headers={"Content-Type": OCI_MANIFEST}).raise_for_status()
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": _digest(manifest), "size": len(manifest),
             "platform": {"os": os_, "architecture": arch}}]}).encode()
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
