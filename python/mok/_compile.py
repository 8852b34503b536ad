# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.compile: options in, an Artifact out. The GPU targets compile through
the compiler extension (mok._mok) or, without it, the mok-compile binary,
and keep their artifacts in an on-disk cache keyed on everything that
decides the kernels."""
import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

from . import _extensions
from ._artifact import STAGE_NAMES, Stages
from ._gpu import GpuArtifact
from ._gpu_train import GpuTrainingArtifact
from ._layer import compile_cpu
from ._options import CompileOptions, resolve_options
from ._spec import DEFAULT_MAX_TOKENS, LayerSpec
from ._version import __version__

# The stages a GPU compile prints, and a cached artifact keeps on disk
# beside its kernels: the small ones. "gpu" and "llvm" (megabytes on the
# benchmark shapes: printing them took longer than the rest of a forward
# compile) are compiled again the first time they are read.
_CACHED_STAGES = ("moe", "training", "mk")
# Every stage the compiler prints ("ptx" is the kernels').
_PRINTED_STAGES = ("moe", "training", "mk", "gpu", "llvm")

# Where the time of the last compile in this process went: [(part, seconds)]
# ("parse", then the compiler's parts: mok._mok's compile_gpu times, or
# mok-compile --times); bench/compile_time.py reads it.
_last_times = []


def compile(layer, target="cpu", options=None, *, function="moe_layer", cache_dir=None,
            **option_kwargs):
    """Compiles a layer for `target`; returns a mok.Artifact.

    layer: a LayerSpec, or moe IR text holding `function` (one MoE layer,
    fused or as an unfused chain; for a GPU target also a quantizer
    function, moe.quantize ops of FP8 weights: mok.ops.fp8_quantizer_ir).
    target: "cpu" (the executable reference, JIT-compiled for this host),
    "sm_90a" or "sm_100a" (one persistent GPU kernel a layer).
    options: a mok.CompileOptions, or None for the defaults; keyword
    arguments name its fields (training=True, profile=True, ...) and
    replace those fields of `options` when both are given. An unknown
    keyword is a TypeError naming it and listing the known ones;
    fuse_dispatch=None/True/False is accepted as the older spelling of
    dispatch="auto"/"fused"/"copy". The options are checked against the
    target (CompileOptions.for_target: what a target refuses is a
    ValueError naming the option).
    cache_dir (GPU targets): the on-disk cache (default $MOK_CACHE_DIR, or
    ~/.cache/mok), keyed on the IR, the target, `function`, every option,
    mok's version and the compiler build.

    Returns, by target and options: a CompiledLayer (target "cpu": call it,
    or forward/backward), a GpuArtifact (a GPU target: PTX + runtime
    metadata; .load() runs it on a CUDA device with torch) or, with
    training (or recompute or main_grads, which imply it on a GPU target),
    a GpuTrainingArtifact (.load() is a GpuTrainingLayer with the CPU
    layer's forward/backward contract). Each has `target`, `options`,
    `stages` (the IR of every step: "moe", "training", "mk", "gpu", "llvm",
    "ptx", those the target has), `save(directory)` and `load(device=None)`.
    """
    options = resolve_options(options, option_kwargs).for_target(target)
    if isinstance(layer, LayerSpec):
        source, name = layer.to_mlir(function), "<LayerSpec>"
    elif isinstance(layer, str):
        source, name = layer, "<ir>"
    else:
        raise TypeError(f"layer: expected a mok.LayerSpec or moe IR text, got "
                        f"{type(layer).__name__}")
    if not isinstance(function, str) or not function:
        raise TypeError(f"function: expected a function name, got {function!r}")
    if (target != "cpu" and isinstance(layer, LayerSpec) and layer.tokens is None
            and layer.max_tokens is None):
        # A GPU layer for any T has buffers for a capacity: the default one.
        layer = dataclasses.replace(layer, max_tokens=DEFAULT_MAX_TOKENS)
        source = layer.to_mlir(function)
    if target != "cpu" and isinstance(layer, LayerSpec) and layer.precision != "bf16":
        _check_gpu_precision(layer, target, options)
    if (options.fp8_quantized_weights and isinstance(layer, LayerSpec)
            and layer.precision not in ("fp8", "mxfp8")):
        raise ValueError(f"CompileOptions.fp8_quantized_weights: for FP8 layers "
                         f"(LayerSpec.precision = 'fp8' or 'mxfp8'), got precision "
                         f"{layer.precision!r}")
    if target != "cpu" and isinstance(layer, LayerSpec) and layer.tokens == 0:
        raise ValueError(f"layer: LayerSpec.tokens = 0; a GPU target ({target}) compiles "
                         "its kernel for one token count of at least 1")
    if target == "cpu":
        return compile_cpu(source, name, function, options,
                           layer.recv_capacity if isinstance(layer, LayerSpec) else None)
    return _compile_gpu(source, name, target, function, cache_dir, options)


def _check_gpu_precision(layer, target, options):
    """What a GPU target compiles of an FP8 LayerSpec (docs/FP8.md): the
    "fp8" layer, inference or training, on E4M3 wgmma (sm_90a) or scalar
    GEMMs; the "mxfp8" layer, inference or training, on tcgen05's
    block-scaled MMA (sm_100a) or scalar GEMMs; the rest is refused by
    name."""
    precision = layer.precision
    if precision == "mxfp8":
        for name in ("hidden", "intermediate"):
            if getattr(layer, name) % 128:
                raise ValueError(f"layer: LayerSpec.{name} = {getattr(layer, name)}: MXFP8 "
                                 f"layers on {target} need a multiple of 128 (the scale "
                                 "atoms; docs/FP8.md)")
        if options.tensor_cores and target == "sm_90a":
            raise ValueError("layer: LayerSpec.precision = 'mxfp8' on sm_90a runs scalar "
                             "GEMMs only: pass tensor_cores=False (Hopper has no "
                             "block-scaled MMA; precision 'fp8' runs on its tensor cores)")
        if options.tensor_cores and layer.padding % 128:
            raise ValueError(f"layer: LayerSpec.padding = {layer.padding}: MXFP8 on "
                             "sm_100a's tensor cores needs a multiple of 128 (the "
                             "block-scaled MMA's 128-row tiles)")
    elif options.tensor_cores and target == "sm_100a":
        raise ValueError("layer: LayerSpec.precision = 'fp8' on sm_100a runs scalar GEMMs "
                         "only: pass tensor_cores=False (tcgen05 runs MXFP8's "
                         "block-scaled MMA, precision 'mxfp8'; docs/FP8.md)")
    # (warp_specialize runs the "fp8" layer's wgmma GEMMs, forward and
    # backward, with a producer warpgroup; MXFP8 has no sm_90a tensor-core
    # GEMMs to take it.)
    gemm = ("dispatch" if options.dispatch == "fused" else
            "multicast" if options.multicast else None)
    if gemm:
        raise ValueError(f"CompileOptions.{gemm}: not implemented for FP8 layers "
                         f"(LayerSpec.precision = {precision!r})")


def _cache_dir(cache_dir):
    return cache_dir or os.environ.get("MOK_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "mok")


def _toolkit(options):
    return options.toolkit or os.environ.get("CUDA_HOME") or "/usr/local/cuda"


def _native_options(ext, target, options):
    """The compiler library's CompileOptions (mok::CompileOptions) for these:
    the same field names, the toolkit resolved."""
    native = ext.CompileOptions()
    native.chip = target
    for name, value in options.as_dict().items():
        setattr(native, name, _toolkit(options) if name == "toolkit" else value)
    return native


def _compile_with_extension(source, name, target, functions, options, stages):
    """({function: GpuArtifact}, {stage: IR}) through mok._mok, the `stages`
    printed; records where the time went in _last_times."""
    global _last_times
    ext = _extensions.compiler()
    start = time.perf_counter()
    module = ext.Module.parse(source, name)
    parsed = time.perf_counter()
    kernels, texts, times = module.compile_gpu(_native_options(ext, target, options),
                                               stages=list(stages), functions=functions)
    _last_times = [("parse", parsed - start)] + list(times)
    kernels = {k.function: k for k in kernels}
    arts = {}
    for function in functions:
        if function not in kernels:
            raise ValueError(f"no fused layer or quantizer function in @{function}")
        k = kernels[function]
        arts[function] = GpuArtifact(k.ptx, json.loads(k.metadata))
    return arts, dict(texts)


def _tool_flags(options):
    """mok-compile's flags for the options that differ from the defaults
    (--<name> for True, --no-<name> for False, --<name> VALUE otherwise)."""
    flags, defaults = [], CompileOptions().as_dict()
    for name, value in options.as_dict().items():
        if name == "toolkit" or value == defaults[name]:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + name.replace("_", "-"))
        else:
            flags += [flag, str(value)]
    return flags


def _installed_scripts_dir():
    """The scripts folder of the Python installation that holds this package
    (pip install puts mok-compile there, on PATH or not; an editable install's
    package path names its folder in site-packages too), or "" when it is not
    installed (a build tree on PYTHONPATH)."""
    parents = {os.path.realpath(os.path.join(p, ".."))
               for p in sys.modules[__package__].__path__}
    for scheme in [{}, {"scheme": f"{os.name}_user"}]:
        paths = sysconfig.get_paths(**scheme)
        if parents & {os.path.realpath(paths["purelib"]), os.path.realpath(paths["platlib"])}:
            return paths["scripts"]
    return ""


def _find_compiler():
    here = os.path.dirname(__file__)
    scripts = _installed_scripts_dir()
    for c in [os.environ.get("MOK_COMPILER"),
              os.path.join(here, "..", "..", "bin", "mok-compile"),  # the build tree
              scripts and os.path.join(scripts, "mok-compile"),
              shutil.which("mok-compile"), shutil.which("mok-compile-static")]:
        if c and os.access(c, os.X_OK):
            return c
    return None


def _compile_with_tool(tool, source, target, functions, options, stages):
    """The same through the mok-compile binary (e.g. the static one carried
    to a GPU machine without MLIR), its stages written by --stages-dir."""
    global _last_times
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "layer.mlir")
        with open(path, "w") as f:
            f.write(source)
        stages_dir = os.path.join(tmp, "stages")
        selected = ["--stages-dir", stages_dir, "--stages", ",".join(stages)] if stages else []
        named = [flag for f in functions for flag in ("--function", f)]
        proc = subprocess.run([tool, path, "--chip", target, "--toolkit", _toolkit(options),
                               "-o", tmp, "--times"] + selected + named + _tool_flags(options),
                              capture_output=True, text=True)
        if proc.returncode:
            raise ValueError(proc.stderr.strip() or f"{tool} failed")
        _last_times = _read_times(proc.stderr)
        arts = {}
        for function in functions:
            base = os.path.join(tmp, function)
            if not os.path.exists(base + ".ptx"):
                raise ValueError(f"no fused layer or quantizer function in @{function}")
            arts[function] = GpuArtifact.from_files(base)
        return arts, _read_stages(stages_dir, STAGE_NAMES)


def _read_times(report):
    """[(part, seconds)] from mok-compile --times' lines "<part> <seconds>"."""
    times = []
    for line in report.splitlines():
        part, _, seconds = line.rpartition(" ")
        try:
            times.append((part, float(seconds)))
        except ValueError:
            pass  # not a time: a warning the compile printed
    return times


def _read_stages(directory, names):
    """{stage: IR} of the `names` whose <stage>.mlir is in `directory`."""
    stages = {}
    for stage in names:
        path = os.path.join(directory, stage + ".mlir")
        if os.path.exists(path):
            with open(path) as f:
                stages[stage] = f.read()
    return stages


def _extension_file():
    """The file of the mok._mok extension, found without importing it
    (loading LLVM and MLIR takes longer than a cached compile); None
    without it."""
    loaded = sys.modules.get(f"{__package__}._mok")
    if loaded is not None:
        return loaded.__file__
    try:
        spec = importlib.util.find_spec(f"{__package__}._mok")
    except (ImportError, ValueError):  # ValueError: a None in sys.modules
        return None
    return spec.origin if spec is not None else None


def _compiler_identity():
    """The compiler a compile would use, for the cache key: the path, size
    and modification time of the mok._mok extension, or else of the
    mok-compile binary (so that a rebuilt compiler never gets the kernels
    of the one before it from the cache)."""
    path = _extension_file() or _find_compiler()
    if not path:
        return "no compiler"
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


def _cache_key(source, target, function, options):
    """Everything that decides the kernels: the IR, the target, the
    function, every field of the options, mok's version and the compiler
    build."""
    inputs = {"source": source, "target": target, "function": function,
              "options": options.as_dict(), "version": __version__,
              "compiler": _compiler_identity()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:24]


def _compile_fresh(source, name, target, functions, options, stages=_CACHED_STAGES):
    """({function: GpuArtifact}, {stage: IR}), compiled now, with the
    `stages` printed."""
    try:
        return _compile_with_extension(source, name, target, functions, options, stages)
    except ImportError:
        tool = _find_compiler()
        if tool is None:
            raise ImportError("compiling for a GPU needs the compiler: the mok._mok "
                              "extension (build/python) or the mok-compile binary "
                              "(set MOK_COMPILER)") from None
        return _compile_with_tool(tool, source, target, functions, options, stages)


def _ptx_stage(arts):
    """The "ptx" stage: each kernel's PTX, after a line naming its function
    when there are several."""
    if len(arts) == 1:
        return arts[0].ptx
    return "\n".join(f"// @{a.metadata['function']}\n{a.ptx}" for a in arts)


def _compile_gpu(source, name, target, function, cache_dir, options):
    functions = ([f"{function}_forward", f"{function}_backward"] if options.training
                 else [function])
    directory = os.path.join(_cache_dir(cache_dir),
                             _cache_key(source, target, function, options))
    stages_dir = os.path.join(directory, "stages")
    bases = [os.path.join(directory, f) for f in functions]
    if all(os.path.exists(b + ".json") and os.path.exists(b + ".ptx") for b in bases):
        arts = {f: GpuArtifact.from_files(b) for f, b in zip(functions, bases)}
        texts = _read_stages(stages_dir, _CACHED_STAGES)
    else:
        arts, texts = _compile_fresh(source, name, target, functions, options)
        for a in arts.values():
            a.options = options
            a.path = a.save(directory)
        os.makedirs(stages_dir, exist_ok=True)
        for stage in _CACHED_STAGES:
            if stage in texts:
                with open(os.path.join(stages_dir, stage + ".mlir"), "w") as f:
                    f.write(texts[stage])
    kernels = [arts[f] for f in functions]
    texts["ptx"] = _ptx_stage(kernels)
    names = [s for s in STAGE_NAMES if s != "training" or options.training]

    def regenerate():
        again, fresh = _compile_fresh(source, name, target, functions, options,
                                      _PRINTED_STAGES)
        fresh["ptx"] = _ptx_stage([again[f] for f in functions])
        return fresh

    stages = Stages(names, texts, regenerate)
    for a in kernels:
        a.options = options
        a._stages = stages
    if not options.training:
        return arts[function]
    art = GpuTrainingArtifact(arts[functions[0]], arts[functions[1]], options.recompute)
    art._stages = stages
    return art
