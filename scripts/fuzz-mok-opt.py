#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Mutation fuzzing of mok-opt: malformed IR must give diagnostics, never a crash.

Mutates seed .mlir files (token deletions, duplications, swaps, number and
type replacements, truncation), packs them into --split-input-file batches
(one process for a thousand inputs), and fails if mok-opt dies by a signal,
LLVM reports a fatal error, or a batch takes too long (a hang). The crashing mutant is then isolated and
printed, so it can become a regression test.

    scripts/fuzz-mok-opt.py --mok-opt build/bin/mok-opt --count 2000 examples/*.mlir
"""
import argparse
import random
import re
import subprocess
import sys
import tempfile

TOKEN = re.compile(r"->|0x[0-9A-Fa-f]+|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
                   r"|[%!#^@]?[\w.$]+|\S")
COMMENT = re.compile(r"//[^\n]*")
NUMBERS = ["0", "-1", "1", "3", "7", "96", "1024", "-9223372036854775808",
           "9223372036854775807", "99999999999999999999", "?", "0.0", "-0.0",
           "0x7FC00000", "0x7F800000"]
TYPES = ["bf16", "f16", "f32", "i32", "i64", "i1", "index", "tensor<?xbf16>",
         "tensor<*xbf16>", "tensor<4x?x?xbf16>", "!moe.plan<tokens = 1, top_k = 1, "
         "experts = 1, ep = 1, padding = 1>", "memref<4xbf16>", "none"]
FATAL = ("Stack dump", "LLVM ERROR", "PLEASE submit a bug report",
         "Assertion", "UNREACHABLE")


def tokenize(text):
    """Tokens with the whitespace that follows each, so unmutated text keeps
    its exact spelling (`->`, `8192x2048xbf16` must survive)."""
    text = COMMENT.sub("", text)
    out, pos = [], 0
    for m in TOKEN.finditer(text):
        if out:
            out[-1][1] = text[pos:m.start()]
        out.append([m.group(), ""])
        pos = m.end()
    return out


def mutate(text, rng):
    toks = tokenize(text)
    for _ in range(rng.randint(1, 3)):
        if not toks:
            break
        i = rng.randrange(len(toks))
        kind = rng.randrange(7)
        if kind == 0:
            del toks[i]
        elif kind == 1:
            toks.insert(i, list(toks[rng.randrange(len(toks))]))
        elif kind == 2:
            j = rng.randrange(len(toks))
            toks[i][0], toks[j][0] = toks[j][0], toks[i][0]
        elif kind == 3:
            nums = [k for k, t in enumerate(toks) if re.fullmatch(r"-?\d+", t[0])]
            if nums:
                toks[rng.choice(nums)][0] = rng.choice(NUMBERS)
        elif kind == 4:
            tys = [k for k, t in enumerate(toks)
                   if re.search(r"(bf16|f32|i32|i64)$", t[0])]
            if tys:
                k = rng.choice(tys)
                toks[k][0] = re.sub(r"(bf16|f32|i32|i64)$", rng.choice(TYPES),
                                    toks[k][0])
        elif kind == 5:
            # One dimension inside a shape such as 8192x2048xbf16.
            shapes = [k for k, t in enumerate(toks)
                      if re.fullmatch(r"(\?|\d+)(x(\?|\d+))*x\w+", t[0])]
            if shapes:
                k = rng.choice(shapes)
                dims = re.findall(r"\?|\d+", toks[k][0])
                d = rng.choice(dims)
                toks[k][0] = toks[k][0].replace(
                    d, rng.choice(["0", "1", "?", "3", "65536"]), 1)
        else:
            toks = toks[: rng.randrange(len(toks) + 1)]
    return "".join(t + ws for t, ws in toks)


def run(tool, path, extra, timeout):
    """True when mok-opt crashed or hung on the file."""
    try:
        proc = subprocess.run([tool, path, "--split-input-file", *extra],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True, f"no answer within {timeout} s"
    crashed = proc.returncode < 0 or proc.returncode >= 128 or any(
        f in proc.stderr for f in FATAL)
    return crashed, proc.stderr[-4000:]


def check(tool, mutants, extra, timeout):
    """None if mok-opt survives every mutant, else the offending mutant."""
    with tempfile.NamedTemporaryFile("w", suffix=".mlir") as f:
        f.write("\n// -----\n".join(mutants))
        f.flush()
        bad, why = run(tool, f.name, extra, timeout * len(mutants))
    if not bad:
        return None
    print(f"fuzz: mok-opt failed on a batch ({' '.join(extra)}): {why}\n"
          "fuzz: isolating the mutant", file=sys.stderr)
    for m in mutants:
        with tempfile.NamedTemporaryFile("w", suffix=".mlir") as one:
            one.write(m)
            one.flush()
            bad, why = run(tool, one.name, extra, max(10.0, timeout * 100))
            if bad:
                print(f"fuzz: {why}", file=sys.stderr)
                return m
    return "(the batch failed, no single mutant does)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mok-opt", required=True)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=1000,
                    help="mutants per mok-opt process")
    ap.add_argument("--timeout", type=float, default=0.1,
                    help="seconds allowed per mutant before it counts as a hang")
    ap.add_argument("seeds", nargs="+")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sources = []
    for path in args.seeds:
        with open(path) as f:
            # Seed files may themselves be split; mutate one chunk at a time.
            sources += [c for c in f.read().split("// -----") if c.strip()]
    mutants = [mutate(rng.choice(sources), rng).replace("// -----", "")
               for _ in range(args.count)]
    pipelines = [["--moe-fuse-layer"],
                 ["--canonicalize", "--moe-fuse-layer=remarks=true"],
                 ["--mlir-print-op-generic"],
                 ["--moe-generate-backward", "--moe-to-cpu"]]
    for start in range(0, len(mutants), args.batch):
        batch = mutants[start:start + args.batch]
        for extra in pipelines:
            bad = check(args.mok_opt, batch, extra, args.timeout)
            if bad is not None:
                print("fuzz: offending input:\n" + bad, file=sys.stderr)
                return 1
    print(f"fuzz: {len(mutants)} mutants x {len(pipelines)} pipelines, no crash")
    return 0


if __name__ == "__main__":
    sys.exit(main())
