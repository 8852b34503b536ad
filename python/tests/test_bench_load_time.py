# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""bench.load_time without a GPU: the layers it finds, the environment of
each mode (which caches a sample starts from), its medians and table, its
refusals. The fresh processes' loads are replaced by a recorder."""
import json
import os

import pytest

from bench import load_time


def _touch(root, d, *names):
    os.makedirs(os.path.join(root, d), exist_ok=True)
    for n in names:
        open(os.path.join(root, d, n), "w").close()


def test_layers_under_finds_inference_and_training_layers(tmp_path):
    root = str(tmp_path)
    _touch(root, "qwen3-30b", "moe_layer.ptx", "moe_layer.json")
    _touch(root, "qwen3-30b-profile", "moe_layer.ptx", "moe_layer.json")
    _touch(root, "dsv3-shard-train", "moe_layer_forward.ptx", "moe_layer_forward.json",
           "moe_layer_backward.ptx", "moe_layer_backward.json")
    _touch(root, "half-train", "moe_layer_forward.ptx")  # no backward: not a layer
    _touch(root, ".cache/x", "moe_layer.ptx", "moe_layer.json")  # the compile cache
    assert load_time.layers_under(root) == [
        ("dsv3-shard-train", "training", os.path.join(root, "dsv3-shard-train")),
        ("qwen3-30b", "inference", os.path.join(root, "qwen3-30b", "moe_layer"))]
    assert [n for n, _, _ in load_time.layers_under(root, with_profile=True)] == [
        "dsv3-shard-train", "qwen3-30b", "qwen3-30b-profile"]
    with pytest.raises(SystemExit, match="is not a folder"):
        load_time.layers_under(str(tmp_path / "missing"))


def test_jit_seconds_reads_the_runtime_detail():
    assert load_time.jit_seconds("the PTX, compiled by the driver (or taken from its JIT "
                                 "cache) in 2.500 s") == 2.5
    assert load_time.jit_seconds("the PTX, compiled by the driver (or taken from its JIT "
                                 "cache) in 0.125 s; the given cubin was refused by the "
                                 "driver: ...") == 0.125
    assert load_time.jit_seconds("the given cubin (123456 bytes)") is None


def _recorder(calls):
    def measure(kind, path, env):
        calls.append((kind, path, env))
        return {"seconds": 0.01 * len(calls), "sources": {"forward": "ptx"},
                "details": {"forward": "the PTX, compiled by the driver (or taken from its "
                                       "JIT cache) in 1.000 s"},
                "process_seconds": 3.0, "jit_seconds": 1.0}
    return measure


def test_each_mode_starts_from_the_caches_it_says(tmp_path):
    calls = []
    layers = [("a", "inference", "/art/a/moe_layer")]
    modes = ["driver-cold", "driver-warm"]
    results = load_time.run(layers, modes, 2, str(tmp_path), measure=_recorder(calls),
                            base_env={"PATH": "/bin", "CUDA_CACHE_PATH": "/x",
                                      "CUDA_CACHE_DISABLE": "1"}, progress=lambda s: None)
    assert [len(results["a"][m]) for m in modes] == [2, 2]
    envs = [env for _, _, env in calls]
    assert len(envs) == 4
    dcold, dwarm = envs[:2]
    # The driver's JIT cache on, in a folder of the sample's own; the
    # caller's CUDA_CACHE_* replaced.
    for env in (dcold, dwarm):
        assert "CUDA_CACHE_DISABLE" not in env and env["PATH"] == "/bin"
        assert env["CUDA_CACHE_MAXSIZE"] == str(4 << 30)
    assert dcold["CUDA_CACHE_PATH"] == dwarm["CUDA_CACHE_PATH"] != "/x"
    # The second sample starts from an empty cache of its own.
    assert envs[2]["CUDA_CACHE_PATH"] != dcold["CUDA_CACHE_PATH"]


