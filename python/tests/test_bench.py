# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The bench package and the GPU machine's scripts, without a GPU: the
benchmarks' timing rounds and arithmetic, the compile step's layer lists,
the A/B driver, the peers benchmark (its refusals, its ratios, its JSON, and
a whole run on the CPU with stand-ins for mok and the peers' harness), and
the scripts' argument checks. The GPU timers are replaced by recorders."""
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
        # The routed and shared parts add up to the whole, phase by phase.
        routed, shared = (moe_training.phase_flops(s, p) for p in ("routed", "shared"))
        for kernel in phases:
            for k, f in phases[kernel].items():
                assert routed[kernel][k] + shared[kernel][k] == f


def test_phase_peak_cycles_count_fp8_routed_gemms_at_twice_the_rate(power):
    from bench import moe_training
    bf16, fp8 = power.SHAPES["dsv3-shard"], power.SHAPES["dsv3-shard-fp8ws"]
    sms = 132
    b, f = moe_training.phase_peak_cycles(bf16, sms), moe_training.phase_peak_cycles(fp8, sms)
    # dsv3-shard's forward gate/up: routed 1.924 TFLOP, shared 0.241 TFLOP.
    routed = 4 * 4096 * 8 * 2048 * 7168
    shared = 4 * 4096 * 2048 * 7168
    assert b["forward"]["gate/up + SwiGLU"] == pytest.approx((routed + shared) / 4096 / sms)
    assert f["forward"]["gate/up + SwiGLU"] == pytest.approx(
        (routed / 8192 + shared / 4096) / sms)
    # Without a shared expert, FP8's phases need half bf16's cycles.
    q, q8 = power.SHAPES["qwen3-30b"], power.SHAPES["qwen3-30b-fp8ws"]
    for kernel, phases in moe_training.phase_peak_cycles(q, sms).items():
        for k, c in phases.items():
            assert moe_training.phase_peak_cycles(q8, sms)[kernel][k] == pytest.approx(c / 2)


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
                                  "ncu_forward", "ncu_training", "peers"])
def test_every_tool_imports_from_the_package(monkeypatch, name):
    assert callable(bench_module(monkeypatch, name).main)


# bench.compile: the one compile step of the test layers and the shapes.

def test_compile_lists_every_test_layer_once():
    from bench import cases, compile as comp
    layers = comp.test_layers()
    names = [n for n, _, _ in layers]
    assert len(names) == len(set(names))
    assert set(names) == (set(cases.CASES) | set(cases.TRAIN_CASES) | set(cases.MAIN_GRAD_CASES)
                          | set(cases.ANY_TOKENS_CASES) | set(cases.FP8_CASES)
                          | set(cases.FP8_TRAIN_CASES) | set(cases.MX_CASES)
                          | {n + "-profile" for n in comp.PROFILED}
                          | set(cases.EP_CASES) | {n + "-ep1" for n in cases.EP_CASES}
                          | set(cases.EP_TRAIN_CASES)
                          | {n + "-ep1" for n in cases.EP_TRAIN_CASES}
                          | {"ep4_shared-self", "train_ep4_shared-self"})
    by_name = {n: (spec, options) for n, spec, options in layers}
    for name in ("ep4_shared-self", "train_ep4_shared-self"):
        assert by_name[name][1]["self_exchange"] is True
        assert by_name[name][0] == by_name[name.replace("-self", "-ep1")][0]
    assert by_name["top1_clamp-profile"][1]["profile"] is True
    assert by_name["train_top1_clamp"][1]["training"] is True
    assert by_name["maingrad_shared_tall"][1]["main_grads"] is True
    assert by_name["ws_top1_clamp"][1]["warp_specialize"] is True
    assert by_name["shared_clamp_i64"][0]["expert_id_dtype"] == "int64"
    # An expert-parallel case and its ep = 1 twin over all the experts.
    assert by_name["ep2_capacity"][0]["ep"] == 2
    assert by_name["ep2_capacity"][0]["recv_capacity"] == 40
    assert "ep" not in by_name["ep2_capacity-ep1"][0]
    assert "recv_capacity" not in by_name["ep2_capacity-ep1"][0]
    assert by_name["ep4_any_tokens-ep1"][0]["max_tokens"] == 128
    assert by_name["train_ep4_shared-ep1"][0]["tokens"] == 4 * 64
    assert by_name["maingrad_ep2"][1]["main_grads"] is True
    # The FP8 layers: precision in the spec, scalar GEMMs asked for.
    assert by_name["fp8_skewed"][0]["precision"] == "fp8"
    assert by_name["fp8_skewed"][1]["tensor_cores"] is False
    assert by_name["fp8_shared_clamp_wgmma_given"][1]["fp8_quantized_weights"] is True


