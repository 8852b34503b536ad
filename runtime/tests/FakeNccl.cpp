// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// A stand-in for NCCL, FOR TESTS ONLY, in the same library as the stand-in
// driver (FakeCuda.cpp): the runtime loads it when MOK_NCCL_LIBRARY names
// that library, so communicators, symmetric buffers and their failures run
// without a GPU. The ranks of a communicator are threads of one process
// (ncclCommInitRank waits for all of them, collectives meet like a
// barrier, with a 10 s bound instead of hanging). Symmetric memory is
// faithful to NCCL 2.28: ncclMemAlloc memory is a memfd mapped twice — at
// its own address and, once registered, in a flat region of 4 GiB a rank
// (the LSA space) — and ncclCommWindowRegister returns a window descriptor
// in "device" memory laid out as nccl_device.h's ncclWindow_vidmem, so the
// peer addresses the runtime computes from it really reach the peers'
// buffers. Built again with MOK_FAKE_NCCL_PEER_POINTER (NCCL 2.29's
// ncclGetPeerDevicePointer too) and MOK_FAKE_NCCL_NO_WINDOWS (without
// ncclCommWindowRegister).
//
// The environment steers it, read at each call: MOK_FAKE_NCCL_VERSION (the
// NCCL_VERSION_CODE ncclGetVersion gives, default 22809),
// MOK_FAKE_NCCL_LSA_SIZE (ranks in ncclTeamLsa, default all),
// MOK_FAKE_NCCL_WINDOW ("none": registration gives no window, "host": a
// host pointer, as NCCL without symmetric-memory support does).
// mok_fake_nccl_fail makes one call fail; mok_fake_nccl_live counts what
// is left.
//
#include "FakeCuda.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

enum : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
};

constexpr char kMagic[8] = {'m', 'o', 'k', 'f', 'a', 'k', 'e', '!'};
constexpr size_t kSpan = size_t(1) << 32; // a rank's part of the LSA space
constexpr size_t kAlign = size_t(2) << 20;

struct UniqueId {
  char internal[128];
};

struct Team {
  int nRanks, rank, stride;
};

/// nccl_device.h's ncclWindow_vidmem (NCCL 2.28): what the runtime reads.
struct Descriptor {
  void *winHost;
  char *lsaFlatBase;
  int lsaRank, worldRank;
  uint32_t stride4G, mcOffset4K, ginOffset4K;
  void *ginWins[4];
};

struct Group;

struct Comm {
  Group *group;
  int rank, device;
  size_t nextOffset = 0; // in the LSA space, for the next window
  bool finalized = false;
};

/// The ranks that share a unique id.
struct Group {
  int nranks;
  int joined = 0, refs = 0;
  char *flat = nullptr; // the LSA space: nranks * 4 GiB, reserved
  // Collectives: each rank's contribution to the current round; the last
  // to arrive copies them into `result` and starts the next round.
  uint64_t round = 0;
  int arrived = 0;
  std::vector<std::string> slots, result;
};

struct Memory {
  int fd;
  size_t mapped; // bytes mapped (rounded up)
};

struct Window {
  Comm *comm;
  char *alias;   // this rank's part of the LSA space
  size_t mapped;
  size_t offset; // in the LSA space
  Descriptor *descriptor;
};

struct State {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, Group *> groups; // by unique id
  std::map<void *, Memory> memory;       // ncclMemAlloc's, by address
  std::map<void *, Window> windows;      // by descriptor
  std::map<void *, int> hostHandles;     // MOK_FAKE_NCCL_WINDOW=host
  int comms = 0;
  uint64_t ids = 0;
  int64_t peerPointerCalls = 0;
  // mok_fake_nccl_fail
  std::string failFunction;
  int failResult = 0, failSkip = 0;
};

State &state() {
  static State *s = new State;
  return *s;
}

thread_local std::string lastError;

int fail(int result, const std::string &message) {
  lastError = "fake NCCL: " + message;
  return result;
}

int envInt(const char *name, int fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::string envString(const char *name) {
  const char *v = std::getenv(name);
  return v ? v : "";
}

/// A failure mok_fake_nccl_fail asked of `function`, or ncclSuccess.
int injected(const char *function) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.failFunction != function)
    return ncclSuccess;
  if (s.failSkip > 0) {
    --s.failSkip;
    return ncclSuccess;
  }
  s.failFunction.clear();
  lastError = std::string("fake NCCL: ") + function + " failed on purpose";
  return s.failResult;
}

#define MOK_INJECTED(name)                                                     \
  if (int r_ = injected(name))                                                 \
    return r_;

