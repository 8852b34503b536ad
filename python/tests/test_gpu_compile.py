# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Compiling for the GPU targets needs no GPU: PTX and metadata, cached."""
import json
import os
import shutil
import subprocess

import pytest

import mok

SPEC = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, tokens=40,
                     shared_intermediate=16, swiglu_limit=7.0, padding=8)


def _ptxas_accepts(ptx, target, tmp_path):
    """ptxas (where the toolkit is) assembles `ptx` for `target`."""
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if os.path.exists(ptxas):
        path = tmp_path / "k.ptx"
        path.write_text(ptx)
        subprocess.run([ptxas, f"-arch={target}", str(path), "-o", str(tmp_path / "k.cubin")],
                       check=True)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_compile_emits_ptx_and_metadata(target, tmp_path):
    art = mok.compile(SPEC, target=target, cache_dir=str(tmp_path))
    assert f".target {target}" in art.ptx
    assert f".entry {art.kernel}(" in art.ptx
    meta = art.metadata
    assert meta["mok_metadata_version"] == 5 and meta["chip"] == target
    assert meta["cooperative"] is True and meta["kernel"] == "moe_layer_forward"
    roles = [p["role"] for p in meta["params"]]
    assert roles[:9] == ["input"] * 9 and roles[9] == "output"
    assert meta["routed_capacity"] == 40 * 2 + 4 * 7
    _ptxas_accepts(art.ptx, target, tmp_path)


def test_profile_kernels_time_their_phases(tmp_path):
    plain = mok.compile(SPEC, target="sm_90a", cache_dir=str(tmp_path))
    prof = mok.compile(SPEC, target="sm_90a", cache_dir=str(tmp_path), profile=True)
    # Cached apart: the profiling kernel is another kernel.
    assert prof.ptx != plain.ptx and "phases" not in plain.metadata
    phases = prof.metadata["phases"]
    assert phases[0] == "plan: count" and phases[-1] == "combine"
    clock = [p for p in prof.metadata["params"] if p["name"] == "phase_clock"]
    assert clock == [{"name": "phase_clock", "role": "workspace", "dtype": "i64",
                      "shape": [len(phases) + 1], "align": 16}]
    assert prof.ptx.count("%globaltimer") == len(phases) + 1
    cycles = [p for p in prof.metadata["params"] if p["name"] == "phase_cycles"]
    assert cycles == [dict(clock[0], name="phase_cycles")]
    # The compiler's metadata passes GpuLayer's checks of both buffers: an
    # unloaded layer over it gets as far as wanting a forward.
    layer = object.__new__(mok.GpuLayer)
    layer.meta = prof.metadata
    for read in (layer.phase_times, layer.phase_cycles):
        with pytest.raises(ValueError, match="no forward has run on this layer yet"):
            read()
    with pytest.raises(ValueError, match="profile: only GPU targets"):
        mok.compile(SPEC, target="cpu", profile=True)


TC_SPEC = mok.LayerSpec(hidden=128, intermediate=128, experts=4, top_k=2, tokens=64,
                        padding=128)


def test_warp_specialized_kernels(tmp_path):
    plain = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path))
    ws = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path), warp_specialize=True)
    # Cached apart; two consumer warpgroups and a producer warpgroup, with
    # registers moved between them.
    assert ws.path != plain.path
    assert plain.metadata["block"] == 256 and ws.metadata["block"] == 384
    assert "setmaxnreg" not in plain.ptx
    assert "setmaxnreg.inc.sync.aligned.u32 \t224;" in ws.ptx
    assert ".maxnreg 168" in ws.ptx
    with pytest.raises(ValueError, match="warp_specialize: implemented for the sm_90a target"):
        mok.compile(TC_SPEC, target="sm_100a", cache_dir=str(tmp_path), warp_specialize=True)
    with pytest.raises(ValueError, match="warp_specialize: only the sm_90a target"):
        mok.compile(TC_SPEC, target="cpu", warp_specialize=True)


def test_staged_register_epilogue(tmp_path):
    # sm_90a: each consumer warp stages its results in 2 KiB of shared
    # memory after the stage ring (stmatrix) and stores 16-byte row pieces
    # (evict-first); the kernel asks for those 16 KiB. sm_100a keeps its
    # shared-memory epilogue and the ring alone (its only streaming stores
    # are the dispatch copy's, a 16-byte piece a thread).
    h = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path))
    b = mok.compile(TC_SPEC, target="sm_100a", cache_dir=str(tmp_path))
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in h.ptx
    assert "st.global.cs.v4.b32" in h.ptx
    assert "stmatrix" not in b.ptx
    assert h.ptx.count("st.global.cs") > b.ptx.count("st.global.cs")
    assert h.metadata["dynamic_shared_memory"] == b.metadata["dynamic_shared_memory"] + 16384


