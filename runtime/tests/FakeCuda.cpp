// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// A stand-in for the CUDA driver, FOR TESTS ONLY: the runtime loads it when
// MOK_CUDA_DRIVER names it, so that loading, launching and every driver
// failure path run on machines without a GPU. "Device" memory is host
// memory (filled with 0xA5 bytes when allocated, so zeroing shows); modules
// remember the `.entry` names of their PTX; launches run nothing and are
// counted. Its "cubins" (made by mok_fake_cuda_cubin) are an ELF header for
// the CUDA machine, then text: the chip they are for and the kernels (and,
// when asked for, a section of static shared memory per kernel, as ptxas
// writes them); it loads one only on a device of that chip, as the driver
// does. The mok_fake_cuda_* functions let a test see what is still
// allocated, loaded or retained (through dlopen of the same path, or
// ctypes), so it can check that nothing leaks. The same library is a
// stand-in NCCL too (FakeNccl.cpp), whose memory is this driver's.
//
#include "FakeCuda.h"

#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr int kSMs = 132; // an H200's

struct Module;

struct Function {
  Module *module;
  std::string name;
  int params; // the kernel's .param count (0 from a cubin)
};

struct Module {
  std::vector<std::string> kernels;
  std::vector<int> paramCounts; // per kernel: its PTX's .param count
  std::vector<std::unique_ptr<Function>> functions; // handed out, by kernel
};

struct Allocation {
  size_t bytes;
  bool nccl; // ncclMemAlloc's (FakeNccl.cpp), not cuMemAlloc's
};

struct State {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> allocations; // by base
  std::set<Module *> modules;
  int computeCapability = 0; // 0: MOK_FAKE_CUDA_CC, else 90
  int64_t retains = 0;     // primary-context retains minus releases
  int64_t launches = 0;
  int64_t badReleases = 0; // frees/unloads/releases of what is not live
  int64_t tensorMaps = 0;
  int capturing = 0; // what cuStreamIsCapturing answers
  std::string lastKernel;
  unsigned lastGrid = 0;
  std::vector<uint64_t> lastParams; // the last launch's, a word each
};

State &state() {
  static State *s = new State; // outlives every user's static destructors
  return *s;
}

int deviceCount() {
  const char *n = std::getenv("MOK_FAKE_CUDA_DEVICES");
  return n && *n ? std::atoi(n) : 1;
}

/// The devices' compute capability, major * 10 + minor (every device's).
int computeCapability() {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.computeCapability) {
    const char *cc = std::getenv("MOK_FAKE_CUDA_CC");
    s.computeCapability = cc && *cc ? std::atoi(cc) : 90;
  }
  return s.computeCapability;
}

CUcontext contextOf(CUdevice d) {
  return reinterpret_cast<CUcontext>(static_cast<uintptr_t>(0x1000 + 16 * d));
}

/// Whether [p, p + bytes) lies in one live allocation (lock held).
bool inAllocation(State &s, uintptr_t p, size_t bytes) {
  auto it = s.allocations.upper_bound(p);
  if (it == s.allocations.begin())
    return false;
  --it;
  return p >= it->first && p + bytes <= it->first + it->second.bytes;
}

thread_local int current = -1; // the device of this thread's context

