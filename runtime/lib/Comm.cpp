// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Communicators and symmetric buffers: NCCL communicators (made from a
// unique id, or adopted), loopback groups of communicators in one process
// (no NCCL), and the symmetric buffers whose peer tables the expert-parallel
// kernels address each other's memory through.
//
#include "Comm.h"

#include "Error.h"
#include "Module.h"

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

using namespace mok::runtime;

namespace mok::runtime {

/// One symmetric buffer of a local group: the k-th allocation of every
/// rank. Its memory (every rank's buffer and peer table) is freed when
/// every rank has allocated and freed its part, or with the group.
struct LocalWindow {
  size_t bytes = 0;
  std::vector<CUdeviceptr> buffers, tables; // per rank; 0 before it arrives
  int arrived = 0, freed = 0;
};

/// What the communicators of a local group share.
struct LocalGroup {
  int size = 0;
  const Driver *driver = nullptr;
  CUcontext context = nullptr;
  std::mutex mutex;
  std::map<int64_t, std::shared_ptr<LocalWindow>> windows; // by sequence

  /// Frees a window's memory (the group's mutex held, context current).
  void release(LocalWindow &w) {
    for (CUdeviceptr p : w.buffers)
      if (p)
        driver->memFree(p);
    for (CUdeviceptr p : w.tables)
      if (p)
        driver->memFree(p);
    w.buffers.assign(w.buffers.size(), 0);
    w.tables.assign(w.tables.size(), 0);
  }

  ~LocalGroup() {
    if (!driver)
      return;
    driver->ctxSetCurrent(context);
    for (auto &[sequence, window] : windows)
      release(*window);
  }
};

} // namespace mok::runtime