def test_fused_dispatch_kernels(tmp_path):
    plain = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path), profile=True,
                        fuse_dispatch=False)
    fd = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path), profile=True,
                     fuse_dispatch=True)
    # The default (None) fuses on sm_90a without warp roles (the same kernel
    # as True); with warp roles (unless asked for), and on sm_100a, the copy.
    default = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path), profile=True)
    assert default.ptx == fd.ptx and default.path != fd.path
    ws = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path), warp_specialize=True)
    assert "routed_x" in [p["name"] for p in ws.metadata["params"]]
    b = mok.compile(TC_SPEC, target="sm_100a", cache_dir=str(tmp_path))
    assert "routed_x" in [p["name"] for p in b.metadata["params"]]
    with pytest.raises(TypeError, match="fuse_dispatch: expected None, True or False"):
        mok.compile(TC_SPEC, target="sm_90a", fuse_dispatch="yes")
    # No dispatch copy: no routed_x workspace, no dispatch phase; the
    # gate/up GEMM copies x's rows with cp.async (its map of x, of one-row
    # boxes, is not read by the kernel: encoding it checks x's alignment).
    names = [p["name"] for p in fd.metadata["params"]]
    assert "routed_x" in [p["name"] for p in plain.metadata["params"]]
    assert "routed_x" not in names
    assert "dispatch" in plain.metadata["phases"] and "dispatch" not in fd.metadata["phases"]
    assert fd.metadata["phases"][-3:] == ["gate/up + SwiGLU", "down", "combine"]
    x_maps = [m for m in fd.metadata["tensor_maps"] if m["buffer"] == "x"]
    assert [m["box_rows"] for m in x_maps] == [1]
    assert "cp.async.cg.shared.global" in fd.ptx and "cp.async.cg" not in plain.ptx
    # With warp roles, asked for: the producer warpgroup copies the rows
    # (its cp.async copies complete on the stages' gather barriers, each
    # copy one of the barrier's expected arrivals: .noinc).
    wsf = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path), fuse_dispatch=True,
                      warp_specialize=True)
    assert "routed_x" not in [p["name"] for p in wsf.metadata["params"]]
    assert wsf.metadata["block"] == ws.metadata["block"] == 384
    assert "cp.async.mbarrier.arrive.noinc.shared.b64" in wsf.ptx
    assert "cp.async.mbarrier.arrive" not in ws.ptx and "cp.async.mbarrier.arrive" not in fd.ptx
    with pytest.raises(ValueError, match="dispatch: the fused dispatch is implemented for "
                                         "the sm_90a target only"):
        mok.compile(TC_SPEC, target="sm_100a", cache_dir=str(tmp_path), fuse_dispatch=True)
    with pytest.raises(ValueError, match="dispatch: only the sm_90a target fuses the dispatch"):
        mok.compile(TC_SPEC, target="cpu", fuse_dispatch=True)
    # dispatch= is the same option by its name.
    assert mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path), profile=True,
                       dispatch="copy").path == plain.path


def test_multicast_kernels(tmp_path):
    plain = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path))
    mc = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path), multicast=True)
    # Cached apart; launched in clusters of 2 CTAs (metadata version 3); the
    # down weights' maps have 128-row boxes (one half of a 256-column
    # tile's B per CTA of a pair); the weight boxes multicast to both.
    assert mc.path != plain.path
    assert mc.metadata["cluster"] == 2 and "cluster" not in plain.metadata
    assert mc.metadata["mok_metadata_version"] == 5
    down = [m["box_rows"] for m in mc.metadata["tensor_maps"] if m["buffer"] == "down_weights"]
    assert down == [128]
    assert [m["box_rows"] for m in plain.metadata["tensor_maps"]
            if m["buffer"] == "down_weights"] == [256]
    assert ".multicast::cluster" in mc.ptx and "mapa.shared::cluster" in mc.ptx
    assert "multicast" not in plain.ptx and "mapa" not in plain.ptx
    with pytest.raises(TypeError, match="multicast: expected True or False"):
        mok.compile(TC_SPEC, target="sm_90a", multicast=1)
    with pytest.raises(ValueError, match="multicast: implemented for the sm_90a target "
                                         "without warp_specialize only"):
        mok.compile(TC_SPEC, target="sm_100a", multicast=True)
    with pytest.raises(ValueError, match="without warp_specialize only"):
        mok.compile(TC_SPEC, target="sm_90a", multicast=True, warp_specialize=True)
    with pytest.raises(ValueError, match="multicast: only the sm_90a target"):
        mok.compile(TC_SPEC, target="cpu", multicast=True)
    # A layer whose shapes do not fit the tiles runs scalar GEMMs: refused.
    with pytest.raises(ValueError, match="multicast needs tensor-core GEMMs"):
        mok.compile(SPEC, target="sm_90a", cache_dir=str(tmp_path), multicast=True)


def test_artifacts_are_cached_and_reloadable(tmp_path):
    a = mok.compile(SPEC, target="sm_90a", cache_dir=str(tmp_path))
    assert os.path.exists(a.path + ".ptx") and os.path.exists(a.path + ".json")
    b = mok.compile(SPEC, target="sm_90a", cache_dir=str(tmp_path))
    assert b.path == a.path and b.ptx == a.ptx
    c = mok.GpuArtifact.from_files(a.path)
    assert c.metadata == a.metadata
    other = mok.compile(mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=1, tokens=40),
                        target="sm_90a", cache_dir=str(tmp_path))
    assert other.path != a.path
    bad = tmp_path / "bad"
    (tmp_path / "bad.ptx").write_text(a.ptx)
    (tmp_path / "bad.json").write_text(json.dumps({**a.metadata, "mok_metadata_version": 9}))
    with pytest.raises(ValueError, match="unsupported metadata version 9"):
        mok.GpuArtifact.from_files(str(bad))


def test_cache_is_per_compiler(tmp_path, monkeypatch):
    """A rebuilt compiler (another size or time stamp) compiles afresh
    instead of reusing the kernels of the one before it."""
    from mok import _compile
    a = mok.compile(SPEC, target="sm_90a", cache_dir=str(tmp_path))
    monkeypatch.setattr(_compile, "_compiler_identity", lambda: "another build")
    b = mok.compile(SPEC, target="sm_90a", cache_dir=str(tmp_path))
    assert b.path != a.path and b.ptx == a.ptx


def test_compiler_identity_follows_the_build(tmp_path, monkeypatch):
    """The identity names the extension's file; without the extension, the
    mok-compile binary's, and changes when that file is rebuilt."""
    import sys
    from mok import _compile
    assert "_mok" in _compile._compiler_identity()
    tool = tmp_path / "mok-compile"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("MOK_COMPILER", str(tool))
    # The import of mok._mok fails.
    monkeypatch.delattr(mok, "_mok", raising=False)
    monkeypatch.setitem(sys.modules, "mok._mok", None)
    first = _compile._compiler_identity()
    assert str(tool.resolve()) in first
    os.utime(tool, ns=(1, 1))
    assert _compile._compiler_identity() != first


