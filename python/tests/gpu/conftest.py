# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The GPU tests: skipped without torch and a CUDA GPU; their measured
errors printed last. The layers' definitions and the float64 reference
come from the bench package (bench/cases.py, bench/torch_reference.py),
importable from the repository root (pytest.ini's pythonpath)."""
import os

import pytest

from gpu_results import BACKWARD_RESULTS, RESULTS

HERE = os.path.dirname(__file__)


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs torch and a CUDA GPU")
        here = os.path.abspath(HERE)
        for item in items:  # this hook sees the whole session's items
            if os.path.abspath(str(item.fspath)).startswith(here + os.sep):
                item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    if BACKWARD_RESULTS:
        tr.section("GPU backward against float64 autograd (relative error per gradient)")
        tr.write_line(f"{'case':32s} {'gradient':22s} {'rel err':>9s} {'max abs':>9s} "
                      f"{'bwd ms':>8s}")
        for r in BACKWARD_RESULTS:
            tr.write_line(f"{r['case']:32s} {r['grad']:22s} {r['rel']:9.2e} "
                          f"{r['max']:9.2e} {r['ms']:8.3f}")
    if not RESULTS:
        return
    tr.section("GPU forward against the float64 reference")
    tr.write_line(f"{'case':20s} {'T':>5s} {'H':>5s} {'I':>5s} {'E':>4s} {'k':>2s} "
                  f"{'rel err':>9s} {'max abs':>9s} {'ms':>8s}")
    for r in RESULTS:
        tr.write_line(f"{r['case']:20s} {r['T']:5d} {r['H']:5d} {r['I']:5d} {r['E']:4d} "
                      f"{r['k']:2d} {r['rel']:9.2e} {r['max']:9.2e} {r['ms']:8.3f}")
