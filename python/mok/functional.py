# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mok.functional: the explicit forward/backward API that NeMo AutoModel's
``dispatcher: mok`` backend calls (nemo_automodel/components/moe/
mok_experts.py), backed by mok's compiler and runtime.

    cfg = mok.functional.MoKConfig()
    ws = mok.functional.get_workspace(cfg, ep_group, device=x.device,
                                      num_local_tokens=T, hidden_size=H, topk=k)
    sched = mok.functional.build_schedule(ws, cfg, top_experts,
                                          num_local_experts=E_local)
    out, ctx = mok.functional.forward(cfg, ws, sched, x, router_weights,
                                      shared_gate, shared_up, shared_down,
                                      routed_gate, routed_up, routed_down,
                                      swiglu_limit)
    (d_x, d_router_weights, d_routed_gate, d_routed_up, d_routed_down,
     d_shared_gate, d_shared_up, d_shared_down) = mok.functional.backward(
        cfg, ws, sched, ctx, d_out, x, router_weights, shared_gate, shared_up,
        shared_down, routed_gate, routed_up, routed_down, swiglu_limit)

Tensors: x bf16 [T, H]; router_weights f32 [T, k]; top_experts int32 or
int64 [T, k] (-1: no route); shared gate/up bf16 [Is, H], shared down
[H, Is] (all three None: no shared expert); routed gate/up bf16
[E_local, I, H], routed down [E_local, H, I]. CPU tensors run the CPU
target (the executable reference); CUDA tensors on an sm_90a or sm_100a
device run the GPU kernels. The layer is compiled once per shape (for any
token count, see `get_workspace`) and cached; the first call of a shape
pays the compile (seconds) and every later one none.

The schedule and the forward context are dataclasses of tensors only, so
a caller can pass them through ``ctx.save_for_backward`` (saved-tensor
hooks and activation checkpointing see every tensor) and rebuild them
with ``type(obj)(**fields)``. mok builds its routing plan on the device,
inside the kernel: the schedule holds the routes themselves.

``import mok.functional`` creates no CUDA context: the GPU runtime starts
on the first call with CUDA tensors, on their device.

Expert parallelism: `ep_group` of N > 1 ranks (a torch.distributed NCCL
process group, one GPU each) compiles one rank's kernels for ``ep = N``
(docs/ExpertParallel.md) and binds them to the group's NCCL communicator;
the CPU target runs N > 1 only as an in-process group (mok.compile), not
across processes, and refuses it here by name.

