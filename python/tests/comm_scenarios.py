# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Communicator scenarios, each in a process of its own (the runtime loads
NCCL and its driver once a process), with the stand-in driver and NCCL
(runtime/tests/FakeCuda.cpp, FakeNccl.cpp, <build>/lib/libmok_fake_cuda.so)
as MOK_CUDA_DRIVER and MOK_NCCL_LIBRARY, or with none: test_comm.py runs
them.

    python3 comm_scenarios.py SCENARIO

Each checks with assert (a failure exits non-zero with its traceback) and
prints "ok"."""
import ctypes
import gc
import json
import os
import sys
import threading

import mok
from mok import _runtime as rt

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from properties import CUDA0, dense  # noqa: E402

LIB = os.path.join(os.path.dirname(os.path.abspath(rt.__file__)), "..", "..", "lib")
FAKE = os.path.join(LIB, "libmok_fake_cuda.so")
FAKE_PEER_POINTER = os.path.join(LIB, "libmok_fake_nccl_peer_pointer.so")
FAKE_NO_WINDOWS = os.path.join(LIB, "libmok_fake_nccl_no_windows.so")

# An expert-parallel layer (metadata version 5, hand-written: the roles of
# its exchange without the rest of a layer) and its kernel, the params in
# order.
PTX = (".version 8.1\n.target sm_90a\n.address_size 64\n"
       ".visible .entry moe_ep_forward(\n  .param .u64 x,\n  .param .u64 out,\n"
       "  .param .u64 peers,\n  .param .u32 rank,\n  .param .u64 epoch,\n"
       "  .param .u64 symmetric\n)\n{\n  ret;\n}\n")


def ep_meta(ep, symmetric_bytes=8192):
    return {"mok_metadata_version": 5, "kernel": "moe_ep_forward", "block": 256,
            "cooperative": True, "dynamic_shared_memory": 0, "ep": ep,
            "symmetric_bytes": symmetric_bytes, "params": [
                {"name": "x", "role": "input", "dtype": "bf16", "shape": [4, 64]},
                {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]},
                {"name": "peers", "role": "peers", "dtype": "i64", "shape": [ep]},
                {"name": "rank", "role": "rank", "dtype": "i32", "shape": []},
                {"name": "epoch", "role": "epoch", "dtype": "i64", "shape": []},
                {"name": "symmetric", "role": "symmetric", "dtype": "u8",
                 "shape": [symmetric_bytes]}]}


class Fake:
    """The stand-ins' counters and controls (the library the runtime loaded)."""

    def __init__(self, path=FAKE):
        self.lib = ctypes.CDLL(path)
        for name in ("live_allocations", "context_retains", "bad_releases", "launches"):
            getattr(self.lib, "mok_fake_cuda_" + name).restype = ctypes.c_int64
        self.lib.mok_fake_cuda_last_params.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.lib.mok_fake_nccl_live.restype = ctypes.c_int64
        self.lib.mok_fake_nccl_live.argtypes = [ctypes.c_char_p]
        self.lib.mok_fake_nccl_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
        self.lib.mok_fake_nccl_comm_of_one.restype = ctypes.c_void_p
        self.lib.mok_fake_nccl_comm_destroy.argtypes = [ctypes.c_void_p]

    def clean(self):
        return {"allocations": self.lib.mok_fake_cuda_live_allocations(),
                "retains": self.lib.mok_fake_cuda_context_retains(),
                "bad_releases": self.lib.mok_fake_cuda_bad_releases(),
                "comms": self.lib.mok_fake_nccl_live(b"comms"),
                "memory": self.lib.mok_fake_nccl_live(b"memory"),
                "windows": self.lib.mok_fake_nccl_live(b"windows")}

    def last_params(self):
        words = (ctypes.c_uint64 * 16)()
        n = self.lib.mok_fake_cuda_last_params(words, 16)
        return list(words[:n])


CLEAN = {"allocations": 0, "retains": 0, "bad_releases": 0, "comms": 0, "memory": 0,
         "windows": 0}


