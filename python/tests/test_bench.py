# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The bench package and the GPU machine's scripts, without a GPU: the
benchmarks' timing rounds and arithmetic, the compile step's layer lists,
the A/B driver, and the scripts' argument checks. The GPU timers are replaced by recorders."""
import importlib
import json
import os
import shutil
import subprocess
import sys
import types

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def bench_module(monkeypatch, name):
    """bench.<name>, imported without a GPU (a stand-in torch module if
    torch is missing: only the modules' top levels touch it)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    return importlib.import_module("bench." + name)


def load_script(path, name):
    """A script outside the package (scripts/gpu/warm_jit.py) as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch):
    return bench_module(monkeypatch, "moe_forward")


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


@pytest.fixture
def power(monkeypatch):
    """bench.power (power, clock and energy a step), loaded without a GPU."""
    return bench_module(monkeypatch, "power")


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
    from bench import moe_training
    for name in ("dsv3-shard", "qwen3-30b"):
        s = power.SHAPES[name]
        phases = moe_training.phase_flops(s)
        assert set(phases["forward"]) == {"gate/up + SwiGLU", "down"}
        assert set(phases["backward"]) == {"down dgrad + wgrad", "gate/up dgrad + wgrads"}
        total = sum(sum(p.values()) for p in phases.values())
        assert total / 1e12 == pytest.approx(power.step_tflop(s))
        # The forward is a third of it, the backward two thirds.
        assert sum(phases["forward"].values()) * 3 == total


@pytest.fixture
def warm_jit():
    return load_script(os.path.join(ROOT, "scripts", "gpu", "warm_jit.py"), "warm_jit_under_test")


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



def test_main_grad_bench_loads_without_a_gpu(monkeypatch):
    """bench.main_grad's imports (its siblings' helpers) resolve."""
    module = bench_module(monkeypatch, "main_grad")
    assert callable(module.main) and callable(module.peak_extra_mb)


@pytest.mark.parametrize("name", ["ab", "call_time", "host_overhead", "moe_training",
                                  "ncu_forward", "ncu_training"])
def test_every_tool_imports_from_the_package(monkeypatch, name):
    assert callable(bench_module(monkeypatch, name).main)


# bench.compile: the one compile step of the test layers and the shapes.

def test_compile_lists_every_test_layer_once():
    from bench import cases, compile as comp
    layers = comp.test_layers()
    names = [n for n, _, _ in layers]
    assert len(names) == len(set(names))
    assert set(names) == (set(cases.CASES) | set(cases.TRAIN_CASES) | set(cases.MAIN_GRAD_CASES)
                          | {n + "-profile" for n in comp.PROFILED})
    by_name = {n: (spec, options) for n, spec, options in layers}
    assert by_name["top1_clamp-profile"][1]["profile"] is True
    assert by_name["train_top1_clamp"][1]["training"] is True
    assert by_name["maingrad_shared_tall"][1]["main_grads"] is True
    assert by_name["ws_top1_clamp"][1]["warp_specialize"] is True
    assert by_name["shared_clamp_i64"][0]["expert_id_dtype"] == "int64"


def test_compile_shapes_and_their_twins():
    from bench import compile as comp
    forward = comp.shape_layers(["qwen3-30b-ws"], training=False, plain_only=False)
    assert [n for n, _, _ in forward] == ["qwen3-30b-ws", "qwen3-30b-ws-profile"]
    assert forward[0][2] == {"warp_specialize": True, "fuse_dispatch": None, "multicast": False}
    assert forward[1][2] == dict(forward[0][2], profile=True)
    assert forward[0][1] == {"tokens": 8192, "hidden": 2048, "intermediate": 768,
                             "experts": 128, "top_k": 8, "padding": 128}
    training = comp.shape_layers(["dsv3-shard"], training=True, plain_only=False)
    assert [(n, o) for n, _, o in training] == [
        ("dsv3-shard-train", {"training": True, "profile": False, "main_grads": False}),
        ("dsv3-shard-train-profile", {"training": True, "profile": True, "main_grads": False}),
        ("dsv3-shard-train-maingrad", {"training": True, "profile": False, "main_grads": True})]
    assert training[0][1]["shared_intermediate"] == 2048
    plain = comp.shape_layers(["dsv3-shard", "qwen3-30b"], training=True, plain_only=True)
    assert [n for n, _, _ in plain] == ["dsv3-shard-train", "qwen3-30b-train"]
    assert [n for n, _, _ in comp.shape_layers(["small-top2"], False, True)] == ["small-top2"]


