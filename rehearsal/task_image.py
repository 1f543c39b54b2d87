"""The planned task image's userland, unpacked once per manifest digest: the rehearsal's root.

Why: Iris runs the build script in the job's task image (``docker.io/library/ubuntu:22.04``), not on
the worker; a script that calls ``jq`` or ``python3`` before installing it works on the worker and dies
on the cluster. So the rehearsal needs the image's own files. The image is resolved with the project's
registry client (clients/registry.py: anonymous/token auth, digests checked), its layers streamed to
disk and unpacked in order into ``<cache_dir>/roots/<manifest digest>``; a second rehearsal of the same
image costs one manifest HEAD for a tag (none for a digest) and no layer download.

Unpacking uses Python's ``tarfile`` with its extraction filter (PEP 706: ``tar_filter`` strips leading
``/``, refuses any path that resolves outside the root through ``..`` or an already extracted symlink,
and clears setuid bits) rather than hand-parsed tar; ``zstandard`` reads zstd layers. What the filter
does not know is done here: OCI whiteouts (``.wh.<name>`` removes a lower layer's file, ``.wh..wh..opq``
empties a lower layer's directory), hardlink targets checked to stay inside the root, a later layer's
entry replacing (not writing through) an earlier one, device nodes skipped (the rehearsal mounts its
own ``/dev``), and every directory left owner-writable so the next layer (and the cache's pruning)
can write below it (inside the rehearsal, root ignores those bits anyway).

A registry mirror (``policy.rehearsal_registry_mirrors``: ``docker.io = "mirror.example:5000"``) is
asked in place of the image's own registry, as containerd/Docker mirrors are: a worker behind a
pull-through cache, and the sandbox, whose stand-in task image lives in its local registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform as host_platform_mod
import re
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from clients.registry import (
    Denied,
    NotFound,
    RateLimited,
    RegistryClient,
    RegistryError,
    RegistryUnavailable,
    Unauthorized,
    is_digest,
    scheme_for,
)
from domain.validation import ManifestError, Platform, parse_manifest, select_platform

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
MAX_LAYER_BYTES = 8 * 1024**3
PRUNE_AFTER_S = 14 * 86400  # a cached root unused this long is removed when another is added
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_HOST_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class TaskImageError(RuntimeError):
    """The task image could not be laid out; ``transient`` when asking again may succeed."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class ImageReference:
    registry: str  # as written (docker.io for a bare name)
    repository: str
    tag: str | None
    digest: str | None

    @property
    def ref(self) -> str:
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.tag}")


def parse_image_reference(text: str) -> ImageReference:
    """``ubuntu:22.04``, ``docker.io/library/ubuntu:22.04``, ``host:5000/a/b@sha256:…`` (Docker's rules:
    a first component with a dot, a colon or ``localhost`` is a registry; Docker Hub names get ``library/``)."""
    rest, digest = text.strip(), None
    if "@" in rest:
        rest, _, digest = rest.partition("@")
        if not is_digest(digest):
            raise ValueError(f"image reference {text!r}: {digest!r} is not a digest")
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, _, tag = rest.rpartition(":")
        if not _TAG.match(tag):
            raise ValueError(f"image reference {text!r}: bad tag {tag!r}")
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, remainder
    else:
        registry, repository = DOCKER_HUB, rest
    if registry in (DOCKER_HUB, "index.docker.io", DOCKER_HUB_API):
        registry = DOCKER_HUB
        if "/" not in repository:
            repository = f"library/{repository}"
    if not repository or repository != repository.lower() or "//" in repository:
        raise ValueError(f"image reference {text!r}: bad repository {repository!r}")
    return ImageReference(registry, repository, tag if digest is None else tag, digest)


def host_platform() -> str:
    return f"linux/{_HOST_ARCH.get(host_platform_mod.machine().lower(), host_platform_mod.machine().lower())}"


def runnable_platform(target: str, emulator: str | None = None, why_not: str | None = None
                      ) -> tuple[str, str | None]:
    """The platform whose binaries the rehearsal runs for ``target``, and a note when it is not ``target``.

    A worker runs another architecture's binaries through a registered binfmt_misc emulator, or through
    ``emulator`` (qemu user mode under proot, rehearsal/emulation.py); without either the same image's
    own-architecture variant is used: the same userland (which tools exist before the script installs
    any), and the stand-in ``uname`` still answers the target's architecture; ``why_not`` says why there
    is no emulator."""
    want = Platform.parse(target)
    host = host_platform()
    if want.matches(Platform.parse(host)) or emulator:
        return target, None
    qemu = {"arm64": "aarch64", "amd64": "x86_64"}.get(want.architecture, want.architecture)
    with contextlib.suppress(OSError):
        if Path(f"/proc/sys/fs/binfmt_misc/qemu-{qemu}").read_text().startswith("enabled"):
            return target, None
    return host, (f"{host} variant: this worker cannot execute {target} binaries ("
                  + (why_not or "no binfmt_misc emulator") + ")")


