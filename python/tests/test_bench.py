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


def load_bench_script(monkeypatch, path, name):
    """The bench script at `path` as module `name`, without a GPU (a stand-in
    torch module if torch is missing: only the scripts' top levels touch
    it), its folder on sys.path for its sibling imports."""
    try:
        import torch  # noqa: F401
    except ImportError:
        monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.syspath_prepend(os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch):
    return load_bench_script(monkeypatch, BENCH, "moe_forward_under_test")


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


POWER = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "power.py")


@pytest.fixture
def power(monkeypatch):
    """bench/power.py (power, clock and energy a step), loaded without a GPU."""
    return load_bench_script(monkeypatch, POWER, "power_under_test")


def test_power_counts_a_step_as_three_forwards(power):
    # 18 (T k + T_shared) H I: dsv3-shard's step is 9.74 TFLOP, qwen3-30b's
    # (no shared expert) 1.855.
    assert power.step_tflop(power.SHAPES["dsv3-shard"]) == pytest.approx(
        18 * (4096 * 8 + 4096) * 7168 * 2048 / 1e12)
    assert power.step_tflop(power.SHAPES["qwen3-30b"]) == pytest.approx(
        18 * 8192 * 8 * 2048 * 768 / 1e12)


class FakeSampler:
    def __init__(self, samples):
        self.samples = samples

    def window(self, t0, t1):
        return [s for s in self.samples if t0 <= s[0] <= t1]


def test_power_reports_the_second_half_of_a_burst(power, capsys):
    # (t, MHz, W, throttle reasons): the first half (t < 2) is left out;
    # of the second half's three samples two are power-capped (bit 0x4).
    samples = [(0.5, 1980.0, 300.0, 0), (1.5, 1800.0, 650.0, 4),
               (2.5, 1500.0, 690.0, 4), (3.0, 1450.0, 700.0, 4), (3.5, 1600.0, 680.0, 1)]
    power.report("mok", 20.0, 0.0, 4.0, FakeSampler(samples), 10.0)
    line = capsys.readouterr().out
    # Median of 690, 700, 680 W and of 1500, 1450, 1600 MHz; 690 W x 20 ms
    # = 13.8 J, over 10 TFLOP 1.38 J a TFLOP; 10 TFLOP in 20 ms is 500 TFLOP/s.
    assert "690.0 W" in line and "1500 MHz" in line
    assert "power-capped  67 %" in line
    assert "13.80 J" in line and "1.380 J/TFLOP" in line
    assert "500.0 TFLOP/s" in line and "(3 samples)" in line


def test_power_says_when_no_sample_fell_in_the_burst(power, capsys):
    power.report("torch", 5.0, 10.0, 11.0, FakeSampler([(1.0, 1980.0, 100.0, 0)]), 1.0)
    assert "no nvidia-smi samples" in capsys.readouterr().out


def test_power_refuses_a_variant_that_is_not_name_equals_folder(power, monkeypatch, tmp_path):
    for bad, why in [("bench-artifacts", "is not NAME=DIR"),
                     ("torch=" + str(tmp_path), "is not NAME=DIR"),
                     ("new=" + str(tmp_path / "missing"), "is not a folder")]:
        monkeypatch.setattr(sys, "argv", ["power.py", bad])
        with pytest.raises(SystemExit) as e:
            power.main()
        assert why in str(e.value)


def test_phase_flops_add_up_to_the_step(power):
    # moe_training's GEMM phases, by the profiling kernels' names, add up to
    # a step's 3 x forward FLOPs (power.py counts the step the same way).
    import moe_training
    for name in ("dsv3-shard", "qwen3-30b"):
        s = power.SHAPES[name]
        phases = moe_training.phase_flops(s)
        assert set(phases["forward"]) == {"gate/up + SwiGLU", "down"}
        assert set(phases["backward"]) == {"down dgrad + wgrad", "gate/up dgrad + wgrads"}
        total = sum(sum(p.values()) for p in phases.values())
        assert total / 1e12 == pytest.approx(power.step_tflop(s))
        # The forward is a third of it, the backward two thirds.
        assert sum(phases["forward"].values()) * 3 == total


WARM_JIT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu", "warm_jit.py")


@pytest.fixture
def warm_jit(monkeypatch):
    return load_bench_script(monkeypatch, WARM_JIT, "warm_jit_under_test")


def test_warm_jit_finds_inference_and_training_layers(warm_jit, tmp_path):
    def touch(d, *names):
        os.makedirs(tmp_path / d, exist_ok=True)
        for n in names:
            (tmp_path / d / n).write_text("")
    touch("a/top1", "moe_layer.ptx", "moe_layer.json")
    touch("a/top1-profile", "moe_layer.ptx", "moe_layer.json")
    touch("b/shape-train", "moe_layer_forward.ptx", "moe_layer_forward.json",
          "moe_layer_backward.ptx", "moe_layer_backward.json")
    touch("b/half-train", "moe_layer_forward.ptx")  # no backward: not a layer
    touch("a/.cache/x", "moe_layer.ptx", "moe_layer.json")  # the compile cache
    found = warm_jit.layers_under([str(tmp_path / "a"), str(tmp_path / "b")])
    assert found == [("inference", str(tmp_path / "a" / "top1" / "moe_layer")),
                     ("inference", str(tmp_path / "a" / "top1-profile" / "moe_layer")),
                     ("training", str(tmp_path / "b" / "shape-train"))]


def test_warm_jit_refuses_a_missing_folder_and_an_empty_one(warm_jit, monkeypatch, tmp_path):
    with pytest.raises(SystemExit) as e:
        warm_jit.layers_under([str(tmp_path / "missing")])
    assert "is not a folder" in str(e.value)
    monkeypatch.setattr(sys, "argv", ["warm_jit.py", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        warm_jit.main()
    assert "no compiled layers" in str(e.value)


AB_RUN = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu", "ab_run.sh")


@pytest.mark.parametrize("args, message", [
    ([], "usage: bash scripts/gpu/ab_run.sh [--tests DIR] NAME=DIR"),
    (["old"], "ab_run.sh: 'old' is not NAME=DIR"),
    (["old=MISSING"], "ab_run.sh: 'MISSING' (of old=MISSING) is not a folder"),
    (["--tests", "MISSING", "old=HERE"], "ab_run.sh: --tests 'MISSING' is not a folder"),
])
def test_ab_run_refuses_bad_arguments_before_touching_the_gpu(args, message, tmp_path):
    """The device call's script checks its variants before it builds or
    loads anything (a refused call costs no device time then)."""
    import subprocess
    missing, here = str(tmp_path / "missing"), str(tmp_path)
    args = [a.replace("MISSING", missing).replace("HERE", here) for a in args]
    message = message.replace("MISSING", missing)
    r = subprocess.run(["bash", AB_RUN, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert message in r.stderr


MAIN_GRAD = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "main_grad.py")


def test_main_grad_bench_loads_without_a_gpu(monkeypatch):
    """bench/main_grad.py's imports (its siblings' helpers) resolve."""
    module = load_bench_script(monkeypatch, MAIN_GRAD, "main_grad_under_test")
    assert callable(module.main) and callable(module.peak_extra_mb)