def test_compile_shapes_and_their_twins():
    from bench import compile as comp
    forward = comp.shape_layers(["qwen3-30b-ws"], training=False, plain_only=False)
    assert [n for n, _, _ in forward] == ["qwen3-30b-ws", "qwen3-30b-ws-profile"]
    assert forward[0][2] == {"warp_specialize": True, "fuse_dispatch": None, "multicast": False,
                             "fp8_quantized_weights": False}
    assert forward[1][2] == dict(forward[0][2], profile=True)
    assert forward[0][1] == {"tokens": 8192, "hidden": 2048, "intermediate": 768,
                             "experts": 128, "top_k": 8, "padding": 128}
    training = comp.shape_layers(["dsv3-shard"], training=True, plain_only=False)
    assert [(n, o) for n, _, o in training] == [
        ("dsv3-shard-train", {"training": True, "profile": False, "main_grads": False}),
        ("dsv3-shard-train-profile", {"training": True, "profile": True, "main_grads": False}),
        ("dsv3-shard-train-maingrad", {"training": True, "profile": False, "main_grads": True})]
    assert training[0][1]["shared_intermediate"] == 2048
    plain = comp.shape_layers(["dsv3-routed", "qwen3-30b"], training=True, plain_only=True)
    assert [n for n, _, _ in plain] == ["dsv3-routed-train", "qwen3-30b-train"]
    assert "shared_intermediate" not in plain[0][1]
    assert [n for n, _, _ in comp.shape_layers(["small-top2"], False, True)] == ["small-top2"]


def test_compile_defaults_to_the_forward_shapes_not_the_peers_one():
    from bench import compile as comp
    from bench.shapes import FORWARD_SHAPES, SHAPES
    args = comp.parse_args(["shapes", "out"])
    assert [n for n, _, _ in args.layers][::2] == list(FORWARD_SHAPES)
    assert "dsv3-routed" in SHAPES and "dsv3-routed" not in FORWARD_SHAPES
    assert comp.parse_args(["tests", "out", "--jobs", "3"]).jobs == 3
    # The FP8 shapes: the training layers take the quantized weights of
    # "-fp8w" (both layouts); "-fp8ws"'s training forward takes warp roles.
    assert SHAPES["dsv3-shard-fp8"]["precision"] == "fp8"
    assert "dsv3-shard-fp8" in [n for n, _, _ in args.layers]
    by_name = {n: (spec, options) for n, spec, options in args.layers}
    assert by_name["dsv3-shard-fp8w"][1]["fp8_quantized_weights"] is True
    assert by_name["dsv3-shard-fp8w-profile"][1]["fp8_quantized_weights"] is True
    assert by_name["dsv3-shard-fp8"][1]["fp8_quantized_weights"] is False
    training = {n: o for n, _, o in comp.parse_args(["shapes", "out", "--training"]).layers}
    assert "dsv3-shard-train" in training and "dsv3-shard-fp8-train" in training
    assert training["dsv3-shard-fp8w-train"]["fp8_quantized_weights"] is True
    assert "fp8_quantized_weights" not in training["dsv3-shard-fp8-train"]
    assert "warp_specialize" not in training["dsv3-shard-fp8w-train"]
    assert training["dsv3-shard-fp8ws-train"] == dict(
        training["dsv3-shard-fp8w-train"], warp_specialize=True)
    assert training["dsv3-shard-ws-train"]["warp_specialize"] is True


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


@pytest.mark.parametrize("args, message", [
    (["--bench-peers"], "--bench-peers needs .peers/peer_bench.py"),
    (["--peers"],
     "usage: bash scripts/gpu/run_h200.sh [--bench | --bench-training | --bench-peers]"),
])
def test_run_h200_refuses_before_touching_the_gpu(args, message, tmp_path):
    """A copy of run_h200.sh in a tree without .peers/: --bench-peers stops
    first, naming what to carry."""
    (tmp_path / "scripts" / "gpu").mkdir(parents=True)
    script = tmp_path / "scripts" / "gpu" / "run_h200.sh"
    shutil.copy(os.path.join(ROOT, "scripts", "gpu", "run_h200.sh"), script)
    r = subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, OUT=str(tmp_path)))
    assert r.returncode == 2
    assert message in r.stderr


# bench.peers: mok beside the open-source kernels.

def peer_layer_json(path, shape, access="tensor_maps", ids="i32", **override):
    """Writes the metadata of a training layer of `shape` (a SHAPES entry)
    under `path`, as bench.compile would (the PTX files empty)."""
    T, H, I, E, k = (shape[n] for n in ("tokens", "hidden", "intermediate", "experts", "top_k"))
    inputs = {"x": ("bf16", [T, H]), "top_experts": (ids, [T, k]),
              "router_weights": ("f32", [T, k]), "gate_weights": ("bf16", [E, I, H]),
              "up_weights": ("bf16", [E, I, H]), "down_weights": ("bf16", [E, H, I])}
    inputs.update(override)
    params = [dict(name=n, dtype=d, shape=s, role="input",
                   **({"access": access} if n.endswith("_weights") and n != "router_weights"
                      else {})) for n, (d, s) in inputs.items()]
    params.append(dict(name="out", dtype="bf16", shape=[T, H], role="output"))
    os.makedirs(path, exist_ok=True)
    for kind in ("forward", "backward"):
        with open(os.path.join(path, f"moe_layer_{kind}.json"), "w") as f:
            json.dump({"params": params, "chip": "sm_90a"}, f)
        open(os.path.join(path, f"moe_layer_{kind}.ptx"), "w").close()


@pytest.fixture
def peers(monkeypatch):
    return bench_module(monkeypatch, "peers")


@pytest.fixture
def peer_artifacts(tmp_path, peers):
    for name in ("dsv3-routed", "qwen3-30b"):
        peer_layer_json(str(tmp_path / "art" / (name + "-train")), peers.SHAPES[name])
    return str(tmp_path / "art")


