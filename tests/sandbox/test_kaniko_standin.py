"""The kaniko stand-in, run as the Iris task runs it (host ``python3``), against real local registries."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from sandbox.git_remotes import MARINSKYRL_FIXTURE

STANDIN = MARINSKYRL_FIXTURE / "docker" / "kaniko_standin.py"
ACCEPT = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"

DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG BASE=docker.io/library/ubuntu:22.04
FROM ${BASE} AS builder
ARG GREETING=hello
RUN mkdir -p "$KANIKO_STANDIN_ROOT/out" \\
    && echo "$GREETING from builder" > "$KANIKO_STANDIN_ROOT/out/artifact.txt"

FROM docker.io/library/ubuntu:22.04 AS unused
RUN echo UNUSED-STAGE-RAN

FROM ${BASE} AS rl
ARG GITSHA
ARG HARBOR_COMMIT=deadbeef
ARG EXIT_CODE=0
ENV APP_HOME=/opt/app
LABEL org.opencontainers.image.revision="${GITSHA}" \\
      org.marin.harbor-commit=$HARBOR_COMMIT
WORKDIR /opt/app
COPY src/ ./src/
COPY --from=builder /out/artifact.txt /opt/app/
RUN cat artifact.txt && ls src \\
    && echo "marker gitsha=${GITSHA} home=$APP_HOME"
RUN exit "$EXIT_CODE"
"""


@pytest.fixture
def context(tmp_path: Path) -> Path:
    ctx = tmp_path / "app"
    (ctx / "src").mkdir(parents=True)
    (ctx / "src" / "main.py").write_text("print('hi')\n")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    return ctx


def run_standin(ctx: Path, *args: str, docker_config: Path | None = None,
                env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "DOCKER_CONFIG": str(docker_config or ctx.parent / "no-docker-config"),
           **(env_extra or {})}
    python3 = shutil.which("python3") or "/usr/bin/python3"
    return subprocess.run(
        [python3, str(STANDIN), "--context", f"dir://{ctx}", "--dockerfile", str(ctx / "Dockerfile"), *args],
        capture_output=True, text=True, env=env, timeout=120,
    )