def _tool():
    tool = os.path.join(os.path.dirname(mok.__file__), "..", "..", "bin", "mok-compile")
    if not os.access(tool, os.X_OK):
        pytest.skip("mok-compile is not built next to the package")
    return tool


def _without_extension(monkeypatch):
    """Compiles go through $MOK_COMPILER, as on a machine without mok._mok."""
    from mok import _compile

    def no_extension(*args, **kwargs):
        raise ImportError("no extension here")
    monkeypatch.setattr(_compile, "_compile_with_extension", no_extension)
    monkeypatch.setenv("MOK_COMPILER", _tool())


@pytest.mark.parametrize("options", [
    {}, {"profile": True, "dispatch": "copy"}, {"warp_specialize": True},
    {"multicast": True}, {"tensor_cores": False}, {"training": True, "main_grads": True},
    {"recompute": True}], ids=lambda o: ",".join(o) or "defaults")
def test_compile_through_the_mok_compile_binary(options, tmp_path, monkeypatch):
    """Where the extension is missing (a GPU machine without MLIR), the
    carried mok-compile binary produces the same artifact, every option
    passed as its flag, with the same stages."""
    from mok import _compile
    spec = SPEC if options.get("tensor_cores", True) is False else TC_SPEC
    with_ext = mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path / "a"), **options)
    _without_extension(monkeypatch)
    with_tool = mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path / "b"), **options)
    kernels = ((with_ext.forward, with_tool.forward), (with_ext.backward, with_tool.backward)) \
        if with_ext.options.training else ((with_ext, with_tool),)
    for e, t in kernels:
        assert t.ptx == e.ptx and t.metadata == e.metadata
    assert dict(with_tool.stages) == dict(with_ext.stages)
    monkeypatch.setenv("MOK_COMPILER", "/nonexistent")
    monkeypatch.setattr(_compile, "_find_compiler", lambda: None)
    with pytest.raises(ImportError, match="compiling for a GPU needs the compiler"):
        mok.compile(SPEC, target="sm_100a", cache_dir=str(tmp_path / "c"))


def test_tensor_cores_off_compiles_scalar_gemms(tmp_path):
    tc = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path))
    scalar = mok.compile(TC_SPEC, target="sm_90a", cache_dir=str(tmp_path), tensor_cores=False)
    assert "wgmma" in tc.ptx and "wgmma" not in scalar.ptx
    assert "tensor_maps" not in [p["role"] for p in scalar.metadata["params"]]
    assert "schedule <simt>" in scalar.stages["mk"]
    assert "schedule <simt>" not in tc.stages["mk"]


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_gpu_stages(target, tmp_path, monkeypatch):
    """A GPU compile prints the small stages; the large ones ("gpu",
    "llvm") are compiled again, once, when first read, fresh or from the
    cache, which keeps the small ones."""
    from mok import _compile
    compiles = []
    fresh = _compile._compile_fresh
    monkeypatch.setattr(_compile, "_compile_fresh",
                        lambda *a: compiles.append(a) or fresh(*a))
    art = mok.compile(TC_SPEC, target=target, cache_dir=str(tmp_path))
    assert isinstance(art, mok.Artifact) and art.target == target
    assert art.options == mok.CompileOptions()
    stages = art.stages
    assert list(stages) == ["moe", "mk", "gpu", "llvm", "ptx"]
    assert set(stages.at_hand()) == {"moe", "mk", "ptx"} and len(compiles) == 1
    assert "moe.layer" in stages["moe"] and "mk.kernel" not in stages["moe"]
    # The megakernel schedule: mk ops in the kernel's gpu.func, no nvgpu yet.
    assert "mk.gemm" in stages["mk"] and "mk.grid_barrier" in stages["mk"]
    assert "nvgpu." not in stages["mk"] and len(compiles) == 1
    assert "gpu.func @moe_layer_forward" in stages["gpu"] and "mk.gemm" not in stages["gpu"]
    assert "nvgpu." in stages["gpu"] or "nvvm." in stages["gpu"]
    assert "llvm.func @moe_layer_forward" in stages["llvm"] and "nvvm." in stages["llvm"]
    assert f"#nvvm.target<O = 3, chip = \"{target}\"" in stages["llvm"]
    assert stages["ptx"] == art.ptx and len(compiles) == 2
    with pytest.raises(KeyError, match="no stage 'training' in this compile"):
        stages["training"]
    # From the cache: the small stages at once, the others compiled again.
    compiles.clear()
    cached = mok.compile(TC_SPEC, target=target, cache_dir=str(tmp_path))
    assert cached.path == art.path and compiles == []
    assert set(cached.stages.at_hand()) == {"moe", "mk", "ptx"}
    assert "gpu" in cached.stages and "training" not in cached.stages and compiles == []
    assert cached.stages["mk"] == stages["mk"] and compiles == []
    assert cached.stages["llvm"] == stages["llvm"] and len(compiles) == 1
    assert dict(cached.stages) == dict(stages) and len(compiles) == 1


def test_compile_gpu_prints_the_stages_asked_for():
    """The extension prints every stage (stages=True), none, or those named;
    an unknown name is an error naming it."""
    ext = pytest.importorskip("mok._mok")
    module = ext.Module.parse(SPEC.to_mlir())
    options = ext.CompileOptions()
    options.training = True
    kernels, every, _ = module.compile_gpu(options, stages=True)
    assert sorted(every) == ["gpu", "llvm", "mk", "moe", "training"]
    _, none, _ = module.compile_gpu(options)
    assert none == {}
    again, some, _ = module.compile_gpu(options, stages=["mk", "moe"])
    assert some == {"moe": every["moe"], "mk": every["mk"]}
    assert [k.ptx for k in again] == [k.ptx for k in kernels]
    with pytest.raises(ValueError, match="unknown stage 'ptx'; expected moe, training"):
        module.compile_gpu(options, stages=["moe", "ptx"])
    with pytest.raises(TypeError, match="stages: expected True, False or a list"):
        module.compile_gpu(options, stages=3)