CUresult getErrorString(CUresult r, const char **out) {
  switch (r) {
  case CUDA_SUCCESS:
    *out = "no error";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_VALUE:
    *out = "invalid argument";
    return CUDA_SUCCESS;
  case CUDA_ERROR_OUT_OF_MEMORY:
    *out = "out of memory";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_DEVICE:
    *out = "invalid device ordinal";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_PTX:
    *out = "a PTX JIT compilation failed";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_HANDLE:
    *out = "invalid resource handle";
    return CUDA_SUCCESS;
  case CUDA_ERROR_NOT_FOUND:
    *out = "named symbol not found";
    return CUDA_SUCCESS;
  case CUDA_ERROR_ILLEGAL_ADDRESS:
    *out = "an illegal memory access was encountered";
    return CUDA_SUCCESS;
  case CUDA_ERROR_LAUNCH_FAILED:
    *out = "unspecified launch failure";
    return CUDA_SUCCESS;
  case CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
    *out = "too many blocks in cooperative launch";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_IMAGE:
    *out = "device kernel image is invalid";
    return CUDA_SUCCESS;
  case CUDA_ERROR_NO_BINARY_FOR_GPU:
    *out = "no kernel image is available for execution on the device";
    return CUDA_SUCCESS;
  default:
    *out = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult init(unsigned) { return CUDA_SUCCESS; }

CUresult deviceGetCount(int *count) {
  *count = deviceCount();
  return CUDA_SUCCESS;
}

CUresult deviceGet(CUdevice *d, int ordinal) {
  if (ordinal < 0 || ordinal >= deviceCount())
    return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

CUresult primaryCtxRetain(CUcontext *c, CUdevice d) {
  if (d < 0 || d >= deviceCount())
    return CUDA_ERROR_INVALID_DEVICE;
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.retains;
  *c = contextOf(d);
  return CUDA_SUCCESS;
}

CUresult primaryCtxRelease(CUdevice d) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (d < 0 || d >= deviceCount() || s.retains == 0) {
    ++s.badReleases;
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  --s.retains;
  return CUDA_SUCCESS;
}

CUresult ctxSetCurrent(CUcontext c) {
  uintptr_t v = reinterpret_cast<uintptr_t>(c);
  current = v >= 0x1000 ? static_cast<int>((v - 0x1000) / 16) : -1;
  return CUDA_SUCCESS;
}

/// The number of `.param`s of each `.entry` of `ptx`, in order.
std::vector<int> paramCountsOf(const char *ptx) {
  std::vector<int> counts;
  for (const char *p = std::strstr(ptx, ".entry"); p;
       p = std::strstr(p + 1, ".entry")) {
    const char *open = std::strchr(p, '(');
    const char *close = open ? std::strchr(open, ')') : nullptr;
    int n = 0;
    if (close)
      for (const char *q = std::strstr(open, ".param"); q && q < close;
           q = std::strstr(q + 1, ".param"))
        ++n;
    counts.push_back(n);
  }
  return counts;
}

/// The `.entry` names of `ptx`.
std::vector<std::string> entriesOf(const char *ptx) {
  std::vector<std::string> kernels;
  for (const char *p = std::strstr(ptx, ".entry"); p;
       p = std::strstr(p + 1, ".entry")) {
    p += std::strlen(".entry");
    while (*p == ' ' || *p == '\t')
      ++p;
    size_t len = std::strcspn(p, " \t\n(");
    kernels.emplace_back(p, len);
  }
  return kernels;
}

/// The error log buffer among JIT options, or null.
void logBuffer(unsigned n, const CUjit_option *options, void *const *values,
               char *&log, size_t &size) {
  log = nullptr;
  size = 0;
  for (unsigned i = 0; i < n; ++i) {
    if (options[i] == CU_JIT_ERROR_LOG_BUFFER)
      log = static_cast<char *>(values[i]);
    if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
      size = reinterpret_cast<uintptr_t>(values[i]);
  }
}

CUresult loadModule(CUmodule *out, std::vector<std::string> kernels,
                    std::vector<int> paramCounts = {}) {
  auto m = new Module;
  m->kernels = std::move(kernels);
  m->paramCounts = std::move(paramCounts);
  m->paramCounts.resize(m->kernels.size(), 0);
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.modules.insert(m);
  *out = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

CUresult moduleLoadDataEx(CUmodule *out, const void *image, unsigned n,
                          CUjit_option *options, void **values) {
  std::vector<std::string> kernels =
      entriesOf(static_cast<const char *>(image));
  if (kernels.empty()) {
    // What ptxas would say, in the caller's log buffer.
    char *log;
    size_t size;
    logBuffer(n, options, values, log, size);
    if (log && size)
      std::snprintf(log, size, "fake ptxas: no .entry in the PTX");
    return CUDA_ERROR_INVALID_PTX;
  }
  return loadModule(out, std::move(kernels),
                    paramCountsOf(static_cast<const char *>(image)));
}

constexpr size_t kElfHeader = 64;
const char kCubinTag[] = "mok-fake-cubin ";

template <typename T> void put(std::vector<char> &image, size_t at, T value) {
  std::memcpy(&image[at], &value, sizeof value);
}

/// A cubin of the stand-in: an ELF header (64-bit, little-endian, the CUDA
/// machine) and "mok-fake-cubin CHIP\nentry NAME\n...", NUL terminated.
/// With `staticShared` bytes, sections follow: the section names and, per
/// kernel, `.nv.shared.NAME` (no bytes in the file, that size), as ptxas
/// writes a kernel's static shared memory; else none.
std::vector<char> makeCubin(const std::string &chip,
                            const std::vector<std::string> &kernels,
                            uint64_t staticShared = 0) {
  std::vector<char> image(kElfHeader, 0);
  std::memcpy(image.data(), "\x7f" "ELF", 4);
  image[4] = 2; // ELFCLASS64
  image[5] = 1; // little-endian
  image[6] = 1; // EV_CURRENT
  uint16_t type = 2, machine = 190, headerSize = kElfHeader;
  uint32_t version = 1;
  std::memcpy(&image[16], &type, 2);
  std::memcpy(&image[18], &machine, 2);
  std::memcpy(&image[20], &version, 4);
  std::memcpy(&image[52], &headerSize, 2);
  std::string text = kCubinTag + chip + "\n";
  for (const std::string &k : kernels)
    text += "entry " + k + "\n";
  image.insert(image.end(), text.begin(), text.end());
  image.push_back(0);
  if (!staticShared)
    return image;
  std::string names = std::string("\0.shstrtab\0", 11);
  std::vector<uint32_t> nameAt;
  for (const std::string &k : kernels) {
    nameAt.push_back(static_cast<uint32_t>(names.size()));
    names += ".nv.shared." + k + '\0';
  }
  uint64_t namesAt = image.size();
  image.insert(image.end(), names.begin(), names.end());
  image.resize((image.size() + 7) / 8 * 8, 0);
  uint64_t headersAt = image.size();
  uint16_t count = static_cast<uint16_t>(2 + kernels.size());
  image.resize(image.size() + 64 * count, 0);
  put<uint64_t>(image, 40, headersAt); // e_shoff
  put<uint16_t>(image, 58, 64);        // e_shentsize
  put<uint16_t>(image, 60, count);     // e_shnum
  put<uint16_t>(image, 62, 1);         // e_shstrndx
  size_t names1 = headersAt + 64;      // section 1: the names
  put<uint32_t>(image, names1, 1);
  put<uint32_t>(image, names1 + 4, 3); // SHT_STRTAB
  put<uint64_t>(image, names1 + 24, namesAt);
  put<uint64_t>(image, names1 + 32, names.size());
  put<uint64_t>(image, names1 + 48, 1);
  for (size_t i = 0; i < kernels.size(); ++i) {
    size_t at = headersAt + 64 * (2 + i);
    put<uint32_t>(image, at, nameAt[i]);
    put<uint32_t>(image, at + 4, 8);   // SHT_NOBITS
    put<uint64_t>(image, at + 8, 3);   // SHF_WRITE | SHF_ALLOC
    put<uint64_t>(image, at + 24, headersAt);
    put<uint64_t>(image, at + 32, staticShared);
    put<uint64_t>(image, at + 48, 16); // the alignment a linked cubin has
  }
  return image;
}

CUresult moduleLoadData(CUmodule *out, const void *image) {
  const char *p = static_cast<const char *>(image);
  uint16_t machine = 0;
  if (p)
    std::memcpy(&machine, p + 18, 2);
  if (!p || std::memcmp(p, "\x7f" "ELF", 4) != 0 || machine != 190 ||
      std::strncmp(p + kElfHeader, kCubinTag, sizeof kCubinTag - 1) != 0)
    return CUDA_ERROR_INVALID_IMAGE;
  const char *text = p + kElfHeader + sizeof kCubinTag - 1;
  std::string chip(text, std::strcspn(text, "\n"));
  std::string device = "sm_" + std::to_string(computeCapability());
  if (chip != device && chip != device + "a")
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  std::vector<std::string> kernels;
  for (const char *e = std::strstr(text, "\nentry "); e;
       e = std::strstr(e + 1, "\nentry ")) {
    e += std::strlen("\nentry ");
    kernels.emplace_back(e, std::strcspn(e, "\n"));
  }
  return loadModule(out, std::move(kernels));
}

CUresult moduleUnload(CUmodule module) {
  auto m = reinterpret_cast<Module *>(module);
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.modules.erase(m)) {
    ++s.badReleases;
    return CUDA_ERROR_INVALID_HANDLE;
  }
  delete m;
  return CUDA_SUCCESS;
}

CUresult moduleGetFunction(CUfunction *f, CUmodule module, const char *name) {
  auto m = reinterpret_cast<Module *>(module);
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.modules.count(m))
    return CUDA_ERROR_INVALID_HANDLE;
  for (const auto &fn : m->functions)
    if (fn->name == name) {
      *f = reinterpret_cast<CUfunction>(fn.get());
      return CUDA_SUCCESS;
    }
  for (size_t i = 0; i < m->kernels.size(); ++i)
    if (m->kernels[i] == name) {
      m->functions.push_back(std::make_unique<Function>(
          Function{m, m->kernels[i], m->paramCounts[i]}));
      *f = reinterpret_cast<CUfunction>(m->functions.back().get());
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}

CUresult funcSetAttribute(CUfunction, CUfunction_attribute, int) {
  return CUDA_SUCCESS;
}

/// A launch: counted, its kernel, grid and parameters recorded (each read
/// as 8 bytes: the runtime passes every parameter from a 64-bit word).
CUresult launch(CUfunction f, unsigned grid, bool cooperative,
                void **params) {
  auto fn = reinterpret_cast<Function *>(f);
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!fn || !s.modules.count(fn->module))
    return CUDA_ERROR_INVALID_HANDLE;
  if (cooperative && grid > kSMs)
    return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
  ++s.launches;
  s.lastKernel = fn->name;
  s.lastGrid = grid;
  s.lastParams.clear();
  for (int i = 0; params && i < fn->params; ++i) {
    uint64_t word;
    std::memcpy(&word, params[i], sizeof word);
    s.lastParams.push_back(word);
  }
  return CUDA_SUCCESS;
}

CUresult launchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                      unsigned, unsigned, unsigned, unsigned, CUstream,
                      void **params, void **) {
  return launch(f, gx * gy * gz, false, params);
}

CUresult launchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy,
                                 unsigned gz, unsigned, unsigned, unsigned,
                                 unsigned, CUstream, void **params) {
  return launch(f, gx * gy * gz, true, params);
}

