# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(__file__))

# Fresh random inputs every run; MOK_TEST_SEED=<n> repeats a run (the seed is
# printed at the end).
SEED = int(os.environ.get("MOK_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def seed_for(name):
    """A per-test seed derived from the run's seed (stable across processes,
    unlike hash())."""
    return (SEED + zlib.crc32(name.encode())) % 2**32

# (case, quantity, relative error, max abs error) of every comparison against
# the float64 reference, printed at the end of the run.
MEASURED = []


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"random inputs from MOK_TEST_SEED={SEED}")
    if not MEASURED:
        return
    tr = terminalreporter
    tr.section("errors against the float64 reference (sum|diff| / sum|ref|, max|diff|)")
    worst = {}
    for case, what, rel, mx in MEASURED:
        tr.write_line(f"{case:28s} {what:22s} rel {rel:.2e}  max abs {mx:.2e}")
        if rel > worst.get(what, (0, ""))[0]:
            worst[what] = (rel, case)
    tr.write_line("worst per quantity: " + ", ".join(
        f"{w} {r:.2e} ({c})" for w, (r, c) in sorted(worst.items())))
