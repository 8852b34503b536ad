#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Mutation fuzzing of mok's front ends: malformed IR and options must give
diagnostics, never a crash.

Mutates the IR of seed .mlir files (token deletions, duplications, swaps,
tokens from other seeds, truncation; numbers, shapes, ranks, element types,
operands and whole lines changed) and runs every mutant through

- mok-opt, with the pipelines of its seed file's own RUN lines plus a few
  generic ones, sometimes with a mutated pass option; mutants are packed into
  --split-input-file batches (one process for hundreds of inputs);
- mok-compile (with --mok-compile), for a share of the mutants of MoE
  layers: compiled to PTX for sm_90a or sm_100a with options drawn from the
  seeds' mok-compile RUN lines and from mok-compile's flags (valid or not).

A run fails when the tool dies by a signal, LLVM reports a fatal error or an
assertion, a sanitizer reports (ASan "ERROR: AddressSanitizer", LSan, UBSan
"runtime error:"), or one input takes longer than --hang-timeout (a hang).
The failing mutant is isolated by bisecting its batch, written to --out-dir
with the tool's report, and printed, so it can become a regression test.

    scripts/fuzz-mok-opt.py --mok-opt build/bin/mok-opt \\
        --mok-compile build/bin/mok-compile --count 2000
    scripts/fuzz.sh            # the sanitizer build, for a duration

