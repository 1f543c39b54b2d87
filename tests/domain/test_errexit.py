"""errexit read like bash reads it (issue #34 item 4): a later `set +e` / `set +o errexit` ends "proven by the
final push" for the script echoes after it; a `set -e` that may not run (guarded, in a function or subshell)
never starts it."""

from __future__ import annotations

import re

import pytest

from domain.contract.script import errexit_covers, parse_script
from domain.log_evidence import ImageFacts, LogIntegrity, judge
from domain.markers import check_log, expected_markers
from tests.contract.helpers import COMMIT, SCRIPT, contract, edited
from tests.contract.real import REAL

ARCH = "[arch] build host=x86_64"
PIN = "[pin] HARBOR_COMMIT="


def _script_markers(files=None):
    ms = expected_markers(contract(files), "amd64", "standard", "wheel-builder", f"gpu-rl-{COMMIT}")
    return ms, {m.name: m for m in ms if m.source == "script"}


def _proof(markers: dict, prefix: str):
    return next(m.image_proof for n, m in markers.items() if n.startswith(prefix))


def test_the_real_scripts_keep_errexit_on_to_the_end():
    for era, on in (("era-b", 12), ("era-c", 15)):
        text = (REAL / era / "docker" / "build_gpu_rl_kaniko.sh").read_text()
        assert parse_script(text).errexit_spans == [(on, None)], era  # `set -x` / `set +x` are not errexit


@pytest.mark.parametrize("off", ["set +e", "set +o errexit", "set +eu", "set -u +e"])
def test_a_later_set_plus_e_ends_the_proof_for_what_follows(off):
    _, before = _script_markers()
    assert _proof(before, PIN) == "script" and _proof(before, ARCH) == "script"
    files = edited(SCRIPT, lambda t: t.replace('\necho "[arch] build host=', f'\n{off}\necho "[arch] build host=', 1))
    markers, after = _script_markers(files)
    assert _proof(after, PIN) == "script"  # before the `set +e`: errexit covered it
    assert _proof(after, ARCH) is None, off
    # The judgement: the log lost the [arch] line; our image at the tag no longer proves it.
    tag_push = [m for m in markers if m.role != "assert"]
    log = "\n".join(m.text or "" for m in markers if m.role == "assert" and not m.name.startswith(ARCH)
                    and m.text) + f"\nINFO Pushing image to {tag_push[0].text.split(' to ', 1)[1]}\n" \
        f"INFO Pushed {tag_push[0].text.split(' to ', 1)[1].split(':')[0]}@sha256:{'ab' * 32}\n"
    check = check_log(markers, log)
    assert [n for n in check.missing if n.startswith(ARCH)], check.missing
    image = ImageFacts(ref="r:t", digest="sha256:" + "ab" * 32, ours=True, built_by_job=True)
    j = judge(markers, check, LogIntegrity(lines=len(log.splitlines())), image)
    assert j.verdict == "log_lost" and any(n.startswith(ARCH) for n in j.missing), j


def test_set_e_again_restarts_the_proof_and_a_guarded_or_function_set_is_read_conservatively():
    text = "\n".join([
        "#!/bin/bash",              # 1
        "set -euo pipefail",        # 2
        "relax() { set +e; }",      # 3: off from here: the function may run at any later point
        "echo one",                 # 4
        "set -e",                   # 5
        "echo two",                 # 6
        'if [ -n "${X:-}" ]; then set +o errexit; fi',  # 7: may run: off
        "echo three",               # 8
        'if [ -n "${X:-}" ]; then set -e; fi',  # 9: may not run: not on
        "echo four",                # 10
        "( set -e )",               # 11: a subshell: not this shell
        "echo five",                # 12
    ])
    lines = list(enumerate(text.splitlines(), 1))
    spans = _spans(text)
    assert spans == [(2, 3), (5, 7)], spans
    on = [n for n, line in lines if line.startswith("echo") and errexit_covers(spans, n)]
    assert on == [6]


def _spans(text: str):
    from domain.contract.script import _errexit_spans, _Reader

    return _errexit_spans(_Reader(text, "t.sh"))


def test_the_option_words_are_read_like_set_reads_them():
    for cmd, want in (("set -e", [(1, None)]), ("set -euo pipefail", [(1, None)]), ("set -o errexit", [(1, None)]),
                      ("set -o pipefail", []), ("set -x", []), ("set -- -e", []), ("set -ue -o pipefail", [(1, None)])):
        assert _spans(cmd + "\necho x\n") == want, cmd
    assert re.fullmatch(r"set \+e", "set +e")
