"""Never pass what was not run (#35 item 4): one-line edits of the real era-C script.

A stood-in python3 never exits 0 for a program it did not run; what the rehearsal could not run is
"unrehearsed from file:line" and, under ``rehearsal = "required"``, refuses the plan unless the operator
passes --accept-unrehearsed (recorded in the result). A kaniko call the script puts in the background
and never waits for is refused every time (it passed 3 runs in 12: a race with the namespace's end).
Under ``set -x`` the failure shows bash's own last words, not the line trap's. Lines are found by text."""

from __future__ import annotations

from tests.contract.real import line_in
from tests.rehearsal.helpers import need_isolation, planned, rehearse

SCRIPT = "docker/build_gpu_rl_kaniko.sh"
INSTALL = 'apt-get install -y --no-install-recommends "${APT_PACKAGES[@]}"\n'
LAST = '  "${DESTINATIONS[@]}"\n'


def _edit(old: str, new: str):
    def apply(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new)
    return apply


def _run(tmp_path, edit, **kw):
    need_isolation()
    contract, targets, bundle, script, harbor = planned(tmp_path, "era-c", {SCRIPT: edit}, arches=["amd64"])
    return rehearse(contract, targets, bundle, script, harbor, **kw), targets


PY_YAML = INSTALL.rstrip("\n") + " python3\npython3 - <<'PY'TAIL\nimport yaml\nPY\n"


def test_a_stdin_program_after_a_stood_in_python3_install_is_unrehearsed_and_refused(tmp_path):
    """`python3 - <<PY` exited 0 whatever the program did: `import yaml` passed."""
    refusal, targets = _run(tmp_path, _edit(INSTALL, PY_YAML.replace("TAIL", "")))
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, INSTALL.strip()) + 1}"
    assert refusal and f"unrehearsed from {at}" in refusal and "--accept-unrehearsed" in refusal, refusal
    assert 'policy.rehearsal = "required"' in refusal
    for t in targets:
        r = t.rehearsal
        assert r.status == "skipped" and r.unrehearsed_from == at and not r.unrehearsed_accepted, r.describe()
        assert "python3 - was not run" in " ".join(r.stderr_tail), r.stderr_tail


def test_the_operator_flag_accepts_the_unrehearsed_remainder_and_the_result_records_it(tmp_path):
    refusal, targets = _run(tmp_path, _edit(INSTALL, PY_YAML.replace("TAIL", "")), accept_unrehearsed=True)
    assert refusal is None
    for t in targets:
        assert t.rehearsal.unrehearsed_accepted and "accepted by the operator with --accept-unrehearsed" \
            in t.rehearsal.describe(), t.rehearsal.describe()


def test_a_tolerated_unrun_program_does_not_pass(tmp_path):
    """`python3 - <<PY || true`: the script goes on with a made-up outcome: unrehearsed, never passed."""
    refusal, targets = _run(tmp_path, _edit(INSTALL, PY_YAML.replace("TAIL", " || true")))
    at = f"{SCRIPT}:{line_in('era-c', SCRIPT, INSTALL.strip()) + 1}"
    assert refusal and f"unrehearsed from {at}" in refusal, refusal
    assert all(t.rehearsal.status == "skipped" for t in targets)


def test_a_backgrounded_final_kaniko_is_refused_every_time(tmp_path):
    exec_line = f"{SCRIPT}:{line_in('era-c', SCRIPT, 'exec /kaniko/executor')}"
    for i in range(4):
        refusal, (t, *_) = _run(tmp_path / str(i), _edit(LAST, LAST.rstrip("\n") + " &\n"))
        assert refusal and t.rehearsal.status == "failed", t.rehearsal.describe()
        # the stand-in's own record (its line) when it started before the script's end, else the job bash lists
        assert (f"the kaniko call at {exec_line} was still running when the script exited" in refusal
                or ("background jobs still running, killed with the task on the cluster" in refusal
                    and "Running exec /kaniko/executor" in refusal)), refusal


def test_a_backgrounded_kaniko_that_the_script_waits_for_plans(tmp_path):
    """The control: `… &` then `wait "$!"` runs the build to its end on the cluster too."""
    refusal, targets = _run(tmp_path, _edit(LAST, LAST.rstrip("\n") + ' &\nwait "$!"\n'))
    assert refusal is None, refusal
    assert all(t.rehearsal.status == "passed" for t in targets)


def test_an_unbound_variable_under_set_x_shows_bash_s_own_error(tmp_path):
    """The EXIT trap's own xtrace (`+++ mktemp …`) was the last stderr line, hiding bash's message."""
    refusal, (t, *_) = _run(tmp_path, _edit('  --dockerfile "$DOCKERFILE" \\\n  --build-arg WHEEL',
                                            '  --dockerfile "$DOCKERFILE$NOPE" \\\n  --build-arg WHEEL'))
    at = line_in("era-c", SCRIPT, "exec /kaniko/executor")
    assert t.rehearsal.exit_code == 1 and t.rehearsal.line == f"{SCRIPT}:{at}", t.rehearsal.describe()
    assert refusal and refusal.split(" (planned command")[0].endswith(f"line {at}: NOPE: unbound variable"), refusal


def test_the_cli_flag_reaches_the_request():
    from click.testing import CliRunner

    import starter
    from domain.operator_input import build_request

    assert "--accept-unrehearsed" in CliRunner().invoke(starter.cli, ["build", "--help"]).output
    r = build_request(architectures=["amd64"], variants=["standard"], requested_by="a", reason="r",
                      accept_unrehearsed=True)
    assert r.accept_unrehearsed and not build_request(architectures=["amd64"], variants=["standard"],
                                                      requested_by="a", reason="r").accept_unrehearsed