def docker_config(tmp_path: Path, host: str, user: str, secret: str) -> Path:
    d = tmp_path / "docker-config"
    d.mkdir()
    auth = base64.b64encode(f"{user}:{secret}".encode()).decode()
    (d / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return d


def fetch_image(base_url: str, repo: str, tag: str, auth: tuple[str, str] | None = None):
    with httpx.Client(base_url=base_url, trust_env=False) as http:
        headers = {"Accept": ACCEPT}
        r = http.get(f"/v2/{repo}/manifests/{tag}", headers=headers)
        if r.status_code == 401 and auth:
            challenge = r.headers["www-authenticate"]
            params = dict(p.split("=", 1) for p in challenge.split(" ", 1)[1].split(",") if "=" in p)
            params = {k: v.strip('"') for k, v in params.items()}
            tok = httpx.get(params["realm"], params={"service": params["service"],
                                                     "scope": f"repository:{repo}:pull"}, auth=auth).json()
            headers["Authorization"] = f"Bearer {tok['token']}"
            r = http.get(f"/v2/{repo}/manifests/{tag}", headers=headers)
        r.raise_for_status()
        manifest = r.json()
        cfg = http.get(f"/v2/{repo}/blobs/{manifest['config']['digest']}", headers=headers)
        cfg.raise_for_status()
        return r, manifest, cfg.json()


def test_builds_target_with_skip_unused_and_pushes_schema2(context, open_registry):
    repo = f"marin-community/standin-{uuid.uuid4().hex[:8]}"
    sha = "a" * 40
    res = run_standin(
        context, "--destination", f"{open_registry.host}/{repo}:gpu-rl-{sha}",
        "--destination", f"{open_registry.host}/{repo}:floating", "--custom-platform", "linux/arm64",
        "--skip-unused-stages", "--compressed-caching=false", "--build-arg", f"GITSHA={sha}",
        "--build-arg", "UNUSED_ARG=1", "--image-fs-extract-retry=3",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "UNUSED-STAGE-RAN" not in out
    assert "hello from builder" in out and f"marker gitsha={sha} home=/opt/app" in out
    assert f"Pushing image to {open_registry.host}/{repo}:gpu-rl-{sha}" in out
    pushed = [line.split("Pushed ", 1)[1] for line in out.splitlines() if "] Pushed " in line]
    assert len(pushed) == 2 and pushed[0] == pushed[1] and pushed[0].startswith(f"{open_registry.host}/{repo}@sha256:")
    assert "UNUSED_ARG" in out  # kaniko warns about unconsumed build args

    resp, manifest, config = fetch_image(open_registry.url, repo, f"gpu-rl-{sha}")
    assert manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert resp.headers["docker-content-digest"] == pushed[0].split("@", 1)[1]
    assert (config["architecture"], config["os"]) == ("arm64", "linux")
    assert config["config"]["Labels"] == {"org.opencontainers.image.revision": sha, "org.marin.harbor-commit": "deadbeef"}
    # 3 synthetic base layers + COPY + COPY + RUN + RUN
    assert len(manifest["layers"]) == len(config["rootfs"]["diff_ids"]) == 7
    assert all(layer["mediaType"].endswith("rootfs.diff.tar.gzip") for layer in manifest["layers"])


def test_without_skip_unused_stages_every_earlier_stage_builds(context, open_registry):
    repo = f"standin/all-{uuid.uuid4().hex[:8]}"
    res = run_standin(context, "--destination", f"{open_registry.host}/{repo}:t", "--build-arg", "GITSHA=x")
    assert res.returncode == 0, res.stderr
    assert "UNUSED-STAGE-RAN" in res.stdout


def test_failing_run_prints_kaniko_error_and_exits_1(context, open_registry):
    res = run_standin(context, "--destination", f"{open_registry.host}/standin/fail:t", "--build-arg", "EXIT_CODE=3")
    assert res.returncode == 1
    assert ("error building image: error building stage: failed to execute command: "
            "waiting for process to exit: exit status 3") in res.stderr
    assert "Pushing image" not in res.stdout


def test_same_inputs_give_same_digest_and_target_stage_only(context, open_registry):
    def digest(repo: str, *extra: str) -> str:
        res = run_standin(context, "--destination", f"{open_registry.host}/{repo}:t", "--skip-unused-stages", *extra)
        assert res.returncode == 0, res.stderr
        return [x for x in res.stdout.splitlines() if "] Pushed " in x][0].rsplit("@", 1)[1]

    tag = uuid.uuid4().hex[:8]
    assert digest(f"standin/d1-{tag}", "--build-arg", "GITSHA=b") == digest(f"standin/d2-{tag}", "--build-arg", "GITSHA=b")
    assert digest(f"standin/d3-{tag}", "--build-arg", "GITSHA=c") != digest(f"standin/d4-{tag}", "--build-arg", "GITSHA=b")
    res = run_standin(context, "--destination", f"{open_registry.host}/standin/w-{tag}:t",
                      "--target", "builder", "--skip-unused-stages")
    assert res.returncode == 0 and "marker" not in res.stdout
    _, manifest, _ = fetch_image(open_registry.url, f"standin/w-{tag}", "t")
    assert len(manifest["layers"]) == 4


def test_told_to_behave_like_kaniko_without_reproducible_every_build_gets_a_new_digest(context, open_registry):
    """KANIKO_STANDIN_REPRODUCIBLE=0: the build time goes into the image config (as real kaniko does
    without --reproducible), so the same inputs give a new digest; --reproducible still gives the same."""
    def digest(repo: str, *extra: str) -> str:
        res = run_standin(context, "--destination", f"{open_registry.host}/{repo}:t", "--skip-unused-stages", *extra,
                          env_extra={"KANIKO_STANDIN_REPRODUCIBLE": "0"})
        assert res.returncode == 0, res.stderr
        return [x for x in res.stdout.splitlines() if "] Pushed " in x][0].rsplit("@", 1)[1]

    tag = uuid.uuid4().hex[:8]
    assert digest(f"standin/n1-{tag}") != digest(f"standin/n2-{tag}")
    assert digest(f"standin/n3-{tag}", "--reproducible") == digest(f"standin/n4-{tag}", "--reproducible")


def test_token_auth_push_uses_docker_config_and_never_prints_secret(context, tmp_path, token_registry):
    user, secret = token_registry.credentials
    repo = f"marin-community/marinskyrl-{uuid.uuid4().hex[:8]}"
    cfg = docker_config(tmp_path, token_registry.host, user, secret)
    token_registry.inject(503, 2)  # transient registry errors, absorbed by --push-retry
    res = run_standin(context, "--destination", f"{token_registry.host}/{repo}:t", "--skip-unused-stages",
                      "--push-retry", "3", "--cache=true", "--cache-repo", f"{token_registry.host}/{repo}/cache",
                      docker_config=cfg)
    assert res.returncode == 0, res.stdout + res.stderr
    assert secret not in res.stdout + res.stderr
    assert f"Pushed {token_registry.host}/{repo}@sha256:" in res.stdout
    assert f"Pushing layer {token_registry.host}/{repo}/cache:" in res.stdout
    _, _, config = fetch_image(token_registry.url, repo, "t", auth=(user, secret))
    assert config["architecture"] == "amd64"

    again = run_standin(context, "--destination", f"{token_registry.host}/{repo}:t2", "--skip-unused-stages",
                        "--cache=true", "--cache-repo", f"{token_registry.host}/{repo}/cache", docker_config=cfg)
    assert again.returncode == 0, again.stderr
    assert "Using caching version of cmd: RUN" in again.stdout
    assert "hello from builder" not in again.stdout  # cached RUNs do not execute
    first = [x for x in res.stdout.splitlines() if "] Pushed " in x][0].rsplit("@", 1)[1]
    second = [x for x in again.stdout.splitlines() if "] Pushed " in x][0].rsplit("@", 1)[1]
    assert first == second


def test_token_registry_without_credentials_fails(context, token_registry):
    res = run_standin(context, "--destination", f"{token_registry.host}/private/x:t", "--skip-unused-stages")
    assert res.returncode == 1
    assert "error pushing image: failed to push to destination" in res.stderr
    assert "UNAUTHORIZED" in res.stderr
