#!/usr/bin/env python3
"""Writes tests/test_costs.txt from `.ci/run` logs: for every test that took at least --min
seconds, the longest time any run gave it in the plain build (the README stage, the capped unit
runs) and under the sanitizers (the stage in build-asan/, where code runs 2-4x slower and not
by the same factor for every test). tests/CMakeLists.txt sets each listed test's COST to the
time of its build's kind, so that `ctest -j2` on a clean build (no
Testing/Temporary/CTestCostData.txt yet, as in CI) starts the long tests first instead of in
definition order, and the two cores finish together instead of one idling while the other runs
the last long test (measured on the CI run of 35a38b4: 109 s of the README stage's 746 and 117
s of the sanitizer stage's 652 were one core waiting).

    tools/test_costs.py /tmp/ci.log > tests/test_costs.txt

Each output line is "<plain seconds> <sanitized seconds> <test name>" (0: not run there),
longest first; the first lines are comments."""

import argparse
import re
import sys

LINE = re.compile(r"Test +#\d+: (\S+) \.+.*?\s([0-9]+\.[0-9]+) sec")
# .ci/run's stage headers: the sanitizer stage's names build-asan, the fuzz stage's ends it
SANITIZED = re.compile(r"^== \.ci/run: .*(build-asan|AddressSanitizer)")
OTHER_STAGE = re.compile(r"^== \.ci/run: ")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="logs holding ctest's per-test lines")
    ap.add_argument("--min", type=float, default=2.0,
                    help="leave out tests shorter than this (seconds; default 2)")
    a = ap.parse_args()
    longest = {}  # name -> [plain, sanitized]
    for path in a.logs:
        sanitized = 0
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if OTHER_STAGE.match(line):
                    sanitized = 1 if SANITIZED.match(line) else 0
                m = LINE.search(line)
                if m:
                    name, secs = m.group(1), float(m.group(2))
                    t = longest.setdefault(name, [0.0, 0.0])
                    t[sanitized] = max(t[sanitized], secs)
    if not longest:
        sys.exit("test_costs.py: no ctest per-test lines ('Test #N: name ... X sec') in "
                 + ", ".join(a.logs))
    rows = sorted(((max(t), t, n) for n, t in longest.items() if max(t) >= a.min),
                  reverse=True)
    print("# CTest COST of the longer tests (tests/CMakeLists.txt): seconds in the plain build,")
    print("# seconds under the sanitizers (0: not run there), the name; written by")
    print("# tools/test_costs.py from .ci/run logs; a test not listed costs 0.")
    for _, (plain, sanitized), name in rows:
        print(f"{plain:.0f} {sanitized:.0f} {name}")


if __name__ == "__main__":
    main()
