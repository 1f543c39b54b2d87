"""A credential in the build context found by difference (#35 item 3): one-line edits of the real era-C script.

The rehearsal runs twice with two different placeholder credentials; a file of the final kaniko call's real
context that differs between the runs follows the credential, whatever the encoding, and is refused naming
the file and the script line that wrote it. A file that differs run to run by itself (a timestamp) is not
refused; a file the same in both runs is not either. Lines are found by their text in the real file."""

from __future__ import annotations

import pytest

from tests.contract.real import line_in
from tests.rehearsal.helpers import need_isolation, planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
UNSET = "unset REGISTRY_TOKEN\n"
LEAKS = {
    "base32": ('printf "%s" "$REGISTRY_TOKEN" | base32 > "$DOCKER_CONTEXT/cloud/leak"; ', ["cloud/leak"]),
    "gzip+base64": ('printf "%s" "$REGISTRY_TOKEN" | gzip -n | base64 > "$DOCKER_CONTEXT/cloud/leak"; ', ["cloud/leak"]),
    "ROT13": ("printf '%s' \"$REGISTRY_TOKEN\" | tr 'A-Za-z' 'N-ZA-Mn-za-m' > \"$DOCKER_CONTEXT/cloud/leak\"; ",
              ["cloud/leak"]),
    "split over two files": ('printf "%s" "${REGISTRY_TOKEN:0:18}" > "$DOCKER_CONTEXT/cloud/a"; '
                             'printf "%s" "${REGISTRY_TOKEN:18}" > "$DOCKER_CONTEXT/docker/b"; ',
                             ["cloud/a", "docker/b"]),
}


def _run(tmp_path, edits):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", edits, arches=["amd64"])
    return rehearse(contract, targets, bundle, script, harbor), targets


def _before_unset(text: str):
    def apply(s: str) -> str:
        assert s.count(UNSET) == 1
        return s.replace(UNSET, text + UNSET)
    return {SCRIPT: apply}


@pytest.mark.parametrize("how", sorted(LEAKS))
def test_an_encoded_credential_in_the_context_is_refused_naming_file_and_line(tmp_path, how):
    leak, files = LEAKS[how]
    refusal, (t, *_) = _run(tmp_path, _before_unset(leak))
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, UNSET.strip())}"
    assert t.rehearsal.status == "failed", t.rehearsal.describe()
    for f in files:  # the line is named when the file's mtime tells it (it may not under heavy load)
        named = f"/app/{f} changes with the credential (rehearsed twice with different placeholder credentials)"
        assert named in refusal, refusal
        after = refusal.split(named, 1)[1]
        assert not after.startswith(", written at") or after.startswith(f", written at {at}"), refusal


def test_a_context_outside_app_is_compared_too(tmp_path):
    """The script copies the bundle to /tmp/ctx, writes the token there, and builds from it."""
    def edit(s: str) -> str:
        s = s.replace("DOCKER_CONTEXT=/app\n", "DOCKER_CONTEXT=/app\nKCTX=/tmp/ctx\n", 1)
        s = s.replace(UNSET, 'cp -r /app /tmp/ctx; printf "%s" "$REGISTRY_TOKEN" | base32 > /tmp/ctx/cloud/t; ' + UNSET)
        return s.replace('exec /kaniko/executor \\\n  --context "dir://${DOCKER_CONTEXT}"',
                         'exec /kaniko/executor \\\n  --context "dir://${KCTX}"')
    refusal, (t, *_) = _run(tmp_path, {SCRIPT: edit})
    assert refusal and "/tmp/ctx/cloud/t changes with the credential" in refusal, refusal


@pytest.mark.parametrize("write", ['date +%s%N > "$DOCKER_CONTEXT/cloud/built-at"; ',
                                   'printf "%s" "${#REGISTRY_TOKEN}" > "$DOCKER_CONTEXT/cloud/length"; ',
                                   'echo hello > "$DOCKER_CONTEXT/cloud/note"; '])
def test_a_context_file_that_does_not_follow_the_credential_plans(tmp_path, write):
    """Controls: a timestamp (differs run to run by itself), the token's length, a constant."""
    refusal, targets = _run(tmp_path, _before_unset(write))
    assert refusal is None, refusal
