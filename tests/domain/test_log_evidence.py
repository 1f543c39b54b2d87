"""Gap detection and the judgement of a succeeded job whose log may have lost lines (pure; issue #26)."""

from __future__ import annotations

import re

from domain.contract.script import parse_script
from domain.failures import Classification, Evidence, FailureClass, classify, decide_retry
from domain.log_evidence import ImageFacts, LogIntegrity, SeqGap, judge, seq_gaps, unexplained_gaps
from domain.markers import DIGEST_RE, Marker, check_log
from tests.contract.real import REAL  # found from a worktree too

REPO, TAG = "registry.local/gpu-rl", "gpu-rl-abc"
DOCKERFILE = "docker/Dockerfile.gpu-rl"
LAYER = 'echo "uv sync layer 0 (small pkgs + torch) done"'

MARKERS = [
    Marker(name="[arch] build host=x86_64", text="[arch] build host=x86_64", source="script", image_proof="script"),
    Marker(name="uv sync layer 0 (small pkgs + torch) done", text="uv sync layer 0 (small pkgs + torch) done",
           source=DOCKERFILE, template=LAYER, step=f"RUN uv sync --frozen && {LAYER}", must_run=True, line=7),
    Marker(name=f"push {REPO}:{TAG}", text=f"Pushing image to {REPO}:{TAG}", source="kaniko", role="push"),
    Marker(name=f"pushed {REPO}@sha256", pattern=re.escape(f"Pushed {REPO}@") + DIGEST_RE, source="kaniko",
           role="pushed"),
]
FULL = ("[arch] build host=x86_64\nuv sync layer 0 (small pkgs + torch) done\n"
        f"INFO Pushing image to {REPO}:{TAG}\nINFO Pushed {REPO}@sha256:{'ab' * 32}\n")
# What the store kept of a 20,000-line burst after the markers: the newest lines, then kaniko's push.
TAIL = "\n".join(str(i) for i in range(10_002, 10_010)) + f"\nINFO Pushing image to {REPO}:{TAG}\n" \
       f"INFO Pushed {REPO}@sha256:{'ab' * 32}\n"
HISTORY = ["COPY . /app", f"RUN uv sync --frozen &&   {LAYER}", "RUN seq 1 20000"]


def _ours(history: list[str] = HISTORY) -> ImageFacts:
    return ImageFacts(ref=f"{REPO}:{TAG}", digest="sha256:" + "ab" * 32, ours=True, history=history, built_by_job=True,
                      history_present=bool(history))


def test_seq_gaps_are_per_attempt_and_only_a_store_wide_hole_counts():
    # Two attempts of a job, with ids 3 and 6 not ours (another job's lines, or rows the store lost).
    entries = [("/u/j/0:0", 1), ("/u/j/0:0", 2), ("/u/j/0:1", 4), ("/u/j/0:0", 5), ("/u/j/0:1", 7), ("/u/j/0:1", 8)]
    gaps = seq_gaps(entries)
    assert gaps == [SeqGap(key="/u/j/0:0", after=2, before=5), SeqGap(key="/u/j/0:1", after=4, before=7)]
    # The store holds ids 5 and 6 between 4 and 7 (another key's row and ours); between 2 and 5 only id 4 of 3,4.
    holes = unexplained_gaps(gaps, {(4, 7): 2, (2, 5): 1})
    assert holes == [SeqGap(key="/u/j/0:0", after=2, before=5)] and holes[0].ids == 2
    assert seq_gaps([("/u/j/0:0", n) for n in range(1, 100)]) == []


def test_a_complete_log_is_judged_on_its_own():
    j = judge(MARKERS, check_log(MARKERS, FULL), LogIntegrity(lines=4), None)
    assert (j.verdict, j.missing, j.stood_in, j.incomplete) == ("log", [], {}, [])


def test_markers_lost_before_a_burst_are_proven_by_our_image():
    check = check_log(MARKERS, TAIL)
    assert check.missing == [MARKERS[0].name, MARKERS[1].name] and check.final_push_seen
    j = judge(MARKERS, check, LogIntegrity(lines=10), _ours())
    assert j.verdict == "image" and j.missing == [] and j.final_push_seen
    assert set(j.stood_in) == {MARKERS[0].name, MARKERS[1].name}
    assert "config history" in j.stood_in[MARKERS[1].name] and "script" in j.stood_in[MARKERS[0].name]
    assert any("absence is not proof" in r for r in j.incomplete)


def test_an_empty_log_with_our_image_validates_and_says_so():
    j = judge(MARKERS, check_log(MARKERS, ""), LogIntegrity(lines=0), _ours())
    assert j.verdict == "image" and j.missing == [] and len(j.stood_in) == 4
    assert j.incomplete == ["the log store holds no line of the job (a succeeded build always prints)"]
    assert "registry" in j.stood_in[MARKERS[3].name] and j.pushed_digest is None


