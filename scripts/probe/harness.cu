// mok probe harness: loads gemm_sm90.ptx (lowered from gemm_sm90.mlir by
// build_ptx.sh) with the CUDA driver API, runs it once on an sm_90a GPU and
// checks C = A . W^T against a float64 CPU reference. Given
// gemm_sm90_nmajor.ptx (its kernel gemm_bf16_nn_256x256x512) it checks
// C = A . B instead, B read N-major; given gemm_sm90_mnmajor.ptx (kernel
// gemm_bf16_tnn_256x256x512), C = A^T . B with A [K,M] read M-major too
// (docs/Backward.md).
//
//   A [M,K] bf16 row-major, W [N,K] bf16 row-major (or B [K,N] row-major),
//   C [M,N] f32 row-major.
//
// Build: nvcc -O2 -std=c++17 harness.cu -o harness -lcuda
// Run:   ./harness [path/to/gemm_sm90.ptx] [seed]
//
// Host-only code (no device code in this file); no MLIR needed at run time.
#include <cuda.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// Must match gemm_sm90{,_nmajor,_mnmajor}.mlir (sizes are baked in).
static constexpr int M = 256, N = 256, K = 512;
static constexpr int BM = 128, BN = 128, BK = 64;
static constexpr unsigned kThreads = 128;        // one warpgroup
static constexpr unsigned kDynSmem = 66560;      // 2 x (16 KiB + 16 KiB) + 1 KiB slack
static const char *kKernel = "gemm_bf16_tn_256x256x512";
static const char *kKernelNMajor = "gemm_bf16_nn_256x256x512";
static const char *kKernelMNMajor = "gemm_bf16_tnn_256x256x512";

static void check(CUresult r, const char *what, int line) {
  if (r == CUDA_SUCCESS) return;
  const char *name = nullptr, *str = nullptr;
  cuGetErrorName(r, &name);
  cuGetErrorString(r, &str);
  std::fprintf(stderr, "CUDA error at line %d: %s -> %d %s (%s)\n", line, what, (int)r,
               name ? name : "?", str ? str : "?");
  std::printf("PROBE FAIL rel=nan (CUDA error in %s)\n", what);
  std::exit(1);
}
#define CK(x) check((x), #x, __LINE__)