The seeds default to every .mlir file under examples/ and test/.
"""
import argparse
import concurrent.futures
import hashlib
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A shape (`?x32xbf16`, one token) before a hexadecimal number or a number.
TOKEN = re.compile(r"->|(?:\d+|\?)(?:x(?:\d+|\?))*x[A-Za-z_]\w*"
                   r"|0x[0-9A-Fa-f]+|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
                   r"|[%!#^@]?[\w.$]+|\S")
COMMENT = re.compile(r"//[^\n]*")
SPLIT = "// -----"
NUMBERS = ["0", "-1", "1", "2", "3", "7", "8", "96", "128", "1024", "65536",
           "2147483647", "-2147483648", "4294967296", "-9223372036854775808",
           "9223372036854775807", "99999999999999999999", "?", "0.0", "-0.0",
           "1.0e308", "0x7FC00000", "0x7F800000", "0xFFFFFFFF"]
SCALARS = ["bf16", "f16", "f32", "f64", "i8", "i32", "i64", "i1", "index"]
TYPES = ["bf16", "f16", "f32", "f64", "i8", "i32", "i64", "i1", "index",
         "tensor<?xbf16>", "tensor<*xbf16>", "tensor<4x?x?xbf16>",
         "tensor<0x0xbf16>", "!moe.plan<tokens = 1, top_k = 1, experts = 1, "
         "ep = 1, padding = 1>", "memref<4xbf16>", "none", "complex<f32>",
         "vector<4xbf16>"]
OPTION_VALUES = ["true", "false", "0", "1", "-1", "7", "128", "4294967295",
                 "sm_90a", "sm_100a", "sm_80", "sm_90", "", "auto", "x"]
# mok-compile's flags, valid and not, for option mutation.
COMPILE_FLAGS = [["--profile"], ["--warp-specialize"], ["--multicast"],
                 ["--dispatch", "auto"], ["--dispatch", "fused"],
                 ["--dispatch", "copy"], ["--dispatch", "both"],
                 ["--fuse-dispatch"], ["--copy-dispatch"],
                 ["--no-tensor-cores"], ["--training"], ["--recompute"],
                 ["--main-grads"], ["--chip", "sm_80"], ["--chip", ""],
                 ["--stages-dir", "{stages}"], ["--bogus"], ["--dispatch"]]
GENERIC_PIPELINES = [
    ["--moe-fuse-layer"],
    ["--canonicalize", "--moe-fuse-layer=remarks=true"],
    ["--mlir-print-op-generic"],
    ["--moe-generate-backward", "--moe-to-cpu"],
    ["--convert-moe-to-mk=chip=sm_90a", "--convert-mk-to-gpu"],
    ["--convert-moe-to-mk=chip=sm_100a", "--convert-mk-to-gpu"],
    ["--moe-to-ptx=chip=sm_90a"],
    ["--moe-to-ptx=chip=sm_100a"],
]
FATAL = ("Stack dump", "LLVM ERROR", "PLEASE submit a bug report",
         "UNREACHABLE executed")
ASSERTION = re.compile(r"Assertion `.*' failed")
SANITIZER = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|"
                       r": runtime error: ")
KINDS = {"crashes": "crash", "sanitizer reports": "sanitizer report",
         "fatal errors": "fatal error", "timeouts": "hang"}
# Inputs that crash MLIR's own parser in libMLIR 22 (not mok's code): such
# mutants are left out and counted. A dense array of `index` elements
# (llvm/llvm-project#179045, fixed after LLVM 22).
UPSTREAM = re.compile(r"array\s*<\s*index\b")


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


def _join(toks):
    return "".join(t + ws for t, ws in toks)


def _lines(toks, rng):
    """Deletes or duplicates one line (an op, an argument, a type alias)."""
    lines = _join(toks).split("\n")
    i = rng.randrange(len(lines))
    if rng.random() < 0.7:
        del lines[i]
    else:
        lines.insert(i, lines[rng.randrange(len(lines))])
    return tokenize("\n".join(lines))


def _pick(toks, pattern, rng):
    hits = [k for k, t in enumerate(toks) if re.fullmatch(pattern, t[0])]
    return rng.choice(hits) if hits else None


def _replace(toks, k, new, rng):
    """Token k becomes `new`; mostly every token equal to it does, so that
    the types stay consistent and the verifiers, not the parser, answer."""
    old, everywhere = toks[k][0], rng.random() < 0.7
    for i, t in enumerate(toks):
        if i == k or (everywhere and t[0] == old):
            t[0] = new


def mutate(text, rng, dictionary):
    """One to three mutations of `text`. Syntax-level ones (token deletions,
    duplications, swaps, foreign tokens, truncation) test the parsers;
    the rest keep the syntax and change the meaning (numbers, shapes,
    ranks, element types, operands, whole lines), to reach the verifiers
    and passes."""
    toks = tokenize(text)
    for _ in range(rng.choices([1, 2, 3], [6, 3, 1])[0]):
        if not toks:
            break
        i = rng.randrange(len(toks))
        kind = rng.choices(
            ["delete", "duplicate", "swap", "foreign", "truncate", "number",
             "type", "dim", "rank", "operand", "line"],
            [1, 1, 1, 1, 0.5, 2, 1.5, 2, 1, 1.5, 1.5])[0]
        if kind == "delete":
            del toks[i]
        elif kind == "duplicate":
            toks.insert(i, list(toks[rng.randrange(len(toks))]))
        elif kind == "swap":
            j = rng.randrange(len(toks))
            toks[i][0], toks[j][0] = toks[j][0], toks[i][0]
        elif kind == "foreign":
            # A token from any seed: op and attribute names of other tests.
            toks[i][0] = rng.choice(dictionary)
        elif kind == "truncate":
            toks = toks[: rng.randrange(len(toks) + 1)]
        elif kind == "number":
            k = _pick(toks, r"-?\d+", rng)
            if k is not None:
                toks[k][0] = rng.choice(NUMBERS)
        elif kind == "type":
            k = _pick(toks, r".*(bf16|f32|i32|i64)", rng)
            if k is not None:
                # In a shape, another element type; alone, any type.
                new = rng.choice(SCALARS if "x" in toks[k][0] else TYPES)
                _replace(toks, k, re.sub(r"(bf16|f32|i32|i64)$", new,
                                         toks[k][0]), rng)
        elif kind in ("dim", "rank"):
            # A shape such as 8192x2048xbf16: one dimension changed, or one
            # dropped or added.
            k = _pick(toks, r"(\?|\d+)(x(\?|\d+))*x\w+", rng)
            if k is not None:
                parts = toks[k][0].split("x")
                d = rng.randrange(len(parts) - 1)
                if kind == "dim":
                    parts[d] = rng.choice(["0", "1", "?", "3", "7", "65536",
                                           str(int(parts[d]) * 2)
                                           if parts[d].isdigit() else "2"])
                elif rng.random() < 0.5 and len(parts) > 2:
                    del parts[d]
                else:
                    parts.insert(d, rng.choice(["1", "2", "8", "?"]))
                _replace(toks, k, "x".join(parts), rng)
        elif kind == "operand":
            # Another SSA value of the same input in place of one.
            k = _pick(toks, r"%[\w.$]+", rng)
            j = _pick(toks, r"%[\w.$]+", rng)
            if k is not None:
                toks[k][0] = toks[j][0]
        else:
            toks = _lines(toks, rng)
    return _join(toks).replace(SPLIT, "")


def run_lines(text):
    """The RUN commands of a lit file, continuation lines joined."""
    lines, cur = [], ""
    for m in re.finditer(r"//\s*RUN:(.*)", text):
        part = m.group(1).rstrip()
        if part.endswith("\\"):
            cur += part[:-1] + " "
            continue
        lines.append(cur + part)
        cur = ""
    return lines


def tool_options(command, tool):
    """The options that `command` (one RUN line) passes to `tool`, without
    the file arguments, output redirections and the lit-only flags."""
    out = []
    for segment in command.split("|"):
        try:
            words = shlex.split(segment)
        except ValueError:
            continue
        words = [w for w in words if w != "not"]
        if not words or words[0] != tool:
            continue
        words = iter(words[1:])
        for w in words:
            if w in ("-o", "--stages-dir", "--toolkit"):
                next(words, None)
            elif w in ("--chip", "--dispatch"):
                v = next(words, "")
                out += [w] + ([v] if ">" not in v else [])
            elif w.startswith("-") and "%" not in w and w.lstrip("-") not in (
                    "split-input-file", "verify-diagnostics"):
                out.append(w)
        return tuple(out)
    return None


class Seeds:
    """The chunks of the seed files, each with the pipelines of its file."""

    def __init__(self, paths):
        self.chunks = []  # (text, mok-opt pipelines)
        self.compile_options = set()
        seen = set()
        files = []
        for p in paths:
            if os.path.isdir(p):
                for d, _, names in sorted(os.walk(p)):
                    files += [os.path.join(d, n) for n in sorted(names)
                              if n.endswith(".mlir")]
            else:
                files.append(p)
        tokens = set()
        for path in files:
            with open(path) as f:
                text = f.read()
            pipelines = set()
            for line in run_lines(text):
                opts = tool_options(line, "mok-opt")
                if opts:
                    pipelines.add(opts)
                opts = tool_options(line, "mok-compile")
                if opts is not None:
                    self.compile_options.add(opts)
            for chunk in text.split(SPLIT):
                body = COMMENT.sub("", chunk).strip()
                if not body or body in seen:
                    continue
                seen.add(body)
                self.chunks.append((chunk, sorted(pipelines)))
                tokens.update(t for t, _ in tokenize(chunk))
        self.dictionary = sorted(tokens)
        self.files = files
        # mok-compile compiles the functions of MoE layers.
        self.layers = [c for c, _ in self.chunks
                       if "func.func" in c and "moe." in c]
        self.compile_options = sorted(self.compile_options)


def classify(returncode, stderr):
    """The kind of failure in a finished run, or None."""
    if SANITIZER.search(stderr):
        return "sanitizer reports"
    if returncode < 0 or returncode >= 128:
        return "crashes"  # a signal: segfault, abort (a failed assertion)
    if any(f in stderr for f in FATAL) or ASSERTION.search(stderr):
        return "fatal errors"
    return None


def execute(argv, timeout):
    """(failure kind or None, report) of one tool process."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True,
                              errors="replace", timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "timeouts", f"no answer within {timeout:.0f} s"
    kind = classify(proc.returncode, proc.stderr)
    return kind, f"exit status {proc.returncode}\n{proc.stderr[-6000:]}"