def test_peers_defaults(peers, peer_artifacts):
    args = peers.parse_args(["--artifacts", peer_artifacts])
    assert args.shapes == ["dsv3-routed", "qwen3-30b"]
    assert (args.iters, args.rounds, args.liger_tune, args.sonic_tune) == (20, 3, "small", "off")
    assert args.peer_list[:4] == ["moe_ops", "scattermoe", "liger_fused_moe", "hf_grouped_mm"]
    assert args.layer_paths["qwen3-30b"] == os.path.join(peer_artifacts, "qwen3-30b-train")
    assert peers.parse_args(["--artifacts", peer_artifacts, "--peers", "moe_ops, scattermoe",
                             "--shapes", "qwen3-30b"]).peer_list == ["moe_ops", "scattermoe"]


def test_peers_default_list_adds_sonicmoe_when_installed(peers):
    assert peers.default_peers(lambda n: None) == list(peers.DEFAULT_PEERS)
    assert peers.default_peers(lambda n: object())[-1] == "sonicmoe"

    def broken(name):
        raise ImportError(name)
    assert "sonicmoe" not in peers.default_peers(broken)


@pytest.mark.parametrize("argv, message", [
    (["--iters", "19"], "--iters: expected at least 20 (a median of 20 calls), got 19"),
    (["--warmup", "0"], "--warmup: expected at least 1, got 0"),
    (["--rounds", "0"], "--rounds: expected at least 1, got 0"),
    (["--budget-s", "0"], "--budget-s: expected seconds above 0"),
    (["--shapes", "nope"], "--shapes: unknown shape 'nope'"),
    (["--shapes", "dsv3-shard"], "dsv3-shard has a shared expert; the peers compute routed"),
    (["--shapes", "qwen3-30b-skewed"], "qwen3-30b-skewed has zipf routing"),
    (["--shapes", "qwen3-30b", "qwen3-30b"], "--shapes: a shape given twice"),
    (["--peers", "moe_ops,,liger"], "--peers: expected comma-separated peer names"),
    (["--peers", "mok,moe_ops"], "--peers: mok always run"),
    (["--peers", "torch_ref"], "--peers: torch_ref always run"),
    (["--peers", "moe_ops,moe_ops"], "--peers: a peer given twice"),
    (["--liger-tune", "huge"], "invalid choice: 'huge'"),
])
def test_peers_refuse_bad_arguments(peers, peer_artifacts, capsys, argv, message):
    with pytest.raises(SystemExit):
        peers.parse_args(["--artifacts", peer_artifacts] + argv)
    assert message in capsys.readouterr().err


def test_peers_refuse_a_clamped_shape(peers, peer_artifacts, monkeypatch, capsys):
    monkeypatch.setitem(peers.SHAPES, "clamped", dict(peers.SHAPES["qwen3-30b"],
                                                      swiglu_limit=7.0))
    with pytest.raises(SystemExit):
        peers.parse_args(["--artifacts", peer_artifacts, "--shapes", "clamped"])
    assert "clamped has a SwiGLU clamp" in capsys.readouterr().err


@pytest.mark.parametrize("layer, message", [
    (None, "no training layer of qwen3-30b at ART/qwen3-30b-train (missing "
           "moe_layer_forward.ptx, moe_layer_forward.json, moe_layer_backward.ptx, "
           "moe_layer_backward.json); compile it: python3 -m bench.compile shapes ART "
           "--training --plain-only qwen3-30b"),
    (dict(shared_gate_weights=("bf16", [768, 2048])), "takes {"),
    (dict(gate_weights=("bf16", [128, 512, 2048])), "the peers' qwen3-30b is {"),
    (dict(access="pointer"), "reads gate_weights, up_weights by pointer"),
    (dict(ids="f32"), "top_experts is f32, expected i32 or i64"),
])
def test_peers_refuse_a_layer_that_is_not_the_peers_shape(peers, tmp_path, capsys, layer, message):
    art = str(tmp_path / "art")
    os.makedirs(art)
    if layer is not None:
        kwargs = {k: layer.pop(k) for k in ("access", "ids") if k in layer}
        peer_layer_json(os.path.join(art, "qwen3-30b-train"), peers.SHAPES["qwen3-30b"],
                        **kwargs, **layer)
    with pytest.raises(SystemExit):
        peers.parse_args(["--artifacts", art, "--shapes", "qwen3-30b"])
    assert message.replace("ART", art) in capsys.readouterr().err


def test_peers_accept_int64_ids(peers, tmp_path):
    peer_layer_json(str(tmp_path / "qwen3-30b-train"), peers.SHAPES["qwen3-30b"], ids="i64")
    assert peers.check_artifact(str(tmp_path), "qwen3-30b")


def test_peers_refuse_a_peer_bench_that_is_not_one(peers, tmp_path):
    with pytest.raises(ValueError, match="--peer-bench: .*missing.py is not a file"):
        peers.load_peer_bench(str(tmp_path / "missing.py"))
    (tmp_path / "other.py").write_text("PEER_CLASSES = {}\ndef time_fn(): pass\n")
    with pytest.raises(ValueError, match="has no make_inputs, run_once, torch_ref_fwd"):
        peers.load_peer_bench(str(tmp_path / "other.py"))
    pb = types.SimpleNamespace(PEER_CLASSES={"torch_ref": 0, "moe_ops": 0, "liger_fused_moe": 0})
    peers.check_peer_names(pb, ["moe_ops"])
    with pytest.raises(ValueError, match="unknown peer.s. sonicmoe, x; .* has moe_ops, "
                                         "liger_fused_moe"):
        peers.check_peer_names(pb, ["sonicmoe", "moe_ops", "x"])