def test_compile_gpu_compiles_the_functions_asked_for():
    """functions= leaves the other layer functions out of the compile (a
    training compile needs no inference kernel); a name without a function
    is an error listing the module's."""
    ext = pytest.importorskip("mok._mok")
    module = ext.Module.parse(SPEC.to_mlir())
    options = ext.CompileOptions()
    options.training = True
    every, stages, _ = module.compile_gpu(options, stages=["mk"])
    assert sorted(k.function for k in every) == [
        "moe_layer", "moe_layer_backward", "moe_layer_forward"]
    assert "gpu.module @moe_layer_kernels" in stages["mk"]
    wanted = ["moe_layer_forward", "moe_layer_backward"]
    some, stages, _ = module.compile_gpu(options, stages=["mk"], functions=wanted)
    assert sorted(k.function for k in some) == sorted(wanted)
    assert "gpu.module @moe_layer_kernels" not in stages["mk"]
    by_name = {k.function: k for k in every}
    for k in some:
        assert (k.ptx, k.metadata) == (by_name[k.function].ptx, by_name[k.function].metadata)
    with pytest.raises(ValueError, match="no function @other to compile; the module has "
                                         "@moe_layer @moe_layer_forward @moe_layer_backward"):
        module.compile_gpu(options, functions=["other"])


def test_compile_gpu_reports_where_the_time_went(tmp_path):
    """compile_gpu's times name each step, the PTX step's parts and the
    printing; mok.compile records them, after the parse, for the benchmark."""
    ext = pytest.importorskip("mok._mok")
    from mok import _compile
    options = ext.CompileOptions()
    options.training = True
    _, _, times = ext.Module.parse(SPEC.to_mlir()).compile_gpu(options)
    assert [name for name, _ in times] == [
        "training", "mk", "gpu", "llvm", "ptx", "ptx.translate", "ptx.link",
        "ptx.optimize", "ptx.codegen", "print"]
    assert all(seconds >= 0 for _, seconds in times)
    assert dict(times)["ptx.optimize"] > 0 and dict(times)["ptx.codegen"] > 0
    mok.compile(SPEC, target="sm_100a", cache_dir=str(tmp_path))
    assert [name for name, _ in _compile._last_times][:3] == ["parse", "mk", "gpu"]


def test_training_stages(tmp_path):
    art = mok.compile(SPEC, target="sm_90a", training=True, cache_dir=str(tmp_path))
    stages = art.stages
    assert list(stages) == ["moe", "training", "mk", "gpu", "llvm", "ptx"]
    assert "@moe_layer_backward" not in stages["moe"]
    assert "func.func @moe_layer_backward" in stages["training"]
    assert "moe.layer_grad" in stages["training"]
    assert "gpu.func @moe_layer_backward_backward" in stages["gpu"]
    assert stages["ptx"] == (f"// @moe_layer_forward\n{art.forward.ptx}\n"
                             f"// @moe_layer_backward\n{art.backward.ptx}")
    assert art.forward.stages is stages and art.target == "sm_90a"
    assert art.options == mok.CompileOptions(training=True)
    # recompute implies training on a GPU target: the options say so.
    assert mok.compile(SPEC, target="sm_90a", recompute=True,
                       cache_dir=str(tmp_path)).options.training


def test_saved_artifacts_keep_their_options(tmp_path):
    art = mok.compile(SPEC, target="sm_100a", profile=True, cache_dir=str(tmp_path / "c"))
    again = mok.GpuArtifact.from_files(art.save(str(tmp_path / "saved")))
    assert again.options == art.options and again.target == "sm_100a"
    assert (again.ptx, again.metadata) == (art.ptx, art.metadata)
    with pytest.raises(ValueError, match="stages: this artifact holds no IR stages"):
        again.stages
    # Files saved without options (by mok-compile, or an older mok): None.
    os.remove(str(tmp_path / "saved" / "moe_layer.options.json"))
    assert mok.GpuArtifact.from_files(str(tmp_path / "saved" / "moe_layer")).options is None
    (tmp_path / "saved" / "moe_layer.options.json").write_text("{}")
    with pytest.raises(ValueError, match="moe_layer.options.json: not the target and options"):
        mok.GpuArtifact.from_files(str(tmp_path / "saved" / "moe_layer"))
    train = mok.compile(SPEC, target="sm_90a", training=True, main_grads=True,
                        cache_dir=str(tmp_path / "c"))
    back = mok.GpuTrainingArtifact.from_files(train.save(str(tmp_path / "train")))
    assert back.options == train.options == mok.CompileOptions(training=True, main_grads=True)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_training_compiles_forward_and_backward(target, tmp_path):
    """training=True: the training forward (the context as extra outputs)
    and the backward (gradients as outputs), saved and read back; with
    recompute the backward takes no context."""
    art = mok.compile(SPEC, target=target, training=True, cache_dir=str(tmp_path))
    assert isinstance(art, mok.GpuTrainingArtifact) and not art.recompute
    fwd_out = [p["name"] for p in art.forward.metadata["params"] if p["role"] == "output"]
    assert fwd_out == ["out", "routed_x", "gate", "up", "hidden", "shared_gate",
                       "shared_up", "shared_hidden"]
    bwd = {p["name"]: p for p in art.backward.metadata["params"]}
    outs = [n for n, p in bwd.items() if p["role"] == "output"]
    assert outs == ["d_x", "d_router_weights", "d_gate_weights", "d_up_weights",
                    "d_down_weights", "d_shared_gate_weights", "d_shared_up_weights",
                    "d_shared_down_weights"]
    assert bwd["d_router_weights"]["dtype"] == "f32"
    assert bwd["gate"]["role"] == "input" and bwd["d_out"]["role"] == "input"
    assert art.backward.kernel == "moe_layer_backward_backward"
    assert ".entry moe_layer_backward_backward" in art.backward.ptx
    again = mok.GpuTrainingArtifact.from_files(art.save(str(tmp_path / "saved")))
    assert again.backward.ptx == art.backward.ptx and not again.recompute
    rec = mok.compile(SPEC, target=target, recompute=True, cache_dir=str(tmp_path))
    assert rec.recompute
    assert [p["name"] for p in rec.forward.metadata["params"] if p["role"] == "output"] == ["out"]
    assert "gate" not in {p["name"] for p in rec.backward.metadata["params"]
                          if p["role"] == "input"}
    assert mok.GpuTrainingArtifact.from_files(rec.save(str(tmp_path / "rec"))).recompute


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_expert_parallel_inference_kernel(target, tmp_path):
    """ep = 4: one rank's inference forward, its exchange's parameters and
    buffer in the metadata; the receive capacity into the plan."""
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=16, top_k=2, tokens=40,
                         shared_intermediate=16, padding=8, ep=4, recv_capacity=100)
    art = mok.compile(spec, target=target, cache_dir=str(tmp_path))
    meta = art.metadata
    assert meta["ep"] == 4 and meta["recv_capacity"] == 100
    assert meta["routed_capacity"] == 100 + 4 * 7
    by_role = {p["role"]: p for p in meta["params"]}
    assert by_role["peers"]["shape"] == [4] and by_role["peers"]["dtype"] == "i64"
    assert by_role["rank"]["dtype"] == "i32" and by_role["rank"]["shape"] == []
    # No epoch by value: the kernel counts its launches on the device (a
    # CUDA graph's replay is a new epoch).
    assert "epoch" not in by_role
    assert by_role["symmetric"] == {"name": "symmetric", "role": "symmetric", "dtype": "u8",
                                    "shape": [meta["symmetric_bytes"]]}
    regions = {r["name"]: r["offset"] for r in meta["symmetric_layout"]}
    assert list(regions) == ["flags", "launches", "matrix", "recv_origin", "recv_experts",
                             "recv_x", "ret"]
    assert all(o % 128 == 0 for o in regions.values())
    # The return buffer (a row a route of this rank's tokens) ends the buffer.
    assert meta["symmetric_bytes"] >= regions["ret"] + 40 * 2 * 64 * 2
    inputs = [p["name"] for p in meta["params"] if p["role"] == "input"]
    assert [p["shape"] for p in meta["params"] if p["name"] == "gate_weights"] == [[4, 32, 64]]
    assert inputs[:3] == ["x", "top_experts", "router_weights"]
    _ptxas_accepts(art.ptx, target, tmp_path)


