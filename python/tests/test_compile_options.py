# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.CompileOptions and mok.compile's options: every field checked by name,
conflicts and target refusals named, unknown keywords refused, the cache
key covering every option; the C++ options (mok._mok.CompileOptions) with
the same fields and checks; and the package's modules importing each
other at the top only, in one direction."""
import ast
import dataclasses
import os
import re

import pytest

import mok
from mok import _compile

SPEC = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, tokens=40,
                     shared_intermediate=16, swiglu_limit=7.0, padding=8)
FIELDS = [f.name for f in dataclasses.fields(mok.CompileOptions)]
# A valid value other than the default, for each field.
OTHER = {"training": True, "recompute": True, "main_grads": True, "profile": True,
         "warp_specialize": True, "dispatch": "copy", "multicast": True,
         "tensor_cores": False, "toolkit": "/opt/cuda", "barrier_timeout_ms": 250,
         "self_exchange": True, "fp8_quantized_weights": True}


def test_the_other_values_cover_every_field():
    assert sorted(OTHER) == sorted(FIELDS)
    for name, value in OTHER.items():
        assert getattr(mok.CompileOptions(**{name: value}), name) == value


@pytest.mark.parametrize("name", [n for n in OTHER if isinstance(OTHER[n], bool)])
@pytest.mark.parametrize("bad", [1, "yes", None])
def test_bool_fields_refuse_other_types(name, bad):
    with pytest.raises(TypeError, match=rf"CompileOptions\.{name}: expected True or False, "
                                        rf"got {bad!r}"):
        mok.CompileOptions(**{name: bad})


def test_dispatch_and_toolkit_values():
    for d in ("auto", "fused", "copy"):
        assert mok.CompileOptions(dispatch=d).dispatch == d
    with pytest.raises(ValueError, match=r"CompileOptions\.dispatch: expected one of 'auto', "
                                         r"'fused', 'copy', got 'fuse'"):
        mok.CompileOptions(dispatch="fuse")
    with pytest.raises(TypeError, match=r"CompileOptions\.dispatch: expected one of"):
        mok.CompileOptions(dispatch=True)
    for bad in ("", 3):
        with pytest.raises(TypeError, match=r"CompileOptions\.toolkit: expected None or a "
                                            r"CUDA toolkit directory"):
            mok.CompileOptions(toolkit=bad)


@pytest.mark.parametrize("kwargs,message", [
    (dict(multicast=True, warp_specialize=True),
     r"CompileOptions\.multicast: implemented for the sm_90a target without "
     r"warp_specialize only"),
    (dict(warp_specialize=True, tensor_cores=False),
     r"CompileOptions\.warp_specialize: needs tensor-core GEMMs, and tensor_cores is False"),
    (dict(dispatch="fused", tensor_cores=False),
     r"CompileOptions\.dispatch: needs tensor-core GEMMs"),
    (dict(multicast=True, tensor_cores=False), r"CompileOptions\.multicast: needs tensor-core"),
    (dict(warp_specialize=True, recompute=True),
     r"CompileOptions\.warp_specialize: not implemented with recompute"),
    (dict(warp_specialize=True, recompute=True, training=True),
     r"CompileOptions\.warp_specialize: not implemented with recompute"),
    (dict(dispatch="fused", training=True),
     r"CompileOptions\.dispatch: not implemented for the training kernels"),
    (dict(multicast=True, training=True),
     r"CompileOptions\.multicast: not implemented for the training kernels"),
])
def test_conflicting_options_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mok.CompileOptions(**kwargs)


def test_options_are_frozen_and_replace_checks():
    o = mok.CompileOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.profile = True
    assert o.replace(profile=True).profile and not o.profile
    with pytest.raises(TypeError, match="unknown compile option 'profiles'; expected one of "
                                        "training, recompute, main_grads, profile"):
        o.replace(profiles=True)
    with pytest.raises(ValueError, match="not implemented for the training kernels"):
        mok.CompileOptions(multicast=True).replace(training=True)
    some = mok.CompileOptions(training=True, main_grads=True, dispatch="copy")
    assert mok.CompileOptions.from_dict(some.as_dict()) == some
    with pytest.raises(TypeError, match="unknown compile option 'fast'"):
        mok.CompileOptions.from_dict({"fast": True})


@pytest.mark.parametrize("name,value,why", [
    ("training", True, "the CPU target always compiles forward and backward"),
    ("main_grads", True, "the kernel's main_grad accumulation is for GPU targets"),
    ("profile", True, "only GPU targets time their phases"),
    ("warp_specialize", True, "only the sm_90a target has warp roles"),
    ("dispatch", "fused", "only the sm_90a target fuses the dispatch"),
    ("dispatch", "copy", "only the sm_90a target fuses the dispatch"),
    ("multicast", True, "only the sm_90a target launches clusters"),
])
def test_the_cpu_target_refuses_gpu_options(name, value, why):
    with pytest.raises(ValueError, match=rf"CompileOptions\.{name}: {why}.*'cpu'"):
        mok.CompileOptions(**{name: value}).for_target("cpu")
    with pytest.raises(ValueError, match=rf"CompileOptions\.{name}: {why}"):
        mok.compile(SPEC, target="cpu", **{name: value})


@pytest.mark.parametrize("name,value,why", [
    ("warp_specialize", True, "implemented for the sm_90a target \\(wgmma\\) only"),
    ("dispatch", "fused", "the fused dispatch is implemented for the sm_90a target only"),
    ("multicast", True, "implemented for the sm_90a target without warp_specialize only"),
])
def test_sm100a_refuses_what_it_does_not_implement(name, value, why, tmp_path):
    with pytest.raises(ValueError, match=rf"CompileOptions\.{name}: {why} \(target 'sm_100a'\)"):
        mok.compile(SPEC, target="sm_100a", cache_dir=str(tmp_path), **{name: value})
    mok.CompileOptions(**{name: value}).for_target("sm_90a")


def test_what_targets_ignore_and_imply():
    o = mok.CompileOptions(toolkit="/opt/cuda", tensor_cores=False, recompute=True)
    assert o.ignored_by("cpu") == ("tensor_cores", "toolkit")
    assert o.ignored_by("sm_90a") == ()
    assert o.for_target("cpu") is o
    assert mok.CompileOptions(dispatch="copy").for_target("sm_100a").dispatch == "copy"
    # On a GPU target recompute and main_grads imply training, and then
    # the tensor-core options are refused as with training (warp roles
    # are the forward kernels': taken with training).
    assert o.for_target("sm_90a") == o.replace(training=True)
    assert mok.CompileOptions(main_grads=True).for_target("sm_100a").training
    ws = mok.CompileOptions(warp_specialize=True, main_grads=True)
    assert ws.for_target("sm_90a") == ws.replace(training=True)
    with pytest.raises(ValueError, match=r"multicast: not implemented for the training"):
        mok.CompileOptions(multicast=True, main_grads=True).for_target("sm_90a")
    for bad in ("sm_80", None):
        with pytest.raises(ValueError, match=rf"target: expected 'cpu', 'sm_90a' or 'sm_100a', "
                                             rf"got {bad!r}"):
            mok.CompileOptions().for_target(bad)


def test_compile_keywords(tmp_path):
    with pytest.raises(TypeError, match=r"unknown compile option 'warp_specialise'; expected "
                                        r"one of training, recompute, main_grads, profile, "
                                        r"warp_specialize, dispatch, multicast, tensor_cores, "
                                        r"toolkit"):
        mok.compile(SPEC, target="sm_90a", warp_specialise=True)
    with pytest.raises(TypeError, match="options: expected a mok.CompileOptions or None, got dict"):
        mok.compile(SPEC, target="sm_90a", options={"profile": True})
    with pytest.raises(TypeError, match="fuse_dispatch: give dispatch= only"):
        mok.compile(SPEC, target="sm_90a", fuse_dispatch=True, dispatch="fused")
    with pytest.raises(TypeError, match="fuse_dispatch: expected None, True or False, got 'no'"):
        mok.compile(SPEC, target="sm_90a", fuse_dispatch="no")
    with pytest.raises(TypeError, match="function: expected a function name"):
        mok.compile(SPEC, target="cpu", function="")
    # Keywords replace the fields of options=; fuse_dispatch is dispatch.
    base = mok.CompileOptions(profile=True)
    art = mok.compile(SPEC, target="sm_90a", options=base, fuse_dispatch=False,
                      cache_dir=str(tmp_path))
    assert art.options == mok.CompileOptions(profile=True, dispatch="copy")
    again = mok.compile(SPEC, target="sm_90a", options=art.options, cache_dir=str(tmp_path))
    assert again.path == art.path
    assert mok.compile(SPEC, target="sm_90a", options=base, profile=False,
                       cache_dir=str(tmp_path)).options == mok.CompileOptions()


def test_cache_key_covers_every_option():
    source = SPEC.to_mlir()
    default = _compile._cache_key(source, "sm_90a", "moe_layer", mok.CompileOptions())
    keys = {default}
    for name, value in OTHER.items():
        key = _compile._cache_key(source, "sm_90a", "moe_layer",
                                  mok.CompileOptions(**{name: value}))
        assert key not in keys, name
        keys.add(key)
    assert _compile._cache_key(source, "sm_100a", "moe_layer", mok.CompileOptions()) != default
    assert _compile._cache_key(source, "sm_90a", "other", mok.CompileOptions()) != default
    assert _compile._cache_key(source + " ", "sm_90a", "moe_layer",
                               mok.CompileOptions()) != default


def test_tool_flags_follow_the_options():
    assert _compile._tool_flags(mok.CompileOptions()) == []
    assert _compile._tool_flags(mok.CompileOptions(**OTHER | {
        "multicast": False, "warp_specialize": False, "tensor_cores": True})) == [
        "--training", "--recompute", "--main-grads", "--profile", "--dispatch", "copy",
        "--barrier-timeout-ms", "250", "--self-exchange", "--fp8-quantized-weights"]
    assert _compile._tool_flags(mok.CompileOptions(tensor_cores=False)) == ["--no-tensor-cores"]


# -- the C++ options (mok._mok) ------------------------------------------------

def test_native_options_have_every_field():
    ext = pytest.importorskip("mok._mok")
    native = _compile._native_options(ext, "sm_100a", mok.CompileOptions(**OTHER | {
        "multicast": False, "warp_specialize": False}))
    for name, value in OTHER.items():
        if name not in ("multicast", "warp_specialize"):
            assert getattr(native, name) == value, name
    assert native.chip == "sm_100a" and native.validate() == ""
    with pytest.raises(ValueError, match="dispatch: expected 'auto', 'fused' or 'copy'"):
        native.dispatch = "both"


@pytest.mark.parametrize("changes,message", [
    (dict(chip="sm_80"), "chip 'sm_80' is not supported; expected sm_90a or sm_100a"),
    (dict(chip="sm_100a", dispatch="fused"), "fuse-dispatch is implemented for sm_90a only"),
    (dict(chip="sm_100a", multicast=True),
     "multicast is implemented for sm_90a without warp-specialize only"),
    (dict(multicast=True, warp_specialize=True),
     "multicast is implemented for sm_90a without warp-specialize only"),
    (dict(chip="sm_100a", warp_specialize=True),
     "warp-specialize is implemented for sm_90a \\(wgmma\\) only, not sm_100a"),
    (dict(warp_specialize=True, tensor_cores=False),
     "warp-specialize needs tensor-core GEMMs, and tensor-cores is off"),
    (dict(dispatch="fused", training=True),
     "fuse-dispatch is not implemented for the training kernels"),
    (dict(multicast=True, training=True), "multicast is not implemented for the training"),
    (dict(recompute=True), "recompute needs training"),
    (dict(main_grads=True), "main-grads needs training"),
])
def test_native_options_validate(changes, message):
    ext = pytest.importorskip("mok._mok")
    native = ext.CompileOptions()
    assert native.validate() == "" and native.chip == "sm_90a" and native.dispatch == "auto"
    for name, value in changes.items():
        setattr(native, name, value)
    assert re.search(message, native.validate())
    module = ext.Module.parse(SPEC.to_mlir())
    with pytest.raises(ValueError, match="invalid compile options: " + message):
        module.compile_gpu(native)


# -- the package's import graph ------------------------------------------------

def _package_imports(tree, module):
    """(top-level, nested) sets of the package modules `tree` imports."""
    top, nested = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            (top if node in tree.body or _in_try(tree, node) else nested).update(names)
    return top, nested


def _in_try(tree, node):
    return any(isinstance(t, ast.Try) and node in ast.walk(t) for t in tree.body)


def test_modules_import_each_other_at_the_top_in_one_direction():
    package = os.path.dirname(mok.__file__)
    graph = {}
    for name in sorted(os.listdir(package)):
        if not name.endswith(".py"):
            continue
        module = name[:-3]
        with open(os.path.join(package, name)) as f:
            top, nested = _package_imports(ast.parse(f.read()), module)
        # Only the native extensions are imported on first use (_extensions).
        assert nested <= {"_mok", "_runtime"}, (module, nested)
        if nested:
            assert module == "_extensions", module
        graph[module] = {m for m in top if m not in ("_mok", "_runtime")}
    done, visiting = set(), []

    def visit(m):
        assert m not in visiting, f"import cycle: {' -> '.join(visiting + [m])}"
        if m in done or m not in graph:
            return
        visiting.append(m)
        for n in graph[m]:
            visit(n)
        visiting.pop()
        done.add(m)
    for m in graph:
        visit(m)
