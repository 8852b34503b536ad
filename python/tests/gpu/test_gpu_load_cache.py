# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Loading without the driver's JIT, on the GPU (docs/Runtime.md, "Loading:
cubins and the driver's JIT cache"). Layers are loaded in fresh processes:

- with the driver's JIT cache in an empty folder of the test's own
  (CUDA_CACHE_PATH, CUDA_CACHE_MAXSIZE 4 GiB), the first process compiles
  each kernel's PTX and the driver stores its machine code; the second
  finds it there, loads in a fraction of the time, and computes the same
  bits as a process with the JIT cache off (CUDA_CACHE_DISABLE=1);
- from cubins shipped beside the PTX (save(..., cubin=True), ptxas) the
  layers load with no JIT, and the results match the float64 reference;
- a cubin linked from relocatable code (ptxas -c, nvlink), whose dynamic
  shared memory starts off the 1024-byte boundary the PTX declares, is not
  used: the runtime loads the PTX instead, says why, and the results match
  the reference.

Uses layers of bench/cases.py (python3 -m bench.compile tests): wgmma
megakernels with and without warp roles (setmaxnreg: sm_90a-specific
code) and a training layer's two kernels."""
import json
import os
import subprocess
import sys

import pytest

import mok
from bench.cases import CASES, TRAIN_CASES

ARTIFACTS = os.environ.get("MOK_GPU_ARTIFACTS", "gpu-artifacts")
NAMES = ["qwen3_ragged", "ws_qwen3_ragged", "train_short_k"]
REL_BOUND = 1e-2

# Run in each fresh process: load every layer of argv (timed, after the
# CUDA context exists), run it once on fixed inputs, print per layer how
# each kernel was loaded, the load's seconds, the results' SHA-256 and the
# output's error against the float64 reference.
_CHILD = r'''
import hashlib, json, os, sys, time
import torch
import mok
from bench import torch_reference
from bench.cases import CASES, TRAIN_CASES

root = sys.argv[1]
torch.zeros(1, device="cuda")  # the context: not part of a load
report = {}
for name in sys.argv[2:]:
    training = name in TRAIN_CASES
    c = (TRAIN_CASES if training else CASES)[name]
    start = time.perf_counter()
    if training:
        layer = mok.GpuTrainingArtifact.from_files(os.path.join(root, name)).load(
            poison_outputs=True)
        kernels = {"forward": layer._forward, "backward": layer._backward}
    else:
        layer = mok.GpuArtifact.from_files(os.path.join(root, name, "moe_layer")).load(
            poison_outputs=True)
        kernels = {"forward": layer}
    seconds = time.perf_counter() - start
    gen = torch.Generator().manual_seed(7)
    args = torch_reference.make_inputs(c, gen)
    if training:
        out, ctx = layer.forward(**args)
        d_out = torch.randn(out.shape, generator=gen).to(torch.bfloat16).to(out.device)
        grads = layer.backward(ctx, d_out)
        results = [out] + [grads[k] for k in sorted(grads)]
    else:
        out = layer(**args)
        results = [out]
    torch.cuda.synchronize()
    digest = hashlib.sha256()
    for t in results:
        digest.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    ref = torch_reference.forward(args, c["experts"], c.get("swiglu_limit"))
    report[name] = {
        "sources": {k: v.load_source for k, v in kernels.items()},
        "details": {k: v.load_detail for k, v in kernels.items()},
        "seconds": seconds, "digest": digest.hexdigest(),
        "rel": torch_reference.relative_error(out, ref)}
    del layer
print(json.dumps(report))
'''


def _run(root, **env):
    """The child's report for every layer of NAMES under `root`, loaded in
    this environment changed by `env` (a None value removes the variable;
    the caller's JIT cache is only used with its own settings, so that a
    smaller CUDA_CACHE_MAXSIZE never trims it)."""
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    proc = subprocess.run([sys.executable, "-c", _CHILD, root, *NAMES], capture_output=True,
                          text=True, env=full, timeout=400)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_artifacts():
    for name in NAMES:
        base = (os.path.join(ARTIFACTS, name, "moe_layer_forward") if name in TRAIN_CASES
                else os.path.join(ARTIFACTS, name, "moe_layer"))
        if not os.path.exists(base + ".ptx"):
            pytest.fail(f"{base}.ptx is missing: run python3 -m bench.compile tests")


def _table(title, runs):
    print(f"\n{title}")
    print(f"{'layer':18s} " + " ".join(f"{r:>24s}" for r in runs))
    for name in NAMES:
        cells = []
        for report in runs.values():
            r = report[name]
            sources = "+".join(sorted(set(r["sources"].values())))
            cells.append(f"{r['seconds']:7.3f} s {sources:>14s}")
        print(f"{name:18s} " + " ".join(f"{c:>24s}" for c in cells))