MXFP8 (AutoModel's ``precision: mxfp8``): the routed weights come as the
tuples of ``mok.ops.mxfp8_quantize`` (forward: ``(values, scales)`` of
the normal layout; backward: gate and up ``(values, scales, values_T,
scales_T)``, down ``(values_T, scales_T)``), and the layer is mok's
``precision="mxfp8"`` layer (docs/FP8.md): the forward's GEMMs read the
normal layouts, the backward's data gradients the transposed ones,
exactly as that layer quantizes the bf16 weights they came from. The
tuples are dequantized to bf16 (exactly) and the layer quantizes them
again, on the CPU target and on the GPU ones (on sm_90a, which has no
block-scaled MMA, its GEMMs are scalar: `tensor_cores=False`).
"""
import atexit
import dataclasses
import math
import threading
import weakref

import torch

from ._comm import Communicator
from ._compile import compile as _compile
from ._gpu import chip_of as _chip
from ._spec import DEFAULT_MAX_TOKENS, LayerSpec
from .ops import mxfp8_dequantize
from .torch import _run_backward, _run_forward

__all__ = ["MoKConfig", "MoKForwardContext", "MoKSchedule", "MoKWorkspace", "backward",
           "build_schedule", "create_workspace", "forward", "get_workspace"]


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class MoKConfig:
    """The layer's run-time settings, validated as NeMo AutoModel's
    MoKBackendConfig validates them.

    schedule_capacity_multiplier: the largest fraction of the group's routes
    one rank may receive (ep > 1): a rank's receive capacity is
    ``T * topk * max(2, ceil(ep * multiplier))`` routes (at most all the
    routes that can reach it), T the layer's token capacity; routing past
    it is an error naming it, never a silent overrun. No effect at ep = 1.

    fwd_num_comm_sms, bwd_num_comm_sms, minibatch_size, macrobatch_size,
    all_gather_top_experts_chunk_bytes: tuning knobs of the kernel mok
    replaces (SMs reserved for communication, the overlap granularity, a
    ring buffer of routed rows, the chunk of a routing all-gather). mok's
    kernels plan their own work split, hold every routed row and exchange
    route counts, not routes, so these are accepted and checked but do not
    change what runs (docs/Trainers.md)."""
    fwd_num_comm_sms: int = 40
    bwd_num_comm_sms: int = 28
    minibatch_size: int = 4096
    macrobatch_size: int = 131072
    schedule_capacity_multiplier: float = 0.5
    all_gather_top_experts_chunk_bytes: int = 2048

    def __post_init__(self):
        for name in ("fwd_num_comm_sms", "bwd_num_comm_sms"):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0 or v % 2:
                raise ValueError(f"MoKConfig.{name}: expected a positive even int, got {v!r}")
        v = self.minibatch_size
        if not _is_int(v) or v <= 0 or v % 256:
            raise ValueError(f"MoKConfig.minibatch_size: expected a positive multiple of 256, "
                             f"got {v!r}")
        v = self.macrobatch_size
        if not _is_int(v) or v <= 0 or v % self.minibatch_size:
            raise ValueError(f"MoKConfig.macrobatch_size: expected a positive multiple of "
                             f"minibatch_size = {self.minibatch_size}, got {v!r}")
        v = self.schedule_capacity_multiplier
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                or v <= 0):
            raise ValueError("MoKConfig.schedule_capacity_multiplier: expected a positive "
                             f"finite number, got {v!r}")
        v = self.all_gather_top_experts_chunk_bytes
        if not _is_int(v) or v <= 0 or v % 16:
            raise ValueError("MoKConfig.all_gather_top_experts_chunk_bytes: expected a "
                             f"positive multiple of 16, got {v!r}")


@dataclasses.dataclass
class MoKSchedule:
    """The routes of one call: top_experts [T, topk] (int32 or int64, -1 =
    no route), as given. The kernel plans the rows from them on the device."""
    top_experts: torch.Tensor


@dataclasses.dataclass
class MoKForwardContext:
    """What the training forward saved for the backward: its tensors, in
    the compiled layer's order."""
    saved: tuple


def _group_shape(group):
    """(size, rank) of `group` (None: one rank)."""
    if group is None:
        return 1, 0
    import torch.distributed as dist
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"ep_group: expected None or a torch.distributed.ProcessGroup, got "
                        f"{type(group).__name__}")
    return dist.get_world_size(group), dist.get_rank(group)


class MoKWorkspace:
    """One local activation shape's state: the group, the device, T, H and
    topk, and the layers compiled for it (opaque to callers)."""

    def __init__(self, config, ep_group, device, tokens, hidden, topk):
        self.config = config
        self.ep_group = ep_group
        self.ep, self.rank = _group_shape(ep_group)
        self.device = device
        self.tokens = tokens
        self.hidden = hidden
        self.topk = topk
        if device.type == "cpu":
            self.target = "cpu"
            if self.ep > 1:
                raise ValueError(f"ep_group: {self.ep} ranks on the CPU; expert parallelism "
                                 "across processes runs on the GPU targets (CUDA tensors and "
                                 "an NCCL group). mok.compile(LayerSpec(ep=N), target='cpu') "
                                 "runs a whole group in one process")
        else:
            self.target = _chip(device)

    def __repr__(self):
        return (f"MoKWorkspace(ep={self.ep}, rank={self.rank}, device={self.device}, "
                f"tokens={self.tokens}, hidden={self.hidden}, topk={self.topk}, "
                f"target={self.target!r})")


def _device_of(device):
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise TypeError(f"device: expected a torch.device, str or int, got {device!r}") from None
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected a CPU or CUDA device, got {device}")
    return device


def create_workspace(config, ep_group, *, device, num_local_tokens, hidden_size, topk):
    """A new workspace (get_workspace without its cache)."""
    if not isinstance(config, MoKConfig):
        raise TypeError(f"config: expected a mok.functional.MoKConfig, got "
                        f"{type(config).__name__}")
    for name, v, low in (("num_local_tokens", num_local_tokens, 0),
                         ("hidden_size", hidden_size, 1), ("topk", topk, 1)):
        if not _is_int(v) or v < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {v!r}")
    if topk > 255:
        raise ValueError(f"topk: expected at most 255, got {topk}")
    return MoKWorkspace(config, ep_group, _device_of(device), num_local_tokens, hidden_size,
                        topk)


_WORKSPACES = {}
_LOCK = threading.Lock()


