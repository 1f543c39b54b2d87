"""The bash reader: which branch each command runs in, and which lines it prints to the log."""

from __future__ import annotations

import pytest

from domain.contract import ContractError
from domain.contract.shell import parse_bash, printed_lines, python_prints, statements

SCRIPT = """\
if [ "$A" = 1 ] && [ -n "${B:-}" ]; then
  echo "one $A"
elif [ "$A" != 2 ] || [ -z "$C" ]; then
  echo two
else
  echo three
fi
[ "${D:-0}" = 1 ] && echo four
[[ "$E" == x ]] || { echo five >&2; exit 2; }
case "$F" in
  a|b) echo six ;;
  c*) echo seven ;;
esac
echo to-file > /tmp/f
echo piped | tr a b
cmd_that_may_fail && echo eight
"""


def _printed(text: str) -> dict[str, list]:
    out = {}
    for s in statements(parse_bash(text, "x.sh")):
        for p in printed_lines(s):
            out[p.template] = s.guards
    return out


def _holds(guards, env):
    results = [g.holds(env) for g in guards]
    return False if False in results else (None if None in results else True)


def test_branches_become_decidable_guards():
    p = _printed(SCRIPT)
    assert set(p) == {"one $A", "two", "three", "four", "six", "seven", "eight"}  # no file/pipe/stderr lines
    assert [str(g) for g in p["one $A"]] == ["A=1 and B non-empty"]
    assert _holds(p["one $A"], {"A": "1", "B": "x"}) is True and _holds(p["one $A"], {"A": "1"}) is False
    # elif: the earlier test failed, this one holds
    assert _holds(p["two"], {"A": "1", "B": "", "C": ""}) is True
    assert _holds(p["two"], {"A": "2", "C": "y"}) is False
    # else: every earlier test failed
    assert _holds(p["three"], {"A": "2", "B": "", "C": "y"}) is True
    assert _holds(p["three"], {"A": "1", "B": "x", "C": "y"}) is False
    assert _holds(p["four"], {}) is False and _holds(p["four"], {"D": "1"}) is True  # ${D:-0} supplies a default
    assert _holds(p["six"], {"F": "b"}) is True and _holds(p["six"], {"F": "c"}) is False
    assert _holds(p["seven"], {"F": "cx"}) is None  # a glob arm is kept, but not decided
    assert p["eight"] == []  # a command that must succeed adds no condition


def test_python_prints_as_patterns():
    code = ("import torch\nprint('torch', torch.__version__)\nprint(f'cuda {torch.version.cuda} ok')\n"
            "print('pct %s%%' % 5)\nprint('{} items'.format(3))\nprint(torch.__version__)\n"
            "print('err', file=sys.stderr)\n")
    assert [p.template for p in python_prints(code)] == [
        "torch $(…)", "cuda $(…) ok", "pct $(…)%", "$(…) items"]
    assert python_prints("this is not python(") == []


def test_syntax_error_names_its_line():
    with pytest.raises(ContractError) as e:
        parse_bash('echo ok\nif [ "$A" = 1 ]; then\n  echo x\n', "x.sh")
    assert e.value.file == "x.sh" and e.value.line >= 2 and "syntax" in str(e.value)
