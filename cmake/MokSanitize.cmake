# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# MOK_SANITIZE=address,undefined (or one of the two): compile and link mok's
# own code (the libraries, the tools, the runtime) with the sanitizers, for
# the fuzzing of the front ends (docs/Building.md, docs/Reliability.md).
#
# - libMLIR.so and libLLVM.so stay as Debian ships them, uninstrumented:
#   ASan replaces malloc/free for the whole process, so it still sees heap
#   misuse of memory MLIR allocates when mok's code touches it, but not
#   accesses made inside MLIR's own code.
# - undefined without vptr: LLVM and MLIR are built without RTTI, so their
#   classes have no type_info for the vptr check to compare.
# - -fno-sanitize-recover: a UBSan report ends the process with an error
#   exit, so a test or the fuzzer cannot miss it.
# - NDEBUG off: mok's assert()s, and the checks of llvm::cast and friends
#   inlined into mok's code, are active (LLVM's ABI does not depend on
#   NDEBUG: LLVM_ENABLE_ABI_BREAKING_CHECKS is fixed by the LLVM build).

if(NOT MOK_SANITIZE)
  return()
endif()

string(REPLACE "," ";" mok_sanitizers "${MOK_SANITIZE}")
foreach(s IN LISTS mok_sanitizers)
  if(NOT s MATCHES "^(address|undefined)$")
    message(FATAL_ERROR "MOK_SANITIZE: '${s}' is not one of address, "
                        "undefined (got MOK_SANITIZE=${MOK_SANITIZE})")
  endif()
endforeach()
if(MOK_BUILD_STATIC_TOOLS)
  message(FATAL_ERROR "MOK_SANITIZE needs the sanitizer runtimes as shared "
                      "libraries; configure without MOK_BUILD_STATIC_TOOLS")
endif()

list(JOIN mok_sanitizers "," mok_sanitizers)
add_compile_options(-fsanitize=${mok_sanitizers} -fno-omit-frame-pointer
                    -UNDEBUG)
add_link_options(-fsanitize=${mok_sanitizers})
if(mok_sanitizers MATCHES "undefined")
  add_compile_options(-fno-sanitize=vptr -fno-sanitize-recover=undefined)
endif()
message(STATUS "mok: sanitizers ${mok_sanitizers} (MOK_SANITIZE)")

# The runtimes' defaults, linked into each tool (tools/SanitizerOptions.cpp).
set(MOK_SANITIZER_OPTIONS_SOURCE
    ${PROJECT_SOURCE_DIR}/tools/SanitizerOptions.cpp)
