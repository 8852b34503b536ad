// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mok-compile: compile the MoE layers of an .mlir file for a GPU and write,
// for each, <out>/<function>.ptx and <out>/<function>.json (the runtime's
// metadata); with --cubin also <out>/<function>.cubin, ptxas's machine code
// for the chip, and <out>/<function>.cubin.json (the chip and the PTX it was
// made from), which the runtime loads instead of compiling the PTX. Built
// fully static too (mok-compile-static), to carry to GPU machines that have
// no MLIR.
//
//   mok-compile layer.mlir --chip sm_90a -o out/ [--cubin]
//
#include "mok/Compiler/Compiler.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/SHA256.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

static int usage(const char *why) {
  std::fprintf(
      stderr,
      "mok-compile: %s\n"
      "usage: mok-compile INPUT.mlir [--chip sm_90a|sm_100a] -o OUTDIR\n"
      "       [--profile] [--warp-specialize] [--multicast]\n"
      "       [--dispatch auto|fused|copy | --fuse-dispatch | --copy-dispatch]\n"
      "       [--no-tensor-cores] [--training [--recompute] [--main-grads]]\n"
      "       [--toolkit CUDA_DIR] [--stages-dir DIR [--stages LIST]]\n"
      "       [--function NAME]... [--times] [--verify-each]\n"
      "       [--barrier-timeout-ms N] [--self-exchange] [--cubin]\n"
      "       [--fp8-quantized-weights]\n"
      "       (--toolkit: libdevice (and ptxas); default $CUDA_HOME or\n"
      "        /usr/local/cuda;\n"
      "        --fuse-dispatch, --copy-dispatch: --dispatch fused, copy;\n"
      "        --training: first derive <fn>_forward, which saves the\n"
      "        backward context, and <fn>_backward (moe-generate-backward);\n"
      "        --recompute: save no context, backward recomputes it;\n"
      "        --main-grads: backward adds the weights' gradients into fp32\n"
      "        main_grad outputs;\n"
      "        --fp8-quantized-weights: an FP8 layer's kernel takes the\n"
      "        routed weights quantized (gate_q, gate_scale, ...; as\n"
      "        mok.ops.fp8_quantize makes them) instead of the bf16 ones;\n"
      "        --stages-dir: also write the IR after each step, DIR/moe.mlir,\n"
      "        training.mlir, mk.mlir, gpu.mlir, llvm.mlir;\n"
      "        --stages: only these of them, comma-separated (gpu and llvm\n"
      "        are megabytes on large layers and slow to print);\n"
      "        --function: compile only this function's kernel, a layer's\n"
      "        or a quantizer's (moe.quantize of FP8 weights; repeatable;\n"
      "        with --training, <fn>_forward, <fn>_backward); default\n"
      "        every function's;\n"
      "        --times: print where the time went to stderr, a line a part:\n"
      "        parse, the steps, the PTX step's parts summed over kernels\n"
      "        (ptx.translate, ptx.link, ptx.optimize, ptx.codegen), print,\n"
      "        and with --cubin, cubin (the kernels' ptxas, side by side);\n"
      "        --verify-each: verify the IR after every pass, not once before\n"
      "        the PTX emission (slower; for finding a pass that breaks it);\n"
      "        --barrier-timeout-ms: debugging, bound every grid barrier's\n"
      "        wait; the runtime reports a barrier that timed out;\n"
      "        --cubin: also write <fn>.cubin, ptxas -arch=CHIP's machine code\n"
      "        (seconds a megakernel), and <fn>.cubin.json: the runtime then\n"
      "        loads the layer on that chip without the driver's JIT)\n",
      why);
  return 2;
}

static bool writeFile(const std::string &path, const std::string &text) {
  std::ofstream f(path);
  f << text;
  if (!f)
    std::fprintf(stderr, "mok-compile: cannot write '%s'\n", path.c_str());
  return static_cast<bool>(f);
}

static bool makeDirectory(const std::string &path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec)
    std::fprintf(stderr, "mok-compile: cannot create '%s': %s\n", path.c_str(),
                 ec.message().c_str());
  return !ec;
}

/// The ptxas of `toolkit`, else $CUDA_HOME's, else /usr/local/cuda's, else
/// one on PATH; "" with the places looked in, in `looked`, if none.
static std::string findPtxas(const std::string &toolkit, std::string &looked) {
  std::vector<std::string> roots;
  if (!toolkit.empty()) {
    roots.push_back(toolkit);
  } else {
    if (const char *home = std::getenv("CUDA_HOME"); home && *home)
      roots.push_back(home);
    roots.push_back("/usr/local/cuda");
  }
  for (const std::string &root : roots) {
    std::string path = root + "/bin/ptxas";
    looked += (looked.empty() ? "" : ", ") + path;
    if (access(path.c_str(), X_OK) == 0)
      return path;
  }
  if (!toolkit.empty())
    return "";
  looked += ", PATH";
  const char *path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && access((dir + "/ptxas").c_str(), X_OK) == 0)
      return dir + "/ptxas";
  return "";
}

