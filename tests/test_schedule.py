"""The known-slow tests run first, spread over the xdist workers (tests/schedule.py, tests/conftest.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.schedule import APART, SLOW_S, chunk_sizes, order

ROOT = Path(__file__).resolve().parents[1]


def test_every_listed_slow_test_still_exists():
    """A renamed test would silently lose its place at the head; the table must follow renames."""
    missing = []
    for nodeid in SLOW_S:
        path, _, name = nodeid.partition("::")
        func = re.sub(r"\[.*\]$", "", name)
        if not (ROOT / path).exists() or not re.search(rf"^(async )?def {re.escape(func)}\(",
                                                       (ROOT / path).read_text(), re.M):
            missing.append(nodeid)
    assert not missing, missing
    assert all(any(x in SLOW_S for x in group) for group in APART)


def test_each_workers_chunk_starts_with_its_share_of_the_slow_tests_and_nothing_is_lost():
    ids = [f"t{i}" for i in range(40)]
    slow = {"t39": 100.0, "t38": 90.0, "t5": 60.0, "t30": 50.0, "t20": 40.0}
    apart = (frozenset({"t39", "t38"}),)
    o = order(ids, 2, slow, apart)
    assert sorted(o) == list(range(40))  # a permutation: every test runs once
    first, second = [ids[i] for i in o[:20]], [ids[i] for i in o[20:]]
    assert chunk_sizes(40, 2) == [20, 20]
    # The two that must not run side by side share a chunk, longest first; the others fill the other chunk.
    assert first[:2] == ["t39", "t38"] and second[:3] == ["t5", "t30", "t20"]
    # Behind the heads, everything else keeps its collection order.
    rest = [x for x in first[2:] + second[3:]]
    assert rest == [x for x in ids if x not in slow]
    # Without ``apart`` the two longest go to different workers.
    o = order(ids, 2, slow, ())
    assert ids[o[0]] == "t39" and ids[o[20]] == "t38"


def test_one_process_runs_the_slow_tests_first_longest_first():
    ids = ["a", "b", "c", "d"]
    assert [ids[i] for i in order(ids, 1, {"d": 5.0, "c": 9.0}, ())] == ["c", "d", "a", "b"]
    assert order(ids, 2, {}, ()) == [0, 1, 2, 3]


def test_the_hook_reorders_a_real_collection():
    bench = "tests/bench/test_bench_smoke.py"
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                          "tests/test_import_graph.py", bench], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout.splitlines()
    nodes = [x for x in out if "::" in x]
    assert nodes[0] == f"{bench}::test_every_bench_runs_at_its_smoke_size_and_prints_its_table", nodes[:3]
    assert nodes[1].startswith("tests/test_import_graph.py::"), nodes[:3]  # then collection order
