# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Communicators for expert-parallel layers (docs/Runtime.md, "Expert
parallelism: communicators and symmetric buffers"): a layer compiled for
ep = N runs on N ranks, one GPU each, bound to a communicator of N ranks
(GpuLayer.bind_comm), through whose symmetric buffers its kernels exchange
tokens. A thin layer over the runtime's mok._runtime.Comm (mok_comm).

NCCL is loaded at run time, on the first call that needs it, from
`nccl_library()`: $MOK_NCCL_LIBRARY, else the libnccl this process has
loaded already (torch's, once torch.distributed has used NCCL), else torch's
wheel's (site-packages/nvidia/nccl/lib/libnccl.so.2), else libnccl.so.2 on
the loader's path. Adopting torch's communicator needs torch's NCCL: the
same library, which this order finds.
"""
import importlib.util
import os

from . import _extensions


def _loaded_nccl():
    """The file of the libnccl mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith("libnccl.so"):
                    return path
    except OSError:
        pass
    return None


def _wheel_nccl():
    """torch's NCCL wheel's library (nvidia-nccl-cu13, ...), or None."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.exists(path):
            return path
    return None


def nccl_library():
    """The NCCL library the communicators load (see the module): a path, or
    None for the runtime's default (libnccl.so.2 on the loader's path)."""
    return os.environ.get("MOK_NCCL_LIBRARY") or _loaded_nccl() or _wheel_nccl()


_loaded = []  # (version, path) of the NCCL this process loaded


def load_nccl(library=None):
    """Loads NCCL (once a process) and returns (NCCL_VERSION_CODE, its
    file): `library`, else nccl_library() (once loaded, None answers with
    the library loaded). MokRuntimeError (MOK_ERROR_NCCL_UNAVAILABLE) names
    the file and why when it cannot be loaded or is older than 2.28; a
    `library` that is another file than the one loaded is refused."""
    if library is not None and not isinstance(library, (str, os.PathLike)):
        raise TypeError(f"library: expected a path (str) or None, got "
                        f"{type(library).__name__}")
    if library is None and _loaded:
        return _loaded[0]
    rt = _extensions.runtime()
    loaded = rt.nccl_load(os.fspath(library) if library is not None else nccl_library())
    _loaded[:] = [loaded]
    return loaded


def _device(device):
    """A CUDA device ordinal: `device` (an int, or a torch.device of type
    cuda), else torch's current device when torch has CUDA, else 0."""
    if device is None:
        try:
            import torch
            if torch.cuda.is_available():
                return torch.cuda.current_device()
        except ImportError:
            pass
        return 0
    if getattr(device, "type", None) == "cuda" and hasattr(device, "index"):
        if device.index is not None:
            return device.index
        import torch
        return torch.cuda.current_device()
    if isinstance(device, bool) or not hasattr(device, "__index__"):
        raise TypeError(f"device: expected a CUDA device ordinal (int), a cuda "
                        f"torch.device or None, got {type(device).__name__}")
    return device.__index__()


def _unique_id(value):
    """`value` (bytes, a bytearray or memoryview) as the 128 bytes of an
    NCCL unique id."""
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise TypeError(f"unique_id: expected bytes (128, from unique_id()), got "
                        f"{type(value).__name__}")
    if len(value) != 128:
        raise ValueError(f"unique_id: expected 128 bytes, got {len(value)}")
    return value


def _int(value, name):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    return value.__index__()