def test_a_lost_log_without_our_image_is_log_lost_not_an_assertion():
    check = check_log(MARKERS, "")
    for image in (None, ImageFacts(ref=f"{REPO}:{TAG}", not_ours_reason="no image at the tag (manifest unknown)")):
        j = judge(MARKERS, check, LogIntegrity(lines=0), image)
        assert j.verdict == "log_lost" and j.missing == [m.name for m in MARKERS]
        assert j.reasons[0].startswith("the image cannot stand in for the lost log")
        assert "holds no line" in j.reasons[1]


def test_what_the_image_cannot_prove_stays_lost():
    unprovable = MARKERS[0].model_copy(update={"image_proof": None})  # a script without `set -e`
    markers = [unprovable, *MARKERS[1:]]
    j = judge(markers, check_log(markers, TAIL), LogIntegrity(lines=10), _ours(history=["RUN seq 1 20000"]))
    assert j.verdict == "log_lost" and j.missing == [MARKERS[0].name, MARKERS[1].name]
    assert "proves 2 marker(s)" in j.reasons[0] and "no step of the image's config history is its RUN" in j.reasons[0]
    # A seq hole is reported; a log that still shows every marker proves them, a log that misses one does not.
    hole = LogIntegrity(lines=4, holes=[SeqGap(key="/u/j/0:0", after=2, before=9)])
    j = judge(MARKERS, check_log(MARKERS, FULL), hole, None)
    assert j.verdict == "log" and j.incomplete == ["the log store lost 6 row(s) between seq 2 and 9 of /u/j/0:0"]
    j = judge(MARKERS, check_log(MARKERS, TAIL), hole, None)
    assert j.verdict == "log_lost" and "lost 6 row(s) between seq 2 and 9" in j.reasons[1]


def test_log_lost_is_its_own_class_with_a_true_next_step_and_is_not_retried():
    c = classify(Evidence(job_state="succeeded", missing_markers=["m"], log_lost=["the image cannot stand in"],
                          log_tail=["error building image"]))
    assert c.failure_class is FailureClass.LOG_LOST and c.reasons == ["the image cannot stand in"]
    assert "starter.py resume" in c.operator_hint and "10,000" in c.operator_hint
    assert decide_retry(c, {}, {}) == "fail"
    assert decide_retry(c, {}, {"log_lost": 1}) == "retry"
    unchanged = classify(Evidence(job_state="succeeded", missing_markers=["m"]))
    assert isinstance(unchanged, Classification) and unchanged.failure_class is FailureClass.ASSERTION_FAILURE


def test_errexit_is_read_from_the_real_scripts():
    for era, line in (("era-b", 12), ("era-c", 15)):
        text = (REAL / era / "docker" / "build_gpu_rl_kaniko.sh").read_text()
        assert parse_script(text).lines["errexit"] == line
        without = text.replace("set -euo pipefail", "set -uo pipefail")
        assert "errexit" not in parse_script(without).lines


def test_the_report_says_the_log_was_incomplete_and_what_stood_in():
    from domain.models import FileRef, LogCheck
    from domain.report import log_evidence_lines

    j = judge(MARKERS, check_log(MARKERS, TAIL), LogIntegrity(lines=10), _ours())
    check = LogCheck(log=FileRef(uri="file:///e/x.log", sha256="0" * 64, size_bytes=1), found=j.found,
                     missing=j.missing, final_push_seen=True, pushed_digest=j.pushed_digest, incomplete=j.incomplete,
                     stood_in=j.stood_in)
    lines = log_evidence_lines("amd64-standard", check)
    assert lines[0].startswith("- amd64-standard build log incomplete: 2 marker(s) absent")
    assert any(line.startswith("  - uv sync layer 0 \\(small pkgs + torch\\) done: proven by image config history")
               for line in lines[1:]), lines
    full = check.model_copy(update={"incomplete": [], "stood_in": {}})
    assert log_evidence_lines("amd64-standard", full) == []


def test_a_lost_log_offers_one_next_step_on_the_target_and_on_the_build():
    """Issue #34: the target said `starter.py resume <workflow-id>`, the build `starter.py build ...`."""
    from domain.buildset import BuildRequest, CompatibilityRequest
    from domain.failures import HINTS
    from domain.models import FailureRecord
    from domain.outcome import resume_command, targets_failure
    from workflows.target import _failure_message

    wid = "gpu-rl-build-abc"
    req = BuildRequest(architectures=["amd64"], variants=["standard"],
                       compatibility_request=CompatibilityRequest(requested_by="ana", reason="test"))
    f = FailureRecord(job_id="/u/j", failure_class="log_lost", reasons=["why"], decision="fail",
                      hint=HINTS[FailureClass.LOG_LOST])
    target = _failure_message("amd64-standard", f, wid)
    build = targets_failure([target], ["log_lost"], req, workflow_id=wid).next_step
    command = resume_command(wid)
    assert f"`{command}`" in target and f"`{command}`" in build
    assert "<workflow-id>" not in target and "starter.py build" not in build