def get_workspace(config, ep_group, *, device, num_local_tokens, hidden_size, topk):
    """The workspace of one local activation shape, cached by (group,
    device, T, H, topk, config): calls with the same shape get the same
    workspace, and so reuse its compiled layers."""
    dev = _device_of(device)
    key = (id(ep_group), str(dev), num_local_tokens, hidden_size, topk, config)
    with _LOCK:
        entry = _WORKSPACES.get(key)
        if entry is not None and entry[0]() is ep_group:
            return entry[1]
    ws = create_workspace(config, ep_group, device=dev, num_local_tokens=num_local_tokens,
                          hidden_size=hidden_size, topk=topk)
    group_ref = (weakref.ref(ep_group) if ep_group is not None else (lambda: None))
    with _LOCK:
        _WORKSPACES[key] = (group_ref, ws)
    return ws


def _check_workspace(workspace, config):
    if not isinstance(workspace, MoKWorkspace):
        raise TypeError(f"workspace: expected a MoKWorkspace (get_workspace), got "
                        f"{type(workspace).__name__}")
    if config is not workspace.config and config != workspace.config:
        raise ValueError("config: not the config the workspace was made with "
                         f"({workspace.config})")


def _check(name, t, dtypes, shape, device):
    """`t` must be a tensor of one of `dtypes`, of `shape`, on `device`."""
    want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
    dims = "[" + ", ".join(str(d) for d in shape) + "]"
    if isinstance(t, tuple):
        raise TypeError(f"{name}: got a tuple (MXFP8 weights, precision='mxfp8'), which "
                        f"only the routed weights may be: expected a {want} tensor of shape "
                        f"{dims}")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a {want} tensor of shape {dims}, got "
                        f"{type(t).__name__}")
    if t.dtype not in dtypes or list(t.shape) != list(shape):
        raise ValueError(f"{name}: expected a {want} tensor of shape {dims}, got "
                         f"{str(t.dtype).replace('torch.', '')} of shape {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the workspace's device), "
                         f"got one on {t.device}")


def build_schedule(workspace, config, top_experts, *, num_local_experts):
    """The schedule of one call: `top_experts` [T, topk] (int32 or int64,
    global expert ids, -1 = no route) checked against the workspace.
    `num_local_experts`: this rank's experts (the routed weights' first
    dimension); the group has ep * num_local_experts."""
    _check_workspace(workspace, config)
    if not _is_int(num_local_experts) or num_local_experts < 1:
        raise ValueError(f"num_local_experts: expected a positive int, got "
                         f"{num_local_experts!r}")
    if workspace.topk > workspace.ep * num_local_experts:
        raise ValueError(f"num_local_experts: {num_local_experts} on {workspace.ep} rank(s) "
                         f"is fewer experts than topk = {workspace.topk}")
    _check("top_experts", top_experts, (torch.int32, torch.int64),
           (workspace.tokens, workspace.topk), workspace.device)
    return MoKSchedule(top_experts=top_experts)


# Compiled (and for the GPU, loaded) layers by their spec, target, device
# and group.
_LAYERS = {}
atexit.register(_LAYERS.clear)  # (before the extension's teardown)


def _capacity(tokens):
    """The token capacity a GPU layer for T tokens is compiled for: at
    least DEFAULT_MAX_TOKENS, else T rounded up to a power of two, so that
    T changing from call to call rarely compiles a new layer."""
    return max(DEFAULT_MAX_TOKENS, 1 << max(tokens - 1, 0).bit_length())


def _reads_views(layer):
    """Whether a GPU training layer's kernels read the routed weights
    through tensor maps, and so take weight views (bind_fc1,
    bind_weights); a layer off the tensor-core path (sizes its GEMM tiles
    do not divide) reads dense weights passed as arguments."""
    return layer._forward._param("gate_weights").get("access") == "tensor_maps"


def _spec(workspace, local_experts, inter, shared_inter, swiglu_limit, id_dtype,
          precision="bf16"):
    ws = workspace
    max_tokens = recv = None
    if ws.target != "cpu":
        max_tokens = _capacity(ws.tokens)
        if ws.ep > 1:
            k = ws.topk
            most = ws.ep * max_tokens * min(k, local_experts)
            multiple = max(2, math.ceil(ws.ep * ws.config.schedule_capacity_multiplier))
            recv = min(most, max_tokens * k * multiple)
    return LayerSpec(hidden=ws.hidden, intermediate=inter, experts=local_experts * ws.ep,
                     top_k=ws.topk, tokens=None, shared_intermediate=shared_inter,
                     swiglu_limit=swiglu_limit,
                     padding=(32 if precision == "mxfp8" else 1) if ws.target == "cpu"
                     else 128, ep=ws.ep,
                     expert_id_dtype="int64" if id_dtype == torch.int64 else "int32",
                     max_tokens=max_tokens, recv_capacity=recv, precision=precision)