def test_expert_parallel_metadata_is_what_the_runtime_takes(tmp_path):
    """The runtime reads the compiler's ep > 1 metadata (roles, the u8
    symmetric buffer, its size) without a GPU, forward and backward."""
    from mok import _extensions
    rt = _extensions.runtime()
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=16, top_k=2, tokens=40,
                         padding=8, ep=4, shared_intermediate=16)
    art = mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path))
    layer = rt.Layer(json.dumps(art.metadata))
    assert layer.ep_size == 4 and layer.symmetric_bytes == art.metadata["symmetric_bytes"]
    train = mok.compile(spec, target="sm_90a", training=True, cache_dir=str(tmp_path))
    for kernel in (train.forward, train.backward):
        layer = rt.Layer(json.dumps(kernel.metadata))
        assert layer.ep_size == 4
        assert layer.symmetric_bytes == kernel.metadata["symmetric_bytes"]
    regions = [r["name"] for r in train.backward.metadata["symmetric_layout"]]
    assert regions[-2:] == ["recv_weights", "ret_weights"]
    # The training forward saves its local plan's rows (C + L*(p-1) = 320 +
    # 4*7 with the default capacity 4 * 40 * min(2, 4)).
    saved = {p["name"]: p["shape"] for p in train.forward.metadata["params"]
             if p["role"] == "output"}
    assert saved["routed_x"] == [348, 64] and saved["hidden"] == [348, 32]


def test_expert_parallel_recompute_is_refused_by_name(tmp_path):
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=16, top_k=2, tokens=40,
                         padding=8, ep=4)
    with pytest.raises(ValueError,
                       match=r"a backward that recomputes the forward is not implemented "
                             r"with expert parallelism \(ep = 4\) yet"):
        mok.compile(spec, target="sm_90a", training=True, recompute=True,
                    cache_dir=str(tmp_path))


def test_self_exchange_kernels_are_one_rank_of_a_group(tmp_path):
    """self_exchange: an ep = 1 layer compiled as the one rank of a group
    (forward and training), its exchange in the metadata, which the
    runtime takes, refusing a call without a communicator; without the
    option the same spec exchanges nothing. The CPU target refuses it."""
    import numpy
    from mok import _extensions
    rt = _extensions.runtime()
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, tokens=40,
                         padding=8, shared_intermediate=16)
    plain = mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path))
    assert plain.metadata.get("symmetric_bytes") is None
    art = mok.compile(spec, target="sm_90a", self_exchange=True, cache_dir=str(tmp_path))
    train = mok.compile(spec, target="sm_100a", self_exchange=True, training=True,
                        cache_dir=str(tmp_path))
    for kernel in (art, train.forward, train.backward):
        meta = kernel.metadata
        assert meta["ep"] == 1 and meta["symmetric_bytes"] > 0
        assert meta["recv_capacity"] == 40 * 2
        by_role = {p["role"]: p for p in meta["params"]}
        assert by_role["peers"]["shape"] == [1]
        layer = rt.Layer(json.dumps(meta))
        assert layer.ep_size == 1 and layer.symmetric_bytes == meta["symmetric_bytes"]
        with pytest.raises(mok.MokRuntimeError, match=r"self-exchange\), but no "
                                                       r"communicator is bound"):
            # (the group is checked before the tensors)
            layer.check(out=numpy.zeros((40, 64), numpy.float32))
    with pytest.raises(ValueError, match=r"CompileOptions\.self_exchange: the CPU target"):
        mok.compile(spec, target="cpu", self_exchange=True, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"not implemented with expert parallelism "
                                         r"\(ep = 1, self-exchange\) yet"):
        mok.compile(spec, target="sm_90a", training=True, recompute=True,
                    self_exchange=True, cache_dir=str(tmp_path))


