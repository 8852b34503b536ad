// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mok-compile: compile the MoE layers of an .mlir file for a GPU and write,
// for each, <out>/<function>.ptx and <out>/<function>.json (the runtime's
// metadata). Built fully static too (mok-compile-static), to carry to GPU
// machines that have no MLIR.
//
//   mok-compile layer.mlir --chip sm_90a -o out/
//
#include "mok/Compiler/Compiler.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>

static int usage(const char *why) {
  std::fprintf(
      stderr,
      "mok-compile: %s\n"
      "usage: mok-compile INPUT.mlir [--chip sm_90a|sm_100a] -o OUTDIR\n"
      "       [--profile] [--warp-specialize] [--multicast]\n"
      "       [--dispatch auto|fused|copy | --fuse-dispatch | --copy-dispatch]\n"
      "       [--no-tensor-cores] [--training [--recompute] [--main-grads]]\n"
      "       [--toolkit CUDA_DIR] [--stages-dir DIR] [--barrier-timeout-ms N]\n"
      "       (--toolkit: libdevice; default $CUDA_HOME or /usr/local/cuda;\n"
      "        --fuse-dispatch, --copy-dispatch: --dispatch fused, copy;\n"
      "        --training: first derive <fn>_forward, which saves the\n"
      "        backward context, and <fn>_backward (moe-generate-backward);\n"
      "        --recompute: save no context, backward recomputes it;\n"
      "        --main-grads: backward adds the weights' gradients into fp32\n"
      "        main_grad outputs;\n"
      "        --stages-dir: also write the IR after each step, DIR/moe.mlir,\n"
      "        training.mlir, mk.mlir, gpu.mlir, llvm.mlir;\n"
      "        --barrier-timeout-ms: debugging, bound every grid barrier's\n"
      "        wait; the runtime reports a barrier that timed out)\n",
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

int main(int argc, char **argv) {
  std::string input, out, stagesDir;
  mok::CompileOptions options;
  bool dispatchGiven = false;
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
        (a == "--stages-dir" && value(stagesDir)))
      continue;
    bool *flag = a == "--profile"           ? &options.profile
                 : a == "--warp-specialize" ? &options.warpSpecialize
                 : a == "--multicast"       ? &options.multicast
                 : a == "--training"        ? &options.training
                 : a == "--recompute"       ? &options.recompute
                 : a == "--main-grads"      ? &options.mainGrads
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
      return usage("compile MoE layers to PTX + runtime metadata"), 0;
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

  std::ifstream file(input);
  if (!file)
    return std::fprintf(stderr, "mok-compile: cannot open '%s'\n",
                        input.c_str()),
           1;
  std::stringstream source;
  source << file.rdbuf();
  std::string error;
  auto module = mok::Module::parse(source.str(), input, error);
  if (!module)
    return std::fprintf(stderr, "%s", error.c_str()), 1;
  std::vector<mok::GpuKernel> kernels;
  std::vector<mok::Stage> stages;
  if (!module->compileGPU(options, kernels, error,
                          stagesDir.empty() ? nullptr : &stages))
    return std::fprintf(stderr, "%s\n", error.c_str()), 1;
  if (!makeDirectory(out))
    return 1;
  for (const mok::GpuKernel &k : kernels) {
    for (auto [ext, text] :
         {std::pair<const char *, const std::string *>{".ptx", &k.ptx},
          {".json", &k.metadata}}) {
      std::string path = out + "/" + k.function + ext;
      if (!writeFile(path, *text))
        return 1;
      std::printf("%s\n", path.c_str());
    }
  }
  if (!stagesDir.empty()) {
    if (!makeDirectory(stagesDir))
      return 1;
    for (const mok::Stage &s : stages)
      if (!writeFile(stagesDir + "/" + s.name + ".mlir", s.ir))
        return 1;
  }
  return 0;
}