class Communicator:
    """A communicator of `size` ranks, this process being `rank`, on CUDA
    `device` (mok_comm). Made by `from_unique_id` (NCCL, every rank with the
    id rank 0 made with `unique_id()`), `adopt` (a torch.distributed process
    group's NCCL communicator, which stays torch's), `from_nccl_comm` (any
    ncclComm_t) or `local_group` (n ranks in this process on one GPU, no
    NCCL: the one-GPU loopback test). Layers bound to it and its symmetric
    buffers keep it alive; `destroy()` ends it sooner (refused while they
    are bound or live)."""

    def __init__(self, comm, keep=None):
        rt = _extensions.runtime()
        if not isinstance(comm, rt.Comm):
            raise TypeError(f"comm: expected a mok._runtime.Comm, got {type(comm).__name__} "
                            "(use Communicator.from_unique_id, adopt or local_group)")
        self._comm = comm
        self._keep = keep  # what must outlive the communicator (a process group)

    @staticmethod
    def unique_id():
        """A new NCCL unique id (128 bytes), made on the rank that starts the
        group; the trainer sends it to every rank (e.g. with
        torch.distributed.broadcast_object_list)."""
        load_nccl()
        return _extensions.runtime().Comm.unique_id()

    @classmethod
    def from_unique_id(cls, unique_id, nranks, rank, device=None):
        """Rank `rank` of a communicator of `nranks` (ncclCommInitRank: it
        returns when every rank has called it with the same id), on CUDA
        `device` (None: torch's current device)."""
        rt = _extensions.runtime()
        # The arguments first: they are named before NCCL is needed.
        unique_id = _unique_id(unique_id)
        nranks, rank = _int(nranks, "nranks"), _int(rank, "rank")
        device = _device(device)
        load_nccl()
        return cls(rt.Comm.create(unique_id, nranks, rank, device))

    @classmethod
    def from_nccl_comm(cls, nccl_comm, device=None, keep=None):
        """A communicator over an existing ncclComm_t (an int), which stays
        its owner's; `device`: the one it was made on (None: the
        communicator's own, ncclCommCuDevice). NCCL must be the library that
        made it (nccl_library())."""
        rt = _extensions.runtime()
        if isinstance(nccl_comm, bool) or not hasattr(nccl_comm, "__index__"):
            raise TypeError(f"nccl_comm: expected an int (an address), got "
                            f"{type(nccl_comm).__name__}")
        if nccl_comm.__index__() == 0:
            raise ValueError("nccl_comm: is 0 (NULL)")
        device = -1 if device is None else _device(device)
        load_nccl()
        return cls(rt.Comm.adopt(nccl_comm, device), keep)

    @classmethod
    def adopt(cls, process_group, device=None):
        """The NCCL communicator of a torch.distributed process group (its
        NCCL backend's, for CUDA `device`, None: torch's current device),
        which stays torch's: mok neither destroys it nor monitors it. If
        torch has not made it yet (NCCL communicators are made lazily), a
        one-element all_reduce on the group makes it: then every rank must
        call adopt at the same point, as for any collective."""
        import torch
        import torch.distributed as dist
        if not isinstance(process_group, dist.ProcessGroup):
            raise TypeError("process_group: expected a torch.distributed.ProcessGroup, got "
                            f"{type(process_group).__name__}")
        device = _device(device)
        try:
            backend = process_group._get_backend(torch.device("cuda", device))
        except RuntimeError as e:
            raise TypeError(f"process_group: has no backend for CUDA ({e}); expected one "
                            "made with backend='nccl'") from None
        if not isinstance(backend, getattr(dist, "ProcessGroupNCCL", ())):
            raise TypeError(f"process_group: its CUDA backend is "
                            f"{type(backend).__name__}, not ProcessGroupNCCL "
                            "(init_process_group(backend='nccl'))")
        with torch.cuda.device(device):
            pointer = _comm_pointer(backend)
            if not pointer:
                probe = torch.zeros(1, device=torch.device("cuda", device))
                dist.all_reduce(probe, group=process_group)
                torch.cuda.synchronize(device)
                pointer = _comm_pointer(backend)
        if not pointer:
            raise RuntimeError("process_group: torch made no NCCL communicator for device "
                               f"{device} (ProcessGroupNCCL._comm_ptr() is 0 after an "
                               "all_reduce)")
        # torch's NCCL, the library that made the communicator.
        load_nccl(_loaded_nccl() or nccl_library())
        return cls.from_nccl_comm(pointer, device, keep=process_group)

    @classmethod
    def local_group(cls, n, device=None):
        """The n communicators (ranks 0 to n-1) of a local group on CUDA
        `device` (None: torch's current device), without NCCL: symmetric
        buffers are device allocations paired by allocation order, and each
        rank's peer table holds the others'. Bind one layer instance to each
        and launch them concurrently (one stream each, each grid at most
        1/n of the multiprocessors: GpuLayer.set_grid)."""
        rt = _extensions.runtime()
        return [cls(c) for c in rt.Comm.local_group(n, _device(device))]

    @property
    def size(self):
        return self._comm.size

    @property
    def rank(self):
        return self._comm.rank

    @property
    def device(self):
        return self._comm.device

    @property
    def nccl_comm(self):
        """The ncclComm_t as an int (0 for a local group's)."""
        return self._comm.nccl_comm

    def alloc_symmetric(self, nbytes):
        """A zeroed symmetric buffer of `nbytes` on every rank (a
        mok._runtime.Symmetric: address, peer_table, peers(), free()).
        Collective: every rank calls it with the same size, in the same
        order; a size that differs is refused on every rank by name."""
        return self._comm.alloc_symmetric(nbytes)

    def destroy(self):
        """Ends the communicator now (an NCCL one made by from_unique_id is
        finalized and destroyed); refused while a layer is bound to it or a
        buffer of it is live."""
        self._comm.destroy()

    def __repr__(self):
        if self._comm.destroyed:
            return "Communicator(destroyed)"
        kind = "nccl" if self._comm.nccl_comm else "local"
        return (f"Communicator({kind}, rank {self.rank} of {self.size}, "
                f"cuda:{self.device})")


def _comm_pointer(backend):
    """ProcessGroupNCCL._comm_ptr() of the current device: 0 when torch has
    made none yet."""
    try:
        return int(backend._comm_ptr())
    except RuntimeError:
        return 0


def comm_arg(comm, name="comm"):
    """The mok._runtime.Comm of `comm` (a Communicator or a Comm), or
    None; TypeError naming `name` otherwise."""
    if comm is None:
        return None
    if isinstance(comm, Communicator):
        return comm._comm
    rt = _extensions.runtime()
    if isinstance(comm, rt.Comm):
        return comm
    raise TypeError(f"{name}: expected a mok.Communicator or None, got {type(comm).__name__}")
