# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""GPU artifacts carrying a cubin (the kernel's machine code for the target,
made by ptxas; no GPU needed): made, saved beside the PTX with what it was
made from, read back only with the PTX it was made from, removed when an
artifact is saved without one. Loading from it runs on the stand-in driver
(test_runtime_driver.py's test_cubins_given_cached_and_compiled) and on the
GPU (gpu/test_gpu_load_cache.py)."""
import hashlib
import json
import os
import warnings

import pytest

import mok
from mok import _artifact

PTX = ".version 8.1\n.target sm_90a\n.address_size 64\n.visible .entry k(\n)\n{\n  ret;\n}\n"
META = {"mok_metadata_version": 3, "function": "moe_layer", "kernel": "k", "chip": "sm_90a",
        "block": 256, "cooperative": True, "dynamic_shared_memory": 0, "params": []}

try:
    PTXAS = _artifact.find_ptxas()
except FileNotFoundError:
    PTXAS = None
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="needs ptxas (the CUDA toolkit)")


def _artifact_of(ptx=PTX, cubin=None):
    return mok.GpuArtifact(ptx, dict(META), cubin=cubin)


def _files(directory):
    return sorted(os.listdir(directory))


@needs_ptxas
def test_make_cubin_runs_ptxas_for_the_target(tmp_path):
    a = _artifact_of()
    assert a.cubin is None
    cubin = a.make_cubin()
    assert cubin is a.cubin and cubin[:4] == b"\x7fELF"
    assert int.from_bytes(cubin[18:20], "little") == 190  # EM_CUDA
    # save(cubin=True) writes it with what it was made from.
    base = a.save(str(tmp_path), cubin=True)
    assert _files(tmp_path) == ["moe_layer.cubin", "moe_layer.cubin.json", "moe_layer.json",
                                "moe_layer.ptx"]
    with open(base + ".cubin", "rb") as f:
        assert f.read() == cubin
    with open(base + ".cubin.json") as f:
        info = json.load(f)
    assert info == {"chip": "sm_90a", "ptx_sha256": hashlib.sha256(PTX.encode()).hexdigest()}
    read = mok.GpuArtifact.from_files(base)
    assert read.cubin == cubin and read.ptx == PTX


@needs_ptxas
def test_save_with_cubin_true_makes_one_only_when_missing(tmp_path, monkeypatch):
    made = []
    real = _artifact.make_cubin
    monkeypatch.setattr("mok._gpu.make_cubin",
                        lambda *a: made.append(a) or real(*a))
    a = _artifact_of()
    a.save(str(tmp_path / "one"), cubin=True)
    a.save(str(tmp_path / "two"), cubin=True)
    assert len(made) == 1 and made[0][:2] == (PTX, "sm_90a")


def test_save_keeps_writes_or_removes_the_cubin(tmp_path):
    cubin = b"\x7fELF not checked here"
    a = _artifact_of(cubin=cubin)
    base = a.save(str(tmp_path))  # the default: the artifact's cubin too
    assert os.path.exists(base + ".cubin") and os.path.exists(base + ".cubin.json")
    assert mok.GpuArtifact.from_files(base).cubin == cubin
    # Saved without: no cubin is left beside the (maybe new) PTX.
    a.save(str(tmp_path), cubin=False)
    assert _files(tmp_path) == ["moe_layer.json", "moe_layer.ptx"]
    assert mok.GpuArtifact.from_files(base).cubin is None
    # An artifact without a cubin saved over one with a cubin: removed too.
    _artifact_of(cubin=cubin).save(str(tmp_path))
    _artifact_of().save(str(tmp_path))
    assert _files(tmp_path) == ["moe_layer.json", "moe_layer.ptx"]
    with pytest.raises(TypeError, match=r"cubin: expected None, True or False, got 'yes'"):
        a.save(str(tmp_path), cubin="yes")


def test_a_cubin_not_made_from_the_ptx_beside_it_is_ignored(tmp_path):
    cubin = b"\x7fELF"
    base = _artifact_of(cubin=cubin).save(str(tmp_path))
    # The PTX edited after the cubin was made.
    with open(base + ".ptx", "a") as f:
        f.write("// edited\n")
    with pytest.warns(UserWarning, match=r"moe_layer.cubin ignored: it was made from other "
                                         r"PTX or for another chip \(sm_90a\)"):
        read = mok.GpuArtifact.from_files(base)
    assert read.cubin is None and read.ptx.endswith("// edited\n")
    # For another chip than the metadata's.
    base = _artifact_of(cubin=cubin).save(str(tmp_path))
    with open(base + ".cubin.json") as f:
        info = json.load(f)
    with open(base + ".cubin.json", "w") as f:
        json.dump(dict(info, chip="sm_100a"), f)
    with pytest.warns(UserWarning, match=r"another chip \(sm_100a\)"):
        assert mok.GpuArtifact.from_files(base).cubin is None
    # Without its .cubin.json, or with a broken one.
    for text in (None, "{", '{"chip": "sm_90a"}'):
        if text is None:
            os.remove(base + ".cubin.json")
        else:
            with open(base + ".cubin.json", "w") as f:
                f.write(text)
        with pytest.warns(UserWarning, match=r"moe_layer.cubin ignored: .*moe_layer.cubin.json "
                                             r"does not say what it was made from"):
            assert mok.GpuArtifact.from_files(base).cubin is None
    # Without a cubin: nothing to say.
    _artifact_of().save(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mok.GpuArtifact.from_files(base).cubin is None


def test_training_artifacts_save_both_cubins(tmp_path):
    fwd = mok.GpuArtifact(PTX, dict(META, function="moe_layer_forward"), cubin=b"\x7fELF f")
    bwd = mok.GpuArtifact(PTX, dict(META, function="moe_layer_backward"), cubin=b"\x7fELF b")
    mok.GpuTrainingArtifact(fwd, bwd, recompute=True).save(str(tmp_path))
    read = mok.GpuTrainingArtifact.from_files(str(tmp_path))
    assert (read.forward.cubin, read.backward.cubin) == (b"\x7fELF f", b"\x7fELF b")
    read.save(str(tmp_path), cubin=False)
    assert not any(f.endswith(".cubin") for f in os.listdir(tmp_path))


def test_ptxas_missing_or_failing_is_named(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"cubin: ptxas \(the CUDA toolkit's assembler\) "
                                                r"is needed to make a cubin; looked in "
                                                r"/nonexistent/bin/ptxas$"):
        _artifact.find_ptxas("/nonexistent")
    a = mok.GpuArtifact(PTX, dict(META), options=mok.CompileOptions(toolkit="/nonexistent"))
    with pytest.raises(FileNotFoundError, match=r"/nonexistent/bin/ptxas"):
        a.save(str(tmp_path), cubin=True)
    assert not os.path.exists(tmp_path / "moe_layer.ptx")  # nothing half-written
    monkeypatch.setenv("CUDA_HOME", "/nonexistent-too")
    monkeypatch.setenv("PATH", "/nonexistent-path")
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(FileNotFoundError, match=r"looked in /nonexistent-too/bin/ptxas, "
                                                r"/usr/local/cuda/bin/ptxas, PATH"):
        _artifact.find_ptxas()


@needs_ptxas
def test_ptxas_errors_are_reported():
    bad = _artifact_of(ptx=PTX.replace("ret;", "not_an_instruction;"))
    with pytest.raises(RuntimeError, match=r"cubin: .*ptxas -arch=sm_90a failed \(exit \d+\): "):
        bad.make_cubin()
    assert bad.cubin is None


@needs_ptxas
def test_mok_compile_cubin_is_read_back(tmp_path):
    """mok-compile --cubin writes what from_files reads: the cubin is
    loaded with the PTX it was made from."""
    import subprocess
    from mok._compile import _find_compiler
    tool = _find_compiler()
    if tool is None:
        pytest.skip("needs the mok-compile binary")
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                           "qwen3-30b-a3b.mlir")
    subprocess.run([tool, example, "--chip", "sm_90a", "--cubin", "-o", str(tmp_path)],
                   check=True, capture_output=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = mok.GpuArtifact.from_files(str(tmp_path / "qwen3_30b_a3b_moe"))
    assert a.cubin is not None and a.cubin[:4] == b"\x7fELF"
    with open(tmp_path / "qwen3_30b_a3b_moe.cubin", "rb") as f:
        assert f.read() == a.cubin
