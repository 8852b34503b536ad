// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Communicators and symmetric buffers (mok_comm, mok_symmetric): what the
// layers bound to a communicator use (Layer.cpp), and their lifetimes.
//
#ifndef MOK_RUNTIME_COMM_H
#define MOK_RUNTIME_COMM_H

#include "Driver.h"
#include "Nccl.h"

#include "mok/Runtime/mok_runtime.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mok::runtime {

enum class CommKind {
  Nccl,    // made by mok_comm_create: mok destroys the ncclComm_t
  Adopted, // mok_comm_adopt: the ncclComm_t stays its owner's
  Local,   // mok_comm_create_local_group: no NCCL
};

struct LocalGroup;
struct LocalWindow;

} // namespace mok::runtime

struct mok_comm_s {
  mok::runtime::CommKind kind = mok::runtime::CommKind::Local;
  int size = 0, rank = 0, device = -1;
  const mok::runtime::Driver *driver = nullptr;
  CUdevice cuDevice = 0;
  CUcontext context = nullptr; // the device's primary context, retained
  const mok::runtime::Nccl *nccl = nullptr;
  void *ncclComm = nullptr;
  std::shared_ptr<mok::runtime::LocalGroup> group; // Local
  std::mutex mutex;                                // guards the counts
  int64_t allocations = 0; // Local: the sequence number of the next buffer
  int liveBuffers = 0;     // mok_comm_alloc_symmetric's, not freed
  int bindings = 0;        // layers bound to it
};

struct mok_symmetric_s {
  mok_comm comm = nullptr;
  CUdeviceptr address = 0;
  // The buffer as this rank's kernels address it: its own peer-table entry
  // (NCCL: its window's mapping; a local group: `address`).
  CUdeviceptr self = 0;
  size_t bytes = 0;
  CUdeviceptr table = 0;           // the peer table, comm->size uint64
  void *window = nullptr;          // NCCL: the ncclWindow_t
  std::shared_ptr<mok::runtime::LocalWindow> local; // Local
  bool layerOwned = false;         // allocated by mok_layer_bind_comm
  mok_layer user = nullptr;        // the layer it is bound to, if any
};

namespace mok::runtime {

/// A live communicator or symmetric buffer, or the error naming it.
mok_status checkComm(mok_comm comm, const char *name = "comm");
mok_status checkSymmetric(mok_symmetric buffer, const char *name = "buffer");

/// mok_comm_alloc_symmetric without the handle checks: a zeroed symmetric
/// buffer of `bytes` on every rank (collective for NCCL), its peer table on
/// the device. `layerOwned`: allocated for a layer (not counted among the
/// caller's live buffers).
mok_status allocSymmetric(mok_comm comm, size_t bytes, bool layerOwned,
                          mok_symmetric &out);
/// Frees a symmetric buffer (no handle check); the first failure is
/// returned, with its message recorded, but everything is freed.
mok_status freeSymmetric(mok_symmetric buffer);

/// Whether every rank's peer table is filled (a local group's waits for the
/// k-th allocation of every rank); else the error naming the ranks missing.
mok_status checkComplete(mok_symmetric buffer, const char *what);

/// Zeroes a buffer given to a layer and, for NCCL, meets the other ranks
/// (an allgather of `bytes`, which must be the same on all): after it, no
/// rank's kernel can see the buffer's earlier contents.
mok_status resetForLayer(mok_symmetric buffer, size_t bytes);

/// For an NCCL communicator, meets the other ranks binding a layer (an
/// allgather of `fingerprint`, a hash of the layer's metadata) and fails,
/// on every rank alike, unless every rank binds the same layer: the
/// kernels store into each other's buffers at the offsets of their own
/// layout. A local group's ranks are not met (nothing to do).
mok_status checkSameLayer(mok_comm comm, uint64_t fingerprint,
                          uint64_t bytes);

/// Counts a layer bound to (+1) or unbound from (-1) `comm`.
void countBinding(mok_comm comm, int delta);

} // namespace mok::runtime

#endif // MOK_RUNTIME_COMM_H
