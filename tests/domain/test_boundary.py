from domain.boundary import BoundaryRule, copy_sources, decide

RULES = [BoundaryRule(glob="skyrl-train/**", rebuild=True),
         BoundaryRule(glob="docker/Dockerfile.gpu-rl*", rebuild=True),
         BoundaryRule(glob="cloud/iris/**", rebuild=False, reaches="/app bundle, no rebuild")]
DOCKERFILE = "FROM x AS rl\nCOPY pyproject.toml uv.lock README.md /opt/skyrl/\nCOPY --from=wheels /w /w\nCOPY cloud skyrl-train \\\n  skyrl-gym /opt/skyrl/\n"


def test_copy_sources_ignores_stage_copies_and_destination():
    assert copy_sources(DOCKERFILE) == ["pyproject.toml", "uv.lock", "README.md", "cloud", "skyrl-train", "skyrl-gym"]


def test_cloud_iris_only_needs_no_rebuild_even_though_copied():
    v = decide(RULES, {"docker/Dockerfile.gpu-rl": DOCKERFILE}, ["cloud/iris/run_rl.py"], harbor_moved=False)
    assert not v.needed and "no rebuild" in v.reasons[0]


def test_trainer_change_harbor_move_and_unlisted_copied_path_rebuild():
    assert decide(RULES, {}, ["skyrl-train/skyrl_train/x.py"], harbor_moved=False).needed
    assert decide(RULES, {}, [], harbor_moved=True, old_harbor="1" * 40, new_harbor="2" * 40).needed
    v = decide(RULES, {"docker/Dockerfile.gpu-rl": DOCKERFILE}, ["skyrl-gym/env.py"], harbor_moved=False)
    assert v.needed and "COPYs `skyrl-gym`" in v.reasons[0]
    v = decide(RULES, {"docker/Dockerfile.gpu-rl": DOCKERFILE}, ["docs/notes.md"], harbor_moved=False)
    assert not v.needed and "outside the image" in v.reasons[0]
