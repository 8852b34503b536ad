# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from cpu_results import MEASURED, SEED  # noqa: E402
import properties  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    # The seeds, to rerun a failure with the same inputs.
    tr.write_line(f"random inputs from MOK_TEST_SEED={SEED}; property cases from "
                  f"MOK_PROPERTY_SEED={properties.SEED} "
                  f"(MOK_PROPERTY_CASES={properties.CASES})")
    if not MEASURED:
        return
    tr.section("errors against the float64 reference (sum|diff| / sum|ref|, max|diff|)")
    worst = {}
    for case, what, rel, mx in MEASURED:
        tr.write_line(f"{case:28s} {what:22s} rel {rel:.2e}  max abs {mx:.2e}")
        if rel > worst.get(what, (0, ""))[0]:
            worst[what] = (rel, case)
    tr.write_line("worst per quantity: " + ", ".join(
        f"{w} {r:.2e} ({c})" for w, (r, c) in sorted(worst.items())))