def test_compile_defaults_to_the_forward_shapes():
    from bench import compile as comp
    from bench.shapes import FORWARD_SHAPES, SHAPES
    args = comp.parse_args(["shapes", "out"])
    assert [n for n, _, _ in args.layers][::2] == list(FORWARD_SHAPES) == list(SHAPES)
    assert comp.parse_args(["tests", "out", "--jobs", "3"]).jobs == 3


@pytest.mark.parametrize("argv, message", [
    (["shapes", "out", "nope"], "unknown shape(s) nope"),
    (["tests", "out", "qwen3-30b"], "SHAPE: only for the benchmark shapes"),
    (["tests", "out", "--training"], "--training: only for the benchmark shapes"),
    (["shapes", "out", "--jobs", "0"], "--jobs: expected at least 1, got 0"),
    (["shapes", "out", "--target", "sm_80"], "invalid choice: 'sm_80'"),
    (["layers", "out"], "invalid choice: 'layers'"),
])
def test_compile_refuses_bad_arguments(argv, message, capsys):
    from bench import compile as comp
    with pytest.raises(SystemExit):
        comp.parse_args(argv)
    assert message in capsys.readouterr().err


def fake_compile(out, target, name, spec, options):
    if name == "bad":
        raise ValueError("bad layer")
    return f"{out}/{name}@{target}:{spec['tokens']}:{sorted(options)}"


def test_compile_all_prints_in_order_and_stops_at_a_failure(capsys):
    from bench import compile as comp
    layers = [("b", {"tokens": 2}, {"x": 1}), ("a", {"tokens": 1}, {})]
    comp.compile_all("/o", "sm_90a", layers, 2, compile_one=fake_compile)
    assert capsys.readouterr().out == "b: /o/b@sm_90a:2:['x']\na: /o/a@sm_90a:1:[]\n"
    with pytest.raises(ValueError, match="bad layer"):
        comp.compile_all("/o", "sm_90a", [("bad", {"tokens": 1}, {})], 1,
                         compile_one=fake_compile)


# bench.ab: variants side by side.

@pytest.mark.parametrize("argv, message", [
    (["bench-artifacts"], "variant 'bench-artifacts' is not NAME=DIR"),
    (["torch=HERE"], "variant name 'torch' is taken"),
    (["a=HERE", "a=HERE"], "variant name 'a' is taken"),
    (["a=MISSING"], "variant a: MISSING is not a folder"),
])
def test_ab_refuses_bad_variants(monkeypatch, tmp_path, argv, message):
    ab = bench_module(monkeypatch, "ab")
    sub = {"HERE": str(tmp_path), "MISSING": str(tmp_path / "missing")}
    argv = [a.replace("HERE", sub["HERE"]).replace("MISSING", sub["MISSING"]) for a in argv]
    with pytest.raises(SystemExit) as e:
        ab.parse_args(argv)
    assert message.replace("MISSING", sub["MISSING"]) in str(e.value)


@pytest.mark.parametrize("argv, message", [
    (["--forward", "--data", "zeros"], "--data: training steps only"),
    (["--rounds", "0"], "--rounds: expected at least 1, got 0"),
    (["--budget", "0"], "--budget: expected seconds above 0"),
    (["--shapes"], "--shapes: expected at least one shape"),
])
def test_ab_refuses_bad_options(monkeypatch, tmp_path, capsys, argv, message):
    ab = bench_module(monkeypatch, "ab")
    with pytest.raises(SystemExit):
        ab.parse_args([f"a={tmp_path}"] + argv)
    assert message in capsys.readouterr().err


