# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The benchmark's timing rounds (bench/moe_forward.py) without a GPU: mok
and PyTorch timed in alternating rounds, each reported time the median of
its rounds. The GPU timer (time_ms) is replaced by a recorder."""
import importlib.util
import os
import sys
import types

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "moe_forward.py")


@pytest.fixture
def bench(monkeypatch):
    try:
        import torch  # noqa: F401
    except ImportError:
        # Only the module's top level touches torch (no GPU here).
        monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    spec = importlib.util.spec_from_file_location("moe_forward_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rounds_alternate_and_report_medians(bench, monkeypatch):
    calls = []

    def fake_time_ms(fn, budget_s):
        calls.append((fn(), budget_s))
        return calls[-1][0][1], 7

    monkeypatch.setattr(bench, "time_ms", fake_time_ms)
    mok = iter([5.0, 6.0, 5.5, 5.8, 5.9])
    ref = iter([9.0, 9.5, 9.2, 9.1, 9.4])
    result = bench.time_rounds([lambda: ("mok", next(mok)), lambda: ("torch", next(ref))],
                               4.0, 5)
    # mok, torch, mok, torch, ...: each round gets its share of the budget.
    assert [c[0][0] for c in calls] == ["mok", "torch"] * 5
    assert all(c[1] == pytest.approx(0.8) for c in calls)
    assert result == [(5.8, [5.0, 6.0, 5.5, 5.8, 5.9], 7), (9.2, [9.0, 9.5, 9.2, 9.1, 9.4], 7)]


def test_one_round_is_one_timing(bench, monkeypatch):
    monkeypatch.setattr(bench, "time_ms", lambda fn, budget_s: (fn(), 3))
    assert bench.time_rounds([lambda: 2.5], 1.0, 1) == [(2.5, [2.5], 3)]