def raises(kind, text, call, *args, **kwargs):
    """The exception `call` raises: of `kind`, its message containing `text`."""
    try:
        call(*args, **kwargs)
    except kind as e:
        assert text in str(e), f"{text!r} not in {str(e)!r}"
        return e
    raise AssertionError(f"{call} did not raise {kind.__name__} ({text})")


def on_ranks(n, body):
    """body(rank) on n threads at once (the runtime calls that wait for the
    other ranks release the GIL); the results, or the exceptions raised."""
    results = [None] * n

    def run(r):
        try:
            results[r] = body(r)
        except Exception as e:  # noqa: BLE001 (returned to the caller)
            results[r] = e
    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def no_nccl():
    """MOK_NCCL_LIBRARY names a file that does not exist: every call that
    needs NCCL says so, naming the file; argument errors come first."""
    assert mok.nccl_library() == "/nonexistent/libnccl.so.2"
    e = raises(mok.MokRuntimeError, "NCCL could not be loaded (/nonexistent/libnccl.so.2): ",
               mok.load_nccl)
    assert e.status == "MOK_ERROR_NCCL_UNAVAILABLE"
    assert "mok's communicators need NCCL 2.28 or newer" in str(e)
    raises(mok.MokRuntimeError, "NCCL could not be loaded", mok.Communicator.unique_id)
    raises(TypeError, "library: expected a path (str) or None, got int", mok.load_nccl, 3)
    raises(TypeError, "unique_id: expected bytes (128, from unique_id()), got str",
           mok.Communicator.from_unique_id, "id", 2, 0, 0)
    raises(ValueError, "unique_id: expected 128 bytes, got 5",
           mok.Communicator.from_unique_id, b"12345", 2, 0, 0)
    raises(TypeError, "nranks: expected an int, got bool",
           mok.Communicator.from_unique_id, b"\1" * 128, True, 0, 0)
    raises(TypeError, "device: expected a CUDA device ordinal (int), a cuda torch.device or "
           "None, got str", mok.Communicator.from_unique_id, b"\1" * 128, 2, 0, "0")
    raises(mok.MokRuntimeError, "NCCL could not be loaded",
           mok.Communicator.from_unique_id, b"\1" * 128, 2, 0, 0)
    raises(TypeError, "nccl_comm: expected an int (an address), got str",
           mok.Communicator.from_nccl_comm, "comm")
    raises(ValueError, "nccl_comm: is 0 (NULL)", mok.Communicator.from_nccl_comm, 0)
    # A local group needs no NCCL, but a driver.
    raises(mok.MokRuntimeError, "n: expected 1 to 1024 ranks, got 0",
           mok.Communicator.local_group, 0, 0)
    raises(TypeError, "n: expected an int, got float", mok.Communicator.local_group, 2.0, 0)
    e = raises(mok.MokRuntimeError, "the CUDA driver could not be loaded",
               mok.Communicator.local_group, 2, 0)
    assert e.status == "MOK_ERROR_DRIVER_UNAVAILABLE"
    raises(TypeError, "comm: expected a mok._runtime.Comm, got int", mok.Communicator, 5)
    # A layer compiled for ep > 1 refuses to load without a communicator.
    layer = rt.Layer(json.dumps(ep_meta(2)))
    assert layer.ep_size == 2 and layer.symmetric_bytes == 8192 and layer.epoch == 0
    assert layer.comm is None and layer.exchange is None
    raises(mok.MokRuntimeError, "layer: compiled for ep = 2 (expert parallelism), but no "
           "communicator is bound (bind one of 2 ranks with mok_layer_bind_comm)",
           layer.load, 0, PTX)
    raises(TypeError, "comm: expected a Comm (or None), got int", layer.bind_comm, 3)
    raises(TypeError, "buffer: expected a Symmetric buffer (Comm.alloc_symmetric) or None, "
           "got str", layer.bind_comm, None, "b")
    layer.bind_comm()  # nothing bound: nothing to unbind
    print("ok")