/// Starts `argv` (argv[0] a path), its output going to ours; its process
/// id, or -1 (said on stderr) when it could not be started.
static pid_t start(const std::vector<std::string> &argv) {
  std::vector<char *> args;
  for (const std::string &a : argv)
    args.push_back(const_cast<char *>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execv(args[0], args.data());
    std::fprintf(stderr, "mok-compile: cannot run '%s': %s\n", args[0],
                 std::strerror(errno));
    _exit(127);
  }
  if (pid < 0)
    std::fprintf(stderr, "mok-compile: cannot run '%s': %s\n", args[0],
                 std::strerror(errno));
  return pid;
}

/// Waits for a process start() started; whether it exited 0.
static bool finish(pid_t pid) {
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) < 0)
    return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/// Starts ptxas making <base>.cubin from <base>.ptx for `chip` (a kernel's
/// ptxas runs beside the others': seconds each).
static pid_t startCubin(const std::string &ptxas, const std::string &base,
                        const std::string &chip) {
  return start({ptxas, "-arch=" + chip, base + ".ptx", "-o", base + ".cubin"});
}

/// Once the ptxas `pid` of startCubin is done: <base>.cubin.json, the chip
/// and the SHA-256 of the PTX (`ptx`) it was made from, which the Python
/// loader checks (python/mok/_artifact.py, read_cubin).
static bool writeCubin(pid_t pid, const std::string &ptxas,
                       const std::string &base, const std::string &ptx,
                       const std::string &chip) {
  if (!finish(pid)) {
    std::fprintf(stderr, "mok-compile: %s -arch=%s %s.ptx failed\n",
                 ptxas.c_str(), chip.c_str(), base.c_str());
    return false;
  }
  std::string sum = llvm::toHex(
      llvm::SHA256::hash(llvm::arrayRefFromStringRef(ptx)), /*LowerCase=*/true);
  if (!writeFile(base + ".cubin.json", "{\n  \"chip\": \"" + chip +
                                           "\",\n  \"ptx_sha256\": \"" + sum +
                                           "\"\n}\n"))
    return false;
  std::printf("%s.cubin\n", base.c_str());
  return true;
}

