// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The sanitizer runtimes' defaults for mok's tools in a MOK_SANITIZE build
// (cmake/MokSanitize.cmake); ASAN_OPTIONS and UBSAN_OPTIONS override them.
//
extern "C" {
#if defined(__SANITIZE_ADDRESS__)
// LLVM's allocators (llvm/Support/Allocator.h) poison the free part of their
// slabs in code compiled with ASan. mok's code is, libMLIR's is not: memory
// that mok's inlined copy poisoned and libMLIR's copy then hands out reads
// as use-after-poison though it is in use. Manual poisoning is therefore
// off; ASan still checks every block from malloc and new.
__attribute__((visibility("default"), used)) const char *
__asan_default_options() {
  return "allow_user_poisoning=0";
}
#endif
// A UBSan report with the stack that led to it.
__attribute__((visibility("default"), used)) const char *
__ubsan_default_options() {
  return "print_stacktrace=1";
}
}
