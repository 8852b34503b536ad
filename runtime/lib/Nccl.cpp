// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include "Nccl.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace mok::runtime {

std::string ncclVersionText(int code) {
  // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z
  // from 2.9 on.
  int major, minor, patch = code % 100;
  if (code >= 10000) {
    major = code / 10000;
    minor = code / 100 % 100;
  } else {
    major = code / 1000;
    minor = code / 100 % 10;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." +
         std::to_string(patch);
}

std::string Nccl::versionText() const { return ncclVersionText(version); }

std::string Nccl::describe(int r, void *comm) const {
  const char *s = getErrorString ? getErrorString(r) : nullptr;
  std::string text = std::string(s && *s ? s : "NCCL error") +
                     " (ncclResult_t " + std::to_string(r) + ")";
  const char *last = getLastError ? getLastError(comm) : nullptr;
  if (last && *last)
    text += ": " + std::string(last);
  return text;
}

namespace {

// Every entry point the communicators need: the Nccl member, its name, and
// the NCCL version that introduced it (for the message when it is missing).
#define MOK_NCCL_ENTRY_POINTS(X)                                               \
  X(getErrorString, "ncclGetErrorString", "2.0")                               \
  X(getLastError, "ncclGetLastError", "2.13")                                  \
  X(getUniqueId, "ncclGetUniqueId", "2.0")                                     \
  X(commInitRank, "ncclCommInitRank", "2.0")                                   \
  X(commFinalize, "ncclCommFinalize", "2.14")                                  \
  X(commDestroy, "ncclCommDestroy", "2.0")                                     \
  X(commGetAsyncError, "ncclCommGetAsyncError", "2.4")                         \
  X(commCount, "ncclCommCount", "2.0")                                         \
  X(commUserRank, "ncclCommUserRank", "2.0")                                   \
  X(commCuDevice, "ncclCommCuDevice", "2.0")                                   \
  X(memAlloc, "ncclMemAlloc", "2.19")                                          \
  X(memFree, "ncclMemFree", "2.19")                                            \
  X(commWindowRegister, "ncclCommWindowRegister", "2.27")                      \
  X(commWindowDeregister, "ncclCommWindowDeregister", "2.27")                  \
  X(teamLsa, "ncclTeamLsa", "2.28")                                            \
  X(allGather, "ncclAllGather", "2.0")

struct Loaded {
  std::mutex mutex;
  void *handle = nullptr; // null until a load succeeded
  Nccl nccl{};
};

Loaded &loaded() {
  static Loaded *l = new Loaded; // never destroyed: comms may outlive statics
  return *l;
}

/// The file a symbol of `handle` lives in (what dlopen found).
std::string fileOf(void *symbol, const std::string &fallback) {
  Dl_info info;
  if (symbol && dladdr(symbol, &info) && info.dli_fname && *info.dli_fname)
    return info.dli_fname;
  return fallback;
}

const char *const kWhy =
    "mok's communicators need NCCL 2.28 or newer (symmetric-memory windows, "
    "ncclMemAlloc and ncclCommWindowRegister: 2.27; the window descriptors of "
    "its device API and ncclTeamLsa: 2.28)";

} // namespace

const Nccl *loadNccl(const char *library, std::string &error) {
  Loaded &l = loaded();
  std::lock_guard<std::mutex> lock(l.mutex);
  if (l.handle) {
    if (!library)
      return &l.nccl;
    // The same library is what dlopen would hand back without loading.
    void *same = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
    if (same)
      dlclose(same);
    if (same == l.handle)
      return &l.nccl;
    error = "library: NCCL is loaded from " + l.nccl.path +
            " already; '" + library +
            "' would be another copy in this process (a communicator "
            "belongs to the library that made it)";
    return nullptr;
  }
  const char *path = library;
  if (!path || !*path)
    path = std::getenv("MOK_NCCL_LIBRARY");
  if (!path || !*path)
    path = "libnccl.so.2";
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = dlerror();
    error = std::string("NCCL could not be loaded (") + path +
            "): " + (why ? why : "unknown reason") + "; " + kWhy +
            ": install it (torch's wheel nvidia-nccl-cu13, or the system's "
            "libnccl2) or name its libnccl.so.2 with MOK_NCCL_LIBRARY";
    return nullptr;
  }
  Nccl n{};
  auto getVersion =
      reinterpret_cast<int (*)(int *)>(dlsym(handle, "ncclGetVersion"));
  if (!getVersion) {
    error = std::string(path) + " has no ncclGetVersion: not an NCCL library";
    dlclose(handle);
    return nullptr;
  }
  n.getVersion = getVersion;
  n.path = fileOf(reinterpret_cast<void *>(getVersion), path);
  if (int r = getVersion(&n.version); r != kNcclSuccess) {
    error = "ncclGetVersion of " + n.path + " failed (ncclResult_t " +
            std::to_string(r) + ")";
    dlclose(handle);
    return nullptr;
  }
  if (n.version < kNcclMinimumVersion) {
    error = "NCCL " + n.versionText() + " (" + n.path + ") is too old: " +
            kWhy;
    dlclose(handle);
    return nullptr;
  }
  std::string missing;
#define MOK_ENTRY(member, name, since)                                         \
  n.member = reinterpret_cast<decltype(n.member)>(dlsym(handle, name));        \
  if (!n.member && missing.empty())                                            \
    missing = std::string(name) + " (NCCL " + since + ")";
  MOK_NCCL_ENTRY_POINTS(MOK_ENTRY)
#undef MOK_ENTRY
  if (!missing.empty()) {
    error = "NCCL " + n.versionText() + " (" + n.path + ") lacks " + missing +
            "; " + kWhy;
    dlclose(handle);
    return nullptr;
  }
  // Optional: the host API for peer addresses (NCCL 2.29).
  n.getPeerDevicePointer = reinterpret_cast<decltype(n.getPeerDevicePointer)>(
      dlsym(handle, "ncclGetPeerDevicePointer"));
  l.nccl = n;
  l.handle = handle;
  return &l.nccl;
}

} // namespace mok::runtime