@pytest.mark.parametrize("target,tensor_cores", [("sm_90a", True), ("sm_90a", False),
                                                 ("sm_100a", False)])
def test_fp8_forward_compiles(target, tensor_cores, tmp_path):
    """The FP8 forward (docs/FP8.md) for a GPU: the quantizers and the E4M3
    GEMMs (wgmma, or scalar) in the kernel, FP8 workspaces the runtime
    takes; ptxas-clean."""
    from mok import _runtime as rt
    spec = mok.LayerSpec(hidden=256, intermediate=128, experts=4, top_k=2, tokens=40,
                         padding=128, shared_intermediate=128, precision="fp8")
    art = mok.compile(spec, target=target, cache_dir=str(tmp_path), tensor_cores=tensor_cores)
    assert "cvt.rn.satfinite.e4m3x2.f32" in art.ptx
    if tensor_cores:  # E4M3 wgmma for the routed GEMMs, bf16 for the shared ones
        assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in art.ptx
        assert ".bf16.bf16" in art.ptx
        maps = {m["buffer"]: m for m in art.metadata["tensor_maps"]}
        assert maps["gate_q"]["box_cols"] == 128 and maps["gate_q"]["box_rows"] == 64
    else:
        assert "cvt.rn.f16x2.e4m3x2" in art.ptx and "wgmma" not in art.ptx
    mk = art.stages["mk"]
    for step in ("mk.quantize_weights", "mk.quantize_rows", " scales("):
        assert step in mk
    # The shared expert stays bf16: two of the four GEMMs read FP8.
    assert mk.count("mk.gemm") == 4 and mk.count(" scales(") == 2
    assert "block_scales(" in mk  # the dispatch of E4M3 rows
    by_name = {p["name"]: p for p in art.metadata["params"]}
    for name in ("gate_q", "up_q", "down_q", "routed_x_q", "hidden_q"):
        assert by_name[name]["dtype"] == "f8e4m3" and by_name[name]["role"] == "workspace"
    assert by_name["routed_x_scale"]["shape"] == [2, 40 * 2 + 4 * 127]
    assert by_name["gate_weights"]["dtype"] == "bf16"  # the layer's operands stay bf16
    rt.Layer(json.dumps(art.metadata))  # the runtime takes the metadata
    _ptxas_accepts(art.ptx, target, tmp_path)


def test_fp8_forward_with_a_producer_compiles(tmp_path):
    """warp_specialize on the FP8 forward (sm_90a): the routed E4M3 GEMMs
    with a producer warpgroup and the registers moved to the consumers;
    ptxas-clean. The other GEMM options are refused by name. In training
    the training forward's GEMMs take the producer (their saves staged
    after the ring), and so do the backward's."""
    spec = mok.LayerSpec(hidden=256, intermediate=128, experts=4, top_k=2, tokens=40,
                         padding=128, shared_intermediate=128, precision="fp8")
    art = mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path), warp_specialize=True)
    assert art.metadata["block"] == 384
    assert art.stages["mk"].count("producer, registers = [224, 56]") == 4
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in art.ptx
    assert "setmaxnreg.inc.sync.aligned.u32" in art.ptx
    _ptxas_accepts(art.ptx, "sm_90a", tmp_path)
    for options, why in ((dict(multicast=True), "CompileOptions.multicast"),
                         (dict(dispatch="fused"), "CompileOptions.dispatch")):
        with pytest.raises(ValueError, match=why + r": not implemented for FP8 layers"):
            mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path), **options)
    train = mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path), warp_specialize=True,
                        training=True)
    assert train.forward.metadata["block"] == 384 and train.backward.metadata["block"] == 384
    # (The stage holds both kernels: the forward's four GEMMs and the
    # backward's ten, five routed E4M3 ones and five of the bf16 shared
    # expert, have a producer.)
    assert train.forward.stages["mk"].count("producer, registers = [224, 56]") == 14
    assert "saves(" in train.forward.stages["mk"]
    for kernel in (train.forward, train.backward):
        assert "setmaxnreg.inc.sync.aligned.u32" in kernel.ptx
        _ptxas_accepts(kernel.ptx, "sm_90a", tmp_path)


@pytest.mark.parametrize("target,tensor_cores", [("sm_100a", True), ("sm_90a", False),
                                                 ("sm_100a", False)])