// float -> bf16 bits, round to nearest even (inputs are finite).
static uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static void make_tmap(CUtensorMap *map, CUdeviceptr base, uint64_t rows, uint64_t cols,
                      cuuint32_t boxRows = 128) {
  // Dimension 0 is the innermost (contiguous); strides exclude dim 0, in bytes.
  cuuint64_t gdim[2] = {cols, rows};
  cuuint64_t gstride[1] = {cols * sizeof(uint16_t)};
  cuuint32_t box[2] = {64, boxRows};  // 64 bf16 = 128 bytes inner (max for SWIZZLE_128B)
  cuuint32_t estride[2] = {1, 1};
  CK(cuTensorMapEncodeTiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, gdim, gstride,
                            box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

int main(int argc, char **argv) {
  const char *ptxPath = argc > 1 ? argv[1] : "scripts/probe/gemm_sm90.ptx";
  uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : std::random_device{}();
  std::printf("probe: M=%d N=%d K=%d tile %dx%dx%d, seed=%llu, ptx=%s\n", M, N, K, BM, BN, BK,
              (unsigned long long)seed, ptxPath);

  // ---- PTX text --------------------------------------------------------------------------
  std::ifstream in(ptxPath, std::ios::binary);
  if (!in) {
    std::printf("PROBE FAIL rel=nan (cannot open %s)\n", ptxPath);
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string ptx = ss.str();  // c_str() is NUL-terminated, as cuModuleLoadData needs
  // The N-major probe: B [K, N], read through boxes of 64 (N) x 64 (K).
  // The M-major-A probe: A [K, M], read through boxes of 64 (M) x 64 (K).
  const bool mMajor = ptx.find(kKernelMNMajor) != std::string::npos;
  const bool nMajor = mMajor || ptx.find(kKernelNMajor) != std::string::npos;
  const char *kernel = mMajor ? kKernelMNMajor : nMajor ? kKernelNMajor : kKernel;
  std::printf("operand A: %s\n", mMajor ? "[K, M] row-major (M-major, imm-trans-a = 1)"
                                         : "[M, K] row-major (K-major)");
  std::printf("operand B: %s\n", nMajor ? "[K, N] row-major (N-major, imm-trans-b = 1)"
                                         : "[N, K] row-major (K-major)");

  // ---- context ---------------------------------------------------------------------------
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  char name[256] = {0};
  CK(cuDeviceGetName(name, sizeof(name), dev));
  int ccMaj = 0, ccMin = 0, drv = 0;
  CK(cuDeviceGetAttribute(&ccMaj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CK(cuDeviceGetAttribute(&ccMin, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  CK(cuDriverGetVersion(&drv));
  std::printf("device: %s (sm_%d%d), driver API %d\n", name, ccMaj, ccMin, drv);
  if (ccMaj != 9 || ccMin != 0) {
    std::printf("PROBE FAIL rel=nan (needs an sm_90 GPU for sm_90a PTX)\n");
    return 1;
  }
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));

  // ---- JIT the PTX -----------------------------------------------------------------------
  std::vector<char> errLog(16384, 0), infoLog(16384, 0);
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_LOG_VERBOSE};
  void *optVals[] = {errLog.data(), (void *)(uintptr_t)errLog.size(), infoLog.data(),
                     (void *)(uintptr_t)infoLog.size(), (void *)(uintptr_t)1};
  CUmodule mod;
  CUresult lr = cuModuleLoadDataEx(&mod, ptx.c_str(), 5, opts, optVals);
  if (lr != CUDA_SUCCESS) {
    std::fprintf(stderr, "JIT error log:\n%s\nJIT info log:\n%s\n", errLog.data(), infoLog.data());
    check(lr, "cuModuleLoadDataEx(gemm_sm90.ptx)", __LINE__);
  }
  std::printf("JIT info log: %s\n", infoLog[0] ? infoLog.data() : "(empty)");
  CUfunction fn;
  CK(cuModuleGetFunction(&fn, mod, kernel));
  int regs = 0, staticSmem = 0;
  CK(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn));
  CK(cuFuncGetAttribute(&staticSmem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn));
  std::printf("kernel %s: %d regs, %d B static smem, %u B dynamic smem\n", kernel, regs,
              staticSmem, kDynSmem);
  CK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)kDynSmem));

  // ---- data: fresh random bf16 in [-1, 1] ------------------------------------------------
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<uint16_t> hA((size_t)M * K), hW((size_t)N * K);
  for (auto &x : hA) x = f2bf(uni(rng));
  for (auto &x : hW) x = f2bf(uni(rng));

  CUdeviceptr dA, dW, dC, dTmA, dTmW;
  CK(cuMemAlloc(&dA, hA.size() * 2));
  CK(cuMemAlloc(&dW, hW.size() * 2));
  CK(cuMemAlloc(&dC, (size_t)M * N * 4));
  CK(cuMemcpyHtoD(dA, hA.data(), hA.size() * 2));
  CK(cuMemcpyHtoD(dW, hW.data(), hW.size() * 2));
  CK(cuMemsetD32(dC, 0x7FC00000u, (size_t)M * N));  // poison C with quiet NaN

  // ---- tensor maps, passed to the kernel by pointer (64-byte aligned, global memory) ------
  alignas(64) CUtensorMap tmA, tmW;
  if (mMajor)
    make_tmap(&tmA, dA, K, M, 64);
  else
    make_tmap(&tmA, dA, M, K);
  if (nMajor)
    make_tmap(&tmW, dW, K, N, 64);
  else
    make_tmap(&tmW, dW, N, K);
  CK(cuMemAlloc(&dTmA, sizeof(CUtensorMap)));  // cuMemAlloc is >= 256-byte aligned
  CK(cuMemAlloc(&dTmW, sizeof(CUtensorMap)));
  CK(cuMemcpyHtoD(dTmA, &tmA, sizeof(CUtensorMap)));
  CK(cuMemcpyHtoD(dTmW, &tmW, sizeof(CUtensorMap)));

  // ---- launch: grid (M/128, N/128), 128 threads; params = (tmA*, tmW*, C*) --------------
  CK(cuCtxSynchronize());  // memset/copies on the legacy stream are done before the launch
  CUstream stream;
  CK(cuStreamCreate(&stream, CU_STREAM_DEFAULT));
  void *args[] = {&dTmA, &dTmW, &dC};
  CK(cuLaunchKernel(fn, M / BM, N / BN, 1, kThreads, 1, 1, kDynSmem, stream, args, nullptr));
  // Poll so that a hang (an mbarrier phase that never completes) is reported, not waited on.
  auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    CUresult q = cuStreamQuery(stream);
    if (q == CUDA_SUCCESS) break;
    if (q != CUDA_ERROR_NOT_READY) check(q, "kernel execution (cuStreamQuery)", __LINE__);
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
      std::printf("PROBE FAIL rel=nan (kernel still running after 20 s: hang, probably an "
                  "mbarrier wait whose TMA transaction never completed)\n");
      std::fflush(stdout);
      std::_Exit(2);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CK(cuCtxSynchronize());

  std::vector<float> hC((size_t)M * N);
  CK(cuMemcpyDtoH(hC.data(), dC, hC.size() * 4));

  // ---- float64 reference and comparison --------------------------------------------------
  std::vector<double> fA(hA.size()), fW(hW.size());
  for (size_t i = 0; i < hA.size(); ++i) fA[i] = bf2f(hA[i]);
  for (size_t i = 0; i < hW.size(); ++i) fW[i] = bf2f(hW[i]);
  double sumDiff = 0, sumRef = 0, maxAbs = 0;
  long nonFinite = 0, bad = 0, shown = 0;
  long badRegion[M / 64][N / 128] = {};  // per 64x128 wgmma accumulator block
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int k = 0; k < K; ++k)
        ref += (mMajor ? fA[(size_t)k * M + m] : fA[(size_t)m * K + k]) *
               (nMajor ? fW[(size_t)k * N + n] : fW[(size_t)n * K + k]);
      double got = hC[(size_t)m * N + n];
      double d = std::fabs(got - ref);
      sumRef += std::fabs(ref);
      if (!std::isfinite(got)) {
        ++nonFinite;
      } else {
        sumDiff += d;
        if (d > maxAbs) maxAbs = d;
      }
      bool mismatch = !std::isfinite(got) || d > 1e-3 * std::fmax(1.0, std::fabs(ref));
      if (mismatch) {
        ++bad;
        ++badRegion[m / 64][n / 128];
        if (shown < 8) {
          std::printf("  mismatch C[%d][%d]: got %.6f ref %.6f\n", m, n, got, ref);
          ++shown;
        }
      }
    }
  if (bad) {
    std::printf("  mismatches per 64x128 block (rows = m/64, cols = n/128):\n");
    for (int i = 0; i < M / 64; ++i) {
      std::printf("   ");
      for (int j = 0; j < N / 128; ++j) std::printf(" %6ld", badRegion[i][j]);
      std::printf("\n");
    }
  }
  double rel = nonFinite ? NAN : sumDiff / sumRef;
  std::printf("non-finite: %ld, mismatches: %ld of %d, max |diff| %.3g, sum|ref| %.6g\n",
              nonFinite, bad, M * N, maxAbs, sumRef);
  bool pass = nonFinite == 0 && bad == 0 && rel < 1e-4;
  std::printf("PROBE %s rel=%.3e\n", pass ? "PASS" : "FAIL", rel);

  cuMemFree(dA);
  cuMemFree(dW);
  cuMemFree(dC);
  cuMemFree(dTmA);
  cuMemFree(dTmW);
  cuStreamDestroy(stream);
  cuModuleUnload(mod);
  cuDevicePrimaryCtxRelease(dev);
  return pass ? 0 : 1;
}