def result(fwd_ms, fwdbwd_ms, check="ok", status="ok"):
    return dict(status=status, check=check, fwd_ms=fwd_ms, fwdbwd_ms=fwdbwd_ms)


def test_peers_best_peer_and_ratios(peers):
    """The best peer is the fastest that passed its check, per direction;
    the ratios are mok's TFLOP/s over the others'."""
    flops = 6 * 8192 * 8 * 2048 * 768
    results = {"mok": result(1.0, 4.0), "torch_ref": result(2.0, 6.0),
               "moe_ops": result(1.25, 5.0), "liger_fused_moe": result(1.5, 4.8),
               "scattermoe": result(0.5, 1.0, check="MISMATCH (>2.0e-02 vs gold)"),
               "hf_grouped_mm": {"status": "error", "error": "boom"},
               "sonicmoe": {"status": "skipped: time budget"}}
    s = peers.summarize(results, flops)
    fwd, both = s["forward"], s["forward_backward"]
    assert (fwd["best_peer"], both["best_peer"]) == ("moe_ops", "liger_fused_moe")
    assert fwd["mok_over_best_peer"] == pytest.approx(1.25)
    assert both["mok_over_best_peer"] == pytest.approx(1.2)
    assert fwd["mok_over_torch"] == pytest.approx(2.0)
    assert both["mok_over_torch"] == pytest.approx(1.5)
    assert fwd["mok_tflops"] == pytest.approx(flops / 1e-3 / 1e12)
    assert both["best_peer_tflops"] == pytest.approx(3 * flops / 4.8e-3 / 1e12)
    assert results["scattermoe"]["fwd_tflops"] == pytest.approx(2 * fwd["mok_tflops"])
    assert results["moe_ops"]["fwdbwd_tflops"] == pytest.approx(3 * flops / 5e-3 / 1e12)
    assert "fwd_tflops" not in results["hf_grouped_mm"]
    assert fwd["mok_check"] == "ok"


def test_peers_no_ratio_without_a_checked_side(peers):
    s = peers.summarize({"mok": result(1.0, 3.0, check="MISMATCH (>3e-2 vs torch_ref)"),
                         "torch_ref": result(2.0, 6.0), "moe_ops": result(1.5, 4.0)}, 10**12)
    assert s["forward"]["best_peer"] == "moe_ops"
    assert s["forward"]["mok_over_best_peer"] is None and s["forward"]["mok_ms"] is None
    assert s["forward"]["mok_check"].startswith("MISMATCH")
    s = peers.summarize({"mok": result(1.0, 3.0), "torch_ref": {"status": "error"},
                         "moe_ops": {"status": "unavailable"}}, 10**12)
    assert s["forward_backward"]["best_peer"] is None
    assert s["forward_backward"]["mok_over_best_peer"] is None
    assert s["forward_backward"]["mok_over_torch"] is None
    assert s["forward_backward"]["mok_ms"] == 3.0


def test_peers_rotation(peers):
    names = ["mok", "torch_ref", "a", "b"]
    assert [peers.rotation(names, r) for r in range(5)] == [
        names, ["torch_ref", "a", "b", "mok"], ["a", "b", "mok", "torch_ref"],
        ["b", "mok", "torch_ref", "a"], names]


SUMMARY_KEYS = {"mok_ms", "mok_tflops", "torch_ms", "torch_tflops", "best_peer",
                "best_peer_ms", "best_peer_tflops", "mok_over_best_peer", "mok_over_torch",
                "mok_check"}


def check_document(doc, peer_names):
    """The JSON's schema: what docs/performance.md cites from it."""
    assert doc["benchmark"] == "bench.peers"
    for key in ("date", "commit", "gpu", "torch", "method", "peers", "shapes"):
        assert key in doc, key
    for key in ("timing", "flops", "routing", "iters", "warmup", "rounds", "peer_bench_sha256"):
        assert key in doc["method"], key
    for s in doc["shapes"]:
        for key in ("shape", "T", "H", "I", "E", "k", "flops_fwd", "results"):
            assert key in s, key
        assert s["flops_fwd"] == 6 * s["T"] * s["k"] * s["H"] * s["I"]
        assert list(s["results"])[:2] == ["mok", "torch_ref"]
        assert set(s["results"]) == {"mok", "torch_ref", *peer_names}
        for mode in ("forward", "forward_backward"):
            assert set(s[mode]) == SUMMARY_KEYS
        for r in s["results"].values():
            if r["status"] == "ok":
                assert {"fwd_ms", "fwd_tflops", "fwdbwd_ms", "fwdbwd_tflops", "check",
                        "worst_rel_l2_vs_ref"} <= set(r)
    json.loads(json.dumps(doc))