def nccl_load():
    """Loading the stand-in NCCL: the variants refused first (an entry point
    missing, too old), then the library, and no second copy."""
    e = raises(mok.MokRuntimeError, "lacks ncclCommWindowRegister (NCCL 2.27)",
               mok.load_nccl, FAKE_NO_WINDOWS)
    assert e.status == "MOK_ERROR_NCCL_UNAVAILABLE"
    os.environ["MOK_FAKE_NCCL_VERSION"] = "22703"
    raises(mok.MokRuntimeError, "NCCL 2.27.3 (", mok.load_nccl)
    del os.environ["MOK_FAKE_NCCL_VERSION"]
    version, path = mok.load_nccl()
    assert version == 22809 and os.path.samefile(path, FAKE), (version, path)
    assert mok.load_nccl() == (version, path)
    e = raises(mok.MokRuntimeError, "library: NCCL is loaded from ", mok.load_nccl,
               FAKE_PEER_POINTER)
    assert e.status == "MOK_ERROR_INVALID_ARGUMENT"
    assert "would be another copy in this process" in str(e)
    print("ok")


def one_rank():
    """One NCCL rank: ids, arguments, NCCL's errors, a symmetric buffer and
    its peer table, adoption, destroy; nothing left."""
    fake = Fake()
    uid = mok.Communicator.unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128
    raises(mok.MokRuntimeError, "id: all 128 bytes are zero",
           mok.Communicator.from_unique_id, bytes(128), 1, 0, 0)
    raises(mok.MokRuntimeError, "nranks/rank: expected 0 <= rank < nranks, got rank 2 of 2",
           mok.Communicator.from_unique_id, uid, 2, 2, 0)
    raises(mok.MokRuntimeError, "device: expected 0 <= device < 1, got 3",
           mok.Communicator.from_unique_id, uid, 1, 0, 3)
    e = raises(mok.MokRuntimeError, "ncclCommInitRank (rank 0 of 1, device 0): invalid "
               "argument", mok.Communicator.from_unique_id, b"\xff" * 128, 1, 0, 0)
    assert e.status == "MOK_ERROR_NCCL"
    assert "fake NCCL: the unique id was not made by ncclGetUniqueId" in str(e)
    assert fake.clean() == CLEAN

    comm = mok.Communicator.from_unique_id(bytearray(uid), 1, 0, 0)
    assert (comm.size, comm.rank, comm.device) == (1, 0, 0) and comm.nccl_comm != 0
    assert repr(comm) == "Communicator(nccl, rank 0 of 1, cuda:0)"
    raises(TypeError, "bytes: expected an int, got str", comm.alloc_symmetric, "4096")
    raises(mok.MokRuntimeError, "bytes: expected an int from 1 to", comm.alloc_symmetric, 0)
    buf = comm.alloc_symmetric(4096)
    assert buf.bytes == 4096 and buf.ranks == 1 and buf.rank == 0 and buf.complete
    peers = buf.peers()
    assert len(peers) == 1 and peers[0] != 0
    # The entry maps this rank's own memory (NCCL's LSA address).
    ctypes.c_uint64.from_address(buf.address + 64).value = 0x5A5A
    assert ctypes.c_uint64.from_address(peers[0] + 64).value == 0x5A5A
    raises(mok.MokRuntimeError, "comm: 1 symmetric buffer(s) of it are live", comm.destroy)
    buf.free()
    assert buf.freed
    raises(mok.MokRuntimeError, "buffer: freed (free() was called)", lambda: buf.address)
    buf.free()  # a second free does nothing
    comm.destroy()
    raises(mok.MokRuntimeError, "comm: destroyed (destroy() was called)", lambda: comm.size)
    assert repr(comm) == "Communicator(destroyed)"
    assert fake.clean() == CLEAN

    # A trainer's ncclComm_t: adopted, not destroyed by mok.
    raw = fake.lib.mok_fake_nccl_comm_of_one(0)
    adopted = mok.Communicator.from_nccl_comm(raw)
    assert adopted.nccl_comm == raw and adopted.size == 1 and adopted.device == 0
    raises(mok.MokRuntimeError, "device: 1, but the communicator is on device 0 "
           "(ncclCommCuDevice)", mok.Communicator.from_nccl_comm, raw, 1)
    del adopted
    gc.collect()
    assert fake.lib.mok_fake_nccl_live(b"comms") == 1
    assert fake.lib.mok_fake_nccl_comm_destroy(raw) == 0
    assert fake.clean() == CLEAN
    print("ok")


