# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# The parts of the `mok` package that need no MLIR, shared by the main build
# (python/CMakeLists.txt) and the standalone build for GPU machines
# (python/runtime-ext/CMakeLists.txt): Python and nanobind, the runtime
# extension `mok._runtime` over the `mok_runtime` target (which must exist),
# and the pure-Python sources. The package is assembled in
# ${CMAKE_BINARY_DIR}/python/mok; put ${CMAKE_BINARY_DIR}/python on
# PYTHONPATH. Defines MOK_PYTHON_PACKAGE_DIR and MOK_PY_OUTPUTS (the copied
# sources, for a target to depend on).
find_package(Python 3.9 COMPONENTS Interpreter Development.Module REQUIRED)
execute_process(
  COMMAND ${Python_EXECUTABLE} -m nanobind --cmake_dir
  OUTPUT_VARIABLE MOK_NANOBIND_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nanobind is not installed for ${Python_EXECUTABLE}; "
                      "run scripts/setup.sh (pip install nanobind)")
endif()
find_package(nanobind CONFIG REQUIRED PATHS ${MOK_NANOBIND_DIR} NO_DEFAULT_PATH)

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
