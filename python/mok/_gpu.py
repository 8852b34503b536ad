# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""GPU targets: the artifact (PTX + metadata) of one kernel, and the layer
that runs it with torch through the mok runtime (needs no MLIR: the
mok._runtime extension over libmok_runtime.so,
runtime/include/mok/Runtime/mok_runtime.h, and a CUDA driver). Compiling
is mok._compile's.
"""
import json
import os
from dataclasses import dataclass, field

from . import _extensions
from ._comm import Communicator, comm_arg
from ._artifact import (Artifact, make_cubin, read_cubin, read_options, write_cubin,
                        write_options)
from ._options import CompileOptions

try:
    from ._runtime import MokRuntimeError
except ImportError:  # the package without its runtime extension
    class MokRuntimeError(RuntimeError):
        """A failing runtime call or a refused argument; the message names
        the argument (or the driver call), `status` is the mok_status name."""


# When the GPU layers raise what their kernels reported (expert ids outside
# [-1, E), a bounded grid barrier that timed out): "deferred" (the
# default) checks after every call without waiting, so a call raises what
# earlier calls' finished kernels reported; "sync" synchronizes the stream
# after every call and raises for that call (debugging: the host waits for
# the GPU); "off" never checks (check_errors() still does). The
# environment variable MOK_ERROR_CHECKS sets the starting mode.
ERROR_CHECKS = ("deferred", "sync", "off")
_error_checks = [os.environ.get("MOK_ERROR_CHECKS", "deferred")]
if _error_checks[0] not in ERROR_CHECKS:
    raise ValueError(f"MOK_ERROR_CHECKS: expected one of {', '.join(ERROR_CHECKS)}, "
                     f"got {_error_checks[0]!r}")


# The mok targets by CUDA compute capability.
_CHIPS = {(9, 0): "sm_90a", (10, 0): "sm_100a"}


def compiles_for(device):
    """Whether mok compiles for CUDA `device` (sm_90a or sm_100a)."""
    import torch
    return torch.cuda.get_device_capability(device) in _CHIPS


def chip_of(device):
    """The mok target of CUDA `device`: "sm_90a" or "sm_100a"."""
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    chip = _CHIPS.get((major, minor))
    if chip is None:
        raise ValueError(f"device: {device} is sm_{major}{minor}; mok's GPU kernels run on "
                         "sm_90a (Hopper) and sm_100a (Blackwell)")
    return chip


def set_error_checks(mode):
    """When GPU layers raise what their kernels reported: "deferred"
    (default), "sync" or "off" (see ERROR_CHECKS); returns the previous
    mode."""
    if mode not in ERROR_CHECKS:
        raise ValueError(f"mode: expected one of {', '.join(map(repr, ERROR_CHECKS))}, "
                         f"got {mode!r}")
    previous, _error_checks[0] = _error_checks[0], mode
    return previous


_DTYPES = {"bf16": "bfloat16", "f32": "float32", "i32": "int32", "i64": "int64",
           "f8e4m3": "float8_e4m3fn", "u8": "uint8"}
# What the runtime reads (version 2 adds params' "access" and tensor maps'
# "experts", both optional; version 5 params' "align" and expert-parallel
# kernels).
_METADATA_VERSIONS = (1, 2, 3, 4, 5)


@dataclass
class GpuArtifact(Artifact):
    """What the compiler emits for one layer on one GPU target: the PTX of
    its kernel and the runtime's metadata (docs/Runtime.md); a mok.Artifact
    whose `target` is the metadata's chip. `path`: where it was saved or
    read (<path>.ptx, <path>.json), "" if nowhere. `cubin`: the kernel's
    machine code for the target (bytes, made by ptxas: make_cubin(),
    save(..., cubin=True)) or None; load() uses it when the device's chip
    is the target, and the PTX otherwise."""
    ptx: str
    metadata: dict
    path: str = ""
    options: CompileOptions = field(default=None, compare=False, repr=False)
    cubin: bytes = field(default=None, compare=False, repr=False)

    @property
    def target(self):
        return self.metadata.get("chip")

    @property
    def kernel(self):
        return self.metadata["kernel"]

    def make_cubin(self, toolkit=None):
        """Makes `cubin` with ptxas (-arch=<target>; from `toolkit`, else
        the options' toolkit, $CUDA_HOME or /usr/local/cuda, else PATH) and
        returns it. Seconds for a megakernel, as the driver's JIT would
        take at load: worth it for an artifact saved once and loaded in
        many processes. FileNotFoundError without ptxas."""
        if toolkit is None and self.options is not None:
            toolkit = self.options.toolkit
        self.cubin = make_cubin(self.ptx, self.target, toolkit)
        return self.cubin

    def save(self, directory, cubin=None):
        """Writes <directory>/<function>.ptx and .json (and the options it
        was compiled with, <function>.options.json); returns that base
        path, which from_files reads. `cubin`: None (the default) also
        writes the artifact's cubin if it has one, True makes one first if
        it has none (make_cubin: ptxas), False writes none; <function>.cubin
        and <function>.cubin.json (what it was made from) are written or,
        without a cubin, removed."""
        if cubin not in (None, True, False):
            raise TypeError(f"cubin: expected None, True or False, got {cubin!r}")
        if cubin and self.cubin is None:
            self.make_cubin()
        os.makedirs(directory, exist_ok=True)
        base = os.path.join(directory, self.metadata["function"])
        with open(base + ".ptx", "w") as f:
            f.write(self.ptx)
        with open(base + ".json", "w") as f:
            json.dump(self.metadata, f, indent=2)
        write_options(base, self.target, self.options)
        write_cubin(base, None if cubin is False else self.cubin, self.ptx, self.target)
        return base

    @staticmethod
    def from_files(base):
        """Reads <base>.ptx and <base>.json, as save() wrote them (and the
        options, where save() recorded them, and the cubin, where there is
        one made from this PTX). It holds no IR stages."""
        with open(base + ".ptx") as f:
            ptx = f.read()
        with open(base + ".json") as f:
            metadata = json.load(f)
        if metadata.get("mok_metadata_version") not in _METADATA_VERSIONS:
            raise ValueError(f"{base}.json: unsupported metadata version "
                             f"{metadata.get('mok_metadata_version')!r}")
        _, options = read_options(base)
        return GpuArtifact(ptx, metadata, base, options,
                           read_cubin(base, ptx, metadata.get("chip")))

    def load(self, device=None, ep_group=None, poison_outputs=False, comm=None):
        """A callable GpuLayer on CUDA `device` (None: torch's current
        device, or `comm`'s), in the expert-parallel group `ep_group` (None:
        EP = 1; see GpuLayer) or bound to communicator `comm` (a
        mok.Communicator: a layer compiled for ep > 1 needs one);
        `poison_outputs`: fill each output it allocates with NaN before the
        launch (see GpuLayer)."""
        return GpuLayer(self, device, ep_group, poison_outputs, comm=comm)


def _ep_group_args(ep_group):
    """(size, rank, nccl_comm) for Layer.set_ep_group from what a trainer
    has: None (EP = 1: (1, 0, 0)), a tuple (size, rank, nccl_comm) with
    nccl_comm an ncclComm_t as an int (0 or None: none), or a process group
    with .size() and .rank() methods (torch.distributed.ProcessGroup; torch
    is not imported), whose NCCL communicator is not taken from here:
    nccl_comm 0. The runtime checks the values and refuses a size > 1 (a
    layer joins a larger group through a communicator: GpuLayer's
    `comm`, mok.Communicator.adopt(process_group))."""
    if ep_group is None:
        return 1, 0, 0
    if isinstance(ep_group, (tuple, list)):
        if len(ep_group) != 3:
            raise TypeError("ep_group: expected (size, rank, nccl_comm), got "
                            f"{len(ep_group)} values")
        size, rank, comm = ep_group
        values = [("size", size), ("rank", rank), ("nccl_comm", 0 if comm is None else comm)]
    elif callable(getattr(ep_group, "size", None)) and callable(getattr(ep_group, "rank", None)):
        values = [("size", ep_group.size()), ("rank", ep_group.rank()), ("nccl_comm", 0)]
    else:
        raise TypeError("ep_group: expected None, (size, rank, nccl_comm) or a process "
                        "group with size() and rank() (torch.distributed.ProcessGroup), "
                        f"got {type(ep_group).__name__}")
    out = []
    for name, v in values:
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"ep_group: {name} must be an int, got {type(v).__name__}")
        out.append(v.__index__())
    return tuple(out)


_ROUTED_WEIGHTS = ("gate_weights", "up_weights", "down_weights")
_NOT_PROFILED = ("this layer was not compiled with profiling "
                 "(mok.compile(..., profile=True))")


def _workspace_param(meta, name):
    """The metadata's workspace parameter `name`, or None."""
    return next((p for p in meta.get("params", ())
                 if p.get("name") == name and p.get("role") == "workspace"), None)


def _check_stamps(param, phases, noun):
    """ValueError unless workspace buffer `param` holds one i64 at each of
    the len(phases) + 1 phase boundaries (`noun`: what they are)."""
    stamps = 1
    for d in param["shape"]:
        stamps *= d
    if param["dtype"] != "i64" or stamps != len(phases) + 1:
        raise ValueError(f"metadata: {len(phases)} phases need {len(phases) + 1} i64 "
                         f"{param['name']} {noun}, the buffer is {param['dtype']} "
                         f"{param['shape']}")


def _profile_phases(meta):
    """The phase names of a profiling layer's metadata (a top-level "phases"
    list, one name per interval between consecutive "phase_clock"
    timestamps), checked against its phase_clock workspace buffer."""
    phases = meta.get("phases")
    clock = _workspace_param(meta, "phase_clock")
    if not isinstance(phases, list) or clock is None:
        raise ValueError(_NOT_PROFILED)
    _check_stamps(clock, phases, "timestamps")
    return [str(p) for p in phases]


def _extent(t):
    """[first byte, last byte + 1) of torch tensor `t`'s elements."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())


def _overlap(a, b):
    """Whether torch tensors `a` and `b` share a byte (never when one of them
    has no elements)."""
    (a0, a1), (b0, b1) = _extent(a), _extent(b)
    return a0 < a1 and b0 < b1 and a0 < b1 and b0 < a1


def _poison(t):
    """Fills `t` with what a kernel never writes: NaN, or the most negative
    integer for an integer dtype."""
    import torch
    t.fill_(float("nan") if t.is_floating_point() else torch.iinfo(t.dtype).min)


class GpuLayer:
    """A compiled forward layer on one CUDA device, called with torch tensors
    by argument name, as the CPU layer is. A thin layer over the runtime's
    mok_layer (mok._runtime.Layer: it owns the module, the workspace and the
    TMA descriptors, and checks every argument against the metadata);
    torch-level checks (tensor type, dtype, shape, device) are made here,
    each naming the argument. The output is allocated per call (torch.empty:
    the kernel writes every element), or passed as `out=` (a contiguous
    bf16 tensor of the output's shape on the layer's device, not requiring
    grad and not overlapping an input, written in place). With
    `poison_outputs=True` an output the layer allocates is filled with NaN
    before the launch, so that anything the kernel left unwritten shows
    (the GPU tests run so; it costs a fill of the output every call). Launches are asynchronous on torch's current stream and
    need no host synchronization, so they can be captured in a CUDA graph.

    A kernel may have several outputs (metadata params of role "output": a
    backward's gradients, a training forward's saved context). The first is
    `out`; `extra_outputs` names the others. A call then returns a dict of
    every output by name (the first included), each allocated as `out` is
    unless given in `outputs=` (a dict by output name, which may hold the
    first output instead of `out=`; each checked as `out` is, against its
    own dtype and shape, and none overlapping another output). A layer with
    one output returns that tensor, and refuses `outputs=`.

    Routed weights can instead be bound once to trainer-owned storage, without
    a copy (bind_weights, bind_fc1): a [E, rows, cols] tensor with any row
    stride, the gate and up halves of a fused FC1 [E, 2I, H] tensor, or one
    tensor per expert. Bound operands are then not passed to calls. Only
    layers whose kernel reads the weights through per-expert tensor maps (the
    tensor-core path; metadata "access": "tensor_maps") accept views.

    A layer compiled with mok.compile(..., profile=True) times its phases:
    phase_times() reads the timestamps its kernel wrote (read_workspace).

    Loading avoids the driver's JIT of the PTX (seconds for a megakernel)
    where it can: it loads the artifact's cubin when the device's chip is
    its target, else the PTX, which the driver compiles or finds in its own
    JIT cache (CUDA_CACHE_MAXSIZE; docs/Runtime.md). `load_source` says
    which ("cubin", "ptx") and `load_detail` how (the JIT's time, why a
    cubin was not used).

    A layer compiled for ep = N > 1 runs bound to a communicator of N ranks
    (a mok.Communicator: `comm`, or bind_comm; docs/Runtime.md, "Expert
    parallelism"), which it needs before it is loaded: its forwards then
    pass the kernel the exchange buffer's peer table, the rank and the
    epoch. `ep_group` describes a group of size 1 only: None (EP = 1), a
    tuple (1, 0, nccl_comm), or a process group with .size() and .rank()
    (torch.distributed.ProcessGroup); a larger one is refused by the runtime
    (MokRuntimeError naming bind_comm), before anything is loaded."""

    def __init__(self, artifact, device=None, ep_group=None, poison_outputs=False,
                 comm=None):
        import torch
        rt = _extensions.runtime()
        self.torch = torch
        if not isinstance(poison_outputs, bool):
            raise TypeError(f"poison_outputs: expected a bool, got "
                            f"{type(poison_outputs).__name__}")
        self.poison_outputs = poison_outputs
        self.meta = artifact.metadata
        self._layer = rt.Layer(json.dumps(self.meta))
        self._comm = None  # the mok.Communicator bound (bind_comm)
        if comm is not None:
            if ep_group is not None:
                raise ValueError("ep_group, comm: give one; a layer bound to a "
                                 "communicator takes its group from it")
            self.bind_comm(comm)  # (not set_ep_group first: it takes size 1 only)
        else:
            self._layer.set_ep_group(*_ep_group_args(ep_group))
        torch.cuda.init()  # the runtime uses the primary context torch uses
        if device is None:
            device = self._comm.device if self._comm is not None else \
                torch.cuda.current_device()
        self.device = torch.device("cuda", device)
        self._layer.load(device, artifact.ptx, artifact.cubin)
        # How the kernel was loaded: "cubin" (the artifact's) or "ptx" (the
        # driver's JIT, or its JIT cache), and the runtime's sentence about it.
        self.load_source, self.load_detail = self._layer.load_source
        params = self.meta["params"]
        self.inputs = [p for p in params if p["role"] == "input"]
        self.outputs = [p for p in params if p["role"] == "output"]
        self.output = self.outputs[0]  # `out` (rt.Layer refused metadata without)
        self._forwards = 0  # launched (a CUDA graph's replays are not counted)
        self._init_tokens()

    def _init_tokens(self):
        # The input whose rows are the tokens (x; a backward's d_out), and
        # the token counts a call may have: 1 to max_tokens for a kernel
        # compiled for any T (LayerSpec(tokens=None)), else the one T.
        self.any_tokens = bool(self.meta.get("any_tokens"))
        self._token_input = next(
            (p["name"] for p in self.inputs
             if list(p.get("call_rows", ())) == [1, 0]
             or (not self.any_tokens and p["name"] in ("x", "d_out"))),
            self.inputs[0]["name"])
        self.max_tokens = (self.meta["max_tokens"] if self.any_tokens
                           else self._param(self._token_input)["shape"][0])
        self._call_tokens = self.max_tokens

    def check_errors(self):
        """Waits for the layer's launches on the current stream and raises
        MokRuntimeError if its kernels reported anything since the last
        check: expert ids outside [-1, E) in top_experts (status
        MOK_ERROR_BAD_ROUTING; the kernels dropped those routes, so nothing
        outside the tensors was read or written) or, compiled with
        barrier_timeout_ms, a grid barrier that timed out
        (MOK_ERROR_TIMEOUT)."""
        stream = self.torch.cuda.current_stream(self.device).cuda_stream
        self._layer.take_report(stream, wait=True)

    @property
    def grid(self):
        """(CTAs the next call launches, the most that can be resident at
        once)."""
        return tuple(self._layer.grid)

    def set_grid(self, ctas):
        """Launch `ctas` CTAs (0: one a multiprocessor, the default), to
        leave multiprocessors to kernels that run beside the layer;
        MokRuntimeError above what can be resident at once."""
        if not isinstance(ctas, int) or isinstance(ctas, bool) or ctas < 0:
            raise TypeError(f"ctas: expected an int >= 0, got {ctas!r}")
        self._layer.set_grid(ctas)

    def _param(self, name):
        for p in self.inputs:
            if p["name"] == name:
                return p
        raise ValueError(f"{name}: not an input of this layer; expected one of "
                         f"{', '.join(p['name'] for p in self.inputs)}")

    def _tensor(self, name, t, dtype, shape):
        """Checks one array in torch terms; returns it as a torch tensor
        detached from autograd (the same storage; any DLPack-capable GPU
        array — CuPy, JAX, ... — is taken zero-copy)."""
        torch = self.torch
        want = self._torch_dtype(dtype)
        if not isinstance(t, torch.Tensor) and hasattr(t, "__dlpack__"):
            try:
                t = torch.from_dlpack(t)
            except Exception as e:  # the producer's or torch's refusal, named
                raise TypeError(f"{name}: expected a torch.Tensor or a DLPack array "
                                f"({dtype} {list(shape)}); torch.from_dlpack of the "
                                f"{type(t).__name__} failed: {e}") from e
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor ({dtype} {list(shape)}), "
                            f"got {type(t).__name__}")
        if t.dtype != want:
            raise TypeError(f"{name}: expected dtype {want}, got {t.dtype}")
        if list(t.shape) != list(shape):
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
        if t.device != self.device:
            raise ValueError(f"{name}: expected a tensor on {self.device}, got {t.device}")
        return t.detach()

    def _tokens_of(self, given):
        """The call's token count: the rows of the token input (x, or a
        backward's d_out), checked against the capacity of a layer for any
        T; a layer for one T takes that T (its shape check names others)."""
        if not self.any_tokens:
            return self.max_tokens
        name = self._token_input
        t = given[name]
        shape = getattr(t, "shape", None)
        if shape is None or len(shape) < 1:
            return self.max_tokens  # the shape check names it
        tokens = int(shape[0])
        if tokens > self.max_tokens:
            raise ValueError(f"{name}: {tokens} tokens, more than this layer's capacity "
                             f"max_tokens = {self.max_tokens} (compile it with "
                             f"LayerSpec(tokens=None, max_tokens=...) of at least "
                             f"{tokens})")
        return tokens

    def _torch_dtype(self, dtype):
        return getattr(self.torch, _DTYPES[dtype])

    @property
    def extra_outputs(self):
        """The names of the outputs but the first (`out`), in the kernel's
        order; () for a layer with one output."""
        return tuple(p["name"] for p in self.outputs[1:])

    def _checked_out(self, name, out, p, inputs, outputs):
        """Output `p` given as `name` (out, or its name in `outputs=`)
        checked as an input is, and contiguous, not requiring grad, not
        overlapping any of `inputs` or of the other given `outputs` (dicts
        of torch tensors by name), as a torch tensor."""
        if getattr(out, "requires_grad", False):
            raise ValueError(f"{name}: must not require grad (the layer writes it in "
                             f"place, outside autograd)")
        out = self._validate(name, out, p)
        if not out.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor "
                             f"{self._shape(p)}, got strides {list(out.stride())}")
        for kind, others in (("input", inputs), ("output", outputs)):
            for n, t in others.items():
                if _overlap(out, t):
                    raise ValueError(f"{name}: overlaps the {kind} {n} in memory; pass a "
                                     f"separate tensor")
        return out

    def _outputs(self, out, outputs, inputs):
        """(tensors, results): every output by name, in the kernel's order,
        as a torch tensor to launch with, and as the call returns it (the
        caller's own object when given). `out` is the first output,
        `outputs` a dict of any of them by name; those given are checked
        (against `inputs`, a dict of torch tensors, and each other), the
        others allocated."""
        first = self.output["name"]
        names = [p["name"] for p in self.outputs]
        given = {}  # output name -> (argument name, the caller's object)
        if outputs is not None:
            if len(names) == 1:
                raise TypeError(f"outputs: this layer has one output ({first}); pass it "
                                f"as out=")
            if not isinstance(outputs, dict):
                raise TypeError(f"outputs: expected a dict of tensors by output name "
                                f"({', '.join(names)}), got {type(outputs).__name__}")
            for n, t in outputs.items():
                if n not in names:
                    raise TypeError(f"outputs: unknown output {n!r}; expected "
                                    f"{', '.join(names)}")
                given[n] = (n, t)
        if out is not None:
            if first in given:
                raise TypeError(f"out: the first output {first} is given twice (as out= "
                                f"and in outputs=)")
            given[first] = ("out", out)
        torch = self.torch
        tensors, results, checked = {}, {}, {}
        for p in self.outputs:
            n = p["name"]
            if n in given:
                arg, t = given[n]
                tensors[n] = checked[arg] = self._checked_out(arg, t, p, inputs, checked)
                results[n] = t
                continue
            if p.get("accumulate"):
                # The kernel adds into it (main_grad += dW): only the caller
                # has the values to add to.
                raise TypeError(f"outputs: {n!r} is accumulated into (the kernel adds to "
                                f"it: main_grad += dW); pass it in outputs=, a "
                                f"{self._torch_dtype(p['dtype'])} tensor of shape "
                                f"{self._shape(p)}")
            # Every element is written by the kernel (the combine writes each
            # token's row; a kernel's extra outputs must be written whole too,
            # which poison_outputs shows): no fill unless asked.
            t = torch.empty(self._shape(p), dtype=self._torch_dtype(p["dtype"]),
                            device=self.device)
            if self.poison_outputs:
                _poison(t)
            tensors[n] = results[n] = t
        return tensors, results

    def _shape(self, p):
        """Param `p`'s shape at this call: rows that follow the token count
        (`call_rows` = [scale, offset]) at the call's T."""
        rows = p.get("call_rows")
        if not rows:
            return list(p["shape"])
        return [rows[0] * self._call_tokens + rows[1]] + list(p["shape"][1:])

    def _validate(self, name, t, p):
        return self._tensor(name, t, p["dtype"], self._shape(p))

    @staticmethod
    def _export(t):
        # No synchronization by the producer: the launch is on torch's
        # current stream, which torch's own work is ordered on already (and
        # an export that synchronizes would break CUDA-graph capture).
        return t.__dlpack__(stream=-1)

    def bind_comm(self, comm, buffer=None):
        """Binds the layer to `comm` (a mok.Communicator of the layer's ep
        ranks; None, with `buffer` None, unbinds): its exchange buffer is
        `buffer` (comm.alloc_symmetric(n) with n >= symmetric_bytes, zeroed
        here) or one the layer allocates. Collective for an NCCL
        communicator: every rank binds its layers in the same order. A
        layer compiled for ep = 1 takes a communicator of one rank and runs
        as without one."""
        self._layer.bind_comm(comm_arg(comm), buffer)
        bound = self._layer.comm
        if bound is None:
            self._comm = None
        elif not (isinstance(comm, Communicator) and comm._comm is bound):
            self._comm = Communicator(bound)
        else:
            self._comm = comm

    @property
    def comm(self):
        """The bound mok.Communicator, or None."""
        return self._comm

    @property
    def exchange(self):
        """The exchange buffer (a mok._runtime.Symmetric: address,
        peer_table, peers()), or None."""
        return self._layer.exchange

    @property
    def epoch(self):
        """The forwards launched since binding (0: none); the compiler's
        kernels count their launches on the device, so a CUDA graph's
        replays are not counted here (docs/Runtime.md, "The epoch")."""
        return self._layer.epoch

    @property
    def symmetric_bytes(self):
        """The bytes of symmetric exchange buffer each rank needs (0 for
        ep = 1)."""
        return self._layer.symmetric_bytes

    @property
    def ep_group(self):
        """(size, rank, nccl_comm) of the layer's expert-parallel group."""
        return self._layer.ep_group

    @property
    def bound_weights(self):
        """The names of the operands bound to weight views."""
        return tuple(p["name"] for p in self.inputs
                     if p["name"] in self._layer.bound_weights)

    def bind_weights(self, name, weights):
        """Binds routed weight operand `name` (gate_weights, up_weights or
        down_weights) to `weights`, without a copy: a [E, rows, cols] tensor
        (cols contiguous; any row and expert strides that are multiples of
        16 bytes), a list of E [rows, cols] tensors (one allocation per
        expert, one row stride), or a mok._runtime.WeightView. The storage
        stays referenced while bound (not after: unbinding does not wait for
        forwards still running, so keep the memory valid until the last
        forward that reads it has finished); calls then take the operand
        from it and refuse it among their arguments. The weights are read in
        stream order: update them on the stream the layer runs on."""
        rt = _extensions.runtime()
        if name not in _ROUTED_WEIGHTS:
            raise ValueError(f"{name}: only the routed weights "
                             f"({', '.join(_ROUTED_WEIGHTS)}) can be bound to views")
        p = self._param(name)
        if isinstance(weights, rt.WeightView):
            view = weights
        elif isinstance(weights, (list, tuple)):
            experts, rows, cols = p["shape"]
            if len(weights) != experts:
                raise ValueError(f"{name}: expected {experts} per-expert tensors "
                                 f"[{rows}, {cols}], got {len(weights)}")
            view = rt.weights_per_expert(
                [self._tensor(f"{name}[{e}]", w, p["dtype"], [rows, cols])
                 for e, w in enumerate(weights)], name)
        else:
            view = rt.weights_from_tensor(self._validate(name, weights, p), name)
        self._layer.bind_weights(name, view)

    def bind_fc1(self, fc1):
        """Binds gate_weights and up_weights to the halves of a fused FC1
        tensor [E, 2I, H] (gate: rows [0, I) of each expert, up: rows
        [I, 2I)), without a copy."""
        rt = _extensions.runtime()
        experts, inter, hidden = self._param("gate_weights")["shape"]
        t = self._tensor("fc1", fc1, "bf16", [experts, 2 * inter, hidden])
        gate, up = rt.weights_split_fc1(t, "fc1")
        previous = self._layer.bound_weights.get("gate_weights")
        self._layer.bind_weights("gate_weights", gate)
        try:
            self._layer.bind_weights("up_weights", up)
        except BaseException:
            self._layer.bind_weights("gate_weights", previous)  # None unbinds
            raise

    def unbind_weights(self, name=None):
        """Unbinds `name` (every bound operand if None); calls take it as an
        argument again."""
        for n in [name] if name is not None else list(self.bound_weights):
            self._param(n)
            self._layer.unbind_weights(n)

    def read_workspace(self, name):
        """A CPU copy of the workspace buffer `name` (a metadata param of role
        "workspace": "phase_clock", "grid_barrier", ...) as a torch tensor of
        its dtype and shape. Synchronizes torch's current stream first, so
        that the forwards launched on it have written the buffer; a forward
        on another stream must be synchronized by the caller."""
        torch = self.torch
        torch.cuda.current_stream(self.device).synchronize()
        data = self._layer.read_workspace(name)  # names a wrong `name`
        p = next(p for p in self.meta["params"] if p["name"] == name)
        dtype = getattr(torch, _DTYPES[p["dtype"]])
        if not data:
            return torch.empty(p["shape"], dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=dtype).reshape(p["shape"])

    def _phase_deltas(self, caller, buffer, phases):
        """[(phase, stamp difference)] of the workspace `buffer` the last
        forward wrote at the boundaries of `phases` (_profile_phases; for
        phase_times, phase_cycles)."""
        if not getattr(self, "_forwards", 0):
            raise ValueError(f"{caller}: no forward has run on this layer yet")
        stamps = self.read_workspace(buffer).reshape(-1).tolist()
        return [(name, end - start) for name, start, end in zip(phases, stamps, stamps[1:])]

    def phase_times(self):
        """[(phase, milliseconds)] of the last forward, for a layer compiled
        with mok.compile(..., profile=True): the differences of consecutive
        %globaltimer timestamps the kernel wrote to its "phase_clock"
        workspace buffer, named by the metadata's "phases". Synchronizes
        torch's current stream (read_workspace). ValueError for a layer
        compiled without profiling, or before its first forward."""
        return [(name, ns / 1e6) for name, ns in self._phase_deltas(
            "phase_times", "phase_clock", _profile_phases(self.meta))]

    def phase_cycles(self):
        """[(phase, SM clock cycles)] of the last forward, for a layer
        compiled with profiling: the differences of consecutive %clock64
        values the grid's first thread wrote to the "phase_cycles" workspace
        buffer with each phase_clock timestamp (its SM's cycles, at whatever
        clock the board ran; with phase_times, the phase's mean clock).
        ValueError as phase_times, and for a layer compiled before the
        kernels recorded cycles."""
        phases = _profile_phases(self.meta)  # a profiled layer first
        # (Kernels compiled before phase_cycles existed record timestamps only.)
        cycles = _workspace_param(self.meta, "phase_cycles")
        if cycles is None:
            raise ValueError("phase_cycles: this layer's profiling kernel records no "
                             "cycles (compiled before phase_cycles existed); compile it "
                             "again")
        # One value with each timestamp (else the phases would pair wrongly).
        _check_stamps(cycles, phases, "values")
        return self._phase_deltas("phase_cycles", "phase_cycles", phases)

    def __call__(self, *args, out=None, outputs=None, **kwargs):
        """The output, for the inputs by name or by position (the inputs'
        order, without the operands bound to weight views); written into
        `out` if given (see the class). A layer with extra outputs returns
        a dict of every output by name, each written into `outputs[name]`
        if given there (`out` for the first)."""
        bound = self._layer.bound_weights
        names = [p["name"] for p in self.inputs if p["name"] not in bound]
        if len(args) > len(names):
            raise TypeError(f"expected at most {len(names)} arguments ({', '.join(names)})")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k in bound:
                raise TypeError(f"{k}: is bound to a weight view (bind_weights); do not "
                                f"pass it too, or unbind_weights({k!r}) first")
            if k not in names or k in given:
                raise TypeError(f"unexpected or repeated argument {k!r}; expected "
                                f"{', '.join(names)}")
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"missing argument(s): {', '.join(missing)}")
        self._call_tokens = self._tokens_of(given)
        for p in self.inputs:
            if p["name"] in given:
                given[p["name"]] = self._validate(p["name"], given[p["name"]], p)
        tensors, results = self._outputs(out, outputs, given)
        first = self.output["name"]
        if self._call_tokens == 0 and self.meta.get("ep", 1) > 1:
            # Every rank of the group must launch (the others wait for its
            # counts and rows).
            raise ValueError(
                f"{self._token_input}: 0 tokens, but this layer is one rank of an "
                f"expert-parallel group (ep = {self.meta['ep']}), whose kernels wait "
                "for each other: pass one token row whose routes are all -1 instead")
        if self._call_tokens == 0:
            # Nothing to compute and nothing launched: empty token rows, and
            # zeros (or, added into, unchanged) for the rest.
            for p in self.outputs:
                if not p.get("call_rows") and not p.get("accumulate"):
                    tensors[p["name"]].zero_()
            return results if len(self.outputs) > 1 else results[first]
        named = {n: self._export(t) for n, t in given.items()}
        named.update((n, self._export(t)) for n, t in tensors.items() if n != first)
        stream = self.torch.cuda.current_stream(self.device).cuda_stream
        self._layer.forward(named, out=self._export(tensors[first]), stream=stream)
        self._forwards += 1
        mode = _error_checks[0]
        if mode != "off":  # (the runtime does not wait on a capturing stream)
            # A local group's ranks run in this process: waiting here for
            # this rank's kernel, which waits for the ranks not launched
            # yet, would never end; their reports are taken without waiting
            # (check_errors() after the group's calls waits).
            comm = getattr(self, "_comm", None)
            local = comm is not None and comm.size > 1 and not comm.nccl_comm
            self._layer.take_report(stream, wait=mode == "sync" and not local)
        return results if len(self.outputs) > 1 else results[first]
