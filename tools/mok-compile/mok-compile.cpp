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
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

static int usage(const char *why) {
  std::fprintf(
      stderr,
      "mok-compile: %s\n"
      "usage: mok-compile INPUT.mlir [--chip sm_90a|sm_100a] [--profile] -o "
      "OUTDIR\n"
      "       [--warp-specialize] [--fuse-dispatch | --copy-dispatch]\n"
      "       [--multicast] [--training [--recompute] [--main-grads]]\n"
      "       [--toolkit CUDA_DIR]\n"
      "       (--toolkit: libdevice; default $CUDA_HOME or /usr/local/cuda;\n"
      "        --training: first derive <fn>_forward, which saves the\n"
      "        backward context, and <fn>_backward (moe-generate-backward);\n"
      "        --recompute: save no context, backward recomputes it;\n"
      "        --main-grads: backward adds the weights' gradients into fp32\n"
      "        main_grad outputs)\n",
      why);
  return 2;
}

int main(int argc, char **argv) {
  std::string input, out, chip = "sm_90a";
  bool profile = false, warpSpecialize = false, multicast = false;
  bool training = false, recompute = false, mainGrads = false;
  std::optional<bool> fuseDispatch; // unset: fused where implemented
  const char *home = std::getenv("CUDA_HOME");
  std::string toolkit = home && *home ? home : "/usr/local/cuda";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string &dst) {
      if (i + 1 >= argc)
        return false;
      dst = argv[++i];
      return true;
    };
    if ((a == "-o" && value(out)) || (a == "--chip" && value(chip)) ||
        (a == "--toolkit" && value(toolkit)))
      continue;
    if (a == "--profile") {
      profile = true;
      continue;
    }
    if (a == "--warp-specialize") {
      warpSpecialize = true;
      continue;
    }
    if (a == "--multicast") {
      multicast = true;
      continue;
    }
    if (a == "--training" || a == "--recompute") {
      (a == "--training" ? training : recompute) = true;
      continue;
    }
    if (a == "--main-grads") {
      mainGrads = true;
      continue;
    }
    if (a == "--fuse-dispatch" || a == "--copy-dispatch") {
      if (fuseDispatch)
        return usage("--fuse-dispatch and --copy-dispatch exclude each other "
                     "and are given once");
      fuseDispatch = a == "--fuse-dispatch";
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
  if (recompute && !training)
    return usage("--recompute needs --training");
  if (mainGrads && !training)
    return usage("--main-grads needs --training");

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
  std::string options;
  if (recompute)
    options += " recompute=true";
  if (mainGrads)
    options += " main-grads=true";
  if (training &&
      !module->runPipeline(
          "moe-generate-backward" +
              (options.empty() ? std::string() : "{" + options.substr(1) + "}"),
          error))
    return std::fprintf(stderr, "%s\n", error.c_str()), 1;
  std::vector<mok::GpuKernel> kernels;
  if (!module->compileGPU(chip, toolkit, kernels, error, profile,
                          warpSpecialize, fuseDispatch, multicast))
    return std::fprintf(stderr, "%s\n", error.c_str()), 1;
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec)
    return std::fprintf(stderr, "mok-compile: cannot create '%s': %s\n",
                        out.c_str(), ec.message().c_str()),
           1;
  for (const mok::GpuKernel &k : kernels) {
    for (auto [ext, text] :
         {std::pair<const char *, const std::string *>{".ptx", &k.ptx},
          {".json", &k.metadata}}) {
      std::string path = out + "/" + k.function + ext;
      std::ofstream f(path);
      f << *text;
      if (!f)
        return std::fprintf(stderr, "mok-compile: cannot write '%s'\n",
                            path.c_str()),
               1;
      std::printf("%s\n", path.c_str());
    }
  }
  return 0;
}
