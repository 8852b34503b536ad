# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Phase profiling on the GPU: a tensor-core layer compiled with
mok.compile(..., profile=True) writes %globaltimer timestamps to its
"phase_clock" workspace buffer at phase boundaries; GpuLayer.phase_times()
reads them back (GpuLayer.read_workspace, over mok_layer_read_workspace).
The profiled forward is checked against the float64 reference with the
output poisoned (NaN), and against the same layer compiled without
profiling, bitwise; the phases against the metadata's "phases" and the
forward's wall time (CUDA events).

The layers are compiled here (the mok._mok extension, or the mok-compile
binary: MOK_COMPILER), or taken from $MOK_GPU_ARTIFACTS/<case>-profile and
$MOK_GPU_ARTIFACTS/<case> when prepared there.
"""
import os

import pytest

import mok
from bench import torch_reference
from bench.cases import CASES, spec_kwargs
from gpu_results import RESULTS

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
REL_BOUND = 1e-2
# On the tensor-core path (H % 64 == 0, I % 128 == 0, padding % 64 == 0),
# and small.
CASE = "top1_clamp"
# The phases' sum against the forward's wall time: %globaltimer ticks by up
# to a microsecond, and the events also time the launch.
WALL_TOLERANCE_MS = 0.05


def _prepared(name, profile):
    return os.path.join(ARTIFACTS, name + ("-profile" if profile else ""), "moe_layer")


def _compile(name, profile, tmp_path_factory, prepared_ok=True):
    prepared = _prepared(name, profile)
    if prepared_ok and os.path.exists(prepared + ".ptx"):
        return mok.GpuArtifact.from_files(prepared)
    spec = mok.LayerSpec(**spec_kwargs(CASES[name]))
    cache = str(tmp_path_factory.mktemp("profile" if profile else "plain"))
    try:
        if profile:
            return mok.compile(spec, target="sm_90a", profile=True, cache_dir=cache)
        return mok.compile(spec, target="sm_90a", cache_dir=cache)
    except ImportError as e:  # a GPU machine without the carried mok-compile
        pytest.skip(f"{e} (or prepare {prepared}.ptx)")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    art = _compile(CASE, True, tmp_path_factory)
    meta = art.metadata
    phases = meta.get("phases")
    clock = [p for p in meta["params"] if p["name"] == "phase_clock"]
    assert isinstance(phases, list) and phases, f"{CASE}: no \"phases\" in the metadata"
    assert all(isinstance(p, str) for p in phases), phases
    assert len(clock) == 1, f"{CASE}: no \"phase_clock\" param in the metadata"
    assert (clock[0]["role"], clock[0]["dtype"], clock[0]["shape"]) == (
        "workspace", "i64", [len(phases) + 1])
    return art


@pytest.fixture(scope="module")
def plain(profiled, tmp_path_factory):
    # From the same compiler as the profiled layer: both prepared, or both
    # compiled here.
    return _compile(CASE, False, tmp_path_factory,
                    prepared_ok=profiled.path == _prepared(CASE, True))


def _compare(label, c, got, ref, ms):
    import torch
    assert not torch.isnan(got).any(), f"{label}: NaN in the output (unwritten?)"
    diff = (got.double() - ref).abs()
    rel = (diff.sum() / ref.abs().sum()).item()
    RESULTS.append(dict(case=label, T=c["tokens"], H=c["hidden"], I=c["intermediate"],
                        E=c["experts"], k=c["top_k"], rel=rel, max=diff.max().item(), ms=ms))
    assert rel <= REL_BOUND, f"{label}: relative error {rel:.3e} > {REL_BOUND}"


def _inputs(seed):
    import torch
    return torch_reference.make_inputs(CASES[CASE], torch.Generator().manual_seed(seed))


def test_profiled_forward_times_its_phases(profiled):
    import torch
    c = CASES[CASE]
    phases = profiled.metadata["phases"]
    layer = profiled.load(poison_outputs=True)
    with pytest.raises(ValueError, match="no forward has run"):
        layer.phase_times()
    args = _inputs(int.from_bytes(os.urandom(4), "little"))
    layer(**args)  # warm-up (module load, first launch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = layer(**args)
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end)
    ref = torch_reference.forward(args, c["experts"], c.get("swiglu_limit"))
    _compare(f"profile {CASE}", c, out, ref, wall)

    times = layer.phase_times()
    print(f"{CASE} (wall {wall:.3f} ms): "
          + ", ".join(f"{n} {ms:.4f} ms" for n, ms in times))
    assert len(times) == len(phases)
    assert [n for n, _ in times] == phases
    assert all(isinstance(ms, float) and ms >= 0 for _, ms in times), times
    total = sum(ms for _, ms in times)
    assert 0 < total <= wall + WALL_TOLERANCE_MS, (
        f"the phases sum to {total:.4f} ms, the forward took {wall:.4f} ms: {times}")

    stamps = layer.read_workspace("phase_clock")
    assert stamps.dtype == torch.int64 and stamps.device.type == "cpu"
    assert list(stamps.shape) == [len(phases) + 1]
    assert (stamps > 0).all() and (stamps[1:] >= stamps[:-1]).all(), stamps
    # The first SM's cycles at the same stamps: as many phases, each at a
    # mean clock the board can run (the H200's SM clock: up to 1.98 GHz).
    cycles = layer.phase_cycles()
    assert [n for n, _ in cycles] == phases
    assert all(isinstance(c, int) and c >= 0 for _, c in cycles), cycles
    for (name, c), (_, ms) in zip(cycles, times):
        if ms > 0.05:
            ghz = c / (ms * 1e6)
            assert 0.2 < ghz < 2.1, f"{name}: {c} cycles in {ms:.4f} ms is {ghz:.2f} GHz"
    # Every forward writes them anew (%globaltimer only moves forward).
    layer(**args)
    again = layer.read_workspace("phase_clock")
    assert again[0] >= stamps[-1], (stamps, again)


def test_profiling_does_not_change_the_output(profiled, plain):
    """The timestamps are stores to their own buffer: the profiled kernel
    computes the same bits as the plain one."""
    import torch
    assert "phases" not in plain.metadata
    args = _inputs(11)
    with_clock, without = profiled.load(poison_outputs=True), plain.load(poison_outputs=True)
    assert torch.equal(with_clock(**args), without(**args))
    with pytest.raises(ValueError, match=r"not compiled with profiling \(mok.compile\(\.\.\., "
                       r"profile=True\)\)"):
        without.phase_times()


def test_read_workspace(profiled):
    """Every workspace buffer comes back as a CPU tensor of its metadata's
    dtype and shape; other names are refused by the runtime, naming them."""
    import torch
    layer = profiled.load(poison_outputs=True)
    layer(**_inputs(12))
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32,
              "i64": torch.int64}
    for p in profiled.metadata["params"]:
        if p["role"] != "workspace":
            continue
        t = layer.read_workspace(p["name"])
        assert (t.dtype, list(t.shape), t.device.type) == (dtypes[p["dtype"]], p["shape"],
                                                           "cpu"), p
    with pytest.raises(mok.MokRuntimeError, match="name: 'x' is an input, not a workspace"):
        layer.read_workspace("x")
    with pytest.raises(mok.MokRuntimeError, match="name: unknown workspace buffer 'clock'"):
        layer.read_workspace("clock")


def test_phase_times_after_cuda_graph_replay(profiled):
    """A replayed graph writes the timestamps too: phase_times reads what
    the last replay wrote (after synchronizing torch's current stream)."""
    import torch
    layer = profiled.load(poison_outputs=True)
    static = _inputs(13)
    layer(**static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(**static)
    graph.replay()
    first = layer.read_workspace("phase_clock")
    graph.replay()
    second = layer.read_workspace("phase_clock")
    assert second[0] >= first[-1], (first, second)
    times = layer.phase_times()
    assert [n for n, _ in times] == profiled.metadata["phases"]
    assert all(ms >= 0 for _, ms in times), times