CUresult launchKernelEx(const CUlaunchConfig *config, CUfunction f,
                        void **params, void **) {
  bool cooperative = false;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
      cooperative = config->attrs[i].value.cooperative;
  return launch(f, config->gridDimX * config->gridDimY * config->gridDimZ,
                cooperative, params);
}

CUresult occupancyMaxActiveClusters(int *count, CUfunction,
                                    const CUlaunchConfig *config) {
  *count = kSMs / static_cast<int>(config->gridDimX);
  return CUDA_SUCCESS;
}

CUresult deviceGetAttribute(int *value, CUdevice_attribute attribute,
                            CUdevice) {
  switch (attribute) {
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
    *value = kSMs;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
    *value = computeCapability() / 10;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
    *value = computeCapability() % 10;
    break;
  default:
    *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult memAlloc(CUdeviceptr *p, size_t bytes) {
  if (!bytes)
    return CUDA_ERROR_INVALID_VALUE;
  size_t rounded = (bytes + 255) / 256 * 256;
  void *m = std::aligned_alloc(256, rounded);
  if (!m)
    return CUDA_ERROR_OUT_OF_MEMORY;
  std::memset(m, 0xA5, rounded);
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.allocations[reinterpret_cast<uintptr_t>(m)] = Allocation{bytes, false};
  *p = reinterpret_cast<CUdeviceptr>(m);
  return CUDA_SUCCESS;
}

CUresult memFree(CUdeviceptr p) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.allocations.find(static_cast<uintptr_t>(p));
  if (it == s.allocations.end() || it->second.nccl) {
    ++s.badReleases;
    return CUDA_ERROR_INVALID_VALUE;
  }
  s.allocations.erase(it);
  std::free(reinterpret_cast<void *>(p));
  return CUDA_SUCCESS;
}

CUresult memsetD8(CUdeviceptr p, unsigned char value, size_t bytes) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!inAllocation(s, p, bytes))
    return CUDA_ERROR_INVALID_VALUE;
  std::memset(reinterpret_cast<void *>(p), value, bytes);
  return CUDA_SUCCESS;
}