def test_peers_json_without_matplotlib(peers, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    results = {"mok": dict(result(1.0, 3.0), worst_rel_l2_vs_ref=1e-3),
               "torch_ref": dict(result(2.0, 6.0), worst_rel_l2_vs_ref=0.0),
               "moe_ops": {"status": "unavailable"}}
    entry = peers.shape_entry("qwen3-30b", 6 * 8192 * 8 * 2048 * 768, results)
    doc = peers.document({"commit": "abc", "gpu": "G", "torch": "2"},
                         {"timing": "t", "flops": "f", "routing": "r", "iters": 20, "warmup": 5,
                          "rounds": 3, "peer_bench_sha256": "0"}, {}, [entry])
    written = peers.write_outputs(str(tmp_path / "o"), doc)
    assert written == [str(tmp_path / "o" / "peers_bench.json")]
    with open(written[0]) as f:
        check_document(json.load(f), ["moe_ops"])
    assert entry["forward"]["mok_over_torch"] == pytest.approx(2.0)


# A stand-in for the peers' harness (the API bench.peers uses), on the CPU:
# each contestant's call adds its made-up milliseconds to CLOCK, which the
# timer reads, and names itself in CALLS.
FAKE_PEER_BENCH = '''
import torch
import torch.nn.functional as F

CLOCK = [0.0]
CALLS = []


def reference(x, w, idx, W13, Wd):
    I = Wd.shape[2]
    gu = torch.einsum("th,tkih->tki", x, W13[idx])
    h = F.silu(gu[..., :I]) * gu[..., I:]
    return torch.einsum("tk,tki,tkhi->th", w.to(h.dtype), h, Wd[idx].to(h.dtype)).to(x.dtype)


torch_ref_fwd = gold_fwd = reference


class Peer:
    variant = "made up"

    def __init__(self, name, ms, scale=1.0, load_error=None):
        self.name, self.ms, self.scale, self.load_error = name, ms, scale, load_error

    def load(self, args, dev):
        assert args.liger_tune in ("small", "full", "off")
        if self.load_error:
            raise ImportError(self.load_error)

    def versions(self):
        return {"peer": "1.0"}

    def fwd(self, x, w, idx, W13, Wd):
        CLOCK[0] += self.ms
        CALLS.append(self.name)
        return reference(x, w, idx, W13, Wd) * self.scale


PEER_CLASSES = {"torch_ref": lambda: Peer("torch_ref", 3.0),
                "fast": lambda: Peer("fast", 1.0),
                "wrong": lambda: Peer("wrong", 0.5, scale=2.0),
                "missing": lambda: Peer("missing", 1.0, load_error="no module named missing")}


def make_inputs(T, H, I, E, k, dev, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).requires_grad_()
    idx = torch.randn(T, E, generator=g).topk(k, dim=1).indices
    w = torch.softmax(torch.randn(T, k, generator=g), 1).requires_grad_()
    W13 = (torch.randn(E, 2 * I, H, generator=g) * H ** -0.5).requires_grad_()
    Wd = (torch.randn(E, H, I, generator=g) * I ** -0.5).requires_grad_()
    return x, w, idx, W13, Wd, torch.randn(T, H, generator=g)


def run_once(fwd, leaves, idx, go):
    x, w, W13, Wd = leaves
    out = fwd(x, w, idx, W13, Wd)
    dx, dw, dW13, dWd = torch.autograd.grad(out, (x, w, W13, Wd), go)
    return {"out": out.detach(), "dx": dx, "dw": dw, "dW13": dW13, "dWd": dWd}


def compare(res, ref):
    return {k: {"rel_l2": float((res[k].double() - ref[k].double()).norm()
                                / ref[k].double().norm())} for k in ref}


def worst(errs):
    return max(e["rel_l2"] for e in errs.values())


def verdict(r, case):
    assert "torch_ref" in case["results"]
    return "ok" if r["worst_rel_l2_vs_gold"] <= 1e-4 else "MISMATCH"


def time_fn(fn, dev, warmup, iters):
    CLOCK[0] = 0.0
    fn()
    return {"median_ms": CLOCK[0], "min_ms": CLOCK[0], "max_ms": CLOCK[0], "n": iters}


def matmul_ceiling(dev):
    raise AssertionError("not on the CPU")


def pkg_version(name):
    return None


def gpu_info():
    return {"nvidia_smi": "none"}
'''


class FakeMokLayer:
    """mok's training layer on the CPU: the harness's reference under
    autograd; 0.8 ms a forward and 1.6 a backward on the harness's clock."""

    def __init__(self, pb, ids, poisoned):
        self.pb, self.ids, self.poisoned, self.fc1 = pb, ids, poisoned, None

    def bind_fc1(self, fc1):
        assert not fc1.requires_grad
        self.fc1 = fc1

    def forward(self, x, top_experts, router_weights, down_weights):
        import torch
        assert self.fc1 is not None and top_experts.dtype == self.ids
        assert not (x.requires_grad or router_weights.requires_grad or down_weights.requires_grad)
        self.pb.CLOCK[0] += 0.8
        self.pb.CALLS.append("mok")
        leaves = [t.detach().clone().requires_grad_() for t in (x, router_weights, self.fc1,
                                                                 down_weights)]
        with torch.enable_grad():
            out = self.pb.reference(leaves[0], leaves[1], top_experts.long(), leaves[2],
                                    leaves[3])
        return out.detach(), (out, leaves)

    def backward(self, ctx, d_out):
        import torch
        self.pb.CLOCK[0] += 1.6
        out, leaves = ctx
        dx, dw, d13, dd = torch.autograd.grad(out, leaves, d_out)
        I = dd.shape[2]
        return {"x": dx, "router_weights": dw, "gate_weights": d13[:, :I],
                "up_weights": d13[:, I:], "down_weights": dd}


def fake_mok(pb, loads):
    import torch

    class Artifact:
        def __init__(self, path):
            with open(os.path.join(path, "moe_layer_forward.json")) as f:
                self.forward = types.SimpleNamespace(metadata=json.load(f))

        @staticmethod
        def from_files(path):
            return Artifact(path)

        def load(self, poison_outputs=False):
            loads.append(poison_outputs)
            ids = {p["name"]: p["dtype"] for p in self.forward.metadata["params"]}
            return FakeMokLayer(pb, {"i32": torch.int32, "i64": torch.int64}[ids["top_experts"]],
                                poison_outputs)
    return types.SimpleNamespace(GpuTrainingArtifact=Artifact)


TINY = dict(tokens=12, hidden=16, intermediate=8, experts=4, top_k=2, padding=8,
            routing="uniform")


@pytest.fixture
def tiny_run(peers, tmp_path, monkeypatch):
    """(bench.peers's args for the tiny shape, the fake harness, mok's loads)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setitem(peers.SHAPES, "tiny", TINY)
    (tmp_path / "peer_bench.py").write_text(FAKE_PEER_BENCH)
    peer_layer_json(str(tmp_path / "art" / "tiny-train"), TINY)
    pb = peers.load_peer_bench(str(tmp_path / "peer_bench.py"))
    torch.manual_seed(0)

    def args(*extra):
        return peers.parse_args(["--artifacts", str(tmp_path / "art"), "--shapes", "tiny",
                                 "--peer-bench", str(tmp_path / "peer_bench.py"),
                                 "--peers", "fast,wrong,missing", "--rounds", "2",
                                 "--out", str(tmp_path / "out"), "--commit", "c0ffee",
                                 *extra])
    return args, pb


def test_peers_whole_run_on_the_cpu(peers, tiny_run, capsys):
    """The run's plumbing with stand-ins: mok checked (poisoned layer) then
    timed (plain one) on the shared W13 with int32 ids; the peers loaded,
    checked and timed in rotating rounds; a peer that fails its check gets
    no ratio; the JSON written."""
    import torch
    args, pb = tiny_run
    args = args()
    loads = []
    doc = peers.run(args, pb, mok=fake_mok(pb, loads), dev=torch.device("cpu"))
    assert loads == [True, False]
    assert doc["peers"]["missing"] == {"status": "unavailable",
                                       "error": "ImportError: no module named missing"}
    (s,) = doc["shapes"]
    r = s["results"]
    assert list(r) == ["mok", "torch_ref", "fast", "wrong", "missing"]
    assert (r["mok"]["check"], r["fast"]["check"], r["wrong"]["check"]) == ("ok", "ok",
                                                                            "MISMATCH")
    assert r["missing"] == {"status": "unavailable"}
    # mok: 0.8 ms forward, + 1.6 backward; a peer's clock moves in its forward.
    assert (r["mok"]["fwd_ms"], r["mok"]["fwdbwd_ms"]) == (pytest.approx(0.8),
                                                           pytest.approx(2.4))
    assert r["mok"]["fwd_ms_rounds"] == [pytest.approx(0.8)] * 2
    assert (r["torch_ref"]["fwd_ms"], r["fast"]["fwdbwd_ms"]) == (3.0, 1.0)
    assert s["forward"]["best_peer"] == "fast"  # "wrong" is faster, but wrong
    assert s["forward"]["mok_over_best_peer"] == pytest.approx(1.25)
    assert s["forward_backward"]["mok_over_best_peer"] == pytest.approx(1 / 2.4)
    assert s["forward"]["mok_over_torch"] == pytest.approx(3.75)
    # The timings: round 1 mok, torch_ref, fast, wrong (each forward, then
    # forward + backward), round 2 rotated by one.
    timed = pb.CALLS[-16:]
    assert timed[::2] == ["mok", "torch_ref", "fast", "wrong", "torch_ref", "fast", "wrong",
                          "mok"]
    check_document(doc, ["fast", "wrong", "missing"])
    assert peers.mok_failures(doc) == []
    r["mok"]["check"] = "MISMATCH (>2.0e-02 vs gold)"
    assert peers.mok_failures(doc) == ["tiny (MISMATCH (>2.0e-02 vs gold))"]
    r["mok"]["check"] = "ok"
    assert (doc["commit"], doc["gpu"], doc["matmul_8192_tflops"]) == ("c0ffee", "cpu", None)
    with open(os.path.join(args.out, "peers_bench.json")) as f:
        assert json.load(f)["shapes"][0]["forward"] == json.loads(json.dumps(s["forward"]))
    peers.print_tables(doc)
    out = capsys.readouterr().out
    assert "tiny         forward" in out and "fast" in out and "1.250x" in out


def test_peers_skip_peers_past_the_budget(peers, tiny_run):
    """Past --budget-s no peer starts (their first calls compile and
    autotune); mok and PyTorch are still timed."""
    import torch
    args, pb = tiny_run
    args = args("--budget-s", "1e-9")
    doc = peers.run(args, pb, mok=fake_mok(pb, []), dev=torch.device("cpu"))
    r = doc["shapes"][0]["results"]
    assert r["fast"] == r["wrong"] == {"status": "skipped: time budget"}
    assert r["mok"]["status"] == r["torch_ref"]["status"] == "ok"
    assert doc["shapes"][0]["forward"]["best_peer"] is None
    assert doc["shapes"][0]["forward"]["mok_over_torch"] == pytest.approx(3.75)


def test_peers_record_a_mok_failure_and_still_time_the_peers(peers, tiny_run):
    import torch
    args, pb = tiny_run
    mok = fake_mok(pb, [])
    bad = mok.GpuTrainingArtifact.load

    def load(self, poison_outputs=False):
        layer = bad(self, poison_outputs)
        layer.bind_fc1 = lambda fc1: (_ for _ in ()).throw(ValueError("fc1: refused"))
        return layer
    mok.GpuTrainingArtifact.load = load
    doc = peers.run(args(), pb, mok=mok, dev=torch.device("cpu"))
    s = doc["shapes"][0]
    assert s["results"]["mok"] == {"status": "error", "error": "ValueError: fc1: refused"}
    assert peers.mok_failures(doc) == ["tiny (ValueError: fc1: refused)"]
    assert s["forward"]["mok_over_best_peer"] is None
    assert s["results"]["fast"]["fwd_ms"] == 1.0


def test_peers_a_contestant_failing_its_timing_leaves_the_rounds(peers):
    calls = []

    def time_fn(fn, dev, warmup, iters):
        calls.append((fn(), warmup))
        if calls[-1][0] == "bad" and len(calls) > 2:
            raise RuntimeError("illegal memory access")
        return {"median_ms": 2.0, "min_ms": 1.5}
    pb = types.SimpleNamespace(time_fn=time_fn)
    fns = {n: (lambda n=n: n, lambda n=n: n) for n in ("good", "bad")}
    results = {"good": {"status": "ok"}, "bad": {"status": "ok", "check": "ok"}}
    args = types.SimpleNamespace(rounds=3, warmup=5, iters=20)
    peers.time_contestants(pb, fns, ["good", "bad"], results, args, None)
    # Round 1: good's two timings, bad's first raises; rounds 2 and 3 good alone.
    assert [c[0] for c in calls] == ["good", "good", "bad"] + ["good"] * 4
    assert [c[1] for c in calls[:2]] == [5, 2]
    assert results["bad"] == {"status": "error", "check": "ok",
                              "error": "timing: RuntimeError: illegal memory access"}
    assert results["good"]["fwd_ms_rounds"] == [2.0, 2.0, 2.0]
    assert (results["good"]["fwdbwd_ms"], results["good"]["fwd_min_ms"]) == (2.0, 1.5)


def test_compile_takes_shapes_after_the_options():
    from bench import compile as comp
    args = comp.parse_args(["shapes", "out", "--training", "--jobs", "2", "qwen3-30b",
                            "small-top2", "--plain-only"])
    assert [n for n, _, _ in args.layers] == ["qwen3-30b-train", "small-top2-train"]


def test_peers_chart_with_matplotlib(peers, tiny_run):
    """With matplotlib (the GPU machine's), the run's chart beside its JSON."""
    pytest.importorskip("matplotlib")
    import torch
    args, pb = tiny_run
    args = args()
    peers.run(args, pb, mok=fake_mok(pb, []), dev=torch.device("cpu"))
    doc = json.load(open(os.path.join(args.out, "peers_bench.json")))
    written = peers.write_outputs(args.out, doc)
    assert written[1] == os.path.join(args.out, "peers_bench.png")
    with open(written[1], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_any_tokens_benchmark_compiles_fixed_and_any_t_twins():
    from bench import any_tokens
    from bench.shapes import SHAPES
    layers = {n: (spec, options) for n, spec, options in any_tokens.layers_to_compile(
        ["qwen3-30b"])}
    assert sorted(layers) == ["qwen3-30b", "qwen3-30b-anyt", "qwen3-30b-anyt-train",
                              "qwen3-30b-train"]
    fixed, anyt = layers["qwen3-30b"][0], layers["qwen3-30b-anyt"][0]
    assert fixed["tokens"] == SHAPES["qwen3-30b"]["tokens"] and "max_tokens" not in fixed
    assert anyt["tokens"] is None and anyt["max_tokens"] == fixed["tokens"]
    assert layers["qwen3-30b-anyt-train"][1] == {"training": True}
    # Every spec is a valid LayerSpec.
    import mok
    for spec, _ in layers.values():
        mok.LayerSpec(**spec)


def test_relative_error_of_an_all_zero_reference():
    """One token whose routes are all dropped has an all-zero output: the
    error is then the output's own size, 0 for exact zeros, never 0/0."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from bench import torch_reference
    zero = torch.zeros(1, 8, dtype=torch.float64)
    assert torch_reference.relative_error(torch.zeros(1, 8, dtype=torch.bfloat16), zero) == 0.0
    assert torch_reference.relative_error(torch.ones(1, 8, dtype=torch.bfloat16), zero) == 8.0
    ref = torch.ones(2, 4, dtype=torch.float64)
    assert torch_reference.relative_error(ref * 1.5, ref) == pytest.approx(0.5)
    nan = torch.full((1, 8), float("nan"), dtype=torch.bfloat16)
    assert torch_reference.relative_error(nan, zero) != torch_reference.relative_error(nan, zero)


def test_router_weights_grad_terms_bound_the_gradient():
    """The terms' size is sum over routes of |d_out * y|: never below
    |d_router_weights| (a sum of those terms), and computed from the
    same expert outputs as the reference's forward."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from bench import torch_reference
    gen = torch.Generator().manual_seed(5)
    T, H, I, E = 3, 16, 8, 4
    bf = lambda *s: (torch.randn(*s, generator=gen) * 0.3).to(torch.bfloat16)
    a = dict(x=bf(T, H), top_experts=torch.tensor([[0, 2], [1, -1], [3, 0]]),
             router_weights=torch.rand(T, 2, generator=gen),
             gate_weights=bf(E, I, H), up_weights=bf(E, I, H), down_weights=bf(E, H, I))
    d_out = bf(T, H)
    terms = torch_reference.router_weights_grad_terms(a, d_out, E)
    ref = torch_reference.backward(a, d_out, E)["router_weights"]
    assert terms >= ref.abs().sum().item() > 0
    routes = []
    torch_reference.forward(a, E, route_outputs=routes)
    assert sorted((int(t), int(j)) for ts, js, _ in routes for t, j in zip(ts, js)) == \
        [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]
    by_hand = sum((d_out.double()[t] * y).abs().sum().item() for t, _, y in routes)
    assert terms == pytest.approx(by_hand)


def test_pytest_shards_sums_every_shard_and_fails_with_any(tmp_path):
    """scripts/gpu/pytest_shards.sh: every test runs in exactly one shard,
    the summary adds the shards up, and one failing test fails the run."""
    (tmp_path / "test_some.py").write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('i', range(7))\n"
        "def test_ok(i):\n    pass\n"
        "def test_bad():\n    assert False\n"
        "def test_skip():\n    pytest.skip('no GPU')\n")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu",
                          "pytest_shards.sh")
    proc = subprocess.run(["bash", script, "-n", "3", "-o", str(tmp_path / "logs"),
                           str(tmp_path / "test_some.py")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "7 passed, 1 failed, 1 skipped (9 tests in 3 shards" in proc.stdout, proc.stdout
    assert "test_some.py::test_bad" in proc.stdout
    assert sorted(os.listdir(tmp_path / "logs")) == ["shard0.log", "shard1.log", "shard2.log"]
    usage = subprocess.run(["bash", script, "-n", "0", "x"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_fp8_training_runs_on_the_cpu_target_and_names_its_target():
    """bench.fp8_training: one step of each precision on the CPU target
    (the GPU kernels with --target sm_90a: bf16 and fp8 only)."""
    pytest.importorskip("torch")
    from bench import fp8_training
    result = fp8_training.main(["--steps", "1"])
    assert result["target"] == "cpu" and set(result["losses"]) == {"bf16", "mxfp8", "fp8"}
    assert set(result["max_rel_diff"]) == {"mxfp8", "fp8"}
    with pytest.raises(SystemExit):
        fp8_training.main(["--target", "sm_100a"])


def test_gemm_ceiling_refuses_sizes_the_block_scales_do_not_divide(monkeypatch, capsys):
    ceiling = bench_module(monkeypatch, "gemm_ceiling")
    monkeypatch.setattr(sys, "argv", ["gemm_ceiling", "--n", "1000"])
    with pytest.raises(SystemExit):
        ceiling.main()
    assert ("--n: expected a positive multiple of 128 (the block scales), got 1000"
            in capsys.readouterr().err)


@pytest.mark.parametrize("argv, message", [
    (["--mnk", "1024", "4096", "7000"],
     "--mnk: expected K a positive multiple of 128 (the block scales), got 7000"),
    (["--mnk", "0", "4096", "7168"],
     "--mnk: expected M a positive multiple of 128 (the block scales), got 0"),
    (["--mnk", "1024", "4096", "7168", "--groups", "0"], "--groups: expected at least 1, got 0"),
])
def test_gemm_ceiling_refuses_bad_shapes_and_groups(monkeypatch, capsys, argv, message):
    ceiling = bench_module(monkeypatch, "gemm_ceiling")
    monkeypatch.setattr(sys, "argv", ["gemm_ceiling"] + argv)
    with pytest.raises(SystemExit):
        ceiling.main()
    assert message in capsys.readouterr().err


def test_gemm_ceiling_takes_the_median_sample(monkeypatch):
    ceiling = bench_module(monkeypatch, "gemm_ceiling")

    class Smi:
        def __init__(self, *a, **k):
            pass

        def terminate(self):
            pass

        def communicate(self):
            return ("1290, 696.1\n1440, 650.0\n1200, 699.9\n", None)

    class Event:
        t = 0.0

        def __init__(self, **k):
            pass

        def record(self):
            Event.t += 1.0
            self.at = Event.t

        def elapsed_time(self, other):
            return 100.0

    cuda = types.SimpleNamespace(synchronize=lambda: None, Event=Event)
    monkeypatch.setattr(ceiling, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(ceiling.subprocess, "Popen", Smi)
    clock = iter(range(0, 10 ** 6))
    monkeypatch.setattr(ceiling.time, "time", lambda: next(clock) * 0.5)
    calls = []
    ms, mhz, watts = ceiling.sustained(lambda: calls.append(1), 1.0)
    assert (mhz, watts) == (1290.0, 696.1)
    # The clock reads 0.5 s apart: one call and one round of 5 to warm up,
    # one round of 5 timed (100 ms between the events).
    assert len(calls) == 11
    assert ms == pytest.approx(100.0 / 5)