int main(int argc, char **argv) {
  std::string input, out, stagesDir, stageList;
  mok::CompileOptions options;
  mok::GpuCompileRequest request;
  bool dispatchGiven = false, cubin = false, times = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string &dst) {
      if (i + 1 >= argc)
        return false;
      dst = argv[++i];
      return true;
    };
    if ((a == "-o" && value(out)) || (a == "--chip" && value(options.chip)) ||
        (a == "--toolkit" && value(options.toolkit)) ||
        (a == "--stages-dir" && value(stagesDir)) ||
        (a == "--stages" && value(stageList)))
      continue;
    if (a == "--times") {
      times = true;
      continue;
    }
    if (a == "--verify-each") {
      request.verifyEachPass = true;
      continue;
    }
    if (a == "--function") {
      std::string name;
      if (!value(name) || name.empty())
        return usage("--function needs a function name");
      request.functions.push_back(name);
      continue;
    }
    bool *flag = a == "--profile"           ? &options.profile
                 : a == "--warp-specialize" ? &options.warpSpecialize
                 : a == "--multicast"       ? &options.multicast
                 : a == "--training"        ? &options.training
                 : a == "--recompute"       ? &options.recompute
                 : a == "--main-grads"      ? &options.mainGrads
                 : a == "--self-exchange"   ? &options.selfExchange
                 : a == "--fp8-quantized-weights"
                     ? &options.fp8QuantizedWeights
                 : a == "--cubin"           ? &cubin
                                            : nullptr;
    if (flag) {
      *flag = true;
      continue;
    }
    if (a == "--barrier-timeout-ms") {
      std::string n;
      if (!value(n))
        return usage("--barrier-timeout-ms needs a value (milliseconds)");
      char *end = nullptr;
      errno = 0;
      unsigned long ms = std::strtoul(n.c_str(), &end, 10);
      if (n.empty() || n[0] == '-' || *end || errno || ms > 3600000)
        return usage(("--barrier-timeout-ms: expected milliseconds from 0 to "
                      "3600000, got '" +
                      n + "'")
                         .c_str());
      options.barrierTimeoutMs = static_cast<unsigned>(ms);
      continue;
    }
    if (a == "--no-tensor-cores") {
      options.tensorCores = false;
      continue;
    }
    if (a == "--dispatch" || a == "--fuse-dispatch" || a == "--copy-dispatch") {
      std::string name = a == "--fuse-dispatch"   ? "fused"
                         : a == "--copy-dispatch" ? "copy"
                                                  : "";
      if (name.empty() && !value(name))
        return usage("--dispatch needs a value: auto, fused or copy");
      if (dispatchGiven)
        return usage("--dispatch, --fuse-dispatch and --copy-dispatch exclude "
                     "each other and are given once");
      std::optional<mok::Dispatch> dispatch = mok::parseDispatch(name);
      if (!dispatch)
        return usage(("--dispatch: expected auto, fused or copy, got '" +
                      name + "'")
                         .c_str());
      options.dispatch = *dispatch;
      dispatchGiven = true;
      continue;
    }
    if (a == "-h" || a == "--help")
      return usage("compile MoE layers (and FP8 weight quantizers) to PTX + "
                   "runtime metadata"),
             0;
    if (!a.empty() && a[0] != '-' && input.empty()) {
      input = a;
      continue;
    }
    return usage(("unexpected argument '" + a + "'").c_str());
  }
  if (input.empty() || out.empty())
    return usage("an input file and -o OUTDIR are required");
  if (std::string why = options.validate(); !why.empty())
    return usage(("invalid compile options: " + why).c_str());
  if (!stageList.empty() && stagesDir.empty())
    return usage("--stages selects what --stages-dir writes; give --stages-dir");
  if (!stagesDir.empty()) {
    std::stringstream names(stageList.empty() ? "moe,training,mk,gpu,llvm"
                                              : stageList);
    for (std::string name; std::getline(names, name, ',');)
      request.stageNames.push_back(name);
  }
  std::string ptxas;
  if (cubin) {
    std::string looked;
    ptxas = findPtxas(options.toolkit, looked);
    if (ptxas.empty())
      return usage(("--cubin needs ptxas (the CUDA toolkit's assembler); "
                    "looked in " +
                    looked)
                       .c_str());
  }

  std::ifstream file(input);
  if (!file)
    return std::fprintf(stderr, "mok-compile: cannot open '%s'\n",
                        input.c_str()),
           1;
  std::stringstream source;
  source << file.rdbuf();
  std::string error;
  auto parseStart = std::chrono::steady_clock::now();
  auto module = mok::Module::parse(source.str(), input, error);
  if (!module)
    return std::fprintf(stderr, "%s", error.c_str()), 1;
  double parseSeconds = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - parseStart)
                            .count();
  std::vector<mok::GpuKernel> kernels;
  if (!module->compileGPU(options, kernels, error, request))
    return std::fprintf(stderr, "%s\n", error.c_str()), 1;
  if (!makeDirectory(out))
    return 1;
  auto cubinStart = std::chrono::steady_clock::now();
  std::vector<pid_t> assembling;
  for (const mok::GpuKernel &k : kernels) {
    for (auto [ext, text] :
         {std::pair<const char *, const std::string *>{".ptx", &k.ptx},
          {".json", &k.metadata}}) {
      std::string path = out + "/" + k.function + ext;
      if (!writeFile(path, *text))
        return 1;
      std::printf("%s\n", path.c_str());
    }
    std::string base = out + "/" + k.function;
    if (cubin) {
      assembling.push_back(startCubin(ptxas, base, options.chip));
    } else {
      // No cubin is left beside PTX it was not made from.
      std::remove((base + ".cubin").c_str());
      std::remove((base + ".cubin.json").c_str());
    }
  }
  bool assembled = true;
  for (size_t i = 0; i < assembling.size(); ++i)
    assembled &= writeCubin(assembling[i], ptxas,
                            out + "/" + kernels[i].function, kernels[i].ptx,
                            options.chip);
  if (!assembled)
    return 1;
  if (times) {
    std::fprintf(stderr, "parse %.4f\n", parseSeconds);
    for (const mok::StepTime &t : request.times)
      std::fprintf(stderr, "%s %.4f\n", t.name.c_str(), t.seconds);
    if (cubin)
      std::fprintf(stderr, "cubin %.4f\n",
                   std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - cubinStart)
                       .count());
  }
  if (!stagesDir.empty()) {
    if (!makeDirectory(stagesDir))
      return 1;
    for (const mok::Stage &s : request.stages)
      if (!writeFile(stagesDir + "/" + s.name + ".mlir", s.ir))
        return 1;
  }
  return 0;
}
