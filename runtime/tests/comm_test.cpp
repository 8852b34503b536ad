// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Communicators, symmetric buffers and expert-parallel layers: argument
// errors and metadata without NCCL or a driver, then, in processes of their
// own, everything against the stand-in driver and NCCL (FakeCuda.cpp,
// FakeNccl.cpp): NCCL missing, too old or lacking an entry point, NCCL's
// errors, sizes that differ between ranks (ranks are threads), peer tables
// (that really reach the peers' memory), a local group of 4, layers bound
// and launched with their epochs, and that nothing is left allocated.
//
#include "mok/Runtime/mok_runtime.h"

#include "Check.h"
#include "Testing.h" // internal: injected driver failures

#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

// An expert-parallel layer (ep = N) as the compiler's metadata version 5
// describes one (the roles of its exchange, without the rest of a layer).
std::string epLayer(int ep, int64_t symmetricBytes, int version = 5,
                    const std::string &extraParams = "",
                    const std::string &extraTop = "") {
  std::string s = R"({"mok_metadata_version": )" + std::to_string(version) +
                  R"(, "kernel": "moe_ep_forward", "block": 256,
    "cooperative": true, "dynamic_shared_memory": 0, "ep": )" +
                  std::to_string(ep) + extraTop;
  if (symmetricBytes >= 0)
    s += R"(, "symmetric_bytes": )" + std::to_string(symmetricBytes);
  s += R"(, "params": [
    {"name": "x", "role": "input", "dtype": "bf16", "shape": [4, 64]},
    {"name": "out", "role": "output", "dtype": "bf16", "shape": [4, 64]})";
  if (extraParams.empty())
    s += R"(,
    {"name": "peers", "role": "peers", "dtype": "i64", "shape": [)" +
         std::to_string(ep) + R"(]},
    {"name": "rank", "role": "rank", "dtype": "i32", "shape": []},
    {"name": "epoch", "role": "epoch", "dtype": "i64", "shape": []},
    {"name": "symmetric", "role": "symmetric", "dtype": "u8", "shape": [)" +
         std::to_string(symmetricBytes) + R"(]}]})";
  else
    s += extraParams + "]}";
  return s;
}

// Its kernel: the parameters in the metadata's order.
const char *kEpPtx =
    ".version 8.1\n.target sm_90a\n.address_size 64\n"
    ".visible .entry moe_ep_forward(\n  .param .u64 x,\n  .param .u64 out,\n"
    "  .param .u64 peers,\n  .param .u32 rank,\n  .param .u64 epoch,\n"
    "  .param .u64 symmetric\n)\n"
    "{\n  ret;\n}\n";

alignas(64) unsigned char xs[4 * 64 * 2], outs[4 * 64 * 2];

struct Args {
  mok_named_tensor in[1];
  mok_tensor out;
};

Args args() {
  int64_t shape[2] = {4, 64};
  Args a;
  a.in[0] = {"x", mok_tensor_contiguous(xs, MOK_DTYPE_BF16, 2, shape)};
  a.out = mok_tensor_contiguous(outs, MOK_DTYPE_BF16, 2, shape);
  return a;
}

void *const kForged = reinterpret_cast<void *>(0x7f00dead0000);

} // namespace

//===----------------------------------------------------------------------===//
// Without NCCL or a driver
//===----------------------------------------------------------------------===//

