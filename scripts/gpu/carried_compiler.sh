# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#
# Sourced by the GPU machine's scripts from the repository root: when
# carry-tools/mok-compile-static (or its .xz) was carried, unpacks it to
# /tmp and exports MOK_COMPILER, so that what the carried layer folders
# lack compiles there (the FP8 weights' quantizer of the -fp8w shapes,
# compiled at their first mok.ops.fp8_quantize call; the test layers).
# Without it those calls fail naming the missing compiler.
_mok_tool=carry-tools/mok-compile-static
if [[ -f $_mok_tool.xz || -f $_mok_tool ]]; then
  export MOK_COMPILER=/tmp/mok-compile-static
  if [[ -f $_mok_tool.xz ]]; then xz -dc "$_mok_tool.xz" > "$MOK_COMPILER"
  else cp "$_mok_tool" "$MOK_COMPILER"; fi
  chmod +x "$MOK_COMPILER"
fi
unset _mok_tool