def two_ranks():
    """Two NCCL ranks (threads): a size that differs is refused on both,
    naming both; equal sizes give peer tables that reach each other's
    buffers."""
    fake = Fake()
    uid = mok.Communicator.unique_id()
    comms = on_ranks(2, lambda r: mok.Communicator.from_unique_id(uid, 2, r, 0))
    assert all(isinstance(c, mok.Communicator) for c in comms), comms
    errors = on_ranks(2, lambda r: comms[r].alloc_symmetric(4096 * (r + 1)))
    assert isinstance(errors[0], mok.MokRuntimeError), errors
    assert "bytes: 4096 on rank 0, but rank 1 asks for 8192: every rank allocates a " \
        "symmetric buffer of the same size" in str(errors[0])
    assert "bytes: 8192 on rank 1, but rank 0 asks for 4096" in str(errors[1])
    assert errors[0].status == errors[1].status == "MOK_ERROR_INVALID_ARGUMENT"
    bufs = on_ranks(2, lambda r: comms[r].alloc_symmetric(4096))
    tables = [b.peers() for b in bufs]
    assert tables[0] == tables[1]
    for r in range(2):
        for i in range(2):
            ctypes.c_uint64.from_address(tables[r][i] + 8 * r).value = 100 + r
            assert ctypes.c_uint64.from_address(bufs[i].address + 8 * r).value == 100 + r
    # Layers of ep = 2: bound (collective), loaded, launched with their
    # peer table, rank and epoch.
    layers = [rt.Layer(json.dumps(ep_meta(2))) for _ in range(2)]
    results = on_ranks(2, lambda r: layers[r].bind_comm(comms[r]._comm))
    assert results == [None, None], results
    for r, layer in enumerate(layers):
        assert layer.comm is comms[r]._comm and layer.exchange is not None
        assert layer.ep_group == (2, r, comms[r].nccl_comm)
        layer.load(0, PTX)
        x, out = dense([4, 64], "bf16", CUDA0), dense([4, 64], "bf16", CUDA0)
        for step in (1, 2):
            layer.forward({"x": x}, out=out)
            params = fake.last_params()
            assert params[2] == layer.exchange.peer_table
            assert params[3] & 0xFFFFFFFF == r and params[4] == step == layer.epoch
            # Its own buffer as its peer table holds it (NCCL's mapping).
            assert params[5] == layer.exchange.peers()[r]
    raises(mok.MokRuntimeError, "buffer: a layer's exchange buffer (unbind the layer "
           "instead)", layers[0].exchange.free)
    raises(mok.MokRuntimeError, "comm: 1 layer(s) are bound to it", comms[0].destroy)
    del layers, layer, results
    gc.collect()
    for b in bufs:
        b.free()
    for c in comms:
        c.destroy()
    gc.collect()
    assert fake.clean() == CLEAN
    print("ok")