namespace {

mok_status outOfMemoryOr(CUresult r) {
  return r == CUDA_ERROR_OUT_OF_MEMORY ? MOK_ERROR_OUT_OF_MEMORY
                                       : MOK_ERROR_CUDA;
}

/// The NCCL library, or MOK_ERROR_NCCL_UNAVAILABLE with the reason.
mok_status ncclOrFail(const Nccl *&n) {
  std::string why;
  n = loadNccl(nullptr, why);
  if (!n)
    return fail(MOK_ERROR_NCCL_UNAVAILABLE, why);
  return MOK_OK;
}

/// An NCCL call's result once it is done: a non-blocking communicator
/// (torch may make them) answers ncclInProgress, then reports the outcome
/// through ncclCommGetAsyncError.
int settled(const Nccl *n, void *comm, int r) {
  while (r == kNcclInProgress) {
    int state = kNcclSuccess;
    if (int e = n->commGetAsyncError(comm, &state); e != kNcclSuccess)
      return e;
    r = state;
    if (r == kNcclInProgress)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return r;
}

/// The device's primary context, retained and made current, and the
/// CUdevice; a device that is not one is the argument's error.
mok_status retainDevice(const Driver *d, int device, CUdevice &dev,
                        CUcontext &ctx) {
  int count = 0;
  if (CUresult r = d->deviceGetCount(&count); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuDeviceGetCount: " << d->describe(r);
  if (device < 0 || device >= count)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "device: expected 0 <= device < " << count << ", got " << device;
  if (CUresult r = d->deviceGet(&dev, device); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuDeviceGet: " << d->describe(r);
  if (CUresult r = d->primaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "cuDevicePrimaryCtxRetain: " << d->describe(r);
  if (CUresult r = d->ctxSetCurrent(ctx); r != CUDA_SUCCESS) {
    d->primaryCtxRelease(dev);
    return Fail(MOK_ERROR_CUDA) << "cuCtxSetCurrent: " << d->describe(r);
  }
  return MOK_OK;
}

mok_status makeCurrent(mok_comm c) {
  if (CUresult r = c->driver->ctxSetCurrent(c->context); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "cuCtxSetCurrent: " << c->driver->describe(r);
  return MOK_OK;
}

/// Every rank's `words` uint64 (this rank's are `mine`) into `all`, rank
/// by rank: ncclAllGather on the legacy default stream, then waited for.
/// Every rank of an NCCL communicator calls it at the same point.
mok_status allGatherWords(mok_comm c, const uint64_t *mine, size_t words,
                          std::vector<uint64_t> &all, const char *what) {
  const Driver *d = c->driver;
  const Nccl *n = c->nccl;
  size_t bytes = 8 * words;
  CUdeviceptr buffer = 0;
  if (CUresult r = d->memAlloc(&buffer, bytes * (c->size + 1));
      r != CUDA_SUCCESS)
    return Fail(outOfMemoryOr(r))
           << what << ": allocating " << bytes * (c->size + 1)
           << " bytes for an allgather: " << d->describe(r);
  auto done = [&](mok_status s) {
    d->memFree(buffer);
    return s;
  };
  CUdeviceptr gathered = buffer + bytes;
  if (CUresult r = d->memcpyHtoDAsync(buffer, mine, bytes, nullptr);
      r != CUDA_SUCCESS)
    return done(Fail(MOK_ERROR_CUDA)
                << what << ": copying to the device: " << d->describe(r));
  int r = n->allGather(reinterpret_cast<void *>(buffer),
                       reinterpret_cast<void *>(gathered), words, kNcclUint64,
                       c->ncclComm, nullptr);
  r = settled(n, c->ncclComm, r);
  if (r != kNcclSuccess)
    return done(Fail(MOK_ERROR_NCCL) << what << ": ncclAllGather failed: "
                                     << n->describe(r, c->ncclComm));
  if (CUresult e = d->streamSynchronize(nullptr); e != CUDA_SUCCESS)
    return done(Fail(MOK_ERROR_CUDA)
                << what << ": waiting for ncclAllGather: " << d->describe(e));
  all.assign(words * c->size, 0);
  if (CUresult e = d->memcpyDtoH(all.data(), gathered, bytes * c->size);
      e != CUDA_SUCCESS)
    return done(Fail(MOK_ERROR_CUDA)
                << what << ": copying to the host: " << d->describe(e));
  return done(MOK_OK);
}

/// Zeroes `bytes` at `address` and waits for it (cuMemsetD8 runs on the
/// legacy default stream, which kernels on non-blocking streams, torch's,
/// do not wait for: a kernel must never see the last binding's flags).
CUresult zeroNow(const Driver *d, CUdeviceptr address, size_t bytes) {
  if (CUresult r = d->memsetD8(address, 0, bytes); r != CUDA_SUCCESS)
    return r;
  return d->streamSynchronize(nullptr);
}

/// Uploads `peers` into the device table `table` (legacy default stream,
/// waited for).
mok_status uploadTable(const Driver *d, CUdeviceptr table,
                       const std::vector<uint64_t> &peers) {
  if (CUresult r = d->memcpyHtoDAsync(table, peers.data(), 8 * peers.size(),
                                      nullptr);
      r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "copying the peer table to the device: " << d->describe(r);
  if (CUresult r = d->streamSynchronize(nullptr); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "copying the peer table to the device: " << d->describe(r);
  return MOK_OK;
}

/// NCCL 2.28's ncclWindow_vidmem (nccl_device/impl/core__types.h), the
/// part the device API's ncclGetPeerPointer reads: the window's descriptor
/// lives in device memory, where ncclCommWindowRegister put it.
struct WindowDescriptor {
  uint64_t winHost;
  uint64_t lsaFlatBase; // rank 0 of the LSA team's copy of the window
  int32_t lsaRank, worldRank;
  uint32_t stride4G; // 4 GiB units between the LSA ranks' copies
  uint32_t mcOffset4K;
};
static_assert(sizeof(WindowDescriptor) == 32, "NCCL 2.28's layout");

/// Rank i's address of window `win` as this rank's kernels see it: what
/// ncclGetPeerPointer(win, 0, i) gives on the device.
mok_status peerAddresses(mok_comm c, void *win, const NcclTeam &lsa,
                         std::vector<uint64_t> &peers) {
  const Nccl *n = c->nccl;
  peers.assign(c->size, 0);
  if (n->getPeerDevicePointer) { // NCCL 2.29 and newer: the host API
    for (int i = 0; i < c->size; ++i) {
      void *p = nullptr;
      if (int r = n->getPeerDevicePointer(win, 0, i, &p); r != kNcclSuccess)
        return Fail(MOK_ERROR_NCCL)
               << "ncclGetPeerDevicePointer (rank " << i
               << "): " << n->describe(r, c->ncclComm);
      if (!p)
        return Fail(MOK_ERROR_UNSUPPORTED)
               << "ncclGetPeerDevicePointer gave no address for rank " << i
               << ": it cannot be reached by load and store";
      peers[i] = reinterpret_cast<uintptr_t>(p);
    }
    return MOK_OK;
  }
  // NCCL 2.28: the descriptor the device API reads, read here.
  WindowDescriptor w{};
  if (CUresult r = c->driver->memcpyDtoH(
          &w, static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(win)),
          sizeof w);
      r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_UNSUPPORTED)
           << "reading NCCL's window descriptor failed ("
           << c->driver->describe(r)
           << "): the window is not a symmetric one (NCCL without "
              "symmetric-memory support: NCCL_WIN_ENABLE=0, "
              "NCCL_CUMEM_ENABLE=0, or GPUs without peer access)";
  if (w.worldRank != c->rank || w.lsaRank != lsa.rank || w.stride4G == 0 ||
      w.lsaFlatBase == 0)
    return Fail(MOK_ERROR_UNSUPPORTED)
           << "NCCL " << n->versionText()
           << "'s window descriptor is not NCCL 2.28's (worldRank "
           << w.worldRank << ", lsaRank " << w.lsaRank << ", stride4G "
           << w.stride4G << ", for rank " << c->rank << " of LSA rank "
           << lsa.rank << "): its peer addresses cannot be read";
  for (int i = 0; i < c->size; ++i) {
    uint64_t lsaRank = static_cast<uint64_t>(w.lsaRank + (i - w.worldRank));
    peers[i] = w.lsaFlatBase + ((lsaRank * w.stride4G) << 32);
  }
  return MOK_OK;
}

mok_status allocNccl(mok_comm c, size_t bytes, mok_symmetric_s &s) {
  const Driver *d = c->driver;
  const Nccl *n = c->nccl;
  // Each rank stores into every other's buffer: all must be in NCCL's
  // load/store-accessible team. (Every rank sees the same team: no rank
  // goes on to the collectives below alone.)
  NcclTeam lsa = n->teamLsa(c->ncclComm);
  if (lsa.nRanks != c->size)
    return Fail(MOK_ERROR_UNSUPPORTED)
           << "comm: NCCL's load/store-accessible (LSA) team holds "
           << lsa.nRanks << " of the " << c->size
           << " ranks (ranks on other nodes, or GPUs without peer access): "
              "the exchange stores into every rank's buffer, so every rank "
              "must reach every other over NVLink";
  // This rank's memory, zeroed before any peer can see it.
  void *memory = nullptr;
  std::string localError;
  mok_status localStatus = MOK_OK;
  if (int r = n->memAlloc(&memory, bytes); r != kNcclSuccess) {
    memory = nullptr;
    localStatus = MOK_ERROR_NCCL;
    localError = "ncclMemAlloc (" + std::to_string(bytes) +
                 " bytes): " + n->describe(r, c->ncclComm);
  } else if (CUresult e = zeroNow(
                 d, static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(memory)),
                 bytes);
             e != CUDA_SUCCESS) {
    localStatus = MOK_ERROR_CUDA;
    localError = "zeroing the symmetric buffer: " + d->describe(e);
  }
  auto freeMemory = [&] {
    if (memory)
      n->memFree(memory);
  };
  // Sizes and outcomes compared across the ranks before the collective
  // registration, so that no rank waits there for one that failed.
  uint64_t mine[2] = {bytes, localStatus == MOK_OK ? 1u : 0u};
  std::vector<uint64_t> all;
  if (mok_status e = allGatherWords(c, mine, 2, all, "comm")) {
    freeMemory();
    return e;
  }
  for (int i = 0; i < c->size; ++i)
    if (all[2 * i] != bytes) {
      freeMemory();
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "bytes: " << bytes << " on rank " << c->rank << ", but rank "
             << i << " asks for " << all[2 * i]
             << ": every rank allocates a symmetric buffer of the same size "
                "(they pair up in call order)";
    }
  if (localStatus != MOK_OK) {
    freeMemory();
    return fail(localStatus, localError);
  }
  for (int i = 0; i < c->size; ++i)
    if (!all[2 * i + 1]) {
      freeMemory();
      return Fail(MOK_ERROR_NCCL)
             << "rank " << i << " could not allocate its part of the "
             << bytes << "-byte symmetric buffer (its own error says why); "
             << "none was allocated";
    }
  void *win = nullptr;
  int r = n->commWindowRegister(c->ncclComm, memory, bytes, &win,
                                kNcclWinCollSymmetric);
  r = settled(n, c->ncclComm, r);
  if (r != kNcclSuccess) {
    mok_status e = Fail(MOK_ERROR_NCCL)
                   << "ncclCommWindowRegister (" << bytes
                   << " bytes): " << n->describe(r, c->ncclComm);
    freeMemory();
    return e;
  }
  auto undo = [&](mok_status e) {
    if (win)
      n->commWindowDeregister(c->ncclComm, win);
    freeMemory();
    return e;
  };
  if (!win)
    return undo(Fail(MOK_ERROR_UNSUPPORTED)
                << "ncclCommWindowRegister gave no window: the communicator "
                   "has no symmetric-memory support (NCCL_WIN_ENABLE=0, "
                   "NCCL_CUMEM_ENABLE=0, or GPUs without peer access)");
  std::vector<uint64_t> peers;
  if (mok_status e = peerAddresses(c, win, lsa, peers))
    return undo(e);
  CUdeviceptr table = 0;
  if (CUresult e = d->memAlloc(&table, 8 * peers.size()); e != CUDA_SUCCESS)
    return undo(Fail(outOfMemoryOr(e))
                << "allocating the peer table (" << 8 * peers.size()
                << " bytes): " << d->describe(e));
  if (mok_status e = uploadTable(d, table, peers)) {
    d->memFree(table);
    return undo(e);
  }
  s.address = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(memory));
  // The rank's own entry of its table: NCCL's window maps the memory a
  // second time, and a kernel must reach its own buffer through one
  // address only (the one its peers' tables also hold for it), or its
  // stores through the table and its loads through the other would not be
  // ordered.
  s.self = static_cast<CUdeviceptr>(peers[c->rank]);
  s.bytes = bytes;
  s.table = table;
  s.window = win;
  return MOK_OK;
}

mok_status allocLocal(mok_comm c, size_t bytes, mok_symmetric_s &s) {
  const Driver *d = c->driver;
  LocalGroup &g = *c->group;
  std::lock_guard<std::mutex> lock(g.mutex);
  int64_t sequence = c->allocations;
  auto it = g.windows.find(sequence);
  if (it != g.windows.end() && it->second->bytes != bytes) {
    int first = 0;
    while (!it->second->buffers[first])
      ++first;
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "bytes: " << bytes << " on rank " << c->rank << ", but rank "
           << first << " allocated " << it->second->bytes
           << " as symmetric buffer #" << sequence
           << " of this local group: every rank allocates the same sizes in "
              "the same order";
  }
  CUdeviceptr buffer = 0, table = 0;
  auto undo = [&](mok_status e) {
    if (buffer)
      d->memFree(buffer);
    if (table)
      d->memFree(table);
    return e;
  };
  if (CUresult r = d->memAlloc(&buffer, bytes); r != CUDA_SUCCESS) {
    buffer = 0;
    return Fail(outOfMemoryOr(r)) << "allocating the symmetric buffer ("
                                  << bytes << " bytes): " << d->describe(r);
  }
  if (CUresult r = d->memAlloc(&table, 8 * static_cast<size_t>(c->size));
      r != CUDA_SUCCESS) {
    table = 0;
    return undo(Fail(outOfMemoryOr(r))
                << "allocating the peer table (" << 8 * c->size
                << " bytes): " << d->describe(r));
  }
  if (CUresult r = zeroNow(d, buffer, bytes); r != CUDA_SUCCESS)
    return undo(Fail(MOK_ERROR_CUDA)
                << "zeroing the symmetric buffer: " << d->describe(r));
  if (CUresult r = zeroNow(d, table, 8 * static_cast<size_t>(c->size));
      r != CUDA_SUCCESS)
    return undo(Fail(MOK_ERROR_CUDA)
                << "zeroing the peer table: " << d->describe(r));
  std::shared_ptr<LocalWindow> w =
      it != g.windows.end() ? it->second : std::make_shared<LocalWindow>();
  if (it == g.windows.end()) {
    w->bytes = bytes;
    w->buffers.assign(c->size, 0);
    w->tables.assign(c->size, 0);
  }
  // The last rank to arrive fills every rank's table.
  if (w->arrived + 1 == c->size) {
    std::vector<uint64_t> peers(w->buffers.begin(), w->buffers.end());
    peers[c->rank] = buffer;
    for (int r = 0; r < c->size; ++r)
      if (mok_status e = uploadTable(d, r == c->rank ? table : w->tables[r],
                                     peers))
        return undo(e);
  }
  w->buffers[c->rank] = buffer;
  w->tables[c->rank] = table;
  ++w->arrived;
  g.windows[sequence] = w;
  ++c->allocations;
  s.address = s.self = buffer;
  s.bytes = bytes;
  s.table = table;
  s.local = std::move(w);
  return MOK_OK;
}

} // namespace

//===----------------------------------------------------------------------===//
// Internal interface (Comm.h)
//===----------------------------------------------------------------------===//

mok_status mok::runtime::checkComm(mok_comm comm, const char *name) {
  return checkHandle(HandleKind::Comm, comm, name);
}

mok_status mok::runtime::checkSymmetric(mok_symmetric buffer,
                                        const char *name) {
  return checkHandle(HandleKind::Symmetric, buffer, name);
}

mok_status mok::runtime::allocSymmetric(mok_comm c, size_t bytes,
                                        bool layerOwned, mok_symmetric &out) {
  auto s = std::make_unique<mok_symmetric_s>();
  s->comm = c;
  s->layerOwned = layerOwned;
  if (mok_status e = makeCurrent(c))
    return e;
  if (mok_status e = c->kind == CommKind::Local ? allocLocal(c, bytes, *s)
                                                : allocNccl(c, bytes, *s))
    return e;
  if (!layerOwned) {
    std::lock_guard<std::mutex> lock(c->mutex);
    ++c->liveBuffers;
  }
  addHandle(HandleKind::Symmetric, s.get());
  out = s.release();
  return MOK_OK;
}

mok_status mok::runtime::freeSymmetric(mok_symmetric s) {
  if (!s || !removeHandle(HandleKind::Symmetric, s))
    return MOK_OK;
  mok_comm c = s->comm;
  const Driver *d = c->driver;
  mok_status status = MOK_OK;
  if (CUresult r = d->ctxSetCurrent(c->context); r != CUDA_SUCCESS)
    status = Fail(MOK_ERROR_CUDA) << "cuCtxSetCurrent: " << d->describe(r);
  if (c->kind == CommKind::Local) {
    LocalGroup &g = *c->group;
    std::lock_guard<std::mutex> lock(g.mutex);
    LocalWindow &w = *s->local;
    if (++w.freed == c->size) {
      g.release(w);
      for (auto it = g.windows.begin(); it != g.windows.end(); ++it)
        if (it->second == s->local) {
          g.windows.erase(it);
          break;
        }
    }
  } else {
    const Nccl *n = c->nccl;
    if (CUresult r = d->memFree(s->table); r != CUDA_SUCCESS && !status)
      status = Fail(MOK_ERROR_CUDA)
               << "freeing the peer table: " << d->describe(r);
    if (int r = n->commWindowDeregister(c->ncclComm, s->window);
        r != kNcclSuccess && !status)
      status = Fail(MOK_ERROR_NCCL) << "ncclCommWindowDeregister: "
                                    << n->describe(r, c->ncclComm);
    if (int r = n->memFree(reinterpret_cast<void *>(s->address));
        r != kNcclSuccess && !status)
      status = Fail(MOK_ERROR_NCCL)
               << "ncclMemFree: " << n->describe(r, c->ncclComm);
  }
  if (!s->layerOwned) {
    std::lock_guard<std::mutex> lock(c->mutex);
    --c->liveBuffers;
  }
  delete s;
  return status;
}

mok_status mok::runtime::checkComplete(mok_symmetric s, const char *what) {
  if (!s->local)
    return MOK_OK;
  LocalGroup &g = *s->comm->group;
  std::lock_guard<std::mutex> lock(g.mutex);
  const LocalWindow &w = *s->local;
  if (w.arrived == s->comm->size)
    return MOK_OK;
  std::string missing;
  for (int r = 0; r < s->comm->size; ++r)
    if (!w.buffers[r])
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  int64_t sequence = -1;
  for (const auto &[k, v] : g.windows)
    if (v == s->local)
      sequence = k;
  return Fail(MOK_ERROR_INVALID_ARGUMENT)
         << what << ": its peer table is not filled yet: rank(s) " << missing
         << " of the local group have not allocated symmetric buffer #"
         << sequence << " (bind their layers, or allocate, too)";
}

mok_status mok::runtime::checkSameLayer(mok_comm c, uint64_t fingerprint,
                                        uint64_t bytes) {
  if (c->kind == CommKind::Local)
    return MOK_OK;
  if (mok_status e = makeCurrent(c))
    return e;
  uint64_t mine[2] = {bytes, fingerprint};
  std::vector<uint64_t> all;
  if (mok_status e = allGatherWords(c, mine, 2, all, "layer"))
    return e;
  for (int i = 0; i < c->size; ++i)
    if (all[2 * i] != bytes)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "layer: needs " << bytes << " bytes of symmetric buffer on rank "
             << c->rank << ", but rank " << i << " binds a layer that needs "
             << all[2 * i]
             << ": every rank binds the same layer, in the same order";
  for (int i = 0; i < c->size; ++i)
    if (all[2 * i + 1] != fingerprint)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "layer: rank " << i << " binds a layer whose metadata "
             << "differs from rank " << c->rank
             << "'s (another kernel, shape or receive capacity): every "
                "rank binds the same layer, in the same order, or their "
                "kernels would store at each other's offsets wrongly";
  return MOK_OK;
}

mok_status mok::runtime::resetForLayer(mok_symmetric s, size_t bytes) {
  mok_comm c = s->comm;
  const Driver *d = c->driver;
  if (mok_status e = makeCurrent(c))
    return e;
  if (CUresult r = zeroNow(d, s->address, s->bytes); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "buffer: zeroing it: " << d->describe(r);
  if (c->kind == CommKind::Local)
    return MOK_OK;
  uint64_t mine = bytes;
  std::vector<uint64_t> all;
  if (mok_status e = allGatherWords(c, &mine, 1, all, "buffer"))
    return e;
  for (int i = 0; i < c->size; ++i)
    if (all[i] != bytes)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "layer: needs " << bytes << " bytes of symmetric buffer on rank "
             << c->rank << ", but rank " << i << " binds a layer that needs "
             << all[i] << ": every rank binds the same layer, in the same order";
  return MOK_OK;
}

void mok::runtime::countBinding(mok_comm c, int delta) {
  std::lock_guard<std::mutex> lock(c->mutex);
  c->bindings += delta;
}

//===----------------------------------------------------------------------===//
// The C API
//===----------------------------------------------------------------------===//

extern "C" mok_status mok_nccl_load(const char *library, int *version,
                                    const char **path) {
  std::string why;
  const Nccl *n = loadNccl(library, why);
  if (!n)
    return fail(why.rfind("library:", 0) == 0 ? MOK_ERROR_INVALID_ARGUMENT
                                              : MOK_ERROR_NCCL_UNAVAILABLE,
                why);
  if (version)
    *version = n->version;
  if (path)
    *path = n->path.c_str();
  return ok();
}

extern "C" mok_status mok_comm_get_unique_id(mok_unique_id *id) {
  if (!id)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "id: is NULL";
  const Nccl *n;
  if (mok_status s = ncclOrFail(n))
    return s;
  NcclUniqueId u{};
  if (int r = n->getUniqueId(&u); r != kNcclSuccess)
    return Fail(MOK_ERROR_NCCL)
           << "ncclGetUniqueId: " << n->describe(r, nullptr);
  static_assert(sizeof u == sizeof *id, "ncclUniqueId is 128 bytes");
  std::memcpy(id->bytes, u.internal, sizeof u);
  return ok();
}

/// A new communicator of `kind` on `device` (its context retained and
/// current), registered.
static mok_comm newComm(CommKind kind, const Driver *d, int device,
                        CUdevice dev, CUcontext ctx) {
  auto c = new mok_comm_s;
  c->kind = kind;
  c->driver = d;
  c->device = device;
  c->cuDevice = dev;
  c->context = ctx;
  return c;
}

/// A communicator over the NCCL communicator `comm` (rank `rank` of
/// `size`), registered as a handle and given to the caller in `out`.
static mok_status publishNcclComm(CommKind kind, const Driver *d, int device,
                                  CUdevice dev, CUcontext ctx, const Nccl *n,
                                  void *comm, int size, int rank,
                                  mok_comm *out) {
  mok_comm c = newComm(kind, d, device, dev, ctx);
  c->nccl = n;
  c->ncclComm = comm;
  c->size = size;
  c->rank = rank;
  addHandle(HandleKind::Comm, c);
  *out = c;
  return ok();
}

extern "C" mok_status mok_comm_create(const mok_unique_id *id, int nranks,
                                      int rank, int device, mok_comm *out) {
  if (!id)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "id: is NULL";
  if (!out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "out: is NULL";
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "nranks/rank: expected 0 <= rank < nranks, got rank " << rank
           << " of " << nranks;
  bool zero = true;
  for (char b : id->bytes)
    zero = zero && b == 0;
  if (zero)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "id: all " << MOK_UNIQUE_ID_BYTES
           << " bytes are zero (not an id from mok_comm_get_unique_id; "
              "rank 0 makes it and the trainer sends it to every rank)";
  const Nccl *n;
  if (mok_status s = ncclOrFail(n))
    return s;
  const Driver *d;
  if (mok_status s = driverOrFail(d))
    return s;
  CUdevice dev;
  CUcontext ctx;
  if (mok_status s = retainDevice(d, device, dev, ctx))
    return s;
  NcclUniqueId u;
  std::memcpy(u.internal, id->bytes, sizeof u);
  void *comm = nullptr;
  if (int r = n->commInitRank(&comm, nranks, u, rank); r != kNcclSuccess) {
    d->primaryCtxRelease(dev);
    return Fail(MOK_ERROR_NCCL)
           << "ncclCommInitRank (rank " << rank << " of " << nranks
           << ", device " << device << "): " << n->describe(r, nullptr);
  }
  return publishNcclComm(CommKind::Nccl, d, device, dev, ctx, n, comm, nranks,
                         rank, out);
}

extern "C" mok_status mok_comm_adopt(void *ncclComm, int device,
                                     mok_comm *out) {
  if (!ncclComm)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "nccl_comm: is NULL";
  if (!out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "out: is NULL";
  if (device < -1)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "device: expected a device ordinal, or -1 for the "
              "communicator's, got "
           << device;
  const Nccl *n;
  if (mok_status s = ncclOrFail(n))
    return s;
  int size = 0, rank = 0, commDevice = -1;
  if (int r = n->commCount(ncclComm, &size); r != kNcclSuccess)
    return Fail(MOK_ERROR_NCCL)
           << "nccl_comm: ncclCommCount: " << n->describe(r, ncclComm);
  if (int r = n->commUserRank(ncclComm, &rank); r != kNcclSuccess)
    return Fail(MOK_ERROR_NCCL)
           << "nccl_comm: ncclCommUserRank: " << n->describe(r, ncclComm);
  if (int r = n->commCuDevice(ncclComm, &commDevice); r != kNcclSuccess)
    return Fail(MOK_ERROR_NCCL)
           << "nccl_comm: ncclCommCuDevice: " << n->describe(r, ncclComm);
  if (device != -1 && device != commDevice)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "device: " << device << ", but the communicator is on device "
           << commDevice << " (ncclCommCuDevice)";
  const Driver *d;
  if (mok_status s = driverOrFail(d))
    return s;
  CUdevice dev;
  CUcontext ctx;
  if (mok_status s = retainDevice(d, commDevice, dev, ctx))
    return s;
  return publishNcclComm(CommKind::Adopted, d, commDevice, dev, ctx, n,
                         ncclComm, size, rank, out);
}

extern "C" mok_status mok_comm_create_local_group(int n, int device,
                                                  mok_comm *comms) {
  if (n < 1 || n > 1024)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "n: expected 1 to 1024 ranks, got " << n;
  if (!comms)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "comms: is NULL";
  const Driver *d;
  if (mok_status s = driverOrFail(d))
    return s;
  CUdevice dev;
  CUcontext ctx;
  if (mok_status s = retainDevice(d, device, dev, ctx))
    return s;
  auto group = std::make_shared<LocalGroup>();
  group->size = n;
  group->driver = d;
  group->context = ctx;
  for (int r = 0; r < n; ++r) {
    // One retain per communicator: each releases its own.
    if (r > 0)
      d->primaryCtxRetain(&ctx, dev);
    mok_comm c = newComm(CommKind::Local, d, device, dev, ctx);
    c->size = n;
    c->rank = r;
    c->group = group;
    addHandle(HandleKind::Comm, c);
    comms[r] = c;
  }
  return ok();
}

extern "C" mok_status mok_comm_destroy(mok_comm c) {
  if (!c)
    return ok();
  if (mok_status s = checkComm(c))
    return s;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (c->bindings)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "comm: " << c->bindings << " layer(s) are bound to it (unbind "
             << "them with mok_layer_bind_comm(layer, NULL, NULL), or destroy "
                "them, first)";
    if (c->liveBuffers)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "comm: " << c->liveBuffers
             << " symmetric buffer(s) of it are live (mok_symmetric_free "
                "them first)";
  }
  removeHandle(HandleKind::Comm, c);
  const Driver *d = c->driver;
  mok_status status = MOK_OK;
  if (c->kind == CommKind::Nccl) {
    const Nccl *n = c->nccl;
    d->ctxSetCurrent(c->context);
    int r = settled(n, c->ncclComm, n->commFinalize(c->ncclComm));
    if (r != kNcclSuccess)
      status = Fail(MOK_ERROR_NCCL) << "ncclCommFinalize: "
                                    << n->describe(r, c->ncclComm);
    // Destroyed either way: a communicator that failed to finalize cannot
    // be used again.
    if (int e = n->commDestroy(c->ncclComm); e != kNcclSuccess && !status)
      status = Fail(MOK_ERROR_NCCL)
               << "ncclCommDestroy: " << n->describe(e, nullptr);
  }
  c->group.reset(); // the last of a local group frees its memory
  d->primaryCtxRelease(c->cuDevice);
  delete c;
  return status ? status : ok();
}

/// The accessors: a live `comm` and a non-NULL `out`.
template <typename T>
static mok_status commAnswer(mok_comm c, T *out, const char *name, T value) {
  if (mok_status s = checkComm(c))
    return s;
  if (!out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << name << ": is NULL";
  *out = value;
  return ok();
}

extern "C" mok_status mok_comm_size(mok_comm c, int *size) {
  return commAnswer(c, size, "size", checkComm(c) ? 0 : c->size);
}

extern "C" mok_status mok_comm_rank(mok_comm c, int *rank) {
  return commAnswer(c, rank, "rank", checkComm(c) ? 0 : c->rank);
}

extern "C" mok_status mok_comm_device(mok_comm c, int *device) {
  return commAnswer(c, device, "device", checkComm(c) ? 0 : c->device);
}

extern "C" mok_status mok_comm_nccl(mok_comm c, void **ncclComm) {
  return commAnswer(c, ncclComm, "nccl_comm",
                    checkComm(c) ? nullptr : c->ncclComm);
}

extern "C" mok_status mok_comm_alloc_symmetric(mok_comm c, size_t bytes,
                                               mok_symmetric *out) {
  if (mok_status s = checkComm(c))
    return s;
  if (!out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "out: is NULL";
  if (bytes < 1 || bytes > (size_t(1) << 46))
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "bytes: expected 1 to 2^46, got " << bytes;
  mok_symmetric s = nullptr;
  if (mok_status e = allocSymmetric(c, bytes, /*layerOwned=*/false, s))
    return e;
  *out = s;
  return ok();
}

extern "C" mok_status mok_symmetric_free(mok_symmetric s) {
  if (!s)
    return ok();
  if (mok_status e = checkSymmetric(s))
    return e;
  if (s->layerOwned || s->user)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "buffer: a layer uses it ("
           << (s->layerOwned ? "its own exchange buffer"
                             : "given to mok_layer_bind_comm")
           << "); unbind the layer instead";
  if (mok_status e = freeSymmetric(s))
    return e;
  return ok();
}

extern "C" mok_status mok_symmetric_get_info(mok_symmetric s,
                                             mok_symmetric_info *info) {
  if (mok_status e = checkSymmetric(s))
    return e;
  if (!info)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "info: is NULL";
  *info = mok_symmetric_info{};
  info->address = reinterpret_cast<void *>(s->address);
  info->bytes = s->bytes;
  info->peer_table = reinterpret_cast<void *>(s->table);
  info->ranks = s->comm->size;
  info->rank = s->comm->rank;
  info->complete = checkComplete(s, "buffer") == MOK_OK;
  info->comm = s->comm;
  return ok();
}

extern "C" mok_status mok_symmetric_read_peers(mok_symmetric s,
                                               uint64_t *entries,
                                               size_t count) {
  if (mok_status e = checkSymmetric(s))
    return e;
  if (!entries)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "entries: is NULL";
  if (count != static_cast<size_t>(s->comm->size))
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "count: expected " << s->comm->size
           << " (the communicator's ranks), got " << count;
  mok_comm c = s->comm;
  if (mok_status e = makeCurrent(c))
    return e;
  if (CUresult r = c->driver->memcpyDtoH(entries, s->table, 8 * count);
      r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "copying the peer table to the host: " << c->driver->describe(r);
  return ok();
}
