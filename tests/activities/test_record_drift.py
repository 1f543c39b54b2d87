"""A tag moved between validation and recording (issue #28.1): the pin is still the validated digest and
the PR says what the tag serves now — the real record activity against the GitHub stand-in, real git
remotes and the real local registry."""

from __future__ import annotations

import subprocess
import uuid

from temporalio.testing import ActivityEnvironment

from activities.record import RecordActivities
from domain.config import ServiceConfig
from domain.models import PinnedImage
from sandbox.stack import MARINSKYRL_SLUG
from tests.activities.test_record_guard import _inp
from tests.activities.test_record_rendering import github  # noqa: F401  (fixture)
from tests.registry.imagepush import ImageSpec, Pusher


async def test_a_tag_moved_before_recording_is_pinned_at_the_validated_digest_and_named_in_the_pr(
        tmp_path, monkeypatch, github, open_registry):  # noqa: F811
    remotes, handle = github
    repo = f"lab/record-{uuid.uuid4().hex[:8]}"
    pusher = Pusher(open_registry.url)
    try:
        validated = await pusher.push_image(repo, "t1", ImageSpec(seed="validated"))
        moved = await pusher.push_image(repo, "t1", ImageSpec(seed="someone-else"))
        gone = await pusher.push_image(repo, "t2", ImageSpec(seed="t2"))
    finally:
        await pusher.aclose()
    monkeypatch.setenv("X", handle.token)
    acts = RecordActivities(ServiceConfig.model_validate({
        "work_dir": str(tmp_path / "work"),
        "repos": {"marinskyrl_url": remotes.marinskyrl_url, "harbor_url": remotes.harbor_url},
        "clusters": {},
        "registry": {"image_repository": f"{open_registry.host}/gpu-rl", "insecure_hosts": [open_registry.host],
                     "user": {"kind": "literal_public", "value": "u"}, "token": {"kind": "env", "name": "X"}},
        "github": {"token": {"kind": "env", "name": "X"}, "api_url": handle.api_url},
    }))
    inp = _inp(remotes)
    inp.targets = [inp.targets[0].model_copy(update={
        "tag": "t1", "image_ref": f"{open_registry.host}/{repo}:t1", "digest": validated.digest})]

    pr = await ActivityEnvironment().run(acts.record_artifact, inp)

    status, pull = handle.api("GET", f"/repos/{MARINSKYRL_SLUG}/pulls/{pr.number}")
    assert status == 200
    assert "**Registry changed since validation**" in pull["body"]
    assert f"{open_registry.host}/{repo}:t1 now points at {moved.digest}, not the validated {validated.digest}" in (
        pull["body"])
    pinned = subprocess.run(["git", "--git-dir", remotes.marinskyrl_url.removeprefix("file://"), "show",
                             f"{pr.pin_commit}:cloud/iris/gpu_rl_images.py"], capture_output=True, text=True,
                            check=True).stdout
    assert validated.digest in pinned and moved.digest not in pinned

    # The same check the merge wait runs: a deleted tag reads as gone, an untouched one as no drift.
    images = [PinnedImage(key="a", image_repository=f"{open_registry.host}/{repo}", tag="t1", digest=validated.digest),
              PinnedImage(key="b", image_repository=f"{open_registry.host}/{repo}", tag="t2", digest=gone.digest),
              PinnedImage(key="c", image_repository=f"{open_registry.host}/{repo}", tag="nope", digest=gone.digest)]
    drift = await ActivityEnvironment().run(acts.registry_drift, images)
    assert [(d.key, d.kind, d.now) for d in drift] == [("a", "moved", moved.digest), ("c", "gone", None)]