/// One round of a collective of `c`'s group: every rank's `mine`, in rank
/// order, in `all` (lock held through `lock`). ncclSystemError after 10 s
/// without every rank.
int meet(std::unique_lock<std::mutex> &lock, Comm *c, const std::string &mine,
         std::vector<std::string> &all) {
  State &s = state();
  Group &g = *c->group;
  uint64_t round = g.round;
  g.slots[c->rank] = mine;
  if (++g.arrived == g.nranks) {
    g.result = g.slots;
    g.arrived = 0;
    ++g.round;
    s.changed.notify_all();
  } else if (!s.changed.wait_for(lock, std::chrono::seconds(10),
                                 [&] { return g.round != round; })) {
    --g.arrived;
    return fail(ncclSystemError, "a collective waited 10 s for the other "
                                 "ranks");
  }
  all = g.result;
  return ncclSuccess;
}

size_t typeSize(int type) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return type >= 0 && type < 12 ? sizes[type] : 0;
}

} // namespace

#define MOK_FAKE_API extern "C" __attribute__((visibility("default")))

MOK_FAKE_API int ncclGetVersion(int *version) {
  if (!version)
    return fail(ncclInvalidArgument, "version is NULL");
  *version = envInt("MOK_FAKE_NCCL_VERSION", 22809);
  return ncclSuccess;
}

MOK_FAKE_API const char *ncclGetErrorString(int result) {
  switch (result) {
  case ncclSuccess:
    return "no error";
  case ncclUnhandledCudaError:
    return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError:
    return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError:
    return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument:
    return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage:
    return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  }
  return "unknown result code";
}

MOK_FAKE_API const char *ncclGetLastError(void *) { return lastError.c_str(); }

MOK_FAKE_API int ncclGetUniqueId(UniqueId *id) {
  MOK_INJECTED("ncclGetUniqueId");
  if (!id)
    return fail(ncclInvalidArgument, "uniqueId is NULL");
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, kMagic, sizeof kMagic);
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  uint64_t n = ++s.ids;
  std::memcpy(id->internal + 8, &n, sizeof n);
  return ncclSuccess;
}

MOK_FAKE_API int ncclCommInitRank(Comm **out, int nranks, UniqueId id,
                                  int rank) {
  MOK_INJECTED("ncclCommInitRank");
  if (!out || nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks));
  if (std::memcmp(id.internal, kMagic, sizeof kMagic) != 0)
    return fail(ncclInvalidArgument,
                "the unique id was not made by ncclGetUniqueId");
  int device = mok_fake::currentDevice();
  if (device < 0)
    return fail(ncclUnhandledCudaError, "no CUDA device is current");
  State &s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  std::string key(id.internal, sizeof id.internal);
  Group *&g = s.groups[key];
  if (!g) {
    g = new Group;
    g->nranks = nranks;
    g->slots.resize(nranks);
    void *flat = mmap(nullptr, kSpan * nranks, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    g->flat = flat == MAP_FAILED ? nullptr : static_cast<char *>(flat);
  }
  if (g->nranks != nranks)
    return fail(ncclInvalidArgument,
                "nranks " + std::to_string(nranks) + ", but the id's group has " +
                    std::to_string(g->nranks));
  Group *group = g;
  ++group->joined;
  ++group->refs;
  s.changed.notify_all();
  if (!s.changed.wait_for(lock, std::chrono::seconds(10),
                          [&] { return group->joined >= group->nranks; })) {
    --group->joined;
    --group->refs;
    return fail(ncclSystemError, "ncclCommInitRank waited 10 s for the "
                                 "other ranks");
  }
  *out = new Comm{group, rank, device};
  ++s.comms;
  return ncclSuccess;
}

MOK_FAKE_API int ncclCommFinalize(Comm *c) {
  MOK_INJECTED("ncclCommFinalize");
  if (!c || c->finalized)
    return fail(ncclInvalidArgument, "comm is NULL or finalized");
  c->finalized = true;
  return ncclSuccess;
}

MOK_FAKE_API int ncclCommDestroy(Comm *c) {
  MOK_INJECTED("ncclCommDestroy");
  if (!c)
    return fail(ncclInvalidArgument, "comm is NULL");
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  Group *g = c->group;
  if (--g->refs == 0) {
    for (auto it = s.groups.begin(); it != s.groups.end(); ++it)
      if (it->second == g) {
        s.groups.erase(it);
        break;
      }
    if (g->flat)
      munmap(g->flat, kSpan * g->nranks);
    delete g;
  }
  delete c;
  --s.comms;
  return ncclSuccess;
}

MOK_FAKE_API int ncclCommGetAsyncError(Comm *c, int *state) {
  if (!c || !state)
    return fail(ncclInvalidArgument, "comm or state is NULL");
  *state = ncclSuccess;
  return ncclSuccess;
}

MOK_FAKE_API int ncclCommCount(Comm *c, int *count) {
  MOK_INJECTED("ncclCommCount");
  if (!c || !count)
    return fail(ncclInvalidArgument, "comm or count is NULL");
  *count = c->group->nranks;
  return ncclSuccess;
}

