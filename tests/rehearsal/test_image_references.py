"""Every image reference a build pulls is checked before submission (#35 item 1, the parts that need no
registry): one-line edits of the real era-C Dockerfile. A FROM fed by a stage-scoped ARG expands to nothing
(BuildKit's and kaniko's ARG scoping) and a `COPY --from` naming no stage pulls docker.io/library/<name>:
both passed (the unresolved FROM was taken for a stage, the --from for an image the plan knows). Each is
refused naming the Dockerfile line; lines are found by their text in the real file."""

from __future__ import annotations

from tests.contract.real import line_in
from tests.rehearsal.helpers import need_isolation, planned, rehearse

DF = "docker/Dockerfile.gpu-rl"
WHEELS_FROM = "ARG WHEEL_SOURCE\nFROM ${WHEEL_SOURCE} AS wheels\n"


def _run(tmp_path, old: str, new: str):
    need_isolation()

    def edit(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new)
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", {DF: edit}, arches=["amd64"])
    return rehearse(contract, targets, bundle, script, harbor), targets


def test_a_from_fed_by_a_stage_scoped_arg_is_refused(tmp_path):
    refusal, (t, *_) = _run(tmp_path, WHEELS_FROM, "ARG WHEEL_STAGE=wheel-builder\nFROM ${WHEEL_STAGE} AS wheels\n")
    at = f"{DF}:{line_in('era-c', DF, 'FROM ${WHEEL_SOURCE} AS wheels')}"
    (d,) = [d for d in t.rehearsal.differences if d.field == "FROM"]
    assert d.planned_source == at
    assert refusal and f"{at}: `FROM ${{WHEEL_STAGE}}` expands to" in refusal
    assert "WHEEL_STAGE is declared only inside stage prebuilt-wheelhouse, which a FROM cannot read" in refusal


def test_copy_from_naming_no_stage_is_refused(tmp_path):
    refusal, (t, *_) = _run(tmp_path, "COPY --from=wheels /wheels /wheels", "COPY --from=wheel /wheels /wheels")
    at = f"{DF}:{line_in('era-c', DF, 'COPY --from=wheels /wheels /wheels')}"
    (d,) = [d for d in t.rehearsal.differences if d.field == "COPY --from"]
    assert d.planned_source == at and d.script == "wheel"
    assert refusal and f"{at}: `COPY --from=wheel` names no stage" in refusal and "did you mean stage wheels" in refusal


def test_a_from_with_a_global_arg_and_a_full_copy_from_reference_plan(tmp_path):
    """Controls: the unedited FROM ${WHEEL_SOURCE} (a global ARG) and a --from with a registry path and tag."""
    refusal, targets = _run(tmp_path, "COPY --from=wheel-builder /wheels /wheels",
                            "COPY --from=wheel-builder /wheels /wheels\n"
                            "COPY --from=ghcr.io/marin-community/tools:1.0 /bin/true /wheels/.keep")
    assert refusal is None, refusal


COPY_CLOUD = "COPY cloud ${SKYRL_HOME}/cloud"


def test_an_env_expanded_copy_source_missing_from_the_context_is_refused(tmp_path):
    """`ENV CLOUD_DIR=clouds` then `COPY ${CLOUD_DIR}`: the source was skipped as unresolved (it passed)."""
    refusal, (t, *_) = _run(tmp_path, COPY_CLOUD, "ENV CLOUD_DIR=clouds\nCOPY ${CLOUD_DIR} ${SKYRL_HOME}/cloud")
    at = f"{DF}:{line_in('era-c', DF, COPY_CLOUD) + 1}"
    assert refusal and f"{at}: `COPY` of ${{CLOUD_DIR}}: not in the build context" in refusal, refusal


def test_an_env_expanded_copy_source_in_the_context_plans(tmp_path):
    refusal, _ = _run(tmp_path, COPY_CLOUD, "ENV CLOUD_DIR=cloud\nCOPY ${CLOUD_DIR} ${SKYRL_HOME}/cloud")
    assert refusal is None, refusal