@dataclass(frozen=True)
class TaskImageRoot:
    """One unpacked userland: where it is, and what it is (for the plan: which image, which digest)."""

    reference: str
    platform: str
    digest: str  # the platform manifest's digest
    path: Path
    downloaded_bytes: int  # 0 when the cache already held it
    note: str | None = None

    def describe(self) -> str:
        return f"{self.reference} ({self.platform}, {self.digest[:19]})" + (f"; {self.note}" if self.note else "")


class TaskImages:
    """Resolves and unpacks task images into ``cache_dir`` (shared by every rehearsal of a worker)."""

    def __init__(self, cache_dir: str | os.PathLike[str], *, mirrors: dict[str, str] | None = None,
                 insecure_hosts: tuple[str, ...] | list[str] = (), max_retries: int = 2,
                 timeout_s: float = 60.0) -> None:
        self.cache_dir = Path(cache_dir)
        self.mirrors = dict(mirrors or {})
        self.insecure_hosts = tuple(insecure_hosts)
        self.max_retries = max_retries
        self.timeout_s = timeout_s

    def root(self, reference: str, target_platform: str, *, emulator: str | None = None,
             why_not: str | None = None) -> TaskImageRoot:
        """The unpacked root of ``reference`` for ``target_platform`` (blocking: call from a thread);
        ``emulator``: this rehearsal runs that platform's binaries through it (else ``why_not``)."""
        try:
            ref = parse_image_reference(reference)
        except ValueError as e:
            raise TaskImageError(str(e)) from None
        plat, note = runnable_platform(target_platform, emulator, why_not)
        try:
            return asyncio.run(self._root(ref, reference, plat, note))
        except (RegistryUnavailable, RateLimited) as e:
            raise TaskImageError(f"task image {reference}: {e}", transient=True) from None
        except (NotFound, Unauthorized, Denied) as e:
            raise TaskImageError(f"task image {reference} cannot be pulled anonymously: {e}") from None
        except (RegistryError, ManifestError, tarfile.TarError, OSError) as e:
            raise TaskImageError(f"task image {reference}: {e}") from None

    def _client(self, ref: ImageReference) -> RegistryClient:
        host = self.mirrors.get(ref.registry) or (DOCKER_HUB_API if ref.registry == DOCKER_HUB else ref.registry)
        return RegistryClient(host, scheme=scheme_for(host, self.insecure_hosts), max_retries=self.max_retries,
                              timeout_s=self.timeout_s)

    async def _root(self, ref: ImageReference, reference: str, plat: str, note: str | None) -> TaskImageRoot:
        async with self._client(ref) as client:
            digest, kind, body = await self._manifest(client, ref.repository, ref.ref)
            if kind == "index":
                entry, check = select_platform(body, plat)
                host = host_platform()
                if entry is None and plat != host and note is None:  # nothing to emulate: the worker's own
                    entry, _ = select_platform(body, host)
                    plat, note = host, f"{host} variant: the image has no {plat} variant ({check.detail})"
                if entry is None:
                    raise TaskImageError(f"task image {reference}: {check.detail}")
                digest, kind, body = await self._manifest(client, ref.repository, entry["digest"])
                if kind != "image":
                    raise TaskImageError(f"task image {reference}: {digest} is not an image manifest")
            root = self.cache_dir / "roots" / digest.replace(":", "-")
            if root.is_dir():
                self._touch(root)
                return TaskImageRoot(reference, plat, digest, root, 0, note)
            size = await self._unpack(client, ref.repository, body, root)
            self._prune(keep=root)
            return TaskImageRoot(reference, plat, digest, root, size, note)

    async def _manifest(self, client: RegistryClient, repo: str, ref: str) -> tuple[str, str, dict[str, Any]]:
        """(digest, kind, body). By digest from the cache; a tag costs one HEAD once its manifest is cached."""
        digest = ref if is_digest(ref) else (await client.head_manifest(repo, ref)).digest
        path = self.cache_dir / "manifests" / digest.replace(":", "-")
        if path.is_file():
            saved = json.loads(path.read_text())
            return digest, *parse_manifest(saved["data"].encode(), saved["media_type"])
        raw = await client.get_manifest(repo, digest)
        kind, body = parse_manifest(raw.data, raw.media_type)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(raw)}")
        tmp.write_text(json.dumps({"data": raw.data.decode(), "media_type": raw.media_type}))
        tmp.replace(path)
        return digest, kind, body

    async def _unpack(self, client: RegistryClient, repo: str, manifest: dict[str, Any], root: Path) -> int:
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
        total = 0
        try:
            (staging / "rootfs").mkdir()
            for layer in manifest.get("layers") or []:
                media = str(layer.get("mediaType", ""))
                if "nondistributable" in media or "foreign" in media:
                    raise TaskImageError(f"layer {layer.get('digest')} is not distributable ({media})")
                with tempfile.TemporaryFile(dir=staging) as f:
                    total += await client.download_blob(repo, layer["digest"], f, max_bytes=MAX_LAYER_BYTES)
                    f.seek(0)
                    apply_layer(f, staging / "rootfs")
            (staging / "rootfs").rename(staging / "done")
            try:
                (staging / "done").rename(root)
            except OSError:  # another rehearsal unpacked the same digest meanwhile: use theirs
                if not root.is_dir():  # noqa: ASYNC240 - its own loop, in a worker thread
                    raise
            self._touch(root)
            return total
        finally:
            _rmtree(staging)

    def _touch(self, root: Path) -> None:
        with contextlib.suppress(OSError):
            (self.cache_dir / "used").mkdir(exist_ok=True)
            (self.cache_dir / "used" / root.name).touch()

    def _prune(self, keep: Path) -> None:
        """Remove roots no rehearsal used for PRUNE_AFTER_S (a tag that moved on leaves its old root)."""
        now = time.time()
        for d in (self.cache_dir / "roots").iterdir():
            if d != keep and not d.name.startswith(".") and d.is_dir():
                with contextlib.suppress(OSError):
                    if now - (self.cache_dir / "used" / d.name).stat().st_mtime > PRUNE_AFTER_S:
                        _rmtree(d)


