# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""What a compile builds: targets and mok.CompileOptions, checked by name."""
import dataclasses
from dataclasses import dataclass
from typing import Optional

GPU_TARGETS = ("sm_90a", "sm_100a")
TARGETS = ("cpu",) + GPU_TARGETS
DISPATCH = ("auto", "fused", "copy")

# What each target does with an option set away from its default: refuses it
# (ValueError naming the option, with the reason) or ignores it. An option
# not listed for a target is used by it.
_REFUSED = {
    "cpu": {
        "training": "the CPU target always compiles forward and backward; "
                    "training=True is for GPU targets",
        "main_grads": "the kernel's main_grad accumulation is for GPU targets "
                      "(mok.torch adds into main_grad on the CPU target)",
        "profile": "only GPU targets time their phases",
        "warp_specialize": "only the sm_90a target has warp roles",
        "dispatch": "only the sm_90a target fuses the dispatch",
        "multicast": "only the sm_90a target launches clusters",
        "barrier_timeout_ms": "only GPU targets have grid barriers",
        "self_exchange": "the CPU target's expert parallelism is a group of "
                         "functions in one process (docs/ExpertParallel.md)",
        "fp8_quantized_weights": "the CPU layer quantizes its bf16 weights itself",
    },
    "sm_100a": {
        "warp_specialize": "implemented for the sm_90a target (wgmma) only",
        "dispatch": "the fused dispatch is implemented for the sm_90a target only",
        "multicast": "implemented for the sm_90a target without warp_specialize only",
    },
}
_IGNORED = {
    "cpu": {
        "tensor_cores": "the CPU target runs loops, not tensor-core GEMMs",
        "toolkit": "the CPU target needs no CUDA toolkit",
    },
}
# sm_100a refuses dispatch="fused" only: "copy" is what it does anyway.
_DEFAULT_BY_TARGET = {("sm_100a", "dispatch"): ("auto", "copy")}


