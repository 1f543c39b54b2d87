"""The sandbox stack of a bench: attach to a running one (``--stack <stack.json>``) or start its own.

Why: starting a ``SandboxStack`` (Temporal dev server, Iris controller, two registries, stand-in images
pushed) costs ~10 CPU seconds and a minute of wall clock on a loaded 2-core machine, and
tests/bench/test_bench_smoke.py runs several stack benches side by side: it starts one stack and hands
each of them its ``stack.json``. An attached bench still runs on those real services; what a bench
changes stays its own: fresh git remotes (so workflow ids, derived from the commits, are unique), its
own GitHub stand-in, task queue, work dir, evidence store and image repository path (one bench's
visibility toggles never gate another's pushes). Benches that restart services keep their own stack.
"""

from __future__ import annotations

import argparse
import json
import tomllib
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace

from sandbox.git_remotes import SeededRemotes, seed_remotes
from sandbox.github_standin import start_github_standin
from sandbox.stack import HARBOR_SLUG, IMAGE_REPO_PATH, MARINSKYRL_SLUG, SandboxStack, _write_secret, to_toml


def add_stack_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--stack", metavar="STACK_JSON", type=Path,
                    help="attach to a running sandbox stack (the stack.json that `python -m sandbox up` or "
                         "tests/bench/test_bench_smoke.py wrote) instead of starting one; the bench still "
                         "uses its own git remotes, GitHub stand-in, task queue and image repository")


class _TokenRegistry(SimpleNamespace):
    """The shared token registry, its visibility toggled through its admin endpoint (another process)."""

    def set_public(self, repo: str, public: bool) -> None:
        url = f"{self.admin_url}?" + urllib.parse.urlencode({"repo": repo, "public": "1" if public else "0"})
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=30):
            pass


class AttachedStack:
    """The parts of a ``SandboxStack`` a bench uses, on a running stack's services (see module doc)."""

    shared = True

    def __init__(self, stack_json: Path, state_dir: Path, name: str) -> None:
        try:
            info = json.loads(Path(stack_json).read_text())
            base = tomllib.loads(Path(info["config"]).read_text())
            t, i, k, o = info["temporal"], info["iris"], info["registry_token"], info["registry_open"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"--stack {stack_json}: not a readable sandbox stack.json with its config.toml ({e})") from None
        if not (t and i and k and o and k.get("admin_url")):
            raise SystemExit(f"--stack {stack_json}: needs temporal, iris and both registries (one is missing)")
        self.state_dir = Path(state_dir).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.temporal = SimpleNamespace(address=t["address"], namespace=t["namespace"], pid=t["pid"],
                                        ui_url=t.get("ui_url"))
        self.iris = SimpleNamespace(url=i["url"], pid=i["pid"], marker=i.get("marker"))
        self.token_registry = _TokenRegistry(url=k["url"], host=k["host"], pid=k["pid"], admin_url=k["admin_url"])
        self.open_registry = SimpleNamespace(url=o["url"], host=o["host"], pid=o["pid"])
        tag = f"{name}-{uuid.uuid4().hex[:6]}"
        self.image_repo_path = f"{IMAGE_REPO_PATH}-{tag}"
        self.remotes: SeededRemotes = seed_remotes(self.state_dir / "remotes")
        self.github = start_github_standin(self.state_dir / "github", {
            MARINSKYRL_SLUG: self.remotes.marinskyrl_url.removeprefix("file://"),
            HARBOR_SLUG: self.remotes.harbor_url.removeprefix("file://")})
        try:
            gh_token = self.state_dir / "secrets" / "github-token"
            _write_secret(gh_token, self.github.token)
            base["work_dir"] = str(self.state_dir / "work")
            base["evidence"] = {"url": str(self.state_dir / "evidence")}
            base["temporal"]["task_queue"] = f"bench-{tag}"
            base["repos"].update(marinskyrl_url=self.remotes.marinskyrl_url, harbor_url=self.remotes.harbor_url)
            base["registry"]["image_repository"] = f"{k['host']}/{self.image_repo_path}"
            base["github"] = {"api_url": self.github.api_url, "web_url": "https://github.com",
                              "token": {"kind": "file", "path": str(gh_token)}}
            (self.state_dir / "work").mkdir(exist_ok=True)
            self.config_path.write_text(to_toml(base))
            from domain.config import load_config

            load_config(self.config_path)  # fail here, naming the file, not in the worker
        except BaseException:
            self.github.stop()
            raise

    @property
    def config_path(self) -> Path:
        return self.state_dir / "config.toml"

    def start(self) -> AttachedStack:
        return self

    def stop(self) -> None:
        self.github.stop()  # the shared services belong to whoever started them

    def __enter__(self) -> AttachedStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bench_stack(stack_json: Path | None, state_dir: Path, name: str, **kw) -> SandboxStack | AttachedStack:
    """Attached to ``stack_json`` when given, else a started ``SandboxStack`` of its own (``kw`` goes to it).
    Either way ``.image_repo_path`` is the image repository path its builds push to."""
    if stack_json:
        return AttachedStack(stack_json, state_dir, name)
    stack = SandboxStack(state_dir, **kw).start()
    stack.image_repo_path = IMAGE_REPO_PATH
    stack.shared = False
    return stack
