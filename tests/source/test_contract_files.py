"""The contract as the activities read it from a commit: bytes, optional prose, undecodable files refused at once."""

from __future__ import annotations

import shutil

import pytest
from temporalio.exceptions import ApplicationError

from activities.source import SourceActivities
from domain.config import CredentialSource, RegistrySettings, RepoSettings, ServiceConfig
from sandbox.git_remotes import seed_tree_remote
from tests.real_tree_stack import real_tree

OPS = ".agents/ops/gpu-rl-image-build.md"


def _activities(tmp_path, url: str) -> SourceActivities:
    config = ServiceConfig(
        work_dir=str(tmp_path / "work"), repos=RepoSettings(marinskyrl_url=url, harbor_url=url), clusters={},
        registry=RegistrySettings(image_repository="127.0.0.1:5000/gpu-rl", user=CredentialSource(kind="literal_public", value="u"),
                                  token=CredentialSource(kind="env", name="UNUSED_TOKEN")))
    return SourceActivities(config)


def _seed(tmp_path, edit) -> tuple[SourceActivities, object, str]:
    tree = tmp_path / "tree"
    shutil.copytree(real_tree("era-c"), tree)
    edit(tree)
    url, sha = seed_tree_remote(tmp_path / "real.git", tree)
    acts = _activities(tmp_path, url)
    return acts, acts.repos.marinskyrl(), sha


def test_utf16_ops_doc_is_a_non_retryable_input_error_naming_the_file(tmp_path):
    def utf16(tree):
        f = tree / OPS
        f.write_bytes(f.read_text().encode("utf-16"))

    acts, repo, sha = _seed(tmp_path, utf16)
    with pytest.raises(ApplicationError) as e:
        acts._contract(repo, sha)
    assert e.value.non_retryable and e.value.type == "InputError"
    assert OPS in str(e.value) and "UTF-16" in str(e.value)


def test_missing_prose_files_are_read_as_absent(tmp_path):
    def drop(tree):
        (tree / OPS).unlink()
        (tree / "AGENTS.md").unlink()

    acts, repo, sha = _seed(tmp_path, drop)
    files = acts.repos.contract_files(repo, sha)
    assert OPS not in files and "AGENTS.md" not in files and isinstance(files["docker/build_gpu_rl_kaniko.sh"], bytes)
    c = acts._contract(repo, sha)
    assert not c.ops.found and c.agents.policy == []
    assert {f.field for f in c.fallbacks} >= {"amd64.cpu", "policy", "deploy_boundary"}