// Mapped host memory (the kernels' report): an allocation like the
// device's, its device address the host address.
CUresult memHostAlloc(void **p, size_t bytes, unsigned int) {
  CUdeviceptr d = 0;
  if (CUresult r = memAlloc(&d, bytes); r != CUDA_SUCCESS)
    return r;
  *p = reinterpret_cast<void *>(d);
  return CUDA_SUCCESS;
}

CUresult memFreeHost(void *p) {
  return memFree(reinterpret_cast<CUdeviceptr>(p));
}

CUresult memHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned int) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!inAllocation(s, reinterpret_cast<uintptr_t>(p), 1))
    return CUDA_ERROR_INVALID_VALUE;
  *d = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

CUresult streamSynchronize(CUstream) { return CUDA_SUCCESS; }

CUresult occupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction, int,
                                                   size_t) {
  *n = 1;
  return CUDA_SUCCESS;
}

CUresult memcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes,
                         CUstream) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!inAllocation(s, dst, bytes))
    return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(reinterpret_cast<void *>(dst), src, bytes);
  return CUDA_SUCCESS;
}

CUresult streamIsCapturing(CUstream, CUstreamCaptureStatus *status) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  *status = s.capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                        : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult memcpyDtoH(void *dst, CUdeviceptr src, size_t bytes) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!inAllocation(s, src, bytes))
    return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(dst, reinterpret_cast<const void *>(src), bytes);
  return CUDA_SUCCESS;
}

