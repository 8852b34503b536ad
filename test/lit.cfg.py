# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# -*- Python -*-
import os
import shutil

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "mok"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "CMakeLists.txt", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.mok_obj_root, "test")

config.substitutions.append(("%mok_src_root", config.mok_src_root))
config.substitutions.append(("%mok_tools_dir", config.mok_tools_dir))
config.substitutions.append(("%PATH%", config.environment["PATH"]))

llvm_config.with_system_environment(["HOME", "INCLUDE", "LIB", "TMP", "TEMP"])
llvm_config.use_default_substitutions()

# FileCheck, not, count come from LLVM 22's tools directory (there is no
# unversioned FileCheck on PATH on Debian).
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
tool_dirs = [config.mok_tools_dir, config.llvm_tools_dir]
tools = [ToolSubst("mok-opt", unresolved="fatal"),
         ToolSubst("mok-compile", unresolved="fatal")]

# Features: what the machine offers, so tests can say what they need.
if config.mok_build_static_tools in ("ON", "1", "TRUE", "YES"):
    config.available_features.add("static-tools")
    tools.append(ToolSubst("mok-opt-static", unresolved="fatal"))
# Debian's mlir-runner executes the CPU-lowered IR (test/Integration/CPU).
mlir_runner = os.path.join(config.llvm_tools_dir, "mlir-runner")
mlir_lib_dir = os.path.join(os.path.dirname(config.llvm_tools_dir), "lib")
if os.path.exists(mlir_runner) and os.path.exists(
        os.path.join(mlir_lib_dir, "libmlir_c_runner_utils.so")):
    config.available_features.add("mlir-runner")
    tools.append(ToolSubst("mlir-runner", unresolved="ignore"))
    config.substitutions.append(("%mlir_lib_dir", mlir_lib_dir))
ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
if os.path.exists(ptxas):
    config.available_features.add("ptxas")
    config.substitutions.append(("ptxas ", f"{ptxas} "))
# cuobjdump (with nvdisasm beside it): on PATH, in the CUDA toolkit, or the
# wheels scripts/setup.sh puts into <build>/tools.
for cuobjdump in (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump",
                  os.path.join(config.mok_obj_root, "tools", "nvidia", "cu13", "bin",
                               "cuobjdump")):
    if cuobjdump and os.path.exists(cuobjdump) and os.path.exists(
            os.path.join(os.path.dirname(cuobjdump), "nvdisasm")):
        config.available_features.add("cuobjdump")
        config.substitutions.append(("cuobjdump ", f"{cuobjdump} "))
        break
if shutil.which("nvidia-smi") and os.path.exists("/dev/nvidia0"):
    config.available_features.add("cuda-gpu")

llvm_config.add_tool_substitutions(tools, tool_dirs)
