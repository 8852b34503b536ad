# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# The parts of the `mok` package that need no MLIR, shared by the main build
# (python/CMakeLists.txt) and the standalone build for GPU machines
# (python/runtime-ext/CMakeLists.txt): Python and nanobind, the runtime
# extension `mok._runtime` over the `mok_runtime` target (which must exist),
# and the pure-Python sources. The package is assembled in
# ${CMAKE_BINARY_DIR}/python/mok; put ${CMAKE_BINARY_DIR}/python on
# PYTHONPATH. Defines MOK_PYTHON_PACKAGE_DIR, MOK_PY_OUTPUTS (the copied
# sources, for a target to depend on) and MOK_INSTALL_PYTHONDIR (where
# `cmake --install` puts the package, for the other extension's rule).
find_package(Python 3.9 COMPONENTS Interpreter Development.Module REQUIRED)
execute_process(
  COMMAND ${Python_EXECUTABLE} -m nanobind --cmake_dir
  OUTPUT_VARIABLE MOK_NANOBIND_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nanobind is not installed for ${Python_EXECUTABLE}; "
                      "run scripts/setup.sh (pip install nanobind)")
endif()
# nanobind's sources compile into the extensions (NB_STATIC). pip builds in a
# throwaway environment, a new temporary path each time: compiled from there,
# every pip install would rebuild them, and ccache (which keys on paths) would
# miss. Compile them from a copy in the build folder instead, whose files
# change only when nanobind's do.
get_filename_component(MOK_NANOBIND_SOURCE ${MOK_NANOBIND_DIR} DIRECTORY)
set(MOK_NANOBIND_COPY ${CMAKE_BINARY_DIR}/nanobind)
file(GLOB_RECURSE MOK_NANOBIND_FILES RELATIVE ${MOK_NANOBIND_SOURCE}
     ${MOK_NANOBIND_SOURCE}/cmake/* ${MOK_NANOBIND_SOURCE}/include/*
     ${MOK_NANOBIND_SOURCE}/src/* ${MOK_NANOBIND_SOURCE}/ext/*)
set(MOK_NANOBIND_DIRS)
foreach(f IN LISTS MOK_NANOBIND_FILES)
  get_filename_component(dir ${f} DIRECTORY)
  list(APPEND MOK_NANOBIND_DIRS ${dir})
  string(MAKE_C_IDENTIFIER "${dir}" key)
  list(APPEND MOK_NANOBIND_IN_${key} ${MOK_NANOBIND_SOURCE}/${f})
endforeach()
list(REMOVE_DUPLICATES MOK_NANOBIND_DIRS)
foreach(dir IN LISTS MOK_NANOBIND_DIRS)  # copy_if_different: one call a folder
  string(MAKE_C_IDENTIFIER "${dir}" key)
  file(MAKE_DIRECTORY ${MOK_NANOBIND_COPY}/${dir})
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E copy_if_different ${MOK_NANOBIND_IN_${key}}
            ${MOK_NANOBIND_COPY}/${dir}
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "copying nanobind's ${dir} into ${MOK_NANOBIND_COPY} failed")
  endif()
endforeach()
unset(nanobind_DIR CACHE)  # a build folder configured before may name another
find_package(nanobind CONFIG REQUIRED PATHS ${MOK_NANOBIND_COPY}/cmake
             NO_DEFAULT_PATH)

set(MOK_PYTHON_PACKAGE_DIR ${CMAKE_BINARY_DIR}/python/mok)

# mok._runtime links libmok_runtime.so, found next to the package through a
# relative RPATH (the build tree's lib/, where the runtime target puts it).
nanobind_add_module(_runtime NB_STATIC
  ${CMAKE_CURRENT_LIST_DIR}/RuntimeExtension.cpp)
target_link_libraries(_runtime PRIVATE mok_runtime)
get_target_property(MOK_RUNTIME_LIBRARY_DIR mok_runtime LIBRARY_OUTPUT_DIRECTORY)
file(RELATIVE_PATH MOK_RUNTIME_RPATH ${MOK_PYTHON_PACKAGE_DIR}
     ${MOK_RUNTIME_LIBRARY_DIR})
set_target_properties(_runtime PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY ${MOK_PYTHON_PACKAGE_DIR}
  BUILD_RPATH "$ORIGIN/${MOK_RUNTIME_RPATH}")

file(GLOB MOK_PY_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/mok/*.py)
set(MOK_PY_OUTPUTS)
foreach(src IN LISTS MOK_PY_SOURCES)
  get_filename_component(name ${src} NAME)
  add_custom_command(OUTPUT ${MOK_PYTHON_PACKAGE_DIR}/${name}
    COMMAND ${CMAKE_COMMAND} -E copy ${src} ${MOK_PYTHON_PACKAGE_DIR}/${name}
    DEPENDS ${src})
  list(APPEND MOK_PY_OUTPUTS ${MOK_PYTHON_PACKAGE_DIR}/${name})
endforeach()

# Installed (pip install, or cmake --install): the package folder holds both
# extensions and libmok_runtime.so, which mok._runtime finds beside itself.
# Under pip (scikit-build-core) the folder goes to the wheel's root and the
# Python sources come from pyproject.toml's wheel.packages; a plain install
# puts all of it in <prefix>/lib/pythonX.Y/site-packages.
if(SKBUILD)
  set(MOK_INSTALL_PYTHONDIR ${SKBUILD_PLATLIB_DIR})
else()
  set(MOK_INSTALL_PYTHONDIR
      lib/python${Python_VERSION_MAJOR}.${Python_VERSION_MINOR}/site-packages
      CACHE STRING "Where cmake --install puts the mok package, under the prefix")
  install(FILES ${MOK_PY_SOURCES} DESTINATION ${MOK_INSTALL_PYTHONDIR}/mok)
endif()
set_target_properties(_runtime PROPERTIES INSTALL_RPATH "$ORIGIN")
install(TARGETS _runtime mok_runtime
        LIBRARY DESTINATION ${MOK_INSTALL_PYTHONDIR}/mok)