def test_warm_alone_fills_the_cache_first_unrecorded(tmp_path):
    calls = []
    results = load_time.run([("a", "training", "/art/a")], ["driver-warm"], 1, str(tmp_path),
                            measure=_recorder(calls), base_env={}, progress=lambda s: None)
    assert len(calls) == 2
    assert calls[0][2]["CUDA_CACHE_PATH"] == calls[1][2]["CUDA_CACHE_PATH"]
    assert len(results["a"]["driver-warm"]) == 1 and "driver-cold" not in results["a"]
    assert results["a"]["driver-warm"][0]["seconds"] == pytest.approx(0.02)


def test_shipped_loads_the_cubin_copy_without_the_jit_cache(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(load_time, "ship", lambda name, kind, path, into: (
        os.path.join(into, name, "moe_layer"), 4.5))
    results = load_time.run([("a", "inference", "/art/a/moe_layer")],
                            ["shipped", "driver-cold"], 1, str(tmp_path),
                            measure=_recorder(calls), base_env={"CUDA_CACHE_PATH": "/x"},
                            progress=lambda s: None)
    (_, shipped_path, shipped), (_, cold_path, cold) = calls
    assert cold_path == "/art/a/moe_layer"
    assert shipped_path == os.path.join(str(tmp_path), "shipped", "a", "moe_layer")
    assert shipped["CUDA_CACHE_DISABLE"] == "1" and "CUDA_CACHE_PATH" not in shipped
    assert "CUDA_CACHE_DISABLE" not in cold
    assert results["a"]["ptxas_seconds"] == 4.5
    # Without ptxas, no shipped samples, said so.
    said = []

    def no_ptxas(*args):
        raise FileNotFoundError("cubin: ptxas ... is needed")
    monkeypatch.setattr(load_time, "ship", no_ptxas)
    results = load_time.run([("a", "inference", "/p")], ["shipped"], 1, str(tmp_path),
                            measure=_recorder([]), base_env={}, progress=said.append)
    assert "shipped" not in results["a"] and said == ["a: no shipped cubin (cubin: ptxas "
                                                      "... is needed)"]


def test_summary_and_table():
    sample = {"seconds": 2.0, "sources": {"forward": "ptx", "backward": "ptx"},
              "jit_seconds": 1.5}
    modes = ["driver-cold", "driver-warm", "shipped"]
    results = {"a-train": {"kind": "training", "ptxas_seconds": 3.25,
                           "driver-cold": [sample, dict(sample, seconds=4.0, jit_seconds=2.5)],
                           "driver-warm": [dict(sample, seconds=0.04, jit_seconds=0.01)]}}
    rows = load_time.summary(results, modes)
    assert rows == [{"layer": "a-train", "kind": "training", "ptxas_seconds": 3.25,
                     "driver-cold": 3.0, "driver-cold_sources": ["ptx"], "driver-warm": 0.04,
                     "driver-warm_sources": ["ptx"], "shipped": None,
                     "shipped_sources": [], "driver_cold_jit_seconds": 2.0}]
    text = load_time.table(rows, modes)
    assert text.splitlines() == [
        f"{'layer':28s} {'driver-cold':>12s} {'driver-warm':>12s} {'shipped':>12s} "
        f"{'ptxas (AOT)':>12s}",
        f"{'a-train':28s} {'3.000':>12s} {'0.040':>12s} {'-':>12s} {'3.250':>12s}"]
    json.dumps(rows)  # what load_time.json holds


@pytest.mark.parametrize("argv, message", [
    (["--repeat", "0"], "--repeat: expected at least 1, got 0"),
    (["--layers", "nope"], "--layers: no layer nope under"),
    (["--modes", "hot"], "argument --modes: invalid choice: 'hot'"),
])
def test_main_refuses_bad_arguments(argv, message, tmp_path, capsys):
    _touch(str(tmp_path), "a", "moe_layer.ptx", "moe_layer.json")
    with pytest.raises(SystemExit):
        load_time.main(["--artifacts", str(tmp_path), "--out", str(tmp_path / "o"), *argv])
    assert message in capsys.readouterr().err


def test_main_refuses_a_folder_without_layers(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_time.main(["--artifacts", str(tmp_path)])
    assert "--artifacts: no compiled layer under" in capsys.readouterr().err
