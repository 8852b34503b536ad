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
    assert load_time.jit_seconds("the PTX, compiled by the driver's linker in 2.500 s; "
                                 "stored in the cache, /c/x.cubin") == 2.5
    assert load_time.jit_seconds("the PTX, compiled by the driver in 0.125 s; the cubin "
                                 "cache is off") == 0.125
    assert load_time.jit_seconds("a cubin from the cache, /c/x.cubin") is None


def _recorder(calls):
    def measure(kind, path, env):
        calls.append((kind, path, env))
        source = "ptx" if env.get("MOK_CUBIN_CACHE") == "0" else "cached_cubin"
        return {"seconds": 0.01 * len(calls), "sources": {"forward": source},
                "details": {"forward": "the PTX, compiled by the driver in 1.000 s"},
                "process_seconds": 3.0, "jit_seconds": 1.0}
    return measure


def test_each_mode_starts_from_the_caches_it_says(tmp_path):
    calls = []
    layers = [("a", "inference", "/art/a/moe_layer")]
    modes = ["cold", "warm", "driver-cold", "driver-warm"]
    results = load_time.run(layers, modes, 2, str(tmp_path), measure=_recorder(calls),
                            base_env={"PATH": "/bin", "MOK_CUBIN_CACHE": "1",
                                      "CUDA_CACHE_PATH": "/x"}, progress=lambda s: None)
    assert [len(results["a"][m]) for m in modes] == [2, 2, 2, 2]
    envs = [env for _, _, env in calls]
    assert len(envs) == 8
    cold, warm, dcold, dwarm = envs[:4]
    # cold and warm: mok's cache (the same folder), the driver's off.
    for env in (cold, warm):
        assert env["CUDA_CACHE_DISABLE"] == "1" and env["MOK_CUBIN_CACHE"] == "1"
        assert "CUDA_CACHE_PATH" not in env and env["PATH"] == "/bin"
    assert cold["MOK_CACHE_DIR"] == warm["MOK_CACHE_DIR"]
    # driver-*: mok's cache off, the driver's in a folder of the sample's own.
    for env in (dcold, dwarm):
        assert env["MOK_CUBIN_CACHE"] == "0" and "CUDA_CACHE_DISABLE" not in env
        assert env["CUDA_CACHE_MAXSIZE"] == str(4 << 30)
    assert dcold["CUDA_CACHE_PATH"] == dwarm["CUDA_CACHE_PATH"] != "/x"
    # The second sample starts from empty caches of its own.
    assert envs[4]["MOK_CACHE_DIR"] != cold["MOK_CACHE_DIR"]
    assert envs[6]["CUDA_CACHE_PATH"] != dcold["CUDA_CACHE_PATH"]


def test_warm_alone_fills_the_cache_first_unrecorded(tmp_path):
    calls = []
    results = load_time.run([("a", "training", "/art/a")], ["warm"], 1, str(tmp_path),
                            measure=_recorder(calls), base_env={}, progress=lambda s: None)
    assert len(calls) == 2 and calls[0][2]["MOK_CACHE_DIR"] == calls[1][2]["MOK_CACHE_DIR"]
    assert len(results["a"]["warm"]) == 1 and "cold" not in results["a"]
    assert results["a"]["warm"][0]["seconds"] == pytest.approx(0.02)


def test_shipped_loads_the_cubin_copy_with_an_empty_cache(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(load_time, "ship", lambda name, kind, path, into: (
        os.path.join(into, name, "moe_layer"), 4.5))
    results = load_time.run([("a", "inference", "/art/a/moe_layer")], ["cold", "shipped"], 1,
                            str(tmp_path), measure=_recorder(calls), base_env={},
                            progress=lambda s: None)
    (_, cold_path, cold), (_, shipped_path, shipped) = calls
    assert cold_path == "/art/a/moe_layer"
    assert shipped_path == os.path.join(str(tmp_path), "shipped", "a", "moe_layer")
    assert shipped["MOK_CACHE_DIR"] != cold["MOK_CACHE_DIR"]
    assert shipped["CUDA_CACHE_DISABLE"] == "1"
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
    results = {"a-train": {"kind": "training", "ptxas_seconds": 3.25,
                           "cold": [sample, dict(sample, seconds=4.0, jit_seconds=2.5)],
                           "warm": [dict(sample, seconds=0.04,
                                         sources={"forward": "cached_cubin",
                                                  "backward": "cached_cubin"},
                                         jit_seconds=None)]}}
    rows = load_time.summary(results, ["cold", "warm", "shipped"])
    assert rows == [{"layer": "a-train", "kind": "training", "ptxas_seconds": 3.25,
                     "cold": 3.0, "cold_sources": ["ptx"], "warm": 0.04,
                     "warm_sources": ["cached_cubin"], "shipped": None,
                     "shipped_sources": [], "cold_jit_seconds": 2.0}]
    text = load_time.table(rows, ["cold", "warm", "shipped"])
    assert text.splitlines() == [
        f"{'layer':28s} {'cold':>12s} {'warm':>12s} {'shipped':>12s} {'ptxas (AOT)':>12s}",
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