// MOK_NCCL_LIBRARY names a file that does not exist, MOK_CUDA_DRIVER too.
void testCommWithoutNccl() {
  int version = -1;
  const char *path = nullptr;
  CHECK_FAILS(mok_nccl_load(nullptr, &version, &path),
              MOK_ERROR_NCCL_UNAVAILABLE,
              "NCCL could not be loaded (/nonexistent/libnccl.so.2): ");
  CHECK_ERROR("mok's communicators need NCCL 2.28 or newer");
  CHECK_ERROR("name its libnccl.so.2 with MOK_NCCL_LIBRARY");
  CHECK(version == -1 && path == nullptr);
  CHECK(std::string(mok_status_name(MOK_ERROR_NCCL)) == "MOK_ERROR_NCCL");
  CHECK(std::string(mok_status_name(MOK_ERROR_NCCL_UNAVAILABLE)) ==
        "MOK_ERROR_NCCL_UNAVAILABLE");

  mok_unique_id id;
  CHECK_FAILS(mok_comm_get_unique_id(nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "id: is NULL");
  CHECK_FAILS(mok_comm_get_unique_id(&id), MOK_ERROR_NCCL_UNAVAILABLE,
              "NCCL could not be loaded (/nonexistent/libnccl.so.2)");

  // Argument errors first, each named; then NCCL is needed.
  std::memset(&id, 7, sizeof id);
  mok_comm c = nullptr;
  CHECK_FAILS(mok_comm_create(nullptr, 2, 0, 0, &c), MOK_ERROR_INVALID_ARGUMENT,
              "id: is NULL");
  CHECK_FAILS(mok_comm_create(&id, 2, 0, 0, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "out: is NULL");
  CHECK_FAILS(mok_comm_create(&id, 2, 2, 0, &c), MOK_ERROR_INVALID_ARGUMENT,
              "nranks/rank: expected 0 <= rank < nranks, got rank 2 of 2");
  CHECK_FAILS(mok_comm_create(&id, 0, 0, 0, &c), MOK_ERROR_INVALID_ARGUMENT,
              "got rank 0 of 0");
  CHECK_FAILS(mok_comm_create(&id, 4, -1, 0, &c), MOK_ERROR_INVALID_ARGUMENT,
              "got rank -1 of 4");
  mok_unique_id zero{};
  CHECK_FAILS(mok_comm_create(&zero, 2, 0, 0, &c), MOK_ERROR_INVALID_ARGUMENT,
              "id: all 128 bytes are zero (not an id from "
              "mok_comm_get_unique_id");
  CHECK_FAILS(mok_comm_create(&id, 2, 0, 0, &c), MOK_ERROR_NCCL_UNAVAILABLE,
              "NCCL could not be loaded");
  CHECK(c == nullptr);

  CHECK_FAILS(mok_comm_adopt(nullptr, 0, &c), MOK_ERROR_INVALID_ARGUMENT,
              "nccl_comm: is NULL");
  CHECK_FAILS(mok_comm_adopt(kForged, 0, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "out: is NULL");
  CHECK_FAILS(mok_comm_adopt(kForged, -2, &c), MOK_ERROR_INVALID_ARGUMENT,
              "device: expected a device ordinal, or -1 for the "
              "communicator's, got -2");
  CHECK_FAILS(mok_comm_adopt(kForged, -1, &c), MOK_ERROR_NCCL_UNAVAILABLE,
              "NCCL could not be loaded");

  mok_comm comms[4] = {};
  CHECK_FAILS(mok_comm_create_local_group(0, 0, comms),
              MOK_ERROR_INVALID_ARGUMENT, "n: expected 1 to 1024 ranks, got 0");
  CHECK_FAILS(mok_comm_create_local_group(1025, 0, comms),
              MOK_ERROR_INVALID_ARGUMENT, "got 1025");
  CHECK_FAILS(mok_comm_create_local_group(4, 0, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "comms: is NULL");
  CHECK_FAILS(mok_comm_create_local_group(4, 0, comms),
              MOK_ERROR_DRIVER_UNAVAILABLE, "the CUDA driver could not be "
                                            "loaded");
  CHECK(comms[0] == nullptr);

  // Handles: NULL and forged ones, by name.
  CHECK(mok_comm_destroy(nullptr) == MOK_OK);
  auto forgedComm = static_cast<mok_comm>(kForged);
  CHECK_FAILS(mok_comm_destroy(forgedComm), MOK_ERROR_INVALID_ARGUMENT,
              "comm: 0x7f00dead0000 is not a live mok_comm (destroyed "
              "already, or not made by mok_comm_create, mok_comm_adopt or "
              "mok_comm_create_local_group)");
  int n = -1;
  void *nccl = kForged;
  CHECK_FAILS(mok_comm_size(nullptr, &n), MOK_ERROR_INVALID_ARGUMENT,
              "comm: is NULL");
  CHECK_FAILS(mok_comm_rank(forgedComm, &n), MOK_ERROR_INVALID_ARGUMENT,
              "is not a live mok_comm");
  CHECK_FAILS(mok_comm_device(nullptr, &n), MOK_ERROR_INVALID_ARGUMENT,
              "comm: is NULL");
  CHECK_FAILS(mok_comm_nccl(nullptr, &nccl), MOK_ERROR_INVALID_ARGUMENT,
              "comm: is NULL");
  CHECK(n == -1 && nccl == kForged);
  mok_symmetric b = nullptr;
  CHECK_FAILS(mok_comm_alloc_symmetric(nullptr, 64, &b),
              MOK_ERROR_INVALID_ARGUMENT, "comm: is NULL");
  CHECK_FAILS(mok_comm_alloc_symmetric(forgedComm, 64, &b),
              MOK_ERROR_INVALID_ARGUMENT, "is not a live mok_comm");
  CHECK(mok_symmetric_free(nullptr) == MOK_OK);
  auto forgedBuffer = static_cast<mok_symmetric>(kForged);
  CHECK_FAILS(mok_symmetric_free(forgedBuffer), MOK_ERROR_INVALID_ARGUMENT,
              "buffer: 0x7f00dead0000 is not a live mok_symmetric");
  mok_symmetric_info info;
  CHECK_FAILS(mok_symmetric_get_info(nullptr, &info),
              MOK_ERROR_INVALID_ARGUMENT, "buffer: is NULL");
  uint64_t peers[2];
  CHECK_FAILS(mok_symmetric_read_peers(forgedBuffer, peers, 2),
              MOK_ERROR_INVALID_ARGUMENT, "is not a live mok_symmetric");
}

// Metadata version 5 (expert-parallel kernels) and the layer entry points
// that need no communicator.
void testExpertParallelMetadata() {
  mok_layer layer = nullptr;
  CHECK(mok_layer_create(epLayer(2, 8192).c_str(), &layer) == MOK_OK);
  int32_t ep = 0;
  size_t bytes = 0;
  CHECK(mok_layer_ep_size(layer, &ep) == MOK_OK && ep == 2);
  CHECK(mok_layer_symmetric_bytes(layer, &bytes) == MOK_OK && bytes == 8192);
  CHECK(mok_layer_input_count(layer) == 1); // peers, rank, epoch: not inputs
  mok_comm comm = static_cast<mok_comm>(kForged);
  mok_symmetric buffer = static_cast<mok_symmetric>(kForged);
  CHECK(mok_layer_comm(layer, &comm, &buffer) == MOK_OK && !comm && !buffer);
  uint64_t epoch = 7;
  CHECK(mok_layer_epoch(layer, &epoch) == MOK_OK && epoch == 0);
  mok_ep_group g{};
  CHECK(mok_layer_ep_group(layer, &g) == MOK_OK && g.size == 1);

  // Without a communicator: no check, no load (before the driver is
  // needed), no forward.
  Args a = args();
  CHECK_FAILS(mok_layer_check(layer, a.in, 1, &a.out), MOK_ERROR_INVALID_ARGUMENT,
              "layer: compiled for ep = 2 (expert parallelism), but no "
              "communicator is bound (bind one of 2 ranks with "
              "mok_layer_bind_comm)");
  CHECK_FAILS(mok_layer_load(layer, 0, kEpPtx), MOK_ERROR_INVALID_ARGUMENT,
              "no communicator is bound");
  CHECK_FAILS(mok_layer_forward(layer, a.in, 1, &a.out, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "layer: not loaded");
  // Binding: handles by name; NULL, NULL unbinds nothing.
  CHECK(mok_layer_bind_comm(layer, nullptr, nullptr) == MOK_OK);
  CHECK_FAILS(mok_layer_bind_comm(layer, static_cast<mok_comm>(kForged), nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "comm: 0x7f00dead0000 is not a live "
                                          "mok_comm");
  CHECK_FAILS(mok_layer_bind_comm(layer, nullptr, static_cast<mok_symmetric>(kForged)),
              MOK_ERROR_INVALID_ARGUMENT, "buffer: 0x7f00dead0000 is not a live "
                                          "mok_symmetric");
  CHECK_FAILS(mok_layer_bind_comm(nullptr, nullptr, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "layer: is NULL");
  CHECK_FAILS(mok_layer_epoch(layer, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "epoch: is NULL");
  CHECK_FAILS(mok_layer_symmetric_bytes(layer, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "bytes: is NULL");
  CHECK_FAILS(mok_layer_comm(nullptr, &comm, &buffer),
              MOK_ERROR_INVALID_ARGUMENT, "layer: is NULL");
  // The group of size 1 does not match; a larger one goes through a
  // communicator.
  CHECK_FAILS(mok_layer_set_ep_group(layer, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: size 1, but this layer was compiled for ep = 2 (the "
              "metadata's \"ep\"); the group's size must be the compiled one: "
              "bind a communicator of 2 ranks with mok_layer_bind_comm");
  mok_ep_group two{2, 1, kForged};
  CHECK_FAILS(mok_layer_set_ep_group(layer, &two), MOK_ERROR_INVALID_ARGUMENT,
              "ep_group: size 2: a layer joins an expert-parallel group "
              "through a communicator (mok_comm_create or mok_comm_adopt, "
              "then mok_layer_bind_comm); mok_layer_set_ep_group sets size 1 "
              "only");
  mok_layer_destroy(layer);

  // An ep = 1 layer has no symmetric bytes.
  layer = nullptr;
  CHECK(mok_layer_create(epLayer(1, -1, 5, R"(,
    {"name": "s", "role": "workspace", "dtype": "i32", "shape": [2]})").c_str(),
                         &layer) == MOK_OK);
  CHECK(mok_layer_symmetric_bytes(layer, &bytes) == MOK_OK && bytes == 0);
  mok_layer_destroy(layer);

  // An ep = 1 layer that exchanges (the compiler's self-exchange): its
  // symmetric bytes, and no call without a communicator of one rank.
  layer = nullptr;
  CHECK(mok_layer_create(epLayer(1, 4096).c_str(), &layer) == MOK_OK);
  CHECK(mok_layer_symmetric_bytes(layer, &bytes) == MOK_OK && bytes == 4096);
  CHECK_FAILS(mok_layer_check(layer, nullptr, 0, nullptr),
              MOK_ERROR_INVALID_ARGUMENT,
              "layer: compiled to exchange through a symmetric buffer at ep = "
              "1 (self-exchange), but no communicator is bound (bind one of 1 "
              "rank with mok_layer_bind_comm)");
  mok_layer_destroy(layer);

  // Malformed expert-parallel metadata, each refused by name.
  const std::string rank = R"(,
    {"name": "rank", "role": "rank", "dtype": "i32", "shape": []})";
  const std::string epochP = R"(,
    {"name": "epoch", "role": "epoch", "dtype": "i64", "shape": []})";
  const std::string peers4 = R"(,
    {"name": "peers", "role": "peers", "dtype": "i64", "shape": [4]})";
  struct {
    std::string json;
    const char *message;
  } bad[] = {
      {epLayer(4, 8192, 4),
       "metadata: 'ep' = 4 needs mok_metadata_version 5 (the exchange's "
       "'symmetric_bytes' and its params of roles peers, rank and epoch), got "
       "version 4"},
      {epLayer(4, 8192, 6), "metadata: expected mok_metadata_version 1 to 5"},
      {epLayer(4, -1),
       "metadata: a kernel for ep = 4 without 'symmetric_bytes' (the exchange "
       "buffer a rank needs)"},
      {epLayer(4, 0), "metadata: 'symmetric_bytes' must be an integer >= 1"},
      {epLayer(1, 4096, 5, R"(,
    {"name": "s", "role": "workspace", "dtype": "i32", "shape": [2]})"),
       "metadata: a kernel for ep = 1 without a parameter of role 'peers'"},
      {epLayer(1, -1, 5, rank),
       "metadata: params[2]: role 'rank' in a kernel that exchanges nothing "
       "(ep = 1 without 'symmetric_bytes')"},
      {epLayer(4, 64, 5, R"(,
    {"name": "peers", "role": "peers", "dtype": "i64", "shape": [2]})" + rank +
                             epochP),
       "metadata: params[2]: role 'peers' must be i64 [4] (one address a "
       "rank)"},
      {epLayer(4, 64, 5, R"(,
    {"name": "peers", "role": "peers", "dtype": "i32", "shape": [4]})" + rank +
                             epochP),
       "role 'peers' must be i64 [4]"},
      {epLayer(4, 64, 5, peers4 + R"(,
    {"name": "rank", "role": "rank", "dtype": "i64", "shape": []})" + epochP),
       "metadata: params[3]: role 'rank' must be an i32 scalar (shape [])"},
      {epLayer(4, 64, 5, peers4 + rank + R"(,
    {"name": "epoch", "role": "epoch", "dtype": "i64", "shape": [1]})"),
       "metadata: params[4]: role 'epoch' must be an i64 scalar (shape [])"},
      {epLayer(4, 64, 5, peers4 + rank + epochP + R"(,
    {"name": "epoch2", "role": "epoch", "dtype": "i64", "shape": []})"),
       "metadata: params[5]: more than one parameter has role 'epoch'"},
      {epLayer(4, 64, 5, peers4 + epochP),
       "metadata: a kernel for ep = 4 without a parameter of role 'rank'"},
      {epLayer(4, 64, 5, rank + epochP),
       "without a parameter of role 'peers'"},
      {epLayer(4, 64, 5, peers4 + rank + epochP),
       "metadata: a kernel for ep = 4 without a parameter of role "
       "'symmetric'"},
      {epLayer(4, 64, 5, peers4 + rank + epochP + R"(,
    {"name": "symmetric", "role": "symmetric", "dtype": "u8", "shape": [32]})"),
       "metadata: params[5]: role 'symmetric' must be u8 [64] (the "
       "symmetric_bytes of the exchange buffer)"},
      {epLayer(4, 64, 5, peers4 + rank + epochP + R"(,
    {"name": "symmetric", "role": "symmetric", "dtype": "i64", "shape": [64]})"),
       "role 'symmetric' must be u8 [64]"},
      {epLayer(1, -1, 5, R"(,
    {"name": "symmetric", "role": "symmetric", "dtype": "u8", "shape": [8]})"),
       "metadata: params[2]: role 'symmetric' in a kernel that exchanges "
       "nothing (ep = 1 without 'symmetric_bytes')"},
  };
  for (auto &b : bad) {
    mok_layer l = nullptr;
    mok_status s = mok_layer_create(b.json.c_str(), &l);
    check(s == MOK_ERROR_INVALID_ARGUMENT, b.message, __LINE__);
    check(std::strstr(mok_last_error(), b.message) != nullptr, b.message,
          __LINE__);
    check(l == nullptr, b.message, __LINE__);
  }
}

//===----------------------------------------------------------------------===//
// With the stand-in driver and NCCL
//===----------------------------------------------------------------------===//

namespace {

/// What the tests read from the stand-ins (the library the runtime loaded).
struct Fakes {
  int64_t (*liveAllocations)();
  int64_t (*contextRetains)();
  int64_t (*badReleases)();
  int64_t (*launches)();
  int (*lastParams)(uint64_t *, int);
  void (*setCapturing)(int);
  void (*ncclFail)(const char *, int, int);
  int64_t (*ncclLive)(const char *);
  void *(*commOfOne)(int);
  int (*commDestroy)(void *);

  bool clean() const {
    return liveAllocations() == 0 && contextRetains() == 0 &&
           badReleases() == 0 && ncclLive("comms") == 0 &&
           ncclLive("memory") == 0 && ncclLive("windows") == 0;
  }
};

Fakes fakes;

bool bindFakes(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return false;
  bool ok = true;
  auto get = [&](auto &fn, const char *name) {
    void *p = dlsym(lib, name);
    ok = ok && p;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  get(fakes.liveAllocations, "mok_fake_cuda_live_allocations");
  get(fakes.contextRetains, "mok_fake_cuda_context_retains");
  get(fakes.badReleases, "mok_fake_cuda_bad_releases");
  get(fakes.launches, "mok_fake_cuda_launches");
  get(fakes.lastParams, "mok_fake_cuda_last_params");
  get(fakes.setCapturing, "mok_fake_cuda_set_capturing");
  get(fakes.ncclFail, "mok_fake_nccl_fail");
  get(fakes.ncclLive, "mok_fake_nccl_live");
  get(fakes.commOfOne, "mok_fake_nccl_comm_of_one");
  get(fakes.commDestroy, "mok_fake_nccl_comm_destroy");
  return ok;
}

/// What one rank's call did: its status and message (mok_last_error is per
/// thread: the checks run on the main thread, after the ranks are done).
struct Outcome {
  mok_status status = MOK_OK;
  std::string message;
  void record(mok_status s) {
    status = s;
    message = mok_last_error();
  }
  bool says(mok_status s, const char *text) const {
    return status == s && message.find(text) != std::string::npos;
  }
};

/// Runs body(rank) on `n` threads at once (the ranks of a communicator).
template <typename F> void onRanks(int n, F body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back(body, r);
  for (std::thread &t : threads)
    t.join();
}

/// N communicators of one NCCL group (threads meet in ncclCommInitRank).
std::vector<mok_comm> ncclGroup(int n) {
  mok_unique_id id;
  std::vector<mok_comm> comms(n, nullptr);
  if (mok_comm_get_unique_id(&id) != MOK_OK)
    return comms;
  onRanks(n, [&](int r) { mok_comm_create(&id, n, r, 0, &comms[r]); });
  return comms;
}

void destroyAll(std::vector<mok_comm> &comms) {
  for (mok_comm &c : comms) {
    CHECK(mok_comm_destroy(c) == MOK_OK);
    c = nullptr;
  }
}

uint64_t word(uint64_t address) {
  uint64_t v;
  std::memcpy(&v, reinterpret_cast<const void *>(address), sizeof v);
  return v;
}

void put(uint64_t address, uint64_t v) {
  std::memcpy(reinterpret_cast<void *>(address), &v, sizeof v);
}

} // namespace

// Loading NCCL: a library without an entry point, one too old, none; then
// the stand-in, and no second copy.
static void testNcclLoad(const char *fake, const char *other) {
  int version = 0;
  const char *path = nullptr;
  CHECK_FAILS(mok_nccl_load(MOK_FAKE_NCCL_NO_WINDOWS, &version, &path),
              MOK_ERROR_NCCL_UNAVAILABLE, "NCCL 2.28.9 (");
  CHECK_ERROR("libmok_fake_nccl_no_windows.so) lacks ncclCommWindowRegister "
              "(NCCL 2.27); mok's communicators need NCCL 2.28 or newer "
              "(symmetric-memory windows, ncclMemAlloc and "
              "ncclCommWindowRegister: 2.27; the window descriptors of its "
              "device API and ncclTeamLsa: 2.28)");
  setenv("MOK_FAKE_NCCL_VERSION", "22703", 1);
  CHECK_FAILS(mok_nccl_load(nullptr, &version, &path),
              MOK_ERROR_NCCL_UNAVAILABLE, "NCCL 2.27.3 (");
  CHECK_ERROR(") is too old: mok's communicators need NCCL 2.28 or newer");
  setenv("MOK_FAKE_NCCL_VERSION", "2804", 1); // the old encoding: 2.8.4
  CHECK_FAILS(mok_nccl_load(nullptr, &version, &path),
              MOK_ERROR_NCCL_UNAVAILABLE, "NCCL 2.8.4 (");
  unsetenv("MOK_FAKE_NCCL_VERSION");
  CHECK_FAILS(mok_nccl_load("/nonexistent/libnccl.so.2", &version, &path),
              MOK_ERROR_NCCL_UNAVAILABLE,
              "NCCL could not be loaded (/nonexistent/libnccl.so.2)");
  CHECK_FAILS(mok_nccl_load("/dev/null", &version, &path),
              MOK_ERROR_NCCL_UNAVAILABLE, "NCCL could not be loaded (/dev/null)");
  CHECK(version == 0 && path == nullptr);
  // MOK_NCCL_LIBRARY (the stand-in) when none is named.
  CHECK(mok_nccl_load(nullptr, &version, &path) == MOK_OK);
  CHECK(version == 22809 && path && std::string(path).find(fake) != std::string::npos);
  CHECK(mok_nccl_load(nullptr, nullptr, nullptr) == MOK_OK);
  CHECK(mok_nccl_load(fake, nullptr, nullptr) == MOK_OK);
  CHECK_FAILS(mok_nccl_load(other, nullptr, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "library: NCCL is loaded from ");
  CHECK_ERROR("already; '");
  CHECK_ERROR("' would be another copy in this process (a communicator "
              "belongs to the library that made it)");
}

// One rank: ids, NCCL's errors, adoption; nothing left behind.
static void testOneRank() {
  mok_unique_id id;
  CHECK(mok_comm_get_unique_id(&id) == MOK_OK);
  mok_comm c = nullptr;
  CHECK(mok_comm_create(&id, 1, 0, 0, &c) == MOK_OK && c);
  int size = 0, rank = -1, device = -1;
  void *nccl = nullptr;
  CHECK(mok_comm_size(c, &size) == MOK_OK && size == 1);
  CHECK(mok_comm_rank(c, &rank) == MOK_OK && rank == 0);
  CHECK(mok_comm_device(c, &device) == MOK_OK && device == 0);
  CHECK(mok_comm_nccl(c, &nccl) == MOK_OK && nccl);
  CHECK_FAILS(mok_comm_size(c, nullptr), MOK_ERROR_INVALID_ARGUMENT,
              "size: is NULL");
  CHECK(fakes.ncclLive("comms") == 1 && fakes.contextRetains() == 1);
  CHECK(mok_comm_destroy(c) == MOK_OK);
  CHECK(fakes.clean());
  CHECK_FAILS(mok_comm_destroy(c), MOK_ERROR_INVALID_ARGUMENT,
              "is not a live mok_comm");

  // NCCL's errors: its result, its message, the call, and nothing kept.
  mok_unique_id bad;
  std::memset(&bad, 0xFF, sizeof bad);
  c = nullptr;
  CHECK_FAILS(mok_comm_create(&bad, 1, 0, 0, &c), MOK_ERROR_NCCL,
              "ncclCommInitRank (rank 0 of 1, device 0): invalid argument (run "
              "with NCCL_DEBUG=WARN for details) (ncclResult_t 4): fake NCCL: "
              "the unique id was not made by ncclGetUniqueId");
  CHECK(c == nullptr && fakes.clean());
  CHECK_FAILS(mok_comm_create(&id, 1, 0, 1, &c), MOK_ERROR_INVALID_ARGUMENT,
              "device: expected 0 <= device < 1, got 1");
  fakes.ncclFail("ncclGetUniqueId", 2, 0);
  CHECK_FAILS(mok_comm_get_unique_id(&id), MOK_ERROR_NCCL,
              "ncclGetUniqueId: unhandled system error");
  CHECK_ERROR("(ncclResult_t 2): fake NCCL: ncclGetUniqueId failed on purpose");
  // A driver failure before NCCL is asked: the context goes back.
  mok_testing_fail_driver_call("cuCtxSetCurrent", CUDA_ERROR_INVALID_CONTEXT, 0, 1);
  CHECK(mok_comm_get_unique_id(&id) == MOK_OK);
  CHECK_FAILS(mok_comm_create(&id, 1, 0, 0, &c), MOK_ERROR_CUDA,
              "cuCtxSetCurrent: ");
  CHECK(c == nullptr && fakes.clean());

  // Adopting a trainer's communicator: not destroyed by mok.
  void *raw = fakes.commOfOne(0);
  CHECK(raw != nullptr);
  CHECK(mok_comm_adopt(raw, -1, &c) == MOK_OK);
  CHECK(mok_comm_nccl(c, &nccl) == MOK_OK && nccl == raw);
  CHECK(mok_comm_size(c, &size) == MOK_OK && size == 1);
  CHECK(mok_comm_device(c, &device) == MOK_OK && device == 0);
  mok_comm other = nullptr;
  CHECK_FAILS(mok_comm_adopt(raw, 1, &other), MOK_ERROR_INVALID_ARGUMENT,
              "device: 1, but the communicator is on device 0 "
              "(ncclCommCuDevice)");
  fakes.ncclFail("ncclCommCount", 5, 0);
  CHECK_FAILS(mok_comm_adopt(raw, 0, &other), MOK_ERROR_NCCL,
              "nccl_comm: ncclCommCount: invalid usage");
  CHECK(other == nullptr);
  // Symmetric memory through it too.
  mok_symmetric b = nullptr;
  CHECK(mok_comm_alloc_symmetric(c, 4096, &b) == MOK_OK);
  mok_symmetric_info info;
  CHECK(mok_symmetric_get_info(b, &info) == MOK_OK && info.ranks == 1 &&
        info.complete == 1 && info.bytes == 4096 && info.comm == c);
  CHECK_FAILS(mok_comm_destroy(c), MOK_ERROR_INVALID_ARGUMENT,
              "comm: 1 symmetric buffer(s) of it are live (mok_symmetric_free "
              "them first)");
  CHECK(mok_symmetric_free(b) == MOK_OK);
  CHECK(mok_comm_destroy(c) == MOK_OK);
  CHECK(fakes.ncclLive("comms") == 1); // still the trainer's
  CHECK(fakes.commDestroy(raw) == 0);
  CHECK(fakes.clean());
}

// Two ranks (threads): symmetric buffers, their peer tables, sizes that
// differ, a rank that fails, NCCL without the support needed.
static void testTwoRanks(bool peerPointerApi) {
  std::vector<mok_comm> comms = ncclGroup(2);
  CHECK(comms[0] && comms[1]);
  if (!comms[0] || !comms[1])
    return;
  mok_symmetric b[2] = {};
  Outcome o[2];
  onRanks(2, [&](int r) {
    o[r].record(mok_comm_alloc_symmetric(comms[r], 4096, &b[r]));
  });
  CHECK(o[0].status == MOK_OK && o[1].status == MOK_OK);
  mok_symmetric_info info[2];
  uint64_t table[2][2] = {};
  for (int r = 0; r < 2; ++r) {
    CHECK(mok_symmetric_get_info(b[r], &info[r]) == MOK_OK);
    CHECK(info[r].rank == r && info[r].ranks == 2 && info[r].complete);
    CHECK(mok_symmetric_read_peers(b[r], table[r], 2) == MOK_OK);
    // Zeroed (the stand-in fills new memory with 0xA5).
    CHECK(word(reinterpret_cast<uint64_t>(info[r].address)) == 0);
  }
  CHECK_FAILS(mok_symmetric_read_peers(b[0], table[0], 3),
              MOK_ERROR_INVALID_ARGUMENT,
              "count: expected 2 (the communicator's ranks), got 3");
  CHECK_FAILS(mok_symmetric_read_peers(b[0], nullptr, 2),
              MOK_ERROR_INVALID_ARGUMENT, "entries: is NULL");
  // Entry i of each rank's table reaches rank i's buffer: a store through
  // it is in rank i's memory, also this rank's own entry.
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 2; ++i) {
      uint64_t v = 0x1000 + 16 * r + i;
      put(table[r][i] + 8 * (r + 1), v);
      check(word(reinterpret_cast<uint64_t>(info[i].address) + 8 * (r + 1)) == v,
            "a peer-table entry reaches its rank's buffer", __LINE__);
    }
  // The peer's entries are the LSA space's, 4 GiB apart, the same on both.
  CHECK(table[0][0] == table[1][0] && table[0][1] == table[1][1]);
  CHECK(table[0][1] - table[0][0] == (uint64_t(1) << 32));
  CHECK(fakes.ncclLive("windows") == 2 && fakes.ncclLive("memory") == 2);
  // NCCL 2.29's host API when the library has it, else the descriptor.
  check((fakes.ncclLive("peer_pointer_calls") > 0) == peerPointerApi,
        "peer addresses from ncclGetPeerDevicePointer iff NCCL has it",
        __LINE__);
  for (mok_symmetric s : b)
    CHECK(mok_symmetric_free(s) == MOK_OK);
  CHECK(fakes.ncclLive("windows") == 0 && fakes.ncclLive("memory") == 0);

  // Sizes that differ: every rank fails, naming both, and keeps nothing.
  int64_t allocations = fakes.liveAllocations();
  onRanks(2, [&](int r) {
    b[r] = nullptr;
    o[r].record(mok_comm_alloc_symmetric(comms[r], r ? 8192 : 4096, &b[r]));
  });
  CHECK(o[0].says(MOK_ERROR_INVALID_ARGUMENT,
                  "bytes: 4096 on rank 0, but rank 1 asks for 8192: every rank "
                  "allocates a symmetric buffer of the same size (they pair up "
                  "in call order)"));
  CHECK(o[1].says(MOK_ERROR_INVALID_ARGUMENT,
                  "bytes: 8192 on rank 1, but rank 0 asks for 4096"));
  CHECK(!b[0] && !b[1] && fakes.ncclLive("memory") == 0 &&
        fakes.liveAllocations() == allocations);

  // One rank's allocation fails: that rank says why, the other which rank.
  fakes.ncclFail("ncclMemAlloc", 1, 0);
  onRanks(2, [&](int r) {
    o[r].record(mok_comm_alloc_symmetric(comms[r], 4096, &b[r]));
  });
  int failing = o[0].message.find("ncclMemAlloc") != std::string::npos ? 0 : 1;
  CHECK(o[failing].says(MOK_ERROR_NCCL,
                        "ncclMemAlloc (4096 bytes): unhandled cuda error"));
  CHECK(o[1 - failing].says(MOK_ERROR_NCCL, "could not allocate its part of "
                                            "the 4096-byte symmetric buffer"));
  CHECK(o[1 - failing].message.find("rank " + std::to_string(failing)) == 0);
  CHECK(fakes.ncclLive("memory") == 0 && fakes.liveAllocations() == allocations);

  // NCCL without what the exchange needs: every rank refuses, by name.
  struct {
    const char *variable, *value;
    mok_status status;
    const char *message;
  } unsupported[] = {
      {"MOK_FAKE_NCCL_LSA_SIZE", "1", MOK_ERROR_UNSUPPORTED,
       "comm: NCCL's load/store-accessible (LSA) team holds 1 of the 2 ranks "
       "(ranks on other nodes, or GPUs without peer access): the exchange "
       "stores into every rank's buffer, so every rank must reach every other "
       "over NVLink"},
      {"MOK_FAKE_NCCL_WINDOW", "none", MOK_ERROR_UNSUPPORTED,
       "ncclCommWindowRegister gave no window: the communicator has no "
       "symmetric-memory support"},
      // NCCL 2.28 without symmetric support: the descriptor is not device
      // memory; 2.29 says so itself.
      {"MOK_FAKE_NCCL_WINDOW", "host",
       peerPointerApi ? MOK_ERROR_NCCL : MOK_ERROR_UNSUPPORTED,
       peerPointerApi
           ? "ncclGetPeerDevicePointer (rank 0): invalid argument"
           : "reading NCCL's window descriptor failed (invalid argument "
             "(CUresult 1)): the window is not a symmetric one"},
  };
  for (auto &u : unsupported) {
    setenv(u.variable, u.value, 1);
    onRanks(2, [&](int r) {
      b[r] = nullptr;
      o[r].record(mok_comm_alloc_symmetric(comms[r], 4096, &b[r]));
    });
    unsetenv(u.variable);
    for (int r = 0; r < 2; ++r) {
      check(o[r].says(u.status, u.message), u.message, __LINE__);
      check(!b[r], u.message, __LINE__);
    }
    check(fakes.ncclLive("memory") == 0 && fakes.ncclLive("windows") == 0,
          u.message, __LINE__);
  }
  destroyAll(comms);
  CHECK(fakes.clean());
}

// Expert-parallel layers on two NCCL ranks: binding (collective), the
// parameters each launch passes, the epoch, what is refused.
static void testLayersOnNccl() {
  std::vector<mok_comm> comms = ncclGroup(2);
  {
    // Every rank binds the same layer: metadata that differs (here another
    // x shape with the same symmetric_bytes) is refused on every rank,
    // before any buffer is allocated.
    std::string other = epLayer(2, 8192);
    other.replace(other.find("[4, 64]"), 7, "[8, 64]");
    mok_layer mixed[2] = {};
    CHECK(mok_layer_create(epLayer(2, 8192).c_str(), &mixed[0]) == MOK_OK);
    CHECK(mok_layer_create(other.c_str(), &mixed[1]) == MOK_OK);
    Outcome m[2];
    onRanks(2, [&](int r) {
      m[r].record(mok_layer_bind_comm(mixed[r], comms[r], nullptr));
    });
    for (int r = 0; r < 2; ++r)
      CHECK(m[r].says(MOK_ERROR_INVALID_ARGUMENT,
                      "binds a layer whose metadata differs from rank"));
    for (mok_layer l : mixed)
      mok_layer_destroy(l);
  }
  mok_layer layers[2] = {};
  for (mok_layer &l : layers)
    CHECK(mok_layer_create(epLayer(2, 8192).c_str(), &l) == MOK_OK);
  Outcome o[2];
  onRanks(2, [&](int r) {
    o[r].record(mok_layer_bind_comm(layers[r], comms[r], nullptr));
  });
  CHECK(o[0].status == MOK_OK && o[1].status == MOK_OK);
  mok_symmetric ex[2] = {};
  for (int r = 0; r < 2; ++r) {
    mok_comm c = nullptr;
    CHECK(mok_layer_comm(layers[r], &c, &ex[r]) == MOK_OK && c == comms[r] &&
          ex[r]);
    mok_ep_group g{};
    void *nccl = nullptr;
    mok_comm_nccl(comms[r], &nccl);
    CHECK(mok_layer_ep_group(layers[r], &g) == MOK_OK && g.size == 2 &&
          g.rank == r && g.nccl_comm == nccl);
  }
  mok_symmetric_info info;
  CHECK(mok_symmetric_get_info(ex[0], &info) == MOK_OK && info.bytes == 8192);
  CHECK_FAILS(mok_symmetric_free(ex[0]), MOK_ERROR_INVALID_ARGUMENT,
              "buffer: a layer uses it (its own exchange buffer); unbind the "
              "layer instead");
  CHECK_FAILS(mok_comm_destroy(comms[0]), MOK_ERROR_INVALID_ARGUMENT,
              "comm: 1 layer(s) are bound to it (unbind them with "
              "mok_layer_bind_comm(layer, NULL, NULL), or destroy them, "
              "first)");
  // Rebinding what is bound changes nothing (no collective: one rank alone).
  CHECK(mok_layer_bind_comm(layers[0], comms[0], nullptr) == MOK_OK);
  CHECK(mok_layer_bind_comm(layers[0], nullptr, ex[0]) == MOK_OK);
  mok_symmetric same = nullptr;
  CHECK(mok_layer_comm(layers[0], nullptr, &same) == MOK_OK && same == ex[0]);
  CHECK(mok_layer_set_ep_group(layers[0], nullptr) != MOK_OK);

  // Loaded on the communicator's device, launched: peers, rank, epoch.
  CHECK_FAILS(mok_layer_load(layers[0], 1, kEpPtx), MOK_ERROR_INVALID_ARGUMENT,
              "device: 1, but the layer's communicator (rank 0 of 2) is on "
              "device 0");
  Args a = args();
  for (int r = 0; r < 2; ++r) {
    CHECK(mok_layer_load(layers[r], 0, kEpPtx) == MOK_OK);
    CHECK(mok_layer_check(layers[r], a.in, 1, &a.out) == MOK_OK);
  }
  mok_symmetric_info ri[2];
  for (int r = 0; r < 2; ++r)
    mok_symmetric_get_info(ex[r], &ri[r]);
  for (uint64_t step = 1; step <= 3; ++step)
    for (int r = 0; r < 2; ++r) {
      CHECK(mok_layer_forward(layers[r], a.in, 1, &a.out, nullptr) == MOK_OK);
      uint64_t p[8] = {};
      CHECK(fakes.lastParams(p, 8) == 6);
      CHECK(p[0] == reinterpret_cast<uint64_t>(xs) &&
            p[1] == reinterpret_cast<uint64_t>(outs));
      CHECK(p[2] == reinterpret_cast<uint64_t>(ri[r].peer_table));
      CHECK(static_cast<uint32_t>(p[3]) == static_cast<uint32_t>(r));
      check(p[4] == step, "each forward passes the next epoch", __LINE__);
      // Its own buffer as its table holds it (NCCL's window mapping).
      uint64_t table[2] = {};
      CHECK(mok_symmetric_read_peers(ex[r], table, 2) == MOK_OK &&
            p[5] == table[r]);
      uint64_t epoch = 0;
      CHECK(mok_layer_epoch(layers[r], &epoch) == MOK_OK && epoch == step);
    }
  // A launch that fails ran nothing: the next one passes the same epoch.
  mok_testing_fail_driver_call("cuLaunchCooperativeKernel",
                               CUDA_ERROR_LAUNCH_FAILED, 0, 1);
  CHECK_FAILS(mok_layer_forward(layers[0], a.in, 1, &a.out, nullptr),
              MOK_ERROR_CUDA, "launching 'moe_ep_forward' failed");
  uint64_t epoch = 0;
  CHECK(mok_layer_epoch(layers[0], &epoch) == MOK_OK && epoch == 3);
  CHECK(mok_layer_forward(layers[0], a.in, 1, &a.out, nullptr) == MOK_OK);
  uint64_t p[8] = {};
  fakes.lastParams(p, 8);
  CHECK(p[4] == 4);
  // Not into a CUDA graph: a replay would repeat the epoch.
  fakes.setCapturing(1);
  int64_t launches = fakes.launches();
  CHECK_FAILS(mok_layer_forward(layers[1], a.in, 1, &a.out, nullptr),
              MOK_ERROR_UNSUPPORTED,
              "stream: is being captured into a CUDA graph, but this layer "
              "exchanges tokens (ep = 2): each launch passes its kernel a new "
              "epoch, which a replay would repeat");
  fakes.setCapturing(0);
  CHECK(fakes.launches() == launches);

  // A communicator of another size, by name; the binding stays.
  mok_unique_id id;
  mok_comm one = nullptr;
  CHECK(mok_comm_get_unique_id(&id) == MOK_OK &&
        mok_comm_create(&id, 1, 0, 0, &one) == MOK_OK);
  CHECK_FAILS(mok_layer_bind_comm(layers[0], one, nullptr),
              MOK_ERROR_INVALID_ARGUMENT,
              "comm: a communicator of 1 rank(s), but this layer was compiled "
              "for ep = 2 (the metadata's \"ep\"): bind one of 2 rank(s)");
  mok_comm bound = nullptr;
  CHECK(mok_layer_comm(layers[0], &bound, nullptr) == MOK_OK &&
        bound == comms[0]);

  // A buffer of the caller's: too small, then big enough (zeroed, the ranks
  // meet); the layer gives it back when unbound.
  mok_symmetric small[2] = {}, big[2] = {}, oneBuffer = nullptr;
  onRanks(2, [&](int r) {
    mok_comm_alloc_symmetric(comms[r], 4096, &small[r]);
    mok_comm_alloc_symmetric(comms[r], 16384, &big[r]);
  });
  CHECK(mok_comm_alloc_symmetric(one, 8192, &oneBuffer) == MOK_OK);
  CHECK_FAILS(mok_layer_bind_comm(layers[0], nullptr, small[0]),
              MOK_ERROR_INVALID_ARGUMENT,
              "buffer: 4096 bytes, but this layer's exchange needs "
              "symmetric_bytes = 8192");
  CHECK_FAILS(mok_layer_bind_comm(layers[0], comms[0], oneBuffer),
              MOK_ERROR_INVALID_ARGUMENT,
              "buffer: a symmetric buffer of another communicator (rank 0 of "
              "1), not of `comm` (rank 0 of 2)");
  mok_symmetric_info bi;
  mok_symmetric_get_info(big[0], &bi);
  put(reinterpret_cast<uint64_t>(bi.address) + 64, 99);
  onRanks(2, [&](int r) {
    o[r].record(mok_layer_bind_comm(layers[r], nullptr, big[r]));
  });
  CHECK(o[0].status == MOK_OK && o[1].status == MOK_OK);
  CHECK(word(reinterpret_cast<uint64_t>(bi.address) + 64) == 0);
  CHECK(mok_layer_epoch(layers[0], &epoch) == MOK_OK && epoch == 0);
  CHECK(mok_layer_forward(layers[0], a.in, 1, &a.out, nullptr) == MOK_OK);
  fakes.lastParams(p, 8);
  CHECK(p[2] == reinterpret_cast<uint64_t>(bi.peer_table) && p[4] == 1);
  CHECK_FAILS(mok_symmetric_free(big[0]), MOK_ERROR_INVALID_ARGUMENT,
              "buffer: a layer uses it (given to mok_layer_bind_comm)");
  mok_layer third = nullptr;
  CHECK(mok_layer_create(epLayer(2, 8192).c_str(), &third) == MOK_OK);
  CHECK_FAILS(mok_layer_bind_comm(third, comms[0], big[0]),
              MOK_ERROR_INVALID_ARGUMENT,
              "buffer: another layer uses it already; each layer needs an "
              "exchange buffer of its own");
  mok_layer_destroy(third);
  // The ranks bind layers of different sizes: both refuse.
  mok_layer narrow = nullptr, wide = nullptr;
  mok_symmetric mid[2] = {};
  CHECK(mok_layer_create(epLayer(2, 8192).c_str(), &narrow) == MOK_OK);
  CHECK(mok_layer_create(epLayer(2, 16384).c_str(), &wide) == MOK_OK);
  onRanks(2, [&](int r) {
    mok_comm_alloc_symmetric(comms[r], 16384, &mid[r]);
    o[r].record(mok_layer_bind_comm(r ? wide : narrow, nullptr, mid[r]));
  });
  CHECK(o[0].says(MOK_ERROR_INVALID_ARGUMENT,
                  "layer: needs 8192 bytes of symmetric buffer on rank 0, but "
                  "rank 1 binds a layer that needs 16384: every rank binds the "
                  "same layer, in the same order"));
  CHECK(o[1].says(MOK_ERROR_INVALID_ARGUMENT,
                  "layer: needs 16384 bytes of symmetric buffer on rank 1, but "
                  "rank 0 binds a layer that needs 8192"));
  mok_comm nothing = nullptr;
  CHECK(mok_layer_comm(narrow, &nothing, nullptr) == MOK_OK && !nothing);
  mok_layer_destroy(narrow);
  mok_layer_destroy(wide);
  for (mok_symmetric m : mid)
    CHECK(mok_symmetric_free(m) == MOK_OK);

  // Unbinding: the layer cannot run, the buffers go back to their owner.
  for (int r = 0; r < 2; ++r)
    CHECK(mok_layer_bind_comm(layers[r], nullptr, nullptr) == MOK_OK);
  CHECK_FAILS(mok_layer_forward(layers[0], a.in, 1, &a.out, nullptr),
              MOK_ERROR_INVALID_ARGUMENT, "no communicator is bound");
  for (int r = 0; r < 2; ++r) {
    CHECK(mok_symmetric_free(small[r]) == MOK_OK);
    CHECK(mok_symmetric_free(big[r]) == MOK_OK);
  }
  CHECK(mok_symmetric_free(oneBuffer) == MOK_OK);

  // An ep = 1 layer takes a communicator of one rank, and runs as without.
  mok_layer single = nullptr;
  CHECK(mok_layer_create(epLayer(1, -1, 3, R"(,
    {"name": "s", "role": "workspace", "dtype": "i32", "shape": [2]})").c_str(),
                         &single) == MOK_OK);
  CHECK_FAILS(mok_layer_bind_comm(single, comms[0], nullptr),
              MOK_ERROR_INVALID_ARGUMENT,
              "comm: a communicator of 2 rank(s), but this layer was compiled "
              "for ep = 1");
  CHECK(mok_layer_bind_comm(single, one, nullptr) == MOK_OK);
  mok_symmetric none = static_cast<mok_symmetric>(kForged);
  CHECK(mok_layer_comm(single, &bound, &none) == MOK_OK && bound == one &&
        !none);
  mok_layer_destroy(single); // unbinds
  for (mok_layer l : layers)
    mok_layer_destroy(l);
  CHECK(mok_comm_destroy(one) == MOK_OK);
  destroyAll(comms);
  CHECK(fakes.clean());
}

// A local group of 4 ranks on one device, without NCCL: peer tables filled
// when the last rank allocates, sizes paired by order, layers bound.
static void testLocalGroup() {
  mok_comm comms[4] = {};
  CHECK(mok_comm_create_local_group(4, 0, comms) == MOK_OK);
  CHECK_FAILS(mok_comm_create_local_group(2, 1, comms),
              MOK_ERROR_INVALID_ARGUMENT, "device: expected 0 <= device < 1, "
                                          "got 1");
  for (int r = 0; r < 4; ++r) {
    int rank = -1, size = -1;
    void *nccl = kForged;
    CHECK(mok_comm_rank(comms[r], &rank) == MOK_OK && rank == r);
    CHECK(mok_comm_size(comms[r], &size) == MOK_OK && size == 4);
    CHECK(mok_comm_nccl(comms[r], &nccl) == MOK_OK && nccl == nullptr);
  }
  mok_symmetric b[4] = {};
  for (int r = 0; r < 3; ++r)
    CHECK(mok_comm_alloc_symmetric(comms[r], 4096, &b[r]) == MOK_OK);
  mok_symmetric_info info[4];
  CHECK(mok_symmetric_get_info(b[0], &info[0]) == MOK_OK && !info[0].complete);
  uint64_t table[4][4] = {};
  CHECK(mok_symmetric_read_peers(b[0], table[0], 4) == MOK_OK);
  CHECK(table[0][0] == 0 && table[0][3] == 0);
  CHECK(mok_comm_alloc_symmetric(comms[3], 4096, &b[3]) == MOK_OK);
  for (int r = 0; r < 4; ++r) {
    CHECK(mok_symmetric_get_info(b[r], &info[r]) == MOK_OK && info[r].complete);
    CHECK(mok_symmetric_read_peers(b[r], table[r], 4) == MOK_OK);
    CHECK(word(reinterpret_cast<uint64_t>(info[r].address)) == 0);
  }
  // Entry i of rank r's table is rank i's buffer.
  int right = 0;
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 4; ++i)
      right += table[r][i] == reinterpret_cast<uint64_t>(info[i].address);
  CHECK(right == 16);

  // The second buffer of each rank pairs with the others' second.
  mok_symmetric c[4] = {};
  CHECK(mok_comm_alloc_symmetric(comms[0], 4096, &c[0]) == MOK_OK);
  CHECK_FAILS(mok_comm_alloc_symmetric(comms[1], 8192, &c[1]),
              MOK_ERROR_INVALID_ARGUMENT,
              "bytes: 8192 on rank 1, but rank 0 allocated 4096 as symmetric "
              "buffer #1 of this local group: every rank allocates the same "
              "sizes in the same order");
  CHECK(c[1] == nullptr);
  for (int r = 1; r < 4; ++r)
    CHECK(mok_comm_alloc_symmetric(comms[r], 4096, &c[r]) == MOK_OK);

  // Layers of ep = 4: until every rank has bound, none runs.
  mok_layer layers[4] = {};
  Args a = args();
  for (int r = 0; r < 4; ++r) {
    CHECK(mok_layer_create(epLayer(4, 1024).c_str(), &layers[r]) == MOK_OK);
    if (r < 3) {
      CHECK(mok_layer_bind_comm(layers[r], comms[r], nullptr) == MOK_OK);
      CHECK(mok_layer_load(layers[r], 0, kEpPtx) == MOK_OK);
    }
  }
  CHECK_FAILS(mok_layer_forward(layers[0], a.in, 1, &a.out, nullptr),
              MOK_ERROR_INVALID_ARGUMENT,
              "layer: the exchange buffer: its peer table is not filled yet: "
              "rank(s) 3 of the local group have not allocated symmetric "
              "buffer #2 (bind their layers, or allocate, too)");
  CHECK(mok_layer_bind_comm(layers[3], comms[3], nullptr) == MOK_OK);
  CHECK(mok_layer_load(layers[3], 0, kEpPtx) == MOK_OK);
  for (int r = 0; r < 4; ++r) {
    CHECK(mok_layer_forward(layers[r], a.in, 1, &a.out, nullptr) == MOK_OK);
    uint64_t p[8] = {};
    CHECK(fakes.lastParams(p, 8) == 6);
    mok_symmetric ex = nullptr;
    mok_layer_comm(layers[r], nullptr, &ex);
    mok_symmetric_info ei;
    mok_symmetric_get_info(ex, &ei);
    CHECK(p[2] == reinterpret_cast<uint64_t>(ei.peer_table));
    CHECK(p[5] == reinterpret_cast<uint64_t>(ei.address));
    CHECK(static_cast<uint32_t>(p[3]) == static_cast<uint32_t>(r) && p[4] == 1);
    uint64_t peers[4];
    CHECK(mok_symmetric_read_peers(ex, peers, 4) == MOK_OK);
    mok_symmetric others[4];
    for (int i = 0; i < 4; ++i)
      mok_layer_comm(layers[i], nullptr, &others[i]);
    for (int i = 0; i < 4; ++i) {
      mok_symmetric_info oi;
      mok_symmetric_get_info(others[i], &oi);
      check(peers[i] == reinterpret_cast<uint64_t>(oi.address),
            "a layer's peer table holds every rank's exchange buffer",
            __LINE__);
    }
  }
  // The compiler's kernels take no epoch (they count their launches on the
  // device): nothing a replay would repeat, so they launch while a stream
  // is captured into a CUDA graph.
  {
    const char *ptx =
        ".version 8.1\n.target sm_90a\n.address_size 64\n"
        ".visible .entry moe_ep_forward(\n  .param .u64 x,\n  .param .u64 out,\n"
        "  .param .u64 peers,\n  .param .u32 rank,\n  .param .u64 symmetric\n)\n"
        "{\n  ret;\n}\n";
    std::string meta = epLayer(4, 1024, 5, R"(,
    {"name": "peers", "role": "peers", "dtype": "i64", "shape": [4]},
    {"name": "rank", "role": "rank", "dtype": "i32", "shape": []},
    {"name": "symmetric", "role": "symmetric", "dtype": "u8", "shape": [1024]})");
    mok_layer counted[4] = {};
    for (int r = 0; r < 4; ++r) {
      CHECK(mok_layer_create(meta.c_str(), &counted[r]) == MOK_OK);
      CHECK(mok_layer_bind_comm(counted[r], comms[r], nullptr) == MOK_OK);
      CHECK(mok_layer_load(counted[r], 0, ptx) == MOK_OK);
    }
    fakes.setCapturing(1);
    int64_t before = fakes.launches();
    for (int r = 0; r < 4; ++r) {
      CHECK(mok_layer_forward(counted[r], a.in, 1, &a.out, nullptr) == MOK_OK);
      uint64_t p[8] = {};
      CHECK(fakes.lastParams(p, 8) == 5);
      mok_symmetric ex = nullptr;
      mok_layer_comm(counted[r], nullptr, &ex);
      mok_symmetric_info ei;
      mok_symmetric_get_info(ex, &ei);
      CHECK(p[4] == reinterpret_cast<uint64_t>(ei.address));
    }
    CHECK(fakes.launches() == before + 4);
    fakes.setCapturing(0);
    for (mok_layer l : counted)
      mok_layer_destroy(l);
  }

  // A buffer of an incomplete window is refused as a layer's exchange.
  mok_symmetric lone = nullptr;
  CHECK(mok_comm_alloc_symmetric(comms[0], 2048, &lone) == MOK_OK);
  mok_layer extra = nullptr;
  CHECK(mok_layer_create(epLayer(4, 1024).c_str(), &extra) == MOK_OK);
  CHECK_FAILS(mok_layer_bind_comm(extra, nullptr, lone),
              MOK_ERROR_INVALID_ARGUMENT,
              "buffer: its peer table is not filled yet: rank(s) 1, 2, 3");
  mok_layer_destroy(extra);

  CHECK_FAILS(mok_comm_destroy(comms[0]), MOK_ERROR_INVALID_ARGUMENT,
              "layer(s) are bound to it");
  for (mok_layer l : layers)
    mok_layer_destroy(l);
  CHECK_FAILS(mok_comm_destroy(comms[0]), MOK_ERROR_INVALID_ARGUMENT,
              "comm: 3 symmetric buffer(s) of it are live");
  for (int r = 0; r < 4; ++r) {
    CHECK(mok_symmetric_free(b[r]) == MOK_OK);
    CHECK(mok_symmetric_free(c[r]) == MOK_OK);
  }
  CHECK(mok_symmetric_free(lone) == MOK_OK);
  CHECK_FAILS(mok_symmetric_free(lone), MOK_ERROR_INVALID_ARGUMENT,
              "is not a live mok_symmetric");
  for (mok_comm &comm : comms)
    CHECK(mok_comm_destroy(comm) == MOK_OK);
  CHECK(fakes.clean());

  // A driver failure while allocating leaves nothing, and the order intact.
  CHECK(mok_comm_create_local_group(2, 0, comms) == MOK_OK);
  mok_testing_fail_driver_call("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY, 1, 1);
  CHECK_FAILS(mok_comm_alloc_symmetric(comms[0], 512, &b[0]),
              MOK_ERROR_OUT_OF_MEMORY, "allocating the peer table (16 bytes): "
                                       "out of memory");
  CHECK(mok_comm_alloc_symmetric(comms[0], 512, &b[0]) == MOK_OK);
  CHECK(mok_comm_alloc_symmetric(comms[1], 512, &b[1]) == MOK_OK);
  // Memory goes when every rank has freed its part.
  int64_t live = fakes.liveAllocations();
  CHECK(mok_symmetric_free(b[0]) == MOK_OK && fakes.liveAllocations() == live);
  CHECK(mok_symmetric_free(b[1]) == MOK_OK &&
        fakes.liveAllocations() == live - 4);
  // One rank alone: its part stays until the group goes.
  CHECK(mok_comm_alloc_symmetric(comms[0], 512, &b[0]) == MOK_OK);
  CHECK(mok_symmetric_free(b[0]) == MOK_OK);
  for (int r = 0; r < 2; ++r)
    CHECK(mok_comm_destroy(comms[r]) == MOK_OK);
  CHECK(fakes.clean());
}

void testCommWithFakeNccl(const char *path, bool peerPointerApi) {
  if (!bindFakes(path)) {
    check(false, "the stand-ins load (MOK_FAKE_CUDA)", __LINE__);
    return;
  }
  if (!peerPointerApi) {
    testNcclLoad(path, MOK_FAKE_NCCL_PEER_POINTER);
    testOneRank();
    testLayersOnNccl();
    testLocalGroup();
  } else {
    // NCCL 2.29's host API for peer addresses instead of the descriptor.
    CHECK(mok_nccl_load(nullptr, nullptr, nullptr) == MOK_OK);
    testTwoRanks(true);
    return;
  }
  testTwoRanks(false);
  mok_testing_fail_driver_call(nullptr, 0, 0, 1);
}
