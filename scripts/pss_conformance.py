#!/usr/bin/env python3
"""Run tests/deploy/pod_security.py over the upstream pod-security-admission module's own fixtures.

Why: that evaluator is hand-written (the Go module cannot be built here), so its claim to follow the
module's rules is checked against the module's test/testdata/<level>/<version>/{pass,fail}/*.yaml, which
upstream generates from its checks. Those fixtures are not vendored (fetched files are not committed);
point this at a checkout:

    python scripts/pss_conformance.py <checkout of kubernetes/pod-security-admission> [--version v1.37]

It prints a table per level and kind and every disagreement, and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.deploy import pod_security as pss  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--version", default="v1.37")
    args = ap.parse_args()
    wrong: list[str] = []
    print(f"{'level':<11}{'kind':<6}{'fixtures':>9}{'agree':>7}")
    for level in ("baseline", "restricted"):
        for kind in ("pass", "fail"):
            files = sorted((args.checkout / "test" / "testdata" / level / args.version / kind).glob("*.yaml"))
            agree = 0
            for f in files:
                doc = yaml.safe_load(f.read_text())
                spec, annotations = pss.pod_template(doc)
                found = pss.violations(level, spec, annotations)
                if bool(found) == (kind == "fail"):
                    agree += 1
                else:
                    wrong.append(f"{level}/{kind}/{f.name}: {found or 'admitted'}")
            print(f"{level:<11}{kind:<6}{len(files):>9}{agree:>7}")
    if not any(True for _ in args.checkout.glob(f"test/testdata/*/{args.version}/*/*.yaml")):
        print(f"no fixtures under {args.checkout}/test/testdata/*/{args.version}", file=sys.stderr)
        return 2
    print("\n".join(wrong) or "no disagreement")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