def test_ab_defaults_by_kind(monkeypatch, tmp_path):
    ab = bench_module(monkeypatch, "ab")
    training = ab.parse_args([f"a={tmp_path}"])
    forward = ab.parse_args(["--forward", f"a={tmp_path}"])
    assert (training.budget, training.data, forward.budget) == (1.0, "random", 1.5)
    assert training.variant_dirs == [("a", str(tmp_path))]


def test_ab_forward_rotates_the_variants_and_keeps_running(monkeypatch, tmp_path, capsys):
    """--forward: one bench.moe_forward run per variant and round, round r
    starting at the r-th variant, their table rows printed; a failed run
    does not stop the others, but the exit status says so."""
    ab = bench_module(monkeypatch, "ab")
    for n in ("x", "y", "z"):
        (tmp_path / n).mkdir()
    runs = []

    def fake_run(cmd, cwd, stdout, stderr, text):
        args = cmd[cmd.index("bench.moe_forward") + 1:]
        artifacts = args[args.index("--artifacts") + 1]
        name = args[args.index("--commit") + 1]
        runs.append((name, args[args.index("--out") + 1], args[args.index("--budget") + 1]))
        assert cwd == os.path.abspath(ROOT) and artifacts == str(tmp_path / name)
        out = f"noise\nshape ms\nqwen3-30b {name} row\nother line\n"
        return types.SimpleNamespace(stdout=out, returncode=3 if len(runs) == 4 else 0)

    monkeypatch.setattr(ab.subprocess, "run", fake_run)
    out = tmp_path / "out"
    args = ab.parse_args(["--forward", "--rounds", "2", "--shapes", "qwen3-30b", "--out",
                          str(out)] + [f"{n}={tmp_path / n}" for n in ("x", "y", "z")])
    with pytest.raises(SystemExit) as e:
        ab.forward_ab(args)
    assert "failed on y (round 2)" in str(e.value)
    assert [r[0] for r in runs] == ["x", "y", "z", "y", "z", "x"]
    assert runs[3][1] == str(out / "ab" / "y-2") and runs[0][2] == "1.5"
    printed = capsys.readouterr().out
    assert "== round 2: z (" in printed and "qwen3-30b x row" in printed
    # Other lines only in the failed run's tail.
    assert printed.count("noise") == printed.count("other line") == 1
    assert "bench.moe_forward failed on y (rc 3):\nnoise" in printed


AB_SH = os.path.join(ROOT, "scripts", "gpu", "ab.sh")


@pytest.mark.parametrize("args, message", [
    ([], "usage: bash scripts/gpu/ab.sh [--forward] [--tests DIR] NAME=DIR"),
    (["--forward"], "usage: bash scripts/gpu/ab.sh"),
    (["--fast", "old=HERE"], "ab.sh: unknown option '--fast'"),
    (["old"], "ab.sh: 'old' is not NAME=DIR"),
    (["old=MISSING"], "ab.sh: 'MISSING' (of old=MISSING) is not a folder"),
    (["--tests", "MISSING", "old=HERE"], "ab.sh: --tests 'MISSING' is not a folder"),
    (["--forward", "--tests", "MISSING", "old=HERE"], "ab.sh: --tests 'MISSING' is not a folder"),
])
def test_ab_sh_refuses_bad_arguments_before_touching_the_gpu(args, message, tmp_path):
    """The device call's script checks its variants before it builds or
    loads anything (a refused call costs no device time then)."""
    missing, here = str(tmp_path / "missing"), str(tmp_path)
    args = [a.replace("MISSING", missing).replace("HERE", here) for a in args]
    message = message.replace("MISSING", missing)
    r = subprocess.run(["bash", AB_SH, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert message in r.stderr


def test_compile_takes_shapes_after_the_options():
    from bench import compile as comp
    args = comp.parse_args(["shapes", "out", "--training", "--jobs", "2", "qwen3-30b",
                            "small-top2", "--plain-only"])
    assert [n for n, _, _ in args.layers] == ["qwen3-30b-train", "small-top2-train"]