CUresult tensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type,
                              cuuint32_t rank, void *address,
                              const cuuint64_t *dims, const cuuint64_t *strides,
                              const cuuint32_t *box, const cuuint32_t *,
                              CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion,
                              CUtensorMapFloatOOBfill) {
  if (!map || !address || reinterpret_cast<uintptr_t>(address) % 16 ||
      rank < 1 || rank > 5)
    return CUDA_ERROR_INVALID_VALUE;
  // The runtime builds its host maps 64-byte aligned, CUDA 13's header
  // gives the type 128-byte alignment: written as bytes, not through it.
  // The stand-in's encoding, for tests to read: the address, the data
  // type, dims[0..1], the byte stride and box[0..1] (2-D maps).
  uint64_t words[CU_TENSOR_MAP_NUM_QWORDS] = {reinterpret_cast<uintptr_t>(address),
                                              static_cast<uint64_t>(type)};
  if (rank == 2) {
    words[2] = dims[0];
    words[3] = dims[1];
    words[4] = strides[0];
    words[5] = box[0];
    words[6] = box[1];
  }
  std::memcpy(static_cast<void *>(map), words, sizeof words);
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.tensorMaps;
  return CUDA_SUCCESS;
}

struct Entry {
  const char *name;
  void *fn;
};