@dataclass(frozen=True)
class CompileOptions:
    """What mok.compile builds, besides the layer and the target. Every field
    is checked when the object is made (TypeError for a wrong type,
    ValueError for a wrong value or options that exclude each other, each
    naming the field); `for_target` checks what a target refuses.

    training: GPU targets: the training forward and backward kernels
        (GpuTrainingArtifact) instead of the inference kernel. The CPU target
        always compiles both and refuses it.
    recompute: the forward saves no context; backward recomputes it. On a
        GPU target it implies training.
    main_grads: GPU targets: the backward adds the weights' gradients,
        unrounded fp32, into main_grads the caller passes (Megatron-Core's
        main_grad += dW). Implies training.
    profile: GPU targets: kernels that record the global timer after each
        phase (GpuLayer.phase_times()).
    warp_specialize: sm_90a: the forward kernels' GEMMs (inference and,
        with training, the training forward's) with a TMA producer
        warpgroup; the backward's GEMMs have none yet. Refused with
        recompute.
    dispatch: "auto" (fused into the gate/up GEMM on sm_90a tensor-core
        GEMMs without warp_specialize, else copied), "fused" (required:
        the GEMM loads its A rows straight from x; sm_90a) or "copy" (the
        dispatch copy into routed_x).
    multicast: sm_90a tensor-core GEMMs without warp_specialize: clusters
        of 2 CTAs sharing weight boxes by TMA multicast.
    tensor_cores: GPU targets: tensor-core GEMMs (wgmma, tcgen05) where the
        layer's shapes fit the tiles; False: scalar GEMMs everywhere.
    toolkit: GPU targets: the CUDA toolkit holding libdevice (None:
        $CUDA_HOME, else /usr/local/cuda).
    barrier_timeout_ms: GPU targets, for debugging: bound every grid
        barrier's wait to this many milliseconds (0, the default:
        unbounded). A kernel whose barrier times out ends instead of
        hanging, and the call raises MokRuntimeError (status
        MOK_ERROR_TIMEOUT) naming the barrier and the CTAs that arrived.
    fp8_quantized_weights: GPU targets, FP8 layers (LayerSpec.precision =
        "fp8" or "mxfp8"): the kernel takes the routed weights quantized,
        as inputs gate_q, gate_scale, up_q, up_scale, down_q and
        down_scale (the normal layout of mok.ops.fp8_quantize; for
        "mxfp8" of mok.ops.mxfp8_quantize, its uint8 scales through
        mok.ops.mxfp8_scale_atoms), which the caller refreshes when the
        weights change, instead of the bf16 weights it would quantize at
        every call. With training=True both kernels take both layouts
        (quantize(w, normal=True, transposed=True)): also gate_qt,
        gate_scale_t, up_qt, up_scale_t, down_qt and down_scale_t, which
        the backward's dgrads read; the weights' gradients are still
        returned (or added into main_grads) for the bf16 weights.
        mok.torch.MoELayer takes such a training artifact and quantizes
        its bf16 parameters itself.
    self_exchange: GPU targets, for testing the exchange on one GPU: a
        layer of ep = 1 is compiled as the one rank of an expert-parallel
        group, its routes crossing its own symmetric buffer; it runs bound
        to a communicator of one rank (an NCCL one, or a local group of
        one). Slower than the ep = 1 kernel; a layer of ep > 1 ignores it.

    The options that change the tensor-core GEMMs (warp_specialize,
    dispatch="fused", multicast) are refused without tensor_cores;
    dispatch="fused" and multicast also for the training kernels, and
    multicast with warp_specialize. By
    target (`for_target`, `ignored_by`): "cpu" refuses training,
    main_grads, profile, warp_specialize, dispatch other than "auto",
    multicast, barrier_timeout_ms, self_exchange and fp8_quantized_weights,
    and ignores tensor_cores and toolkit; "sm_100a" refuses
    warp_specialize, dispatch="fused" and multicast; "sm_90a" uses every
    option. A layer whose shapes do not fit the tiles runs scalar GEMMs,
    and the compiler then refuses the tensor-core options too, naming the
    tile rule.
    """
    training: bool = False
    recompute: bool = False
    main_grads: bool = False
    profile: bool = False
    warp_specialize: bool = False
    dispatch: str = "auto"
    multicast: bool = False
    tensor_cores: bool = True
    toolkit: Optional[str] = None
    barrier_timeout_ms: int = 0
    self_exchange: bool = False
    fp8_quantized_weights: bool = False

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type is bool and not isinstance(value, bool):
                raise TypeError(f"CompileOptions.{f.name}: expected True or False, "
                                f"got {value!r}")
        if not isinstance(self.dispatch, str):
            raise TypeError(f"CompileOptions.dispatch: expected one of "
                            f"{', '.join(map(repr, DISPATCH))}, got {self.dispatch!r}")
        if self.dispatch not in DISPATCH:
            raise ValueError(f"CompileOptions.dispatch: expected one of "
                             f"{', '.join(map(repr, DISPATCH))}, got {self.dispatch!r}")
        if self.toolkit is not None and (not isinstance(self.toolkit, str)
                                         or not self.toolkit):
            raise TypeError(f"CompileOptions.toolkit: expected None or a CUDA toolkit "
                            f"directory, got {self.toolkit!r}")
        if (not isinstance(self.barrier_timeout_ms, int)
                or isinstance(self.barrier_timeout_ms, bool)):
            raise TypeError(f"CompileOptions.barrier_timeout_ms: expected an int "
                            f"(milliseconds), got {self.barrier_timeout_ms!r}")
        if not 0 <= self.barrier_timeout_ms <= 3600000:
            raise ValueError(f"CompileOptions.barrier_timeout_ms: expected 0 (unbounded) "
                             f"to 3600000 milliseconds, got {self.barrier_timeout_ms}")
        if self.multicast and self.warp_specialize:
            raise ValueError("CompileOptions.multicast: implemented for the sm_90a target "
                             "without warp_specialize only")
        gemm = self._gemm_option()
        if gemm and not self.tensor_cores:
            raise ValueError(f"CompileOptions.{gemm}: needs tensor-core GEMMs, and "
                             "tensor_cores is False")
        if gemm and self.self_exchange:
            raise ValueError(f"CompileOptions.{gemm}: not implemented with expert "
                             "parallelism (self_exchange) yet")
        # Warp roles are the forward kernels': the training forward's GEMMs
        # take a producer, the backward's none yet.
        gemm_train = self._gemm_option(training=True)
        if gemm_train and self.training:
            raise ValueError(f"CompileOptions.{gemm_train}: not implemented for the "
                             "training kernels (the training forward and the "
                             "backward) yet")
        if self.warp_specialize and self.recompute:
            raise ValueError("CompileOptions.warp_specialize: not implemented with "
                             "recompute (the backward's recomputed SwiGLU, without "
                             "warp roles, would not match the forward's bit for "
                             "bit); save the forward's context instead")

    def _gemm_option(self, training=False):
        """The first option set that changes the tensor-core GEMMs, or None;
        `training`: of those the training kernels do not take (all but
        warp_specialize)."""
        if self.warp_specialize and not training:
            return "warp_specialize"
        if self.dispatch == "fused":
            return "dispatch"
        if self.multicast:
            return "multicast"
        return None

    def _non_default(self):
        return [f.name for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default]

    def ignored_by(self, target):
        """The options set away from their defaults that `target` ignores
        (by name), e.g. ("toolkit",) for the CPU target."""
        _check_target(target)
        return tuple(n for n in self._non_default() if n in _IGNORED.get(target, {}))

    def for_target(self, target):
        """These options as `target` compiles them: ValueError naming the
        first option it refuses (and why); on a GPU target recompute and
        main_grads imply training (so the result may differ from self)."""
        _check_target(target)
        for name in self._non_default():
            why = _REFUSED.get(target, {}).get(name)
            allowed = _DEFAULT_BY_TARGET.get((target, name), ())
            if why and getattr(self, name) not in allowed:
                raise ValueError(f"CompileOptions.{name}: {why} (target {target!r})")
        if target in GPU_TARGETS and (self.recompute or self.main_grads) and not self.training:
            return self.replace(training=True)
        return self

    def replace(self, **changes):
        """A copy with `changes` (checked as the constructor checks)."""
        unknown = [k for k in changes if k not in _FIELDS]
        if unknown:
            raise TypeError(_unknown_message(unknown[0]))
        return dataclasses.replace(self, **changes)

    def as_dict(self):
        """Every field by name (the on-disk cache's key and the saved
        artifacts record this)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields):
        """The options as_dict() gave; unknown names are refused."""
        if not isinstance(fields, dict):
            raise TypeError(f"CompileOptions.from_dict: expected a dict, got "
                            f"{type(fields).__name__}")
        unknown = [k for k in fields if k not in _FIELDS]
        if unknown:
            raise TypeError(_unknown_message(unknown[0]))
        return cls(**fields)


_FIELDS = tuple(f.name for f in dataclasses.fields(CompileOptions))
# Older keyword spellings mok.compile still takes: fuse_dispatch=None/True/
# False is dispatch="auto"/"fused"/"copy".
_FUSE_DISPATCH = {None: "auto", True: "fused", False: "copy"}


def _unknown_message(name):
    return (f"unknown compile option {name!r}; expected one of {', '.join(_FIELDS)} "
            "(or fuse_dispatch, the older spelling of dispatch)")


def _check_target(target):
    if target not in TARGETS:
        raise ValueError(f"target: expected {', '.join(map(repr, TARGETS[:-1]))} or "
                         f"{TARGETS[-1]!r}, got {target!r}")


def resolve_options(options, keywords):
    """mok.compile's `options=` merged with its option keywords (a keyword
    replaces that field of `options`), checked. TypeError for an unknown
    keyword, naming it and listing the known ones."""
    if options is None:
        options = CompileOptions()
    elif not isinstance(options, CompileOptions):
        raise TypeError(f"options: expected a mok.CompileOptions or None, got "
                        f"{type(options).__name__}")
    keywords = dict(keywords)
    if "fuse_dispatch" in keywords:
        fuse = keywords.pop("fuse_dispatch")
        if "dispatch" in keywords:
            raise TypeError("fuse_dispatch: give dispatch= only (fuse_dispatch is its "
                            "older spelling)")
        if fuse is not None and not isinstance(fuse, bool):
            raise TypeError(f"fuse_dispatch: expected None, True or False, got {fuse!r}")
        keywords["dispatch"] = _FUSE_DISPATCH[fuse]
    return options.replace(**keywords) if keywords else options
