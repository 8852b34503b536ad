# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# The package's version, and its one source: pyproject.toml reads it for the
# wheel, CMake for the build, and the GPU compile cache keys on it.
__version__ = "0.3.0"
