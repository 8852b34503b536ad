// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// FOR TESTS ONLY: not part of the C API (mok_runtime.h), no stability
// promise. Makes calls of the CUDA driver fail on purpose, so that tests can
// check the messages and that a failed call frees what it allocated. The
// runtime's own tests (runtime/tests) and the Python tests (through ctypes)
// use it; a trainer never should.
//
#ifndef MOK_RUNTIME_TESTING_H
#define MOK_RUNTIME_TESTING_H

#include "mok/Runtime/mok_runtime.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Makes driver entry point `function` (its CUDA name: "cuMemAlloc",
 * "cuModuleLoadDataEx", "cuLaunchCooperativeKernel", ...) return `result`
 * (a CUresult) instead of being called: the next `skip` calls go through,
 * then `times` calls fail (-1: every later call). A new injection for a
 * function replaces its previous one; `function` NULL clears every
 * injection. An unknown name is MOK_ERROR_INVALID_ARGUMENT. Works with any
 * driver (the real one or a stand-in named by MOK_CUDA_DRIVER), from before
 * or after it is loaded; injecting into cuInit before the first call that
 * needs the driver makes the process's driver unavailable for good. */
MOK_API mok_status mok_testing_fail_driver_call(const char *function,
                                                int result, int64_t skip,
                                                int64_t times);

/* How many calls of driver entry point `function` the runtime has made
 * (the failed injected ones included) since the process started; -1 for an
 * unknown name. */
MOK_API int64_t mok_testing_driver_calls(const char *function);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOK_RUNTIME_TESTING_H */
