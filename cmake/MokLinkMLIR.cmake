# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# Two ways to link a mok tool against MLIR, from one set of object files:
#
#   mok_link_mlir(<target> <MLIR component targets...>)
#       development: link libMLIR.so (which brings libLLVM.so). Fast links.
#
#   mok_link_mlir_static(<target> LIBS <mok libraries...>
#                        COMPONENTS <MLIR component targets...>)
#       carry-anywhere: the static libMLIR*.a archives of the transitive
#       closure of the given targets, plus LLVM's static archives, plus
#       static libstdc++/libgcc. The binary needs only glibc, libz, libzstd.
#
# Debian's static MLIR targets all list `LLVM` (libLLVM.so) in their link
# interface, so linking them "statically" still loads the 150 MB shared LLVM.
# Re-pointing the imported `LLVM` target would break the dylib tools of the
# same tree (two LLVMs in one process), so the static tool's link line is
# computed here instead: walk the imported targets, keep their archives and
# substitute LLVM's static libraries for `LLVM`.

function(mok_link_mlir target)
  # In dylib mode all MLIR components live in libMLIR.so; the components named
  # by the caller are documentation of what the tool uses (and what the static
  # variant links).
  target_link_libraries(${target} PRIVATE MLIR LLVM)
endfunction()

function(_mok_collect_archives out_var visited_var)
  set(archives ${${out_var}})
  set(visited ${${visited_var}})
  foreach(lib IN LISTS ARGN)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" lib "${lib}")
    if(lib IN_LIST visited)
      continue()
    endif()
    list(APPEND visited ${lib})
    if(lib STREQUAL "LLVM" OR lib MATCHES "^LLVM[A-Z]")
      continue() # replaced by LLVM's static libraries below
    endif()
    if(NOT TARGET ${lib})
      message(FATAL_ERROR "mok_link_mlir_static: '${lib}' is not a known target")
    endif()
    get_target_property(type ${lib} TYPE)
    if(type STREQUAL "STATIC_LIBRARY")
      get_target_property(loc ${lib} IMPORTED_LOCATION_RELWITHDEBINFO)
      if(NOT loc)
        get_target_property(loc ${lib} IMPORTED_LOCATION_RELEASE)
      endif()
      if(NOT loc)
        message(FATAL_ERROR "mok_link_mlir_static: no archive for '${lib}'")
      endif()
      list(APPEND archives ${loc})
    elseif(NOT type STREQUAL "INTERFACE_LIBRARY") # header-only: deps only
      message(FATAL_ERROR "mok_link_mlir_static: '${lib}' is a ${type}, not a static library")
    endif()
    get_target_property(deps ${lib} INTERFACE_LINK_LIBRARIES)
    if(deps)
      _mok_collect_archives(archives visited ${deps})
    endif()
  endforeach()
  set(${out_var} ${archives} PARENT_SCOPE)
  set(${visited_var} ${visited} PARENT_SCOPE)
endfunction()

function(mok_link_mlir_static target)
  cmake_parse_arguments(ARG "" "" "LIBS;COMPONENTS" ${ARGN})
  set(archives)
  set(visited)
  _mok_collect_archives(archives visited ${ARG_COMPONENTS})
  list(REMOVE_DUPLICATES archives)
  # mok's own static libraries go inside the group too: they and MLIR
  # reference each other, and their transitive order is not the link order.
  set(own)
  foreach(lib IN LISTS ARG_LIBS)
    list(APPEND own $<TARGET_FILE:${lib}>)
    add_dependencies(${target} ${lib})
  endforeach()

  set(llvm_config ${LLVM_TOOLS_BINARY_DIR}/llvm-config)
  execute_process(
    COMMAND ${llvm_config} --link-static --libs ${MOK_STATIC_LLVM_COMPONENTS}
    OUTPUT_VARIABLE llvm_libs OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "llvm-config --link-static --libs failed: ${err}")
  endif()
  execute_process(
    COMMAND ${llvm_config} --link-static --system-libs
    OUTPUT_VARIABLE llvm_system_libs OUTPUT_STRIP_TRAILING_WHITESPACE)
  separate_arguments(llvm_libs UNIX_COMMAND "${llvm_libs}")
  separate_arguments(llvm_system_libs UNIX_COMMAND "${llvm_system_libs}")

  # The archives reference each other in both directions; a group lets the
  # linker resolve that without a hand-ordered list. Only referenced objects
  # are pulled in, so the group costs link time, not size.
  target_link_libraries(${target} PRIVATE
    -L${LLVM_LIBRARY_DIR}
    -Wl,--start-group ${own} ${archives} ${llvm_libs} -Wl,--end-group
    ${llvm_system_libs}
    -static-libstdc++ -static-libgcc -Wl,--gc-sections)
endfunction()

# LLVM components the static tools need (NVPTX for the in-process PTX
# emission).
set(MOK_STATIC_LLVM_COMPONENTS support demangle targetparser core binaryformat
    remarks bitstreamreader nvptx passes irreader linker bitwriter bitreader
    asmparser target mc object transformutils analysis codegen)