class Fuzzer:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.failures = {k: 0 for k in KINDS}
        self.runs = 0
        self.compiles = 0
        self.signatures = {}
        self.tmp = tempfile.mkdtemp(prefix="mok-fuzz-")

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _file(self, text):
        fd, path = tempfile.mkstemp(suffix=".mlir", dir=self.tmp)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def _opt(self, mutants, pipeline, timeout):
        path = self._file(("\n" + SPLIT + "\n").join(mutants))
        try:
            return execute([self.args.mok_opt, path, "--split-input-file",
                            *pipeline], timeout)
        finally:
            os.unlink(path)

    def opt_batch(self, mutants, pipeline):
        """Runs mok-opt over one batch; on a failure, bisects the batch down
        to one mutant and records it."""
        a = self.args
        kind, why = self._opt(mutants, pipeline,
                              a.startup + a.timeout * len(mutants))
        with self.lock:
            self.runs += len(mutants)
        if kind is None:
            return
        while len(mutants) > 1:
            half = len(mutants) // 2
            for part in (mutants[:half], mutants[half:]):
                k, w = self._opt(part, pipeline,
                                 max(a.hang_timeout, a.timeout * len(part)))
                if k is not None:
                    mutants, kind, why = part, k, w
                    break
            else:
                break
        if len(mutants) > 1 and kind == "timeouts":
            # Slow as a batch (a loaded machine), no single input hangs.
            return
        if len(mutants) == 1 and kind == "timeouts":
            kind, why = self._opt(mutants, pipeline, a.hang_timeout)
            if kind is None:
                return
        args = ["mok-opt", "--split-input-file", *pipeline]
        self.record(kind, why, "\n// -----\n".join(mutants), args)

    def compile(self, mutant, options):
        path = self._file(mutant)
        out = tempfile.mkdtemp(dir=self.tmp)
        try:
            argv = [o.replace("{stages}", os.path.join(out, "stages"))
                    for o in options]
            kind, why = execute([self.args.mok_compile, path, *argv,
                                 "-o", out], self.args.hang_timeout)
        finally:
            os.unlink(path)
            shutil.rmtree(out, ignore_errors=True)
        with self.lock:
            self.runs += 1
            self.compiles += 1
        if kind is not None:
            self.record(kind, why, mutant, ["mok-compile", *options])

    def record(self, kind, why, text, argv):
        # One entry per distinct report: its first error line and top frame
        # inside mok (addresses and line numbers removed).
        head = next((l for l in why.splitlines()
                     if SANITIZER.search(l) or "ERROR" in l or "Assertion" in l
                     or "no answer" in l), why.splitlines()[-1] if why else "")
        frame = next((l for l in why.splitlines()
                      if re.match(r"\s*#\d+ ", l) and ROOT in l), "")
        sig = re.sub(r"0x[0-9a-f]+|:\d+", "", head + frame)
        with self.lock:
            self.failures[kind] += 1
            n = self.signatures.setdefault(sig, 0)
            self.signatures[sig] = n + 1
        print(f"fuzz: {KINDS[kind]}: {' '.join(argv)}\n{why}\n"
              f"fuzz: offending input:\n{text}\n", file=sys.stderr, flush=True)
        if self.args.out_dir and n < 3:
            os.makedirs(self.args.out_dir, exist_ok=True)
            name = hashlib.sha1(text.encode()).hexdigest()[:12]
            base = os.path.join(self.args.out_dir, name)
            with open(base + ".mlir", "w") as f:
                f.write(f"// {' '.join(argv)}\n{text}\n")
            with open(base + ".txt", "w") as f:
                f.write(f"{kind}: {' '.join(argv)}\n{why}\n")

    def failed(self):
        return sum(self.failures.values())