def _gpu_options(target, spec):
    """The compile options of a GPU layer beyond `training`: MXFP8 on
    sm_90a runs scalar GEMMs (Hopper has no block-scaled MMA)."""
    if spec.precision == "mxfp8" and target == "sm_90a":
        return {"tensor_cores": False}
    return {}


def _layer(workspace, spec):
    """The compiled layer of `spec` for the workspace's target, device and
    group: compiled (and loaded) on first use, cached after."""
    ws = workspace
    key = (spec, ws.target, str(ws.device), id(ws.ep_group))
    with _LOCK:
        entry = _LAYERS.get(key)
    if entry is not None and entry[0]() is ws.ep_group:
        return entry[1]
    if ws.target == "cpu":
        layer = _compile(spec, target="cpu")
    else:
        artifact = _compile(spec, target=ws.target, training=True,
                            **_gpu_options(ws.target, spec))
        comm = None
        if ws.ep > 1:
            comm = Communicator.adopt(ws.ep_group, ws.device.index)
        layer = artifact.load(ws.device.index, comm=comm)
    group_ref = (weakref.ref(ws.ep_group) if ws.ep_group is not None else (lambda: None))
    with _LOCK:
        _LAYERS[key] = (group_ref, layer)
    return layer


def _swiglu_limit(v):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"swiglu_limit: expected None (no clamp) or a positive finite number, "
                         f"got {v!r}")
    return float(v)


_ROUTED = ("routed_gate_weights", "routed_up_weights", "routed_down_weights")


def _mxfp8_routed(workspace, routed, phase):
    """The bf16 routed weights [E, I, H], [E, I, H], [E, H, I] that the
    MXFP8 tuples `routed` dequantize to: the normal layouts (`phase`
    "forward") or the transposed ones, transposed back ("backward"), each
    exact in bf16, so that the mxfp8 layer quantizing them again reads the
    same operands (mok.ops.mxfp8_dequantize)."""
    ws = workspace
    if not all(isinstance(w, tuple) for w in routed):
        plain = [n for n, w in zip(_ROUTED, routed) if not isinstance(w, tuple)]
        raise TypeError(f"{', '.join(plain)}: expected MXFP8 tuples like the other routed "
                        "weights (mok.ops.mxfp8_quantize), got a tensor")
    want = (2, 2, 2) if phase == "forward" else (4, 4, 2)
    out = []
    for name, w, n in zip(_ROUTED, routed, want):
        if len(w) != n:
            layout = ("(values, scales)" if phase == "forward" else
                      "(values, scales, values_T, scales_T)" if n == 4 else
                      "(values_T, scales_T)")
            raise ValueError(f"{name}: expected an MXFP8 tuple of {n} tensors {layout} in "
                             f"{phase}, got {len(w)}")
        for t in w:
            if not isinstance(t, torch.Tensor) or t.device != ws.device:
                raise ValueError(f"{name}: expected MXFP8 tensors on {ws.device} (the "
                                 f"workspace's device), got "
                                 f"{getattr(t, 'device', type(t).__name__)}")
        values, scales = w[:2] if phase == "forward" else w[-2:]
        dense = mxfp8_dequantize(values, scales, name)
        out.append(dense if phase == "forward" else dense.transpose(-1, -2).contiguous())
    return out