def _rmtree(path: Path) -> None:
    def onexc(func: Any, p: str, _exc: BaseException) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            func(p)

    shutil.rmtree(path, onexc=onexc)


# ----------------------------------------------------------------------------------------- layers

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def _open_layer(f: IO[bytes]) -> IO[bytes]:
    """A decompressed stream of the layer (gzip, zstd or plain tar, told by its magic bytes)."""
    magic = f.read(4)
    f.seek(0)
    if magic[:2] == b"\x1f\x8b":
        import gzip

        return gzip.GzipFile(fileobj=f)  # type: ignore[return-value]
    if magic == b"\x28\xb5\x2f\xfd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(f)  # type: ignore[return-value]
    return f


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        _rmtree(Path(path))
    elif os.path.lexists(path):
        os.unlink(path)


def apply_layer(f: IO[bytes], rootfs: Path) -> None:
    """Apply one layer tar (compressed or not) over ``rootfs`` with OCI whiteout semantics."""
    root = os.path.realpath(rootfs)
    with tarfile.open(fileobj=_open_layer(f), mode="r|") as tar:
        tar.extractall(root, members=_members(tar, root), numeric_owner=True, filter=_filter)


def _filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    if member.ischr() or member.isblk() or member.isfifo():
        return None
    m = tarfile.tar_filter(member, dest)
    if m.isdir():
        m = m.replace(mode=(m.mode if m.mode is not None else 0o755) | 0o700, deep=False)
    return m


def _members(tar: tarfile.TarFile, root: str):
    """The layer's entries to extract; whiteouts are applied here (to lower layers only) and dropped."""
    this_layer: set[str] = set()
    for m in tar:
        name = os.path.normpath(m.name.lstrip("/")).removeprefix("./")
        if name in (".", ""):
            continue
        parent_rel, base = os.path.split(name)
        parent = os.path.realpath(os.path.join(root, parent_rel))
        if not _inside(root, parent):
            raise tarfile.OutsideDestinationError(m, parent)
        if base == OPAQUE:
            if os.path.isdir(parent):
                for child in os.listdir(parent):
                    if os.path.join(parent_rel, child) not in this_layer:
                        _remove(os.path.join(parent, child))
            continue
        if base.startswith(WHITEOUT):
            _remove(os.path.join(parent, base[len(WHITEOUT):]))
            continue
        if m.islnk():
            target = os.path.realpath(os.path.join(root, m.linkname.lstrip("/")))
            if not _inside(root, target):
                raise tarfile.LinkOutsideDestinationError(m, target)
        path = os.path.join(parent, base)
        if os.path.lexists(path) and not (m.isdir() and os.path.isdir(path) and not os.path.islink(path)):
            _remove(path)  # a later layer's entry replaces the lower one (never writes through a symlink)
        this_layer.add(name)
        yield m