def mutate_pipeline(pipeline, rng):
    """The pipeline with one pass option given another value."""
    pipeline = list(pipeline)
    slots = [(i, m) for i, p in enumerate(pipeline)
             for m in re.finditer(r"([\w-]+)=([\w.-]*)", p)]
    if not slots:
        return pipeline
    i, m = rng.choice(slots)
    p = pipeline[i]
    pipeline[i] = p[:m.start(2)] + rng.choice(OPTION_VALUES) + p[m.end(2):]
    return pipeline


def compile_options(seeds, rng):
    """mok-compile's options: a seed's RUN line's, or a random mix."""
    if seeds.compile_options and rng.random() < 0.5:
        opts = list(rng.choice(seeds.compile_options))
    else:
        opts = []
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            opts += rng.choice(COMPILE_FLAGS)
    if "--chip" not in opts:
        opts += ["--chip", rng.choice(["sm_90a", "sm_100a"])]
    return opts


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--mok-opt", required=True)
    ap.add_argument("--mok-compile",
                    help="also fuzz this mok-compile (a share of the mutants)")
    ap.add_argument("--count", type=int, default=1000,
                    help="mutants to run through mok-opt (0: no limit)")
    ap.add_argument("--duration", type=float, default=0,
                    help="stop after this many seconds (0: no limit)")
    ap.add_argument("--compile-share", type=float, default=0.01,
                    help="fraction of the mutants of layers that mok-compile "
                         "also compiles")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=500,
                    help="mutants per mok-opt process")
    ap.add_argument("--round", type=int, default=2000,
                    help="mutants made at a time, then grouped by pipeline")
    ap.add_argument("--timeout", type=float, default=0.1,
                    help="seconds per mutant a batch may take before it is "
                         "bisected")
    ap.add_argument("--startup", type=float, default=5.0,
                    help="seconds a batch may take on top of --timeout's")
    ap.add_argument("--hang-timeout", type=float, default=60.0,
                    help="seconds one input may take before it counts as a "
                         "hang")
    ap.add_argument("--jobs", "-j", type=int, default=1,
                    help="tool processes at a time")
    ap.add_argument("--keep-going", action="store_true",
                    help="record every failure and go on (default: stop at "
                         "the first)")
    ap.add_argument("--out-dir", help="write each failing input here")
    ap.add_argument("seeds", nargs="*",
                    help="seed .mlir files or folders (default: examples/ "
                         "and test/ of this checkout)")
    args = ap.parse_args()
    if args.count <= 0 and args.duration <= 0:
        ap.error("give --count or --duration (or both)")
    for tool in filter(None, (args.mok_opt, args.mok_compile)):
        if not shutil.which(tool):
            ap.error(f"no such tool: {tool}")
    # Sanitizer reports with function names and lines (LLVM 22's symbolizer
    # is not on PATH under its plain name); the sanitized tools bring their
    # other options (tools/SanitizerOptions.cpp).
    symbolizer = "/usr/lib/llvm-22/bin/llvm-symbolizer"
    if os.path.exists(symbolizer):
        os.environ.setdefault("ASAN_SYMBOLIZER_PATH", symbolizer)

    seeds = Seeds(args.seeds or [os.path.join(ROOT, "examples"),
                                 os.path.join(ROOT, "test")])
    if not seeds.chunks:
        ap.error("the seeds hold no IR")
    rng = random.Random(args.seed)
    fuzzer = Fuzzer(args)
    start = time.monotonic()
    mutants = skipped = 0
    pool = concurrent.futures.ThreadPoolExecutor(max(1, args.jobs))

    def out_of_time():
        return args.duration > 0 and time.monotonic() - start > args.duration

    try:
        while not out_of_time() and (args.count <= 0 or mutants < args.count):
            n = args.round if args.count <= 0 else min(args.round,
                                                       args.count - mutants)
            # Group the round's mutants by pipeline: each is run with its
            # seed file's pipelines and two generic ones.
            groups, layers, made = {}, [], 0
            while made < n:
                chunk, own = rng.choice(seeds.chunks)
                text = mutate(chunk, rng, seeds.dictionary)
                if UPSTREAM.search(text):
                    skipped += 1
                    continue
                made += 1
                for p in own + rng.sample(GENERIC_PIPELINES, 2):
                    groups.setdefault(tuple(p), []).append(text)
                if (args.mok_compile and "func.func" in chunk and "moe." in chunk
                        and rng.random() < args.compile_share):
                    layers.append(text)
            mutants += n
            tasks = []
            for p, group in sorted(groups.items()):
                if rng.random() < 0.1:
                    p = tuple(mutate_pipeline(p, rng))
                for i in range(0, len(group), args.batch):
                    tasks.append(pool.submit(fuzzer.opt_batch,
                                             group[i:i + args.batch], list(p)))
            for text in layers:
                tasks.append(pool.submit(fuzzer.compile, text,
                                         compile_options(seeds, rng)))
            for t in tasks:
                t.result()
            if fuzzer.failed() and not args.keep_going:
                break
            if args.duration > 0 or args.count > 10 * args.round:
                print(f"fuzz: {mutants} mutants, {fuzzer.runs} runs "
                      f"({fuzzer.compiles} by mok-compile), "
                      f"{fuzzer.failed()} failures, "
                      f"{time.monotonic() - start:.0f} s", file=sys.stderr,
                      flush=True)
    finally:
        pool.shutdown()
        fuzzer.close()
    took = time.monotonic() - start
    totals = ", ".join(f"{fuzzer.failures[k]} {k}" for k in KINDS)
    print(f"fuzz: {mutants} mutants from {len(seeds.chunks)} seed inputs of "
          f"{len(seeds.files)} files, {fuzzer.runs} runs ({fuzzer.compiles} "
          f"by mok-compile) in {took:.0f} s: {totals}; {skipped} mutants "
          "left out for a known MLIR parser defect")
    return 1 if fuzzer.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