MOK_FAKE_API int ncclCommUserRank(Comm *c, int *rank) {
  if (!c || !rank)
    return fail(ncclInvalidArgument, "comm or rank is NULL");
  *rank = c->rank;
  return ncclSuccess;
}

MOK_FAKE_API int ncclCommCuDevice(Comm *c, int *device) {
  if (!c || !device)
    return fail(ncclInvalidArgument, "comm or device is NULL");
  *device = c->device;
  return ncclSuccess;
}

MOK_FAKE_API int ncclMemAlloc(void **ptr, size_t bytes) {
  MOK_INJECTED("ncclMemAlloc");
  if (!ptr || !bytes)
    return fail(ncclInvalidArgument, "ptr is NULL or size is 0");
  size_t mapped = (bytes + kAlign - 1) / kAlign * kAlign;
  int fd = memfd_create("mok-fake-nccl", 0);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    if (fd >= 0)
      close(fd);
    return fail(ncclSystemError, "memfd_create/ftruncate failed");
  }
  void *p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return fail(ncclSystemError, "mmap failed");
  }
  std::memset(p, 0xA5, mapped); // as cuMemAlloc's stand-in: zeroing shows
  mok_fake::addNcclMemory(reinterpret_cast<uintptr_t>(p), bytes);
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.memory[p] = Memory{fd, mapped};
  *ptr = p;
  return ncclSuccess;
}

MOK_FAKE_API int ncclMemFree(void *ptr) {
  MOK_INJECTED("ncclMemFree");
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.memory.find(ptr);
  if (it == s.memory.end())
    return fail(ncclInvalidArgument, "ncclMemFree of memory it did not "
                                     "allocate");
  munmap(ptr, it->second.mapped);
  close(it->second.fd);
  mok_fake::removeNcclMemory(reinterpret_cast<uintptr_t>(ptr));
  s.memory.erase(it);
  return ncclSuccess;
}

#ifndef MOK_FAKE_NCCL_NO_WINDOWS
MOK_FAKE_API int ncclCommWindowRegister(Comm *c, void *buffer, size_t bytes,
                                        void **win, int flags) {
  MOK_INJECTED("ncclCommWindowRegister");
  if (!c || !win || flags != 1)
    return fail(ncclInvalidArgument, "comm/win NULL, or flags not "
                                     "NCCL_WIN_COLL_SYMMETRIC");
  std::string mode = envString("MOK_FAKE_NCCL_WINDOW");
  if (mode == "none")
    return ncclSuccess; // *win untouched, as without symmetric support
  State &s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  if (mode == "host") {
    void *handle = new int(0);
    s.hostHandles[handle] = 0;
    *win = handle;
    return ncclSuccess;
  }
  auto m = s.memory.find(buffer);
  if (m == s.memory.end() || bytes > m->second.mapped)
    return fail(ncclInvalidArgument, "the buffer is not ncclMemAlloc's");
  Group &g = *c->group;
  if (!g.flat)
    return fail(ncclSystemError, "no LSA space could be reserved");
  // The ranks agree on the window's offset, map their own part there, then
  // meet again: after that every rank's part is mapped.
  std::vector<std::string> all;
  std::string mine(reinterpret_cast<const char *>(&c->nextOffset),
                   sizeof c->nextOffset);
  mine.append(reinterpret_cast<const char *>(&bytes), sizeof bytes);
  if (int r = meet(lock, c, mine, all))
    return r;
  size_t offset = 0, largest = 0;
  for (const std::string &a : all) {
    size_t o, b;
    std::memcpy(&o, a.data(), sizeof o);
    std::memcpy(&b, a.data() + sizeof o, sizeof b);
    offset = std::max(offset, o);
    largest = std::max(largest, b);
  }
  size_t span = (largest + kAlign - 1) / kAlign * kAlign;
  if (offset + span > kSpan)
    return fail(ncclSystemError, "the LSA space is full");
  char *alias = g.flat + c->rank * kSpan + offset;
  if (mmap(alias, m->second.mapped, PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_FIXED, m->second.fd, 0) == MAP_FAILED)
    return fail(ncclSystemError, "mapping into the LSA space failed");
  c->nextOffset = offset + span;
  if (int r = meet(lock, c, "", all))
    return r;
  auto *d = static_cast<Descriptor *>(std::aligned_alloc(256, 256));
  std::memset(d, 0, 256);
  d->lsaFlatBase = g.flat + offset;
  d->lsaRank = c->rank;
  d->worldRank = c->rank;
  d->stride4G = static_cast<uint32_t>(kSpan >> 32);
  d->winHost = d;
  lock.unlock();
  mok_fake::addNcclMemory(reinterpret_cast<uintptr_t>(d), sizeof *d);
  lock.lock();
  s.windows[d] = Window{c, alias, m->second.mapped, offset, d};
  *win = d;
  return ncclSuccess;
}

