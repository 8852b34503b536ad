#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Writes the PTX held by each gpu.binary of a module printed by mok-opt
(after --moe-to-ptx) to <out-dir>/<binary name>.ptx, and prints the paths.

    mok-opt layer.mlir --moe-to-ptx=chip=sm_90a | scripts/extract-ptx.py out/
"""
import os
import re
import sys

# gpu.binary @name [#gpu.object<#nvvm.target<...>, "...escaped PTX...">]
BINARY = re.compile(r'gpu\.binary @(\w+)\s*\[#gpu\.object<#nvvm\.target<[^>]*>,\s*(?:properties = \{[^}]*\},\s*)?(?:assembly = )?"((?:[^"\\]|\\.)*)"')


def unescape(s):
    """MLIR string escapes: \\XX hex bytes, \\n, \\t, \\\\ and \\"."""
    out, i = bytearray(), 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            nxt = s[i + 1]
            if nxt in "\\\"":
                out += nxt.encode()
                i += 2
                continue
            if nxt == "n":
                out += b"\n"
                i += 2
                continue
            if nxt == "t":
                out += b"\t"
                i += 2
                continue
            out.append(int(s[i + 1:i + 3], 16))
            i += 3
            continue
        out += c.encode()
        i += 1
    return out.decode()


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    text = sys.stdin.read()
    found = BINARY.findall(text)
    if not found:
        print("extract-ptx: no gpu.binary with PTX in the input", file=sys.stderr)
        return 1
    for name, escaped in found:
        path = os.path.join(out_dir, f"{name}.ptx")
        with open(path, "w") as f:
            f.write(unescape(escaped))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
