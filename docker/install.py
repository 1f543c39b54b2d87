"""Every install step of the worker image, shared by docker/Dockerfile and tests/deploy (outside a container).

Standard library only: it runs on the bare base image before any venv exists.

  python docker/install.py wheel SRC DIST            build the service wheel from a source tree
  python docker/install.py venv PREFIX DIST [EXTRAS]  venv + pinned tools (docker/tools.txt) + DIST's wheel
                                                      + marin-iris's message classes (iris-protos below)
  python docker/install.py iris-protos PYTHON         marin-iris and marin-finelog, hash-pinned, without their
                                                      dependencies (docker/iris-protos.txt), into PYTHON's env
  python docker/install.py kubectl BINDIR ARCH        kubectl for amd64|arm64, checked against a pinned sha256

kubectl is pinned here, not trusted from the download server's own .sha256 file (same host, same TLS
connection: that proves only an untruncated transfer). To bump, set KUBECTL_VERSION, KUBECTL_EOL and both
sums from https://dl.k8s.io/release/<version>/bin/linux/<arch>/kubectl.sha256 (tests/deploy/test_image.py
compares them with those files when dl.k8s.io is reachable). KUBECTL_VERSION, KUBECTL_SHA256 and
KUBECTL_BASE_URL may be overridden together from the environment (a mirror; the tests' local copy).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
# kubectl 1.36 (1.36.4, 2026-08-11): within one minor of the newest Kubernetes (1.37), kubectl's version
# skew policy. The sums are the published .sha256 files of v1.36.4, as recorded in kubernetes-sigs/kubespray
# @46dbdd3994b32640bcd806b0097f50e8fdf1d514 roles/kubespray_defaults/vars/main/checksums.yml (kubectl_checksums,
# which kubespray checks against https://dl.k8s.io/release/v<version>/bin/linux/<arch>/kubectl).
KUBECTL_VERSION = "v1.36.4"
KUBECTL_SHA256 = {
    "amd64": "8b8f088da2dab964f853b38464033b1be15ede2839eca751482357c45abdd05a",
    "arm64": "0ecf44450ee6063bf19dd166a103ee6df4a9034455c2abce626e6eea657d73fb",
}
KUBECTL_SHA256_SOURCE = ("kubernetes-sigs/kubespray@46dbdd3994b32640bcd806b0097f50e8fdf1d514:"
                         "roles/kubespray_defaults/vars/main/checksums.yml")
# end-of-life kubectl:v1.36.4 2027-06-28 (Kubernetes 1.36 end of life, https://kubernetes.io/releases/1.36/)
KUBECTL_EOL = "2027-06-28"
KUBECTL_BASE_URL = "https://dl.k8s.io/release"


class InstallError(RuntimeError):
    pass


def _run(*argv: str) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True)


def _pip(python: Path | str, *args: str) -> None:
    _run(str(python), "-m", "pip", "--disable-pip-version-check", *args)


def build_wheel(src: Path, dist: Path) -> None:
    _pip(sys.executable, "wheel", "--no-deps", "--wheel-dir", str(dist), str(src))


def build_venv(prefix: Path, dist: Path, extras: str = "") -> None:
    wheels = sorted(dist.glob("gpu_rl_builder-*.whl"))
    if len(wheels) != 1:
        raise InstallError(f"expected one gpu_rl_builder wheel in {dist}, found {[w.name for w in wheels]}")
    _run(sys.executable, "-m", "venv", str(prefix))
    python = prefix / "bin" / "python"
    _pip(python, "install", "--require-hashes", "--only-binary=:all:", "-r", str(HERE / "tools.txt"))
    _pip(python, "install", f"{wheels[0]}[{extras}]" if extras else str(wheels[0]))
    install_iris_protos(python)


def install_iris_protos(python: Path | str) -> None:
    """clients/iris.py speaks marin-iris's generated messages (``iris.rpc.*_pb2``, ``finelog.rpc.logging_pb2``).
    Their packages come without dependencies: the pb2 modules import ``protobuf`` alone (installed with the
    wheel), while marin-iris's own requirements are the controller's (grpcio, sqlalchemy, gcsfs, ...)."""
    _pip(python, "install", "--no-deps", "--require-hashes", "--only-binary=:all:", "-r", str(HERE / "iris-protos.txt"))
    _run(str(python), "-c", "import iris.rpc.controller_pb2, iris.rpc.job_pb2, finelog.rpc.logging_pb2")


def install_kubectl(bindir: Path, arch: str, env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ if env is None else env)
    overridden = [k for k in ("KUBECTL_VERSION", "KUBECTL_SHA256") if env.get(k)]
    if len(overridden) == 1:
        raise InstallError(f"{overridden[0]} is set alone: override KUBECTL_VERSION and KUBECTL_SHA256 together")
    if not arch:
        raise InstallError("no target architecture: build with BuildKit (docker buildx), which sets TARGETARCH")
    if not overridden and arch not in KUBECTL_SHA256:
        raise InstallError(f"no pinned kubectl sha256 for architecture {arch!r} (have: {', '.join(KUBECTL_SHA256)})")
    version = env.get("KUBECTL_VERSION") or KUBECTL_VERSION
    expected = env.get("KUBECTL_SHA256") or KUBECTL_SHA256[arch]
    url = f"{env.get('KUBECTL_BASE_URL') or KUBECTL_BASE_URL}/{version}/bin/linux/{arch}/kubectl"
    bindir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=bindir, delete=False) as tmp:
        try:
            digest = hashlib.sha256()
            with urllib.request.urlopen(url, timeout=120) as resp:
                while chunk := resp.read(1 << 20):
                    digest.update(chunk)
                    tmp.write(chunk)
            tmp.close()
            if digest.hexdigest() != expected:
                raise InstallError(f"kubectl {version} {arch} from {url}: sha256 {digest.hexdigest()} "
                                   f"!= pinned {expected}")
            os.chmod(tmp.name, 0o755)
            os.replace(tmp.name, bindir / "kubectl")
        finally:
            if os.path.exists(tmp.name):
                os.unlink(tmp.name)
    print(f"kubectl {version} {arch}: sha256 {expected} ok -> {bindir / 'kubectl'}", flush=True)
    return bindir / "kubectl"


def main(argv: list[str]) -> int:
    try:
        match argv:
            case ["wheel", src, dist]:
                build_wheel(Path(src), Path(dist))
            case ["venv", prefix, dist]:
                build_venv(Path(prefix), Path(dist))
            case ["venv", prefix, dist, extras]:
                build_venv(Path(prefix), Path(dist), extras)
            case ["iris-protos", python]:
                install_iris_protos(python)
            case ["kubectl", bindir, arch]:
                install_kubectl(Path(bindir), arch)
            case _:
                print(__doc__, file=sys.stderr)
                return 2
    except (InstallError, subprocess.CalledProcessError, OSError) as e:
        print(f"install.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