// The entry points the runtime looks up, each checked against the header's
// signature.
#define MOK_FAKE(name, fn)                                                     \
  Entry{#name, reinterpret_cast<void *>(                                       \
                   static_cast<decltype(&::name)>(&fn))}
const Entry entries[] = {
    MOK_FAKE(cuGetErrorString, getErrorString),
    MOK_FAKE(cuInit, init),
    MOK_FAKE(cuDeviceGetCount, deviceGetCount),
    MOK_FAKE(cuDeviceGet, deviceGet),
    MOK_FAKE(cuDevicePrimaryCtxRetain, primaryCtxRetain),
    MOK_FAKE(cuDevicePrimaryCtxRelease, primaryCtxRelease),
    MOK_FAKE(cuCtxSetCurrent, ctxSetCurrent),
    MOK_FAKE(cuModuleLoadDataEx, moduleLoadDataEx),
    MOK_FAKE(cuModuleUnload, moduleUnload),
    MOK_FAKE(cuModuleGetFunction, moduleGetFunction),
    MOK_FAKE(cuFuncSetAttribute, funcSetAttribute),
    MOK_FAKE(cuLaunchKernel, launchKernel),
    MOK_FAKE(cuLaunchCooperativeKernel, launchCooperativeKernel),
    MOK_FAKE(cuLaunchKernelEx, launchKernelEx),
    MOK_FAKE(cuOccupancyMaxActiveClusters, occupancyMaxActiveClusters),
    MOK_FAKE(cuDeviceGetAttribute, deviceGetAttribute),
    MOK_FAKE(cuMemAlloc, memAlloc),
    MOK_FAKE(cuMemFree, memFree),
    MOK_FAKE(cuMemsetD8, memsetD8),
    MOK_FAKE(cuMemHostAlloc, memHostAlloc),
    MOK_FAKE(cuMemFreeHost, memFreeHost),
    MOK_FAKE(cuMemHostGetDevicePointer, memHostGetDevicePointer),
    MOK_FAKE(cuStreamSynchronize, streamSynchronize),
    MOK_FAKE(cuOccupancyMaxActiveBlocksPerMultiprocessor,
             occupancyMaxActiveBlocksPerMultiprocessor),
    MOK_FAKE(cuMemcpyHtoDAsync, memcpyHtoDAsync),
    MOK_FAKE(cuStreamIsCapturing, streamIsCapturing),
    MOK_FAKE(cuMemcpyDtoH, memcpyDtoH),
    MOK_FAKE(cuTensorMapEncodeTiled, tensorMapEncodeTiled),
    MOK_FAKE(cuModuleLoadData, moduleLoadData),
};
#undef MOK_FAKE

} // namespace

//===----------------------------------------------------------------------===//
// What the stand-in NCCL uses (FakeCuda.h)
//===----------------------------------------------------------------------===//

bool mok_fake::addNcclMemory(uintptr_t base, size_t bytes) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.allocations.emplace(base, Allocation{bytes, true}).second;
}

bool mok_fake::removeNcclMemory(uintptr_t base) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.allocations.find(base);
  if (it == s.allocations.end() || !it->second.nccl)
    return false;
  s.allocations.erase(it);
  return true;
}

bool mok_fake::isDeviceMemory(uintptr_t p, size_t bytes) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return inAllocation(s, p, bytes);
}

int mok_fake::currentDevice() { return current; }

void mok_fake::setCurrentDevice(int device) { current = device; }

#define MOK_FAKE_API extern "C" __attribute__((visibility("default")))

