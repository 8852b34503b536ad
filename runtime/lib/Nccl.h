// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// NCCL, loaded at run time (dlopen) as the CUDA driver is: the runtime links
// no NCCL and needs no nccl.h to build, so the few types it uses are
// declared here with nccl.h's ABI (NCCL 2.28: enums are ints, a unique id is
// 128 bytes passed by value, a team is three ints returned by value).
//
#ifndef MOK_RUNTIME_NCCL_H
#define MOK_RUNTIME_NCCL_H

#include <cstddef>
#include <string>

namespace mok::runtime {

/// ncclUniqueId.
struct NcclUniqueId {
  char internal[128];
};

/// ncclTeam_t (nccl_device/core.h): a set of ranks.
struct NcclTeam {
  int nRanks, rank, stride;
};

/// The ncclResult_t values the runtime tells apart.
enum : int { kNcclSuccess = 0, kNcclInProgress = 7 };
/// ncclUint64 (ncclDataType_t) and NCCL_WIN_COLL_SYMMETRIC.
enum : int { kNcclUint64 = 5, kNcclWinCollSymmetric = 1 };

/// The oldest NCCL the communicators take: 2.28.0 (NCCL_VERSION_CODE).
constexpr int kNcclMinimumVersion = 22800;

/// The entry points, by their NCCL names. ncclComm_t and ncclWindow_t are
/// opaque pointers here.
struct Nccl {
  int (*getVersion)(int *);
  const char *(*getErrorString)(int);
  const char *(*getLastError)(void *comm);
  int (*getUniqueId)(NcclUniqueId *);
  int (*commInitRank)(void **comm, int nranks, NcclUniqueId id, int rank);
  int (*commFinalize)(void *comm);
  int (*commDestroy)(void *comm);
  int (*commGetAsyncError)(void *comm, int *state);
  int (*commCount)(void *comm, int *count);
  int (*commUserRank)(void *comm, int *rank);
  int (*commCuDevice)(void *comm, int *device);
  int (*memAlloc)(void **ptr, size_t bytes);
  int (*memFree)(void *ptr);
  int (*commWindowRegister)(void *comm, void *buffer, size_t bytes,
                            void **window, int flags);
  int (*commWindowDeregister)(void *comm, void *window);
  NcclTeam (*teamLsa)(void *comm);
  int (*allGather)(const void *send, void *receive, size_t count,
                   int datatype, void *comm, void *stream);
  /// NCCL 2.29 and newer (null before): a peer's address in a window, from
  /// the host. Older versions are read from the window's descriptor.
  int (*getPeerDevicePointer)(void *window, size_t offset, int peer,
                              void **address);

  int version = 0;  // NCCL_VERSION_CODE, e.g. 22809
  std::string path; // the library's file

  /// "2.28.9"
  std::string versionText() const;
  /// "<NCCL's string for r> (ncclResult_t r)", then NCCL's last warning
  /// for `comm` (or the process) when it has one.
  std::string describe(int r, void *comm) const;
};

/// "2.28.9" for an NCCL_VERSION_CODE (either encoding NCCL has used).
std::string ncclVersionText(int code);

/// NCCL, loading it on the first call: `library` names the file (null: the
/// environment's MOK_NCCL_LIBRARY, else libnccl.so.2). Null with the reason
/// in `error` when it cannot be loaded, lacks an entry point or is older
/// than kNcclMinimumVersion; a failed load leaves nothing loaded, so a
/// later call may try another library. Once loaded, a `library` naming
/// another file is refused (a communicator belongs to the library that
/// made it).
const Nccl *loadNccl(const char *library, std::string &error);

} // namespace mok::runtime

#endif // MOK_RUNTIME_NCCL_H
