#!/usr/bin/env python3
"""SANDBOX STAND-IN for a container runtime running a built image: lays the image out, then runs the command.

Why: the sandbox's real Iris controller runs every task as a host process; it ignores the task image. The job
that runs a built image's own checks (activities/build.py ``_run_image_checks``) names the image as its task
image, and on a real cluster its command runs inside it. Here the cluster's ``image_check_runner`` puts this
program first: it pulls ``$GPU_RL_BUILDER_IMAGE`` (``host/repo@sha256:..``) with the kaniko stand-in's registry
client (stdlib; Docker config credentials), unpacks its layers in order into a scratch root (tarfile's data
filter), and runs the command with the image config's Env and ``KANIKO_STANDIN_ROOT`` = that root, the same
convention under which the kaniko stand-in ran the image's RUN steps: what a step wrote at ``/x`` is at
``$KANIKO_STANDIN_ROOT/x``. So a check answers from the image's content, as it would in the real image.

Usage: image_run_standin.py <command...>   (stdlib only; exits with the command's status, 125 on a pull error)
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures" / "marinskyrl" / "docker"))
import kaniko_standin as ks  # noqa: E402  (the stand-in's registry client)

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


def pull(ref: str, root: str) -> dict:
    """Unpack the image's layers into ``root``; its config."""
    name, _, digest = ref.partition("@")
    host, _, repo = name.partition("/")
    reg = ks.Registry(host, True, 2)
    raw = reg.get_manifest(repo, digest)
    if raw is None:
        raise SystemExit(f"image-run stand-in: no manifest {ref}")
    manifest = json.loads(raw)
    if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
        entry = next((m for m in manifest["manifests"] if (m.get("platform") or {}).get("architecture") == arch),
                     manifest["manifests"][0])
        manifest = json.loads(reg.get_manifest(repo, entry["digest"]) or b"{}")
    config = json.loads(reg.get_blob(repo, manifest["config"]["digest"]))
    for layer in manifest.get("layers") or []:
        data = reg.get_blob(repo, layer["digest"])
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(root, filter="data")
    return config


def main(argv: list[str]) -> int:
    ref = os.environ.get("GPU_RL_BUILDER_IMAGE", "")
    if "@" not in ref or not argv:
        print("image-run stand-in: needs GPU_RL_BUILDER_IMAGE=host/repo@digest and a command", file=sys.stderr)
        return 125
    root = tempfile.mkdtemp(prefix="image-run-standin-")
    try:
        try:
            config = pull(ref, root)
        except (ks.BuildError, OSError, ValueError, KeyError) as e:
            print(f"image-run stand-in: cannot pull {ref}: {e}", file=sys.stderr)
            return 125
        env = {"PATH": os.environ.get("PATH", ks.DEFAULT_PATH), "HOME": os.path.join(root, "root")}
        for kv in (config.get("config") or {}).get("Env") or []:
            k, _, v = kv.partition("=")
            env[k] = v
        env.update({"PATH": os.environ.get("PATH", ks.DEFAULT_PATH), "KANIKO_STANDIN_ROOT": root})
        return subprocess.run(argv, env=env, cwd=root).returncode
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
