// Mutated versions of every .mlir file under examples/ and test/: mok-opt
// (each mutant with its file's RUN pipelines and two generic ones) and
// mok-compile (a share of the mutated layers, with mutated options) must
// answer every one with output or diagnostics, never a crash. A fixed seed
// keeps the test repeatable; scripts/fuzz.sh runs the sanitizer build for
// longer (docs/Reliability.md).
// RUN: %python %mok_src_root/scripts/fuzz-mok-opt.py --mok-opt mok-opt --mok-compile mok-compile --count 2000 --compile-share 0.02 --seed 1 --timeout 1 %mok_src_root/examples %mok_src_root/test | FileCheck %s
// CHECK: fuzz: 2000 mutants from {{[0-9]+}} seed inputs of {{[0-9]+}} files, {{[0-9]+}} runs ({{[1-9][0-9]*}} by mok-compile) in {{[0-9]+}} s: 0 crashes, 0 sanitizer reports, 0 fatal errors, 0 timeouts

// The fuzzer catches each kind of failure (Inputs/fuzz-target.py fails as a
// marker in its input says), isolates the mutant and exits non-zero.
// RUN: rm -rf %t && mkdir -p %t
// RUN: echo '"crash.me"() : () -> ()' > %t/crash.mlir
// RUN: echo '"asan.me"() : () -> ()' > %t/asan.mlir
// RUN: echo '"ubsan.me"() : () -> ()' > %t/ubsan.mlir
// RUN: echo '"fatal.me"() : () -> ()' > %t/fatal.mlir
// RUN: echo '"hang.me"() : () -> ()' > %t/hang.mlir
// RUN: echo 'func.func @f() { "moe.compile.me"() : () -> () }' > %t/compile.mlir
// RUN: not %python %mok_src_root/scripts/fuzz-mok-opt.py --mok-opt %S/Inputs/fuzz-target.py --count 20 %t/crash.mlir 2>&1 | FileCheck %s --check-prefix=CRASH
// RUN: not %python %mok_src_root/scripts/fuzz-mok-opt.py --mok-opt %S/Inputs/fuzz-target.py --count 20 %t/asan.mlir 2>&1 | FileCheck %s --check-prefix=ASAN
// RUN: not %python %mok_src_root/scripts/fuzz-mok-opt.py --mok-opt %S/Inputs/fuzz-target.py --count 20 %t/ubsan.mlir 2>&1 | FileCheck %s --check-prefix=UBSAN
// RUN: not %python %mok_src_root/scripts/fuzz-mok-opt.py --mok-opt %S/Inputs/fuzz-target.py --count 20 %t/fatal.mlir 2>&1 | FileCheck %s --check-prefix=FATAL
// RUN: not %python %mok_src_root/scripts/fuzz-mok-opt.py --mok-opt %S/Inputs/fuzz-target.py --count 1 --round 1 --startup 0 --timeout 0.5 --hang-timeout 1 %t/hang.mlir 2>&1 | FileCheck %s --check-prefix=HANG
// RUN: not %python %mok_src_root/scripts/fuzz-mok-opt.py --mok-opt %S/Inputs/fuzz-target.py --mok-compile %S/Inputs/fuzz-target.py --compile-share 1 --count 20 %t/compile.mlir 2>&1 | FileCheck %s --check-prefix=COMPILE
// CRASH: fuzz: crash: mok-opt --split-input-file
// CRASH: exit status -11
// CRASH: fuzz: offending input:
// CRASH-NEXT: crash.me
// CRASH-NOT: // -----
// CRASH: fuzz: 20 mutants {{.*}}: {{[1-9][0-9]*}} crashes, 0 sanitizer reports, 0 fatal errors, 0 timeouts
// ASAN: fuzz: sanitizer report: mok-opt
// ASAN: ERROR: AddressSanitizer: heap-use-after-free
// ASAN: {{[1-9][0-9]*}} sanitizer reports
// UBSAN: fuzz: sanitizer report: mok-opt
// UBSAN: runtime error: signed integer overflow
// UBSAN: {{[1-9][0-9]*}} sanitizer reports
// FATAL: fuzz: fatal error: mok-opt
// FATAL: LLVM ERROR: a fatal error
// FATAL: {{[1-9][0-9]*}} fatal errors
// HANG: fuzz: hang: mok-opt
// HANG: no answer within 1 s
// HANG: {{[1-9][0-9]*}} timeouts
// COMPILE: fuzz: crash: mok-compile {{.*}}--chip
// COMPILE: exit status -6
// COMPILE: fuzz: offending input:
// COMPILE-NEXT: moe.compile.me
