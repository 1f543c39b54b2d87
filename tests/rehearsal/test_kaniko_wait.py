"""Did the script wait for its final kaniko call? Proven under both isolations (#35 item 6).

Under bwrap the kaniko stand-in reads each parent's wchan in /proc; under proot (no /proc) the runner
judges it from the statement trace (runner._not_waited: ``$!``, ``wait``, the bash processes above the
call). Edits of the real era-C script's final kaniko call (`exec /kaniko/executor \\ … "${DESTINATIONS[@]}"`);
every case runs under bwrap and proot (a host missing one skips that one). Before this change every proot
case was refused as unrehearsed (no /proc), the good ones included."""

from __future__ import annotations

import pytest

from rehearsal import runner
from tests.contract.real import line_in
from tests.rehearsal.helpers import planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
LAST = '  "${DESTINATIONS[@]}"\n'
EXEC = "exec /kaniko/executor"
ISOLATIONS = ["bwrap", "proot"]


def _run(tmp_path, isolation, head=EXEC, tail=None, era="era-c"):
    """Rehearse ``era`` with the final call's first words replaced by ``head`` and ``tail`` after its last line."""
    why = runner.isolation_unavailable(isolation)
    if why:
        pytest.skip(f"{isolation} unavailable here: {why}")

    def edit(text: str) -> str:
        assert text.count(EXEC) == 1 and text.count(LAST) == 1
        return text.replace(EXEC, head).replace(LAST, LAST.rstrip("\n") + tail)

    contract, targets, bundle, script, harbor = planned(tmp_path, era, {SCRIPT: edit} if tail else None,
                                                        arches=["amd64"])
    return rehearse(contract, targets, bundle, script, harbor, isolation=isolation), targets


def _passed(refusal, targets):
    assert refusal is None, refusal
    assert all(t.rehearsal.status == "passed" and not t.rehearsal.unrehearsed_from for t in targets), \
        [t.rehearsal.describe() for t in targets]


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("era", ["era-c", "era-b"])
def test_the_real_tree_rehearses_fully_under_required(tmp_path, isolation, era):
    _passed(*_run(tmp_path, isolation, era=era))


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_backgrounded_kaniko_then_other_work_then_exit_is_refused(tmp_path, isolation):
    """`exec kaniko … &`, then foreground work lasting longer than the stand-in's stay, then `exit 0`."""
    refusal, (t, *_) = _run(tmp_path, isolation, tail=" &\necho built\nsleep 1\nexit 0\n")
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, EXEC)}"
    assert refusal and t.rehearsal.status == "failed", t.rehearsal.describe()
    assert f"the kaniko call at {at} was still running when the script exited" in refusal, refusal


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_kaniko_detached_in_a_subshell_is_refused(tmp_path, isolation):
    """`( kaniko … & )` then foreground work: no `$!` in the script's shell, but the subshell that started
    the call ended while it ran."""
    refusal, (t, *_) = _run(tmp_path, isolation, "( /kaniko/executor", " & )\nsleep 1\n")
    assert refusal and t.rehearsal.status == "failed", t.rehearsal.describe()
    assert "was still running when the script exited" in refusal, refusal


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_kaniko_started_by_another_shell_is_refused(tmp_path, isolation):
    """`sh -c 'kaniko … & sleep 1'`: dash runs no line trap, so its waiting cannot be seen: refused."""
    refusal, (t, *_) = _run(tmp_path, isolation, "sh -c '/kaniko/executor \"$@\" & sleep 1' sh", "\n")
    assert refusal and t.rehearsal.status == "failed", t.rehearsal.describe()
    assert "not the script's bash" in refusal, refusal


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("head,tail", [
    ("timeout 600 sh -c '/kaniko/executor \"$@\" & sleep 1' sh", "\n"),  # timeout waits for sh, not kaniko
    ("/kaniko/executor", " & KPID=$!\necho built\nsleep 1\nexit 0\n"),  # its PID kept, never waited for
], ids=["timeout-sh-c-background", "pid-kept-not-waited"])
def test_near_misses_of_the_waited_forms_stay_refused(tmp_path, isolation, head, tail):
    refusal, (t, *_) = _run(tmp_path, isolation, head, tail)
    assert refusal and t.rehearsal.status == "failed", t.rehearsal.describe()
    assert "was still running when the script exited" in refusal, refusal


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("head,tail", [(EXEC, " &\nwait $!\n"), (EXEC, " &\nwait\n"),
                                       ("/kaniko/executor", " | tee /tmp/kaniko.log\n"),
                                       ("out=$(/kaniko/executor", ")\necho \"$out\"\n"),
                                       ("timeout 600 /kaniko/executor", "\n"),
                                       ("/kaniko/executor", " & KPID=$!; wait $KPID\n")],
                         ids=["wait-bang", "wait", "tee", "command-substitution", "timeout", "pid-variable"])
def test_a_waited_kaniko_plans(tmp_path, isolation, head, tail):
    """`& wait $!`, `& wait`, `| tee`, `$(…)`, `timeout 600 …` and `& KPID=$!; wait $KPID` wait for kaniko:
    they plan under both isolations (the last two were refused: timeout is not the script's bash, and the
    statement after the launch was not a `wait`)."""
    _passed(*_run(tmp_path, isolation, head, tail))