MOK_FAKE_API int ncclCommWindowDeregister(Comm *c, void *win) {
  MOK_INJECTED("ncclCommWindowDeregister");
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (auto h = s.hostHandles.find(win); h != s.hostHandles.end()) {
    delete static_cast<int *>(win);
    s.hostHandles.erase(h);
    return ncclSuccess;
  }
  auto it = s.windows.find(win);
  if (!c || it == s.windows.end() || it->second.comm != c)
    return fail(ncclInvalidArgument, "not a window of this communicator");
  // Back to reserved, unmapped space.
  mmap(it->second.alias, it->second.mapped, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  mok_fake::removeNcclMemory(reinterpret_cast<uintptr_t>(win));
  std::free(win);
  s.windows.erase(it);
  return ncclSuccess;
}
#endif

#ifdef MOK_FAKE_NCCL_PEER_POINTER
MOK_FAKE_API int ncclGetPeerDevicePointer(void *win, size_t offset, int peer,
                                          void **out) {
  MOK_INJECTED("ncclGetPeerDevicePointer");
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.peerPointerCalls;
  auto it = s.windows.find(win);
  if (it == s.windows.end() || !out || peer < 0 ||
      peer >= it->second.comm->group->nranks)
    return fail(ncclInvalidArgument, "not a window, or no such peer");
  *out = it->second.comm->group->flat + peer * kSpan + it->second.offset +
         offset;
  return ncclSuccess;
}
#endif

MOK_FAKE_API Team ncclTeamLsa(Comm *c) {
  int n = c->group->nranks;
  int lsa = envInt("MOK_FAKE_NCCL_LSA_SIZE", n);
  if (lsa < 1)
    lsa = 1;
  return Team{lsa, c->rank % lsa, 1};
}

MOK_FAKE_API int ncclAllGather(const void *send, void *receive, size_t count,
                               int type, Comm *c, void *) {
  MOK_INJECTED("ncclAllGather");
  size_t bytes = count * typeSize(type);
  if (!c || !typeSize(type))
    return fail(ncclInvalidArgument, "comm is NULL or the datatype unknown");
  int n = c->group->nranks;
  if (!mok_fake::isDeviceMemory(reinterpret_cast<uintptr_t>(send), bytes) ||
      !mok_fake::isDeviceMemory(reinterpret_cast<uintptr_t>(receive),
                                bytes * n))
    return fail(ncclInvalidArgument, "a buffer is not device memory");
  State &s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  std::vector<std::string> all;
  if (int r = meet(lock, c,
                   std::string(static_cast<const char *>(send), bytes), all))
    return r;
  for (int i = 0; i < n; ++i)
    std::memcpy(static_cast<char *>(receive) + i * bytes, all[i].data(),
                bytes);
  return ncclSuccess;
}

/* What a test steers and reads back. */

/// Makes the next call of NCCL entry point `function` fail with `result`
/// after `skip` calls that go through (one failure); NULL clears it.
MOK_FAKE_API void mok_fake_nccl_fail(const char *function, int result,
                                     int skip) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.failFunction = function ? function : "";
  s.failResult = result;
  s.failSkip = skip;
}

/// What is still alive: "comms", "memory" (ncclMemAlloc's), "windows"; and
/// "peer_pointer_calls", the calls of ncclGetPeerDevicePointer so far.
MOK_FAKE_API int64_t mok_fake_nccl_live(const char *what) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::string w = what ? what : "";
  if (w == "comms")
    return s.comms;
  if (w == "memory")
    return static_cast<int64_t>(s.memory.size());
  if (w == "windows")
    return static_cast<int64_t>(s.windows.size() + s.hostHandles.size());
  if (w == "peer_pointer_calls")
    return s.peerPointerCalls;
  return -1;
}

/// A raw communicator of one rank on device 0 (for tests of
/// mok_comm_adopt: a trainer's ncclComm_t), or NULL.
MOK_FAKE_API void *mok_fake_nccl_comm_of_one(int device) {
  UniqueId id;
  ncclGetUniqueId(&id);
  int saved = mok_fake::currentDevice();
  Comm *c = nullptr;
  mok_fake::setCurrentDevice(device); // what cudaSetDevice would do
  int r = ncclCommInitRank(&c, 1, id, 0);
  mok_fake::setCurrentDevice(saved);
  return r == ncclSuccess ? c : nullptr;
}

/// Destroys what mok_fake_nccl_comm_of_one made.
MOK_FAKE_API int mok_fake_nccl_comm_destroy(void *c) {
  return ncclCommDestroy(static_cast<Comm *>(c));
}
