"""The sandbox's stand-in base images: small real multi-platform OCI images in its local registry.

Why: before submission the service asks each base image a build pulls (and each image its crane calls
read) in its registry, for the target's platform (rehearsal/images.py). The sandbox and the tests reach
no public registry, so the open local registry, named the mirror of docker.io and gcr.io
(``policy.rehearsal_registry_mirrors``), holds stand-ins under the real names the fixture and the real
MarinSkyRL trees use: ``nvidia/cuda:12.9.2-cudnn-devel-ubuntu22.04`` (their ``BASE_IMAGE``) and
``gcr.io/kaniko-project/executor:latest`` (what their scripts `crane export`). Each is an OCI index with a
linux/amd64 and a linux/arm64 entry, as the real ones are; each entry is a real image (config naming its
platform, one small layer saying what it stands in for).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import httpx

from sandbox.task_image import OCI_INDEX, OCI_MANIFEST, _digest, push_manifest

# (registry it stands in for, repository there, tag)
STANDIN_BASES = (
    ("docker.io", "nvidia/cuda", "12.9.2-cudnn-devel-ubuntu22.04"),
    ("gcr.io", "kaniko-project/executor", "latest"),
)
PLATFORMS = ("linux/amd64", "linux/arm64")


def _layer(text: str) -> tuple[bytes, str]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = text.encode()
        info = tarfile.TarInfo("etc/gpu-rl-builder-standin.txt")
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0), _digest(raw)


def push_image(registry_host: str, repository: str, tag: str, platforms: tuple[str, ...] = PLATFORMS,
               *, note: str = "", credentials: tuple[str, str] | None = None, index: bool = True) -> str:
    """Push a small image for ``platforms`` to ``http://registry_host`` as ``repository:tag`` (an OCI index,
    or with ``index=False`` and one platform a plain image manifest); the digest the tag points at.
    ``credentials``: Basic auth for an htpasswd registry (the tests' private registry)."""
    base = f"http://{registry_host}"
    auth = httpx.BasicAuth(*credentials) if credentials else None
    entries = []
    with httpx.Client(timeout=60, trust_env=False, auth=auth) as http:
        for plat in platforms:
            os_, _, arch = plat.partition("/")
            blob, diff_id = _layer(f"gpu-rl-builder stand-in for {repository}:{tag} ({plat}){note}\n")
            config = json.dumps({"architecture": arch, "os": os_, "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                                 "config": {"Labels": {"org.opencontainers.image.description":
                                                       f"gpu-rl-builder sandbox stand-in for {repository}:{tag}"}}},
                                sort_keys=True).encode()
            manifest = push_manifest(http, base, repository, blob, config, tag=None if index else tag)
            if not index:
                return _digest(manifest)
            entries.append({"mediaType": OCI_MANIFEST, "digest": _digest(manifest), "size": len(manifest),
                            "platform": {"os": os_, "architecture": arch}})
        data = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
        http.put(f"{base}/v2/{repository}/manifests/{tag}", content=data,
                 headers={"Content-Type": OCI_INDEX}).raise_for_status()
    return _digest(data)


def push_base_images(registry_host: str) -> dict[str, str]:
    """Push every stand-in base to ``registry_host``; the mirror map (registry -> host) that serves them."""
    for _, repository, tag in STANDIN_BASES:
        push_image(registry_host, repository, tag)
    return {registry: registry_host for registry, _, _ in STANDIN_BASES}