// The one symbol the runtime looks up: every entry point by its name (the
// runtime asks for the unversioned names; CUDA_VERSION picks the version).
MOK_FAKE_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int,
                                          cuuint64_t,
                                          CUdriverProcAddressQueryResult *status) {
  for (const Entry &e : entries)
    if (std::strcmp(e.name, symbol) == 0) {
      *pfn = e.fn;
      if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *pfn = nullptr;
  if (status)
    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

/* What a test reads back. */
MOK_FAKE_API int64_t mok_fake_cuda_live_allocations() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return static_cast<int64_t>(state().allocations.size());
}

MOK_FAKE_API int64_t mok_fake_cuda_live_bytes() {
  std::lock_guard<std::mutex> lock(state().mutex);
  int64_t bytes = 0;
  for (const auto &a : state().allocations)
    bytes += static_cast<int64_t>(a.second.bytes);
  return bytes;
}

MOK_FAKE_API int64_t mok_fake_cuda_live_modules() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return static_cast<int64_t>(state().modules.size());
}

/// Primary-context retains not yet released.
MOK_FAKE_API int64_t mok_fake_cuda_context_retains() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().retains;
}

/// Frees, unloads and releases of what was not live (double frees).
MOK_FAKE_API int64_t mok_fake_cuda_bad_releases() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().badReleases;
}

MOK_FAKE_API int64_t mok_fake_cuda_launches() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().launches;
}

MOK_FAKE_API int64_t mok_fake_cuda_tensor_maps() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().tensorMaps;
}

/// The kernel name and grid size of the last launch.
MOK_FAKE_API const char *mok_fake_cuda_last_kernel(unsigned *grid) {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (grid)
    *grid = state().lastGrid;
  return state().lastKernel.c_str();
}

/// The last launch's parameters, each as the 64-bit word the runtime passed
/// (a 32-bit one in its low half), into `out` (`capacity` words); returns
/// how many there were (the kernel's PTX `.param`s; 0 from a cubin).
MOK_FAKE_API int mok_fake_cuda_last_params(uint64_t *out, int capacity) {
  std::lock_guard<std::mutex> lock(state().mutex);
  const std::vector<uint64_t> &p = state().lastParams;
  for (int i = 0; out && i < capacity && i < static_cast<int>(p.size()); ++i)
    out[i] = p[i];
  return static_cast<int>(p.size());
}

/// Makes cuStreamIsCapturing say that every stream is (1) or is not (0)
/// being captured into a CUDA graph.
MOK_FAKE_API void mok_fake_cuda_set_capturing(int capturing) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().capturing = capturing;
}

/// Makes every device of compute capability `cc` (major * 10 + minor: 90,
/// 100); 0: back to $MOK_FAKE_CUDA_CC, else 90.
MOK_FAKE_API void mok_fake_cuda_set_compute_capability(int cc) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().computeCapability = cc;
}

/// Writes the stand-in's cubin of `ptx`'s kernels for `chip` ("sm_90"),
/// with a section of `static_shared` bytes of static shared memory per
/// kernel (`.nv.shared.<kernel>`; none for 0), to `out` when it holds
/// `capacity` bytes; returns its size either way.
MOK_FAKE_API size_t mok_fake_cuda_cubin_shared(const char *chip,
                                               const char *ptx,
                                               uint64_t static_shared,
                                               void *out, size_t capacity) {
  std::vector<char> image = makeCubin(chip, entriesOf(ptx), static_shared);
  if (out && capacity >= image.size())
    std::memcpy(out, image.data(), image.size());
  return image.size();
}

/// The stand-in's cubin without sections (mok_fake_cuda_cubin_shared, 0).
MOK_FAKE_API size_t mok_fake_cuda_cubin(const char *chip, const char *ptx,
                                        void *out, size_t capacity) {
  return mok_fake_cuda_cubin_shared(chip, ptx, 0, out, capacity);
}
