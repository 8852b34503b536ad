# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Communicators on the GPU (docs/Runtime.md, "Expert parallelism:
communicators and symmetric buffers"): a real NCCL communicator of one rank
(unique id, init, window registration, its peer table mapping the buffer's
memory), torch's process group adopted, NCCL's error paths each named, and a
local group of 4 ranks on the one GPU whose layers (a hand-written kernel) store into each other's
exchange buffers through their peer tables, with their rank and epoch.

One GPU allows one NCCL rank (NCCL refuses two ranks on one device): sizes
that differ between NCCL ranks are tested with the stand-in NCCL
(test_comm.py, mok-runtime-host-test) and here with a local group."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

import mok

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 120


def _alias(address, count, torch, dtype="<i8"):
    """A torch tensor of `count` elements over device memory at `address`
    (zero-copy, through __cuda_array_interface__)."""
    class Raw:
        __cuda_array_interface__ = {"shape": (count,), "typestr": dtype,
                                    "data": (address, False), "version": 3,
                                    "strides": None}
    return torch.as_tensor(Raw(), device="cuda")


def _python(code, **env):
    """Runs `code` in a fresh python3 (NCCL and the driver are loaded once a
    process), bounded; (returncode, stdout + stderr)."""
    environment = dict(os.environ, **env)
    environment["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, env=environment,
                          timeout=TIMEOUT_S)
    return proc.returncode, proc.stdout + proc.stderr


def test_nccl_is_loaded_and_new_enough():
    version, path = mok.load_nccl()
    print(f"NCCL {version} from {path}")
    assert version >= 22800 and os.path.exists(path)


def test_one_rank_window_and_peer_table():
    """unique id -> ncclCommInitRank -> ncclMemAlloc + ncclCommWindowRegister:
    the buffer starts zeroed, and its one peer-table entry (NCCL's LSA
    address of this rank's window) maps the buffer's memory."""
    import torch
    torch.cuda.init()
    comm = mok.Communicator.from_unique_id(mok.Communicator.unique_id(), 1, 0, 0)
    assert (comm.size, comm.rank, comm.device) == (1, 0, 0) and comm.nccl_comm
    n = (1 << 20) // 8
    buf = comm.alloc_symmetric(8 * n)
    assert buf.bytes == 8 * n and buf.complete and buf.ranks == 1
    peers = buf.peers()
    assert len(peers) == 1 and peers[0]
    print(f"buffer 0x{buf.address:x}, its peer-table entry 0x{peers[0]:x}")
    mine, through_table = _alias(buf.address, n, torch), _alias(peers[0], n, torch)
    assert int(mine.abs().sum()) == 0  # zeroed
    mine.copy_(torch.arange(n, device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(through_table, mine)
    through_table[7] = -5
    torch.cuda.synchronize()
    assert int(mine[7]) == -5
    with pytest.raises(mok.MokRuntimeError, match="symmetric buffer"):
        comm.destroy()  # a buffer of it is live
    buf.free()
    comm.destroy()


def test_adopts_torch_process_group():
    """torch.distributed's NCCL communicator (world of one), adopted: not
    destroyed by mok; its symmetric buffer maps as the one above."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out = _python(f"""
        import torch, torch.distributed as dist, mok
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:{port}",
                                rank=0, world_size=1, device_id=torch.device("cuda", 0))
        comm = mok.Communicator.adopt(dist.group.WORLD)
        version, path = mok.load_nccl()
        print("NCCL", version, path)
        assert comm.size == 1 and comm.rank == 0 and comm.device == 0
        buf = comm.alloc_symmetric(4096)
        peer = buf.peers()[0]
        class Raw:
            def __init__(self, a):
                self.__cuda_array_interface__ = {{"shape": (512,), "typestr": "<i8",
                    "data": (a, False), "version": 3, "strides": None}}
        mine = torch.as_tensor(Raw(buf.address), device="cuda")
        mine.fill_(3)
        torch.cuda.synchronize()
        assert int(torch.as_tensor(Raw(peer), device="cuda").sum()) == 3 * 512
        buf.free(); comm.destroy()
        t = torch.ones(1, device="cuda"); dist.all_reduce(t)  # still torch's
        torch.cuda.synchronize()
        dist.destroy_process_group()
        print("ok")
    """)
    assert code == 0 and "ok" in out, out[-4000:]


def test_missing_nccl_library_is_named():
    code, out = _python("""
        import mok
        try:
            mok.Communicator.unique_id()
        except mok.MokRuntimeError as e:
            assert e.status == "MOK_ERROR_NCCL_UNAVAILABLE", e.status
            assert "NCCL could not be loaded (/nonexistent/libnccl.so.2)" in str(e), str(e)
            print("ok")
    """, MOK_NCCL_LIBRARY="/nonexistent/libnccl.so.2")
    assert code == 0 and "ok" in out, out[-4000:]


def test_bad_unique_id_is_nccls_error_named():
    """An id no rank 0 made: NCCL's own error, through mok, by name (in a
    process of its own, bounded: NCCL reports it at once here, its address
    being of no family; an id of a vanished rank 0 would wait for it)."""
    code, out = _python("""
        import mok
        try:
            mok.Communicator.from_unique_id(b"\\xff" * 128, 1, 0, 0)
        except mok.MokRuntimeError as e:
            print(e.status, e)
            assert e.status == "MOK_ERROR_NCCL", e.status
            assert "ncclCommInitRank (rank 0 of 1, device 0): " in str(e), str(e)
            print("ok")
        try:
            mok.Communicator.from_unique_id(bytes(128), 1, 0, 0)
        except mok.MokRuntimeError as e:
            assert "id: all 128 bytes are zero" in str(e), str(e)
            print("ok")
    """)
    assert code == 0 and out.count("ok") == 2, out[-4000:]


def test_local_group_sizes_must_agree():
    comms = mok.Communicator.local_group(2, 0)
    a = comms[0].alloc_symmetric(4096)
    with pytest.raises(mok.MokRuntimeError, match="bytes: 8192 on rank 1, but rank 0 "
                       "allocated 4096 as symmetric buffer #0 of this local group"):
        comms[1].alloc_symmetric(8192)
    b = comms[1].alloc_symmetric(4096)
    assert a.peers() == b.peers() == [a.address, b.address]
    a.free()
    b.free()


def _ep_kernel(ep):
    """Each of the first `ep` threads reads entry i of the peer table and
    stores the launch's epoch into slot `rank` of rank i's buffer."""
    return f"""
