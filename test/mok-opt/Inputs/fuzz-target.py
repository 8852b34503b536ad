#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A stand-in for mok-opt and mok-compile that fails the way a broken tool
would, so that test/mok-opt/fuzz.mlir can show the fuzzer catches each kind
of failure: a marker in the input picks the failure."""
import os
import signal
import sys
import time

text = open(sys.argv[1]).read()
compiling = "--chip" in sys.argv  # called as mok-compile
if "crash.me" in text:
    os.kill(os.getpid(), signal.SIGSEGV)
if "asan.me" in text:
    sys.exit("==1==ERROR: AddressSanitizer: heap-use-after-free on address 0x1")
if "ubsan.me" in text:
    sys.exit("lib/Dialect/X.cpp:1:2: runtime error: signed integer overflow")
if "fatal.me" in text:
    sys.exit("LLVM ERROR: a fatal error")
if "hang.me" in text:
    time.sleep(60)
if "compile.me" in text and compiling:
    os.kill(os.getpid(), signal.SIGABRT)
sys.exit(f"{sys.argv[1]}:1:1: error: a diagnostic")