def local_group():
    """A local group of 4 (no NCCL): peer tables filled when the last rank
    allocates, sizes paired by order, layers bound and their exchange
    buffers in every rank's table."""
    fake = Fake()
    comms = mok.Communicator.local_group(4, 0)
    assert [c.rank for c in comms] == [0, 1, 2, 3] and all(c.size == 4 for c in comms)
    assert all(c.nccl_comm == 0 for c in comms)
    assert repr(comms[2]) == "Communicator(local, rank 2 of 4, cuda:0)"
    bufs = [comms[r].alloc_symmetric(4096) for r in range(3)]
    assert not bufs[0].complete and bufs[0].peers() == [0, 0, 0, 0]
    bufs.append(comms[3].alloc_symmetric(4096))
    assert all(b.complete for b in bufs)
    addresses = [b.address for b in bufs]
    assert all(b.peers() == addresses for b in bufs)
    second = comms[0].alloc_symmetric(1024)
    e = raises(mok.MokRuntimeError, "bytes: 2048 on rank 1, but rank 0 allocated 1024 as "
               "symmetric buffer #1 of this local group", comms[1].alloc_symmetric, 2048)
    assert e.status == "MOK_ERROR_INVALID_ARGUMENT"
    seconds = [second] + [comms[r].alloc_symmetric(1024) for r in range(1, 4)]
    # Layers: one per rank, each with its own exchange buffer.
    layers = [rt.Layer(json.dumps(ep_meta(4, 2048))) for _ in range(4)]
    raises(mok.MokRuntimeError, "comm: a communicator of 4 rank(s), but this layer was "
           "compiled for ep = 2", rt.Layer(json.dumps(ep_meta(2))).bind_comm, comms[0]._comm)
    raises(mok.MokRuntimeError, "buffer: 1024 bytes, but this layer's exchange needs "
           "symmetric_bytes = 2048", layers[0].bind_comm, None, second)
    for r in range(4):
        layers[r].bind_comm(comms[r]._comm)
    exchanges = [layer.exchange.address for layer in layers]
    for layer in layers:
        assert layer.exchange.peers() == exchanges and layer.exchange.complete
    del layers, layer
    gc.collect()
    for b in bufs + seconds:
        b.free()
    for c in comms:
        c.destroy()
    assert fake.clean() == CLEAN
    print("ok")


def training_self_exchange():
    """A training layer compiled with self_exchange (ep = 1 as a group of
    one) on the stand-in driver: refused unbound by name; bound to a local
    group of one, both its kernels are (each its own exchange buffer), the
    communicator is not destroyed while they are, and bind_comm(None)
    unbinds both. (torch's CUDA initialization is skipped: the stand-in
    driver is the runtime's, not torch's.)"""
    import torch
    torch.cuda.init = lambda: None
    torch.cuda.current_device = lambda: 0
    fake = Fake()
    spec = mok.LayerSpec(hidden=64, intermediate=32, experts=4, top_k=2, tokens=40, padding=8)
    art = mok.compile(spec, target="sm_90a", training=True, self_exchange=True)
    raises(mok.MokRuntimeError, "compiled to exchange through a symmetric buffer at ep = 1 "
           "(self-exchange), but no communicator is bound", art.load, 0)
    comms = mok.Communicator.local_group(1, 0)
    trainer = art.load(0, comm=comms[0])
    assert trainer.comm is comms[0] and trainer._backward.comm is comms[0]
    sizes = [k.symmetric_bytes for k in (trainer._forward, trainer._backward)]
    assert all(sizes) and [k.exchange.bytes for k in (trainer._forward,
                                                      trainer._backward)] == sizes
    raises(mok.MokRuntimeError, "comm: 2 layer(s) are bound to it", comms[0].destroy)
    trainer.bind_comm(None)
    assert trainer.comm is None and trainer._backward.comm is None
    comms[0].destroy()
    del trainer
    gc.collect()
    assert fake.clean() == CLEAN
    print("ok")


def process_groups():
    """Communicator.adopt takes a torch.distributed process group with an
    NCCL backend only, naming what it got otherwise."""
    import torch.distributed as dist
    raises(TypeError, "process_group: expected a torch.distributed.ProcessGroup, got tuple",
           mok.Communicator.adopt, (2, 0))
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        raises(TypeError, "process_group: ", mok.Communicator.adopt,
               dist.group.WORLD, 0)
    finally:
        dist.destroy_process_group()
    print("ok")


if __name__ == "__main__":
    globals()[sys.argv[1]]()