.version 8.0
.target sm_90a
.address_size 64

.visible .entry moe_ep_forward(
  .param .u64 x,
  .param .u64 out,
  .param .u64 peers,
  .param .u32 rank,
  .param .u64 epoch,
  .param .u64 symmetric
)
{{
  .reg .pred %p;
  .reg .b32 %r<2>;
  .reg .b64 %rd<8>;
  mov.u32 %r0, %tid.x;
  setp.ge.u32 %p, %r0, {ep};
  @%p bra DONE;
  ld.param.u64 %rd0, [peers];
  ld.param.u32 %r1, [rank];
  ld.param.u64 %rd1, [epoch];
  mul.wide.u32 %rd2, %r0, 8;
  add.u64 %rd3, %rd0, %rd2;
  ld.u64 %rd4, [%rd3];
  mul.wide.u32 %rd5, %r1, 8;
  add.u64 %rd6, %rd4, %rd5;
  st.u64 [%rd6], %rd1;
DONE:
  ret;
}}
"""


def _ep_metadata(ep):
    return {"mok_metadata_version": 5, "function": "moe_ep", "kernel": "moe_ep_forward",
            "chip": "sm_90a", "block": 256, "grid": "persistent: one CTA per SM",
            "cooperative": True, "dynamic_shared_memory": 0, "ep": ep,
            "symmetric_bytes": 4096, "params": [
                {"name": "x", "role": "input", "dtype": "bf16", "shape": [4, 64]},
                {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
                {"name": "peers", "role": "peers", "dtype": "i64", "shape": [ep]},
                {"name": "rank", "role": "rank", "dtype": "i32", "shape": []},
                {"name": "epoch", "role": "epoch", "dtype": "i64", "shape": []},
                {"name": "symmetric", "role": "symmetric", "dtype": "u8", "shape": [4096]}]}


def test_local_group_of_four_layers_store_into_each_other():
    """Four layers of ep = 4, one per rank of a local group: each launch
    stores its epoch into its slot of every rank's exchange buffer through
    its peer table, so after step s every slot of every buffer holds s."""
    import torch
    ep = 4
    comms = mok.Communicator.local_group(ep, 0)
    art = mok.GpuArtifact(_ep_kernel(ep), _ep_metadata(ep))
    layers = [art.load(comm=c) for c in comms]
    for r, layer in enumerate(layers):
        assert layer.comm is comms[r] and layer.epoch == 0
        assert layer.symmetric_bytes == 4096 and layer.exchange.bytes == 4096
    addresses = [layer.exchange.address for layer in layers]
    for layer in layers:
        assert layer.exchange.peers() == addresses
    buffers = [_alias(a, ep, torch) for a in addresses]
    assert all(int(b.abs().sum()) == 0 for b in buffers)  # zeroed
    x = torch.zeros(4, 64, dtype=torch.bfloat16, device="cuda")
    for step in (1, 2, 3):
        for layer in layers:
            layer(x)
        torch.cuda.synchronize()
        for r, b in enumerate(buffers):
            assert b.tolist() == [step] * ep, (step, r, b.tolist())
        assert all(layer.epoch == step for layer in layers)
    # A rebinding starts the epoch again, with a buffer of the caller's.
    bufs = [c.alloc_symmetric(8192) for c in comms]
    for layer, b in zip(layers, bufs):
        layer.bind_comm(layer.comm, b)
    for layer in layers:
        layer(x)
    torch.cuda.synchronize()
    assert all(_alias(b.address, ep, torch).tolist() == [1] * ep for b in bufs)
    # Not into a CUDA graph: a replay would repeat the epoch.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with pytest.raises(mok.MokRuntimeError, match="being captured into a CUDA graph"):
            layers[0](x)
    for layer in layers:
        layer.bind_comm(None)
    for b in bufs:
        b.free()



def test_layers_through_one_rank_nccl_communicator():
    """unique id -> init -> window registration -> the layer through it.
    Layers compiled with self_exchange (ep = 1 planned as the one rank of
    an expert-parallel group: every route crosses the exchange) bound to a
    real NCCL communicator of one rank: their exchange buffers are NCCL's
    (ncclMemAlloc, registered as windows), and the kernels store counts,
    rows and results through NCCL's peer table and wait on its epoch
    flags. The forward (tensor cores, a shared expert) and the training
    forward + backward are bitwise the ep = 1 layers' and within 1e-2 of
    float64, outputs poisoned first, over repeated calls (new epochs). An
    ep = 1 layer bound to the communicator runs as without one."""
    import torch
    from bench import torch_reference
    from bench.cases import EP_CASES, EP_TRAIN_CASES, ep1_twin, ep_train_twin
    from gpu_layers import forward_artifact, fresh_seed, training_artifact
    torch.cuda.init()
    comm = mok.Communicator.from_unique_id(mok.Communicator.unique_id(), 1, 0, 0)
    assert comm.nccl_comm and comm.size == 1
    gen = torch.Generator().manual_seed(fresh_seed())

    # The forward.
    c = dict(EP_CASES["ep4_shared"], **ep1_twin(EP_CASES["ep4_shared"]))
    selfx = forward_artifact("ep4_shared-self")
    with pytest.raises(mok.MokRuntimeError, match="self-exchange"):
        selfx.load(poison_outputs=True)  # no communicator
    through = selfx.load(comm=comm, poison_outputs=True)
    assert through.comm is comm and through.ep_group[0] == 1
    assert through.symmetric_bytes > 0
    assert through.exchange.bytes >= through.symmetric_bytes
    assert len(through.exchange.peers()) == 1 and through.exchange.peers()[0]
    plain = forward_artifact("ep4_shared-ep1")
    plain_bound = plain.load(comm=comm, poison_outputs=True)
    assert plain_bound.symmetric_bytes == 0 and plain_bound.exchange is None
    unbound = plain.load(poison_outputs=True)
    for call in range(3):
        inputs = torch_reference.make_inputs(c, gen, tokens=c["tokens"])
        out = through(**inputs)
        out_plain = plain_bound(**inputs)
        expected = unbound(**inputs)
        torch.cuda.synchronize()
        through.check_errors()
        assert not torch.isnan(out).any(), f"call {call}: NaN (unwritten rows?)"
        assert torch.equal(out, expected), f"call {call}: differs from the ep = 1 layer"
        assert torch.equal(out_plain, expected)
        ref64 = torch_reference.forward(inputs, c["experts"], c.get("swiglu_limit"))
        rel = torch_reference.relative_error(out, ref64)
        assert rel <= 1e-2, f"call {call}: relative error {rel:.3e}"
    assert through.epoch == 3

    # Training: the forward with its context, then the backward.
    t = dict(EP_TRAIN_CASES["train_ep4_shared"],
             **ep_train_twin(EP_TRAIN_CASES["train_ep4_shared"]))
    trainer = training_artifact("train_ep4_shared-self").load(comm=comm, poison_outputs=True)
    assert trainer.comm is comm
    reference = training_artifact("train_ep4_shared-ep1").load(poison_outputs=True)
    for call in range(2):
        inputs = torch_reference.make_inputs(t, gen, tokens=t["tokens"])
        d_out = torch.randn(t["tokens"], t["hidden"], generator=gen).to(torch.bfloat16).cuda()
        out, ctx = trainer.forward(**inputs)
        grads = trainer.backward(ctx, d_out)
        out1, ctx1 = reference.forward(**inputs)
        grads1 = reference.backward(ctx1, d_out)
        torch.cuda.synchronize()
        trainer.check_errors()
        assert torch.equal(out, out1), f"training call {call}: out differs from ep = 1"
        ref64 = torch_reference.backward(inputs, d_out, t["experts"], t.get("swiglu_limit"))
        for name, want in grads1.items():
            got = grads[name]
            assert not torch.isnan(got).any(), f"training call {call}: NaN in d_{name}"
            assert torch.equal(got, want), f"training call {call}: d_{name} differs from ep = 1"
            if name in ref64:
                rel = torch_reference.relative_error(got, ref64[name])
                assert rel <= 1e-2, f"training call {call}: d_{name} relative error {rel:.3e}"

    layers = (through, plain_bound, trainer)
    with pytest.raises(mok.MokRuntimeError, match="layer"):
        comm.destroy()  # layers are bound to it
    for bound in layers:
        bound.bind_comm(None)
    assert trainer.comm is None
    del layers, through, plain_bound, trainer
    import gc
    gc.collect()
    comm.destroy()