def _call(workspace, schedule, x, router_weights, shared, routed, swiglu_limit,
          phase="forward"):
    """(layer, argument names, tensors in the layer's order) of one call,
    every tensor checked against the workspace and the others."""
    ws = workspace
    if not isinstance(schedule, MoKSchedule):
        raise TypeError(f"schedule: expected a MoKSchedule (build_schedule), got "
                        f"{type(schedule).__name__}")
    T, H, k, dev = ws.tokens, ws.hidden, ws.topk, ws.device
    _check("x", x, (torch.bfloat16,), (T, H), dev)
    _check("router_weights", router_weights, (torch.float32,), (T, k), dev)
    top = schedule.top_experts
    _check("schedule.top_experts", top, (torch.int32, torch.int64), (T, k), dev)
    precision = "bf16"
    if any(isinstance(w, tuple) for w in routed):
        routed = _mxfp8_routed(ws, routed, phase)
        precision = "mxfp8"
    gate, up, down = routed
    names = _ROUTED
    if not isinstance(gate, torch.Tensor) or gate.dim() != 3:
        _check(names[0], gate, (torch.bfloat16,), ("E_local", "I", H), dev)
    e, inter = gate.shape[0], gate.shape[1]
    _check(names[0], gate, (torch.bfloat16,), (e, inter, H), dev)
    _check(names[1], up, (torch.bfloat16,), (e, inter, H), dev)
    _check(names[2], down, (torch.bfloat16,), (e, H, inter), dev)
    if k > ws.ep * e:
        raise ValueError(f"routed_gate_weights: {e} local experts on {ws.ep} rank(s) are "
                         f"fewer than topk = {k}")
    s_gate, s_up, s_down = shared
    shared_inter = None
    weights = [gate, up, down]
    if not (s_gate is None and s_up is None and s_down is None):
        if isinstance(s_gate, tuple) or not isinstance(s_gate, torch.Tensor) \
                or s_gate.dim() != 2:
            _check("shared_gate_weights", s_gate, (torch.bfloat16,), ("Is", H), dev)
        shared_inter = s_gate.shape[0]
        _check("shared_gate_weights", s_gate, (torch.bfloat16,), (shared_inter, H), dev)
        _check("shared_up_weights", s_up, (torch.bfloat16,), (shared_inter, H), dev)
        _check("shared_down_weights", s_down, (torch.bfloat16,), (H, shared_inter), dev)
        weights += [s_gate, s_up, s_down]
    spec = _spec(ws, e, inter, shared_inter, _swiglu_limit(swiglu_limit), top.dtype, precision)
    layer = _layer(ws, spec)
    return layer, list(layer.arg_names), [x, top, router_weights, *weights]


def forward(config, workspace, schedule, x, router_weights, shared_gate_weights,
            shared_up_weights, shared_down_weights, routed_gate_weights, routed_up_weights,
            routed_down_weights, swiglu_limit=None):
    """The layer's training forward: (out bf16 [T, H], MoKForwardContext).
    out = shared expert(x) + sum over routes of router_weight * routed
    expert(x), SwiGLU clamped by `swiglu_limit` (None: no clamp)."""
    _check_workspace(workspace, config)
    layer, names, values = _call(
        workspace, schedule, x, router_weights,
        (shared_gate_weights, shared_up_weights, shared_down_weights),
        (routed_gate_weights, routed_up_weights, routed_down_weights), swiglu_limit)
    with torch.no_grad():
        out, *saved = _run_forward(layer, names, values)
    if not saved:
        raise RuntimeError("mok: the training forward saved no context (a recomputing "
                           "layer); mok.functional needs one")
    return out, MoKForwardContext(saved=tuple(saved))


def backward(config, workspace, schedule, forward_context, grad_output, x, router_weights,
             shared_gate_weights, shared_up_weights, shared_down_weights,
             routed_gate_weights, routed_up_weights, routed_down_weights, swiglu_limit=None):
    """The gradients of `forward`'s call from d_out = `grad_output` (bf16
    [T, H]): (d_x bf16 [T, H], d_router_weights f32 [T, topk],
    d_routed_gate, d_routed_up, d_routed_down, d_shared_gate, d_shared_up,
    d_shared_down), each weight's gradient bf16 in its shape (None for an
    absent shared expert). The arguments are forward's, unchanged."""
    _check_workspace(workspace, config)
    if not isinstance(forward_context, MoKForwardContext):
        raise TypeError(f"forward_context: expected a MoKForwardContext (forward), got "
                        f"{type(forward_context).__name__}")
    layer, names, values = _call(
        workspace, schedule, x, router_weights,
        (shared_gate_weights, shared_up_weights, shared_down_weights),
        (routed_gate_weights, routed_up_weights, routed_down_weights), swiglu_limit,
        phase="backward")
    _check("grad_output", grad_output, (torch.bfloat16,), (workspace.tokens, workspace.hidden),
           workspace.device)
    saved = tuple(forward_context.saved)
    with torch.no_grad():
        grads = _run_backward(layer, names, grad_output, [*values, *saved], {})
    return (grads["x"], grads["router_weights"], grads["gate_weights"], grads["up_weights"],
            grads["down_weights"], grads.get("shared_gate_weights"),
            grads.get("shared_up_weights"), grads.get("shared_down_weights"))
