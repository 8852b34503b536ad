// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The runtime tests' checks: counted, each failure printed with its line and
// the runtime's last error.
//
#ifndef MOK_RUNTIME_TESTS_CHECK_H
#define MOK_RUNTIME_TESTS_CHECK_H

#include "mok/Runtime/mok_runtime.h"

#include <cstring>

extern int passed, failed;

void check(bool cond, const char *what, int line);

#define CHECK(c) check((c), #c, __LINE__)
// The call fails with `status` and its message contains `text`.
#define CHECK_FAILS(call, status, text)                                        \
  do {                                                                         \
    mok_status s_ = (call);                                                    \
    check(s_ == (status), #call " returns " #status, __LINE__);                \
    check(std::strstr(mok_last_error(), (text)) != nullptr,                    \
          #call " says \"" text "\"", __LINE__);                               \
  } while (0)
// The last error contains `text` (after a call that returns no status).
#define CHECK_ERROR(text)                                                      \
  check(std::strstr(mok_last_error(), (text)) != nullptr,                      \
        "the last error says \"" text "\"", __LINE__)

/// The tests with a stand-in driver (tests/FakeCuda.cpp, at `fakeDriver`),
/// run in a process of their own: the runtime loads its driver once.
void testWithFakeDriver(const char *fakeDriver);

/// Communicators (comm_test.cpp): without NCCL or a driver (MOK_NCCL_LIBRARY
/// and MOK_CUDA_DRIVER name files that do not exist), and with the stand-in
/// driver and NCCL at `fakeLibrary` (both variables name it), in a process
/// of its own; `peerPointerApi`: the variant with NCCL 2.29's
/// ncclGetPeerDevicePointer.
void testCommWithoutNccl();
void testExpertParallelMetadata();
void testCommWithFakeNccl(const char *fakeLibrary, bool peerPointerApi);

#endif // MOK_RUNTIME_TESTS_CHECK_H