def test_mxfp8_forward_compiles(target, tensor_cores, tmp_path):
    """The MXFP8 forward (docs/FP8.md) for a GPU: the MX quantizers (E8M0
    scales in tcgen05's scale-factor atoms) and the routed GEMMs on
    tcgen05's block-scaled MMA (sm_100a) or scalar; u8 scale workspaces
    the runtime takes; ptxas-clean (no sm_100a GPU here: compiled only)."""
    from mok import _runtime as rt
    spec = mok.LayerSpec(hidden=256, intermediate=128, experts=4, top_k=2, tokens=40,
                         padding=128, shared_intermediate=128, precision="mxfp8")
    art = mok.compile(spec, target=target, cache_dir=str(tmp_path), tensor_cores=tensor_cores)
    assert "cvt.rn.satfinite.e4m3x2.f32" in art.ptx
    if tensor_cores:
        assert "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32" in art.ptx
        assert "tcgen05.cp.cta_group::1.32x128b.warpx4" in art.ptx
        assert "kind::f16" in art.ptx  # the shared expert, bf16
        maps = {m["buffer"]: m for m in art.metadata["tensor_maps"]}
        assert maps["gate_q"]["box_rows"] == 128 and maps["routed_x_q"]["box_rows"] == 128
    else:
        assert "cvt.rn.f16x2.e4m3x2" in art.ptx and "tcgen05.mma" not in art.ptx
    mk = art.stages["mk"]
    assert mk.count("mk.gemm") == 4 and mk.count(" scales(") == 2
    assert "block_scales(" not in mk  # the routed rows are quantized after the dispatch
    by_name = {p["name"]: p for p in art.metadata["params"]}
    assert by_name["routed_x_scale"]["dtype"] == "u8"
    assert by_name["routed_x_scale"]["shape"] == [(40 * 2 + 4 * 127 + 127) // 128, 2, 512]
    assert by_name["down_scale"]["shape"] == [4, 2, 1, 512]
    rt.Layer(json.dumps(art.metadata))  # the runtime takes the metadata
    _ptxas_accepts(art.ptx, target, tmp_path)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_mxfp8_training_layer_compiles(target, tmp_path):
    """The MXFP8 training forward and backward on scalar GEMMs: the
    weights quantized transposed and the column blocks with E8M0 atoms,
    d_out's routed rows quantized (not dispatched quantized), five routed
    GEMMs on E4M3 copies; metadata the runtime takes; ptxas-clean. On the
    tensor cores it is refused by name."""
    from mok import _runtime as rt
    spec = mok.LayerSpec(hidden=256, intermediate=128, experts=4, top_k=2, tokens=40,
                         padding=32, shared_intermediate=128, precision="mxfp8")
    art = mok.compile(spec, target=target, training=True, tensor_cores=False,
                      cache_dir=str(tmp_path))
    mk = art.backward.stages["mk"].split("gpu.func @moe_layer_backward_backward")[1]
    assert mk.count(" scales(") == 5 and mk.count("mk.gemm") == 10
    assert mk.count("transposed") == 3 and mk.count("mk.quantize_columns") == 5
    assert "block_scales(" not in mk and "xf8E8M0FNU>" in mk
    by_name = {p["name"]: p for p in art.backward.metadata["params"]}
    assert by_name["d_y_t_scale"]["dtype"] == "u8"
    # (R = 40 * 2 + 4 * 31 = 204 routed rows, 256 padded: 2 atom columns.)
    assert by_name["d_y_t_scale"]["shape"] == [2, 2, 512]
    assert by_name["down_scale_t"]["shape"] == [4, 1, 2, 512]
    for meta in (art.forward.metadata, art.backward.metadata):
        rt.Layer(json.dumps(meta))
    _ptxas_accepts(art.backward.ptx, target, tmp_path)


@pytest.mark.parametrize("shared", [None, 128])
def test_mxfp8_training_layer_compiles_for_tcgen05(shared, tmp_path):
    """The MXFP8 training layer on sm_100a's block-scaled tcgen05 MMA: the
    backward's five routed GEMMs (the f32 down dgrad, the concat gate/up
    dgrad, three k_groups weight gradients) in 128-row tiles with their
    scale atoms in Tensor Memory, and a shared expert's five bf16 ones in
    the same tiles (kind::f16, M = 128, N- and M-major operands);
    ptxas-clean (no sm_100a GPU here: compiled only)."""
    from mok import _runtime as rt
    spec = mok.LayerSpec(hidden=256, intermediate=128, experts=4, top_k=2, tokens=40,
                         padding=128, shared_intermediate=shared, precision="mxfp8")
    art = mok.compile(spec, target="sm_100a", training=True, cache_dir=str(tmp_path))
    mk = art.backward.stages["mk"].split("gpu.func @moe_layer_backward_backward")[1]
    assert mk.count("schedule <tcgen05, tile = [128, 128, 128]") == 5
    assert mk.count("schedule <tcgen05, tile = [128, 128, 64]") == (5 if shared else 0)
    assert "concat(" in mk and mk.count("k_groups(") == 3
    ptx = art.backward.ptx
    assert "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32" in ptx
    assert ("kind::f16" in ptx) == bool(shared)
    for meta in (art.forward.metadata, art.backward.metadata):
        rt.Layer(json.dumps(meta))
    _ptxas_accepts(ptx, "sm_100a", tmp_path)


@pytest.mark.parametrize("target,tensor_cores", [("sm_90a", True), ("sm_90a", False),
                                                 ("sm_100a", False)])
def test_fp8_training_layer_compiles(target, tensor_cores, tmp_path):
    """The FP8 training forward and backward for a GPU: the backward's
    quantizers (d_out's rows, the weights transposed, the column blocks)
    and its five routed GEMMs on E4M3 copies (wgmma, or scalar); the routed
    weights read by pointer (the quantizer reads them), metadata the
    runtime takes; ptxas-clean."""
    from mok import _runtime as rt
    spec = mok.LayerSpec(hidden=256, intermediate=128, experts=4, top_k=2, tokens=40,
                         padding=128, shared_intermediate=128, precision="fp8")
    art = mok.compile(spec, target=target, training=True, cache_dir=str(tmp_path),
                      tensor_cores=tensor_cores)
    # (The stage holds both kernels: the backward's comes second.)
    mk = art.backward.stages["mk"].split("gpu.func @moe_layer_backward_backward")[1]
    for step in ("mk.quantize_columns", "transposed", "mk.quantize_rows", "block_scales(",
                 "k_groups("):
        assert step in mk
    # Five routed GEMMs read FP8, the shared expert's five bf16.
    assert mk.count(" scales(") == 5 and mk.count("mk.gemm") == 10
    ptx = art.backward.ptx
    if tensor_cores:
        assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3") == 20
    else:
        assert "e4m3.e4m3" not in ptx and "cvt.rn.f16x2.e4m3x2" in ptx
    for meta in (art.forward.metadata, art.backward.metadata):
        access = {p["name"]: p.get("access") for p in meta["params"] if p["role"] == "input"}
        assert [access[w + "_weights"] for w in ("gate", "up", "down")] == ["pointer"] * 3
        rt.Layer(json.dumps(meta))  # the runtime takes the metadata
    by_name = {p["name"]: p for p in art.backward.metadata["params"]}
    assert by_name["d_y_t"]["dtype"] == "f8e4m3" and by_name["d_y_t"]["shape"] == [256, 640]
    assert by_name["down_qt"]["shape"] == [4, 128, 256]
    _ptxas_accepts(ptx, target, tmp_path)


def test_fp8_quantized_weights_are_inputs(tmp_path):
    """fp8_quantized_weights: the routed weights are the kernel's inputs in
    mok.ops.fp8_quantize's layout, no longer quantized in the kernel; a
    bf16 layer refuses the option by name."""
    from mok import _runtime as rt
    spec = mok.LayerSpec(hidden=256, intermediate=128, experts=4, top_k=2, tokens=40,
                         padding=128, precision="fp8")
    art = mok.compile(spec, target="sm_90a", cache_dir=str(tmp_path),
                      fp8_quantized_weights=True)
    inputs = {p["name"]: p for p in art.metadata["params"] if p["role"] == "input"}
    assert list(inputs) == ["x", "top_experts", "router_weights", "gate_q", "gate_scale",
                            "up_q", "up_scale", "down_q", "down_scale"]
    assert inputs["gate_q"]["dtype"] == "f8e4m3" and inputs["gate_q"]["shape"] == [4, 128, 256]
    assert inputs["down_scale"]["dtype"] == "f32" and inputs["down_scale"]["shape"] == [4, 2, 1]
    assert "mk.quantize_weights" not in art.stages["mk"]
    rt.Layer(json.dumps(art.metadata))
    _ptxas_accepts(art.ptx, "sm_90a", tmp_path)
    with pytest.raises(ValueError, match="CompileOptions.fp8_quantized_weights: for FP8 "
                                         "layers"):
        mok.compile(SPEC, target="sm_90a", cache_dir=str(tmp_path), fp8_quantized_weights=True)


@pytest.mark.parametrize("target,tensor_cores", [("sm_100a", True), ("sm_90a", False)])
def test_mxfp8_layers_take_quantized_weights(tmp_path, target, tensor_cores):
    """fp8_quantized_weights for "mxfp8" layers: the kernels take the routed
    weights as E4M3 values and E8M0 scales in tcgen05's atoms
    (mok.ops.mxfp8_quantize, then mok.ops.mxfp8_scale_atoms), a training
    layer's both kernels both layouts; no weight quantizer in any kernel;
    ptxas accepts them."""
    spec = mok.LayerSpec(hidden=256, intermediate=128, experts=4, top_k=2, tokens=40,
                         padding=128, shared_intermediate=128, precision="mxfp8")
    infer = mok.compile(spec, target=target, tensor_cores=tensor_cores,
                        fp8_quantized_weights=True, cache_dir=str(tmp_path))
    inputs = {p["name"]: p for p in infer.metadata["params"] if p["role"] == "input"}
    assert [n for n in inputs if n.startswith(("gate", "up", "down"))] == [
        "gate_q", "gate_scale", "up_q", "up_scale", "down_q", "down_scale"]
    assert inputs["gate_q"]["dtype"] == "f8e4m3" and inputs["gate_q"]["shape"] == [4, 128, 256]
    assert inputs["gate_scale"]["dtype"] == "u8"
    assert inputs["gate_scale"]["shape"] == [4, 1, 2, 512]
    assert inputs["down_scale"]["shape"] == [4, 2, 1, 512]
    assert "mk.quantize_weights" not in infer.stages["mk"]
    _ptxas_accepts(infer.ptx, target, tmp_path)
    train = mok.compile(spec, target=target, tensor_cores=tensor_cores, training=True,
                        fp8_quantized_weights=True, cache_dir=str(tmp_path))
    bwd = {p["name"]: p for p in train.backward.metadata["params"]}
    assert bwd["gate_qt"]["role"] == "input" and bwd["gate_qt"]["shape"] == [4, 256, 128]
    assert bwd["gate_scale_t"]["shape"] == [4, 2, 1, 512] and bwd["gate_scale_t"]["dtype"] == "u8"
    assert bwd["down_scale_t"]["shape"] == [4, 1, 2, 512]
    fwd = [p["name"] for p in train.forward.metadata["params"] if p["role"] == "input"]
    assert all(bwd[n]["role"] == "input" for n in fwd)  # (the context's inputs)
    for kernel in (train.forward, train.backward):
        assert "mk.quantize_weights" not in kernel.stages["mk"]
    _ptxas_accepts(train.backward.ptx, target, tmp_path)


def test_fp8_training_takes_quantized_weights_in_both_layouts(tmp_path):
    """fp8_quantized_weights with training=True: both kernels take the
    routed weights quantized in both layouts (mok.ops.fp8_quantize(w, True,
    True)), the same inputs; neither quantizes weights; the weights'
    gradients are still the backward's outputs."""
    spec = mok.LayerSpec(hidden=256, intermediate=128, experts=4, top_k=2, tokens=40,
                         padding=128, precision="fp8")
    art = mok.compile(spec, target="sm_90a", training=True, fp8_quantized_weights=True,
                      cache_dir=str(tmp_path))
    quantized = ["gate_q", "gate_scale", "up_q", "up_scale", "down_q", "down_scale",
                 "gate_qt", "gate_scale_t", "up_qt", "up_scale_t", "down_qt", "down_scale_t"]
    fwd = [p["name"] for p in art.forward.metadata["params"] if p["role"] == "input"]
    bwd = {p["name"]: p for p in art.backward.metadata["params"]}
    assert fwd == ["x", "top_experts", "router_weights"] + quantized
    assert all(bwd[n]["role"] == "input" for n in quantized)
    assert "gate_weights" not in fwd and "gate_weights" not in bwd
    assert bwd["gate_qt"]["shape"] == [4, 256, 128] and bwd["gate_qt"]["dtype"] == "f8e4m3"
    assert bwd["down_scale_t"]["shape"] == [4, 1, 2]
    assert bwd["d_gate_weights"]["role"] == "output"
    assert bwd["d_gate_weights"]["shape"] == [4, 128, 256]
    for kernel in (art.forward, art.backward):
        assert "mk.quantize_weights" not in kernel.stages["mk"]
    _ptxas_accepts(art.backward.ptx, "sm_90a", tmp_path)