def test_second_process_loads_through_the_driver_jit_cache(tmp_path):
    _check_artifacts()
    jit_cache = {"CUDA_CACHE_PATH": str(tmp_path / "jit-cache"),
                 "CUDA_CACHE_MAXSIZE": str(4 << 30), "CUDA_CACHE_DISABLE": None}
    cold = _run(ARTIFACTS, **jit_cache)
    warm = _run(ARTIFACTS, **jit_cache)
    off = _run(ARTIFACTS, CUDA_CACHE_DISABLE="1")
    _table("load seconds (fresh processes)",
           {"JIT cache cold": cold, "JIT cache warm": warm, "JIT cache off": off})
    assert os.listdir(tmp_path / "jit-cache"), "the driver stored nothing in CUDA_CACHE_PATH"
    for name in NAMES:
        c, w, o = cold[name], warm[name], off[name]
        for r in (c, w, o):
            assert set(r["sources"].values()) == {"ptx"}, r["details"]
            assert r["rel"] <= REL_BOUND, (name, r["rel"])
        # The same machine code: the same bits.
        assert w["digest"] == c["digest"] == o["digest"], name
        # No JIT: fast.
        assert w["seconds"] < 1.0, (name, w["seconds"])
        if c["seconds"] > 0.5:
            assert w["seconds"] < c["seconds"] / 2, (name, c["seconds"], w["seconds"])


def test_cubins_shipped_beside_the_ptx_load_without_jit(tmp_path):
    _check_artifacts()
    try:
        mok._artifact.find_ptxas()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    shipped = tmp_path / "shipped"
    for name in NAMES:
        if name in TRAIN_CASES:
            art = mok.GpuTrainingArtifact.from_files(os.path.join(ARTIFACTS, name))
            art.save(str(shipped / name), cubin=True)
        else:
            art = mok.GpuArtifact.from_files(os.path.join(ARTIFACTS, name, "moe_layer"))
            art.save(str(shipped / name), cubin=True)
    report = _run(str(shipped), CUDA_CACHE_DISABLE="1")
    _table("load seconds from shipped cubins", {"shipped cubin": report})
    for name in NAMES:
        r = report[name]
        assert set(r["sources"].values()) == {"cubin"}, r["details"]
        assert r["rel"] <= REL_BOUND, (name, r["rel"])
        assert r["seconds"] < 1.0, (name, r["seconds"])


def _save_with(art, name, cubin_of, into):
    """`art` (of layer `name`) saved under `into`, each kernel with the
    cubin `cubin_of` gives for its GpuArtifact."""
    for kernel in ([art.forward, art.backward] if name in TRAIN_CASES else [art]):
        kernel.cubin = cubin_of(kernel)
    art.save(str(into / name))


def test_a_cubin_linked_from_relocatable_code_is_left_for_the_ptx(tmp_path):
    _check_artifacts()
    try:
        ptxas = mok._artifact.find_ptxas()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    nvlink = os.path.join(os.path.dirname(ptxas), "nvlink")
    if not os.access(nvlink, os.X_OK):
        pytest.skip(f"no nvlink beside {ptxas}")
    work = tmp_path / "link"
    work.mkdir()

    def linked(kernel):
        (work / "k.ptx").write_text(kernel.ptx)
        for command in ([ptxas, "-c", f"-arch={kernel.target}", "k.ptx", "-o", "k.o"],
                        [nvlink, f"-arch={kernel.target}", "k.o", "-o", "k.cubin"]):
            proc = subprocess.run(command, cwd=work, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-3000:]
        return (work / "k.cubin").read_bytes()

    copies = tmp_path / "linked"
    for name in NAMES:
        if name in TRAIN_CASES:
            art = mok.GpuTrainingArtifact.from_files(os.path.join(ARTIFACTS, name))
        else:
            art = mok.GpuArtifact.from_files(os.path.join(ARTIFACTS, name, "moe_layer"))
        _save_with(art, name, linked, copies)
    report = _run(str(copies))
    _table("load seconds with linked cubins (the PTX loaded instead)", {"linked cubin": report})
    for name in NAMES:
        r = report[name]
        assert set(r["sources"].values()) == {"ptx"}, r["details"]
        for kernel, detail in r["details"].items():
            assert "the given cubin was not used: kernel " in detail, (name, kernel, detail)
            assert "not on the 1024-byte boundary its PTX declares" in detail, (name, detail)
        assert r["rel"] <= REL_BOUND, (name, r["rel"])
