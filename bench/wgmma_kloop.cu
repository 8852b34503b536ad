// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The sm_90a GEMM k-loop's forms outside the megakernel: how many of the
// tensor cores' cycles each step of the FP8 k-tile costs. No global
// operands: every CTA (one an SM) runs its k-tiles over a ring of four
// shared-memory stages filled once, so that only the loop itself is
// timed: the MMAs (E4M3 m64n128k32, four a k-tile of 128 K, as mok's FP8
// tiles, and m64n256k32 for comparison; bf16 m64n256k16, four a k-tile of
// 64 K, as its bf16 tiles), the
// wait after them (wait_group 1, accumulating in place as bf16 does, or
// wait_group 0 every k-tile as FP8's promotion needs), the promotion
// (acc += partial * scale, 64 FMAs a thread) and the stages' handshake
// with a producer warp (the full and empty mbarriers, without bytes).
// Each form prints its TFLOP/s, the SM clock its CTAs measured
// (%clock64 over the k-loop against the launch's time) and its share of
// the dense peak at that clock. Operands all 1.0 (little switching: the
// loop's own limit), or random (the board's power as real data draws
// it: the clock falls under its power cap, and the share of the peak
// a cycle shows what is left). The results are not checked: the GPU
// tests check the lowering's; this only times.
// On the GPU machine:
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/kloop bench/wgmma_kloop.cu
//   /tmp/kloop [k-tiles a CTA, default 20000] [ones | random | both]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int kStages = 4, kStageBytes = 48 * 1024, kAlign = 1024;

// A K-major operand's descriptor, 128-byte swizzle: start address / 16,
// leading byte offset 16 (unused when swizzled), stride 1024 bytes (eight
// 128-byte rows), swizzle mode 1 (128 bytes) in bits 62-63.
__device__ __forceinline__ uint64_t desc(uint32_t smem) {
  return (uint64_t((smem & 0x3ffff) >> 4)) | (uint64_t(1) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

#define R8(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), \
              "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), "+f"(d[b + 7])
#define R64(b) R8(b), R8(b + 8), R8(b + 16), R8(b + 24), R8(b + 32), R8(b + 40), R8(b + 48), R8(b + 56)
#define P8(b) "%" #b ", "
// The operand lists are spelled out: inline asm wants literal numbers.
#define L64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// E4M3 m64n128k32 into 64 floats; `accumulate` 0: D = A B (scale-d 0).
__device__ __forceinline__ void mmaFp8(float *d, uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " L64
               ", %64, %65, p, 1, 1;\n}\n"
               : R64(0)
               : "l"(a), "l"(b), "r"(accumulate));
}

#define L128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// E4M3 m64n256k32 into 128 floats, accumulating (the 128 x 256 FP8 tile
// mok does not have: its partial sums and accumulator would need 256
// registers a thread).
__device__ __forceinline__ void mmaFp8Wide(float *d, uint64_t a, uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " L128
               ", %128, %129, 1, 1, 1;\n"
               : R64(0), R64(64)
               : "l"(a), "l"(b));
}

// bf16 m64n256k16 into 128 floats, accumulating.
__device__ __forceinline__ void mmaBf16(float *d, uint64_t a, uint64_t b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " L128
               ", %128, %129, 1, 1, 1, 0, 0;\n"
               : R64(0), R64(64)
               : "l"(a), "l"(b));
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void waitGroup() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void mbarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Whether the barrier's phase of `parity` has completed, without waiting.
__device__ __forceinline__ bool mbarTest(uint32_t bar, int parity) {
  uint32_t done;
  asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
               "selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbarWait(uint32_t bar, int parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared.b64 done, [%0], %1, 10000000;\n"
               "@!done bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

// The operands every stage holds: 1.0 everywhere (`random` 0), or random
// values (a hash of the element's index: E4M3 bytes of any sign and
// exponent but NaN, bf16 of magnitude 2^-7 to 2^8), whose switching
// draws the board's power as real data does.
__device__ __forceinline__ uint32_t hashOf(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}
__device__ __forceinline__ uint32_t operandWord(uint32_t i, bool fp8, int random) {
  if (!random)
    return fp8 ? 0x38383838u : 0x3f803f80u;
  uint32_t h = hashOf(i), w = 0;
  if (fp8) {
    for (int j = 0; j < 4; ++j) {
      uint32_t byte = (h >> (8 * j)) & 0xff;
      if ((byte & 0x7f) == 0x7f)
        byte -= 1;
      w |= byte << (8 * j);
    }
    return w;
  }
  for (int j = 0; j < 2; ++j) {
    uint32_t g = hashOf(h + j);
    w |= ((g & 0x8000u) | ((120u + ((g >> 8) & 15u)) << 7) | (g & 0x7fu)) << (16 * j);
  }
  return w;
}

// The CTA's ring: the stages (1024-aligned in dynamic shared memory),
// filled with the operands, and each stage's full (one arrival) and
// empty (`releases` arrivals) barriers, initialized and fenced.
struct Ring {
  uint32_t base, fullBar, emptyBar;
};
__device__ Ring setUpRing(uint64_t *full, uint64_t *empty, int releases, bool fp8, int random) {
  extern __shared__ __align__(1024) uint8_t smemRaw[];
  uint8_t *smem = reinterpret_cast<uint8_t *>(
      (reinterpret_cast<uintptr_t>(smemRaw) + kAlign - 1) & ~uintptr_t(kAlign - 1));
  const int tid = threadIdx.x;
  for (int i = tid; i < kStages * kStageBytes / 4; i += blockDim.x)
    reinterpret_cast<uint32_t *>(smem)[i] = operandWord(i + 7919u * blockIdx.x, fp8, random);
  Ring ring{static_cast<uint32_t>(__cvta_generic_to_shared(smem)),
            static_cast<uint32_t>(__cvta_generic_to_shared(full)),
            static_cast<uint32_t>(__cvta_generic_to_shared(empty))};
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) {
      mbarInit(ring.fullBar + 8 * s, 1);
      mbarInit(ring.emptyBar + 8 * s, releases);
    }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  return ring;
}

// With a producer the registers move to the consumers, as mok's warp
// roles do: 40 for the producer, the rest (a multiple of 8, at most 232)
// for them; the producer warpgroup's first thread then completes each
// k-tile's full barrier once the consumers released its stage's previous
// k-tile. Returns true in the producer warpgroup (done).
template <int Consumers, bool Producer>
__device__ __forceinline__ bool takeRole(int kTiles, const Ring &ring) {
  if (!Producer)
    return false;
  constexpr int kConsumerRegs = ((65536 - 40 * 128) / (128 * Consumers)) / 8 * 8;
  constexpr int kRegs = kConsumerRegs > 232 ? 232 : kConsumerRegs;
  const int tid = threadIdx.x;
  if (tid / 128 != Consumers) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
    return false;
  }
  asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
  if (tid % 128 == 0)
    for (int kt = 0; kt < kTiles; ++kt) {
      int s = kt % kStages;
      if (kt >= kStages)
        mbarWait(ring.emptyBar + 8 * s, ((kt / kStages) - 1) & 1);
      mbarArrive(ring.fullBar + 8 * s);
    }
  return true;
}

// One CTA: `consumers` warpgroups issue the k-tiles' MMAs over the ring;
// with a producer, its first thread completes each stage's full barrier
// once the consumers' 4 warps each released it on its empty barrier.
// Kind: 0 bf16 m64n256k16, 1 E4M3 m64n128k32, 2 E4M3 m64n256k32.
// Early: with a producer, the next stage's full barrier is tested before
// the promotion (its latency under the FMAs), and waited for only if it
// was not complete then.
template <int Kind, int Consumers, bool Wait0, bool Promote, bool Producer, bool Early = false>
__global__ void __launch_bounds__(128 * (Consumers + Producer), 1)
kloop(int kTiles, float scale, float *sink, int random, long long *cycles) {
  constexpr bool Fp8 = Kind != 0;
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  const Ring ring = setUpRing(full, empty, 4 * Consumers, Fp8, random);
  const uint32_t base = ring.base, fullBar = ring.fullBar, emptyBar = ring.emptyBar;
  const int tid = threadIdx.x, wg = tid / 128;
  const long long t0 = clock64();
  if (takeRole<Consumers, Producer>(kTiles, ring))
    return;

  constexpr int kFrag = Kind == 1 ? 64 : 128;
  float part[kFrag], acc[kFrag];
  for (int i = 0; i < kFrag; ++i)
    part[i] = acc[i] = 0.f;
  // The A box: 8 KiB a warpgroup (64 rows x 128 bytes); B after all of A.
  constexpr int kBOffset = 16 * 1024 * ((Consumers + 1) / 2);
  float sc = scale;
  bool ready = false;
  for (int kt = 0; kt < kTiles; ++kt) {
    int s = kt % kStages;
    if (Producer && !(Early && ready))
      mbarWait(fullBar + 8 * s, (kt / kStages) & 1);
    uint32_t a = base + s * kStageBytes + wg * 8192, b = base + s * kStageBytes + kBOffset;
    uint64_t da = desc(a), db = desc(b);
    fence();
    for (int ks = 0; ks < 4; ++ks) {
      if (Kind == 1)
        mmaFp8(part, da + 2 * ks, db + 2 * ks, Promote ? ks : 1);
      else if (Kind == 2)
        mmaFp8Wide(part, da + 2 * ks, db + 2 * ks);
      else
        mmaBf16(part, da + 2 * ks, db + 2 * ks);
    }
    commit();
    if (Wait0)
      waitGroup<0>();
    else
      waitGroup<1>();
    if (Producer && tid % 32 == 0)
      mbarArrive(emptyBar + 8 * s);
    if (Producer && Early)
      ready = mbarTest(fullBar + 8 * ((kt + 1) % kStages), ((kt + 1) / kStages) & 1);
    if (Promote) {
      for (int i = 0; i < kFrag; ++i)
        acc[i] = fmaf(part[i], sc, acc[i]);
      sc = sc * 1.0000001f;
    }
  }
  waitGroup<0>();
  float sum = 0.f;
  for (int i = 0; i < kFrag; ++i)
    sum += Promote ? acc[i] : part[i];
  sink[blockIdx.x * blockDim.x + tid] = sum;
  if (tid == 0)
    cycles[blockIdx.x] = clock64() - t0;
}

// FP8 with two sets of partial sums: in runs of four k-tiles, each
// k-tile's MMAs are issued before the previous k-tile's partial sums are
// promoted (wait_group 1), and the run ends in wait_group 0 (ptxas
// serializes the wgmmas when a loop's promotion reads partial sums
// committed in its previous iteration). 192 registers of sums a thread.
// Sync: without a producer, the consumers meet at a named barrier after
// each k-tile's wait (mok's refill point: thread 0 reloads the stage of
// the k-tile before; here nothing is loaded).
// Early: with a producer, each promotion first tests the full barrier of
// the k-tile issued next after it (kt + 2), which then waits only if that
// test failed. (At 232 registers ptxas keeps one value of that form in
// local memory: a load a run of four k-tiles.)
template <int Consumers, bool Producer, bool Sync = false, bool Early = false>
__global__ void __launch_bounds__(128 * (Consumers + Producer), 1)
kloopPipelined(int kTiles, float scale, float *sink, int random, long long *cycles) {
  __shared__ __align__(8) uint64_t full[kStages], empty[kStages];
  const Ring ring = setUpRing(full, empty, 4 * Consumers, true, random);
  const uint32_t base = ring.base, fullBar = ring.fullBar, emptyBar = ring.emptyBar;
  const int tid = threadIdx.x, wg = tid / 128;
  const long long t0 = clock64();
  if (takeRole<Consumers, Producer>(kTiles, ring))
    return;
  float p0[64], p1[64], acc[64];
  for (int i = 0; i < 64; ++i)
    p0[i] = p1[i] = acc[i] = 0.f;
  float sc = scale;
  // `ready`: an earlier promotion found k-tile kt's full barrier complete.
  auto issue = [&](float *part, int kt, bool ready) {
    int s = kt % kStages;
    if (Producer && !(Early && ready))
      mbarWait(fullBar + 8 * s, (kt / kStages) & 1);
    uint64_t da = desc(base + s * kStageBytes + wg * 8192);
    uint64_t db = desc(base + s * kStageBytes + 16 * 1024);
    fence();
    for (int ks = 0; ks < 4; ++ks)
      mmaFp8(part, da + 2 * ks, db + 2 * ks, ks);
    commit();
  };
  // Promotes k-tile kt's partial sums; with Early, returns whether k-tile
  // `test`'s full barrier was complete before the FMAs.
  auto finish = [&](float *part, int kt, int test) {
    if (Sync)
      asm volatile("bar.sync 1, %0;\n" ::"n"(128 * Consumers) : "memory");
    if (Producer && tid % 32 == 0)
      mbarArrive(emptyBar + 8 * (kt % kStages));
    bool ready = Producer && Early &&
                 mbarTest(fullBar + 8 * (test % kStages), (test / kStages) & 1);
    for (int i = 0; i < 64; ++i)
      acc[i] = fmaf(part[i], sc, acc[i]);
    sc = sc * 1.0000001f;
    return ready;
  };
  bool r0 = false, r1 = false;
  for (int kt = 0; kt + 4 <= kTiles; kt += 4) {
    issue(p0, kt, r0);
    issue(p1, kt + 1, r1);
    waitGroup<1>();
    bool r2 = finish(p0, kt, kt + 2);
    issue(p0, kt + 2, r2);
    waitGroup<1>();
    bool r3 = finish(p1, kt + 1, kt + 3);
    issue(p1, kt + 3, r3);
    waitGroup<1>();
    r0 = finish(p0, kt + 2, kt + 4);
    waitGroup<0>();
    r1 = finish(p1, kt + 3, kt + 5);
  }
  float sum = 0.f;
  for (int i = 0; i < 64; ++i)
    sum += acc[i];
  sink[blockIdx.x * blockDim.x + tid] = sum;
  if (tid == 0)
    cycles[blockIdx.x] = clock64() - t0;
}

// Times `kernel` (best of 5 launches, one CTA an SM, after a warm-up)
// and prints its TFLOP/s, its share of the dense peak at the clock the
// CTAs measured (%clock64 over their k-loops, averaged; on random data
// the board may lower it under its power cap) and its cycles a k-tile.
template <typename Kernel>
void timeIt(const char *name, Kernel kernel, int threads, int sms, int kTiles, double kTileFlops,
            bool fp8, float *sink, int random, long long *cycles) {
  int smemBytes = kStages * kStageBytes + kAlign;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smemBytes));
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  kernel<<<sms, threads, smemBytes>>>(kTiles / 10 / 4 * 4, 1.0f, sink, random, cycles);
  CK(cudaGetLastError());
  float best = 1e30f;
  double bestCycles = 0;
  long long host[1024];
  for (int rep = 0; rep < 5; ++rep) {
    CK(cudaEventRecord(start));
    kernel<<<sms, threads, smemBytes>>>(kTiles, 1.0f, sink, random, cycles);
    CK(cudaEventRecord(stop));
    CK(cudaEventSynchronize(stop));
    float ms;
    CK(cudaEventElapsedTime(&ms, start, stop));
    if (ms < best) {
      best = ms;
      CK(cudaMemcpy(host, cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
      bestCycles = 0;
      for (int i = 0; i < sms; ++i)
        bestCycles += double(host[i]) / sms;
    }
  }
  double flops = double(sms) * kTiles * kTileFlops;
  double mhz = bestCycles / (best * 1e3);
  // Dense peak an SM a cycle: bf16 4096 FLOP, E4M3 8192.
  double peak = sms * (fp8 ? 8192.0 : 4096.0) * mhz * 1e6;
  printf("%-48s %8.3f ms  %7.1f TFLOP/s  %4.0f MHz  %5.1f %% of peak  %5.0f cycles a k-tile\n",
         name, best, flops / (best * 1e-3) / 1e12, mhz, 100.0 * flops / (best * 1e-3) / peak,
         bestCycles / kTiles);
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
}

struct Ctx {
  int sms, kTiles, random;
  float *sink;
  long long *cycles;
};

template <int Consumers, bool Producer, bool Sync = false, bool Early = false>
void runPipelined(const char *name, const Ctx &c) {
  // A k-tile: each consumer warpgroup's four E4M3 m64n128k32 MMAs.
  timeIt(name, kloopPipelined<Consumers, Producer, Sync, Early>, 128 * (Consumers + Producer), c.sms,
         c.kTiles / 4 * 4, Consumers * 4 * 2.0 * 64 * 128 * 32, true, c.sink, c.random, c.cycles);
}

template <int Kind, int Consumers, bool Wait0, bool Promote, bool Producer, bool Early = false>
void run(const char *name, const Ctx &c) {
  // A k-tile: each consumer warpgroup's four MMAs of 64 x N x K.
  double n = Kind == 0 ? 256 : Kind == 1 ? 128 : 256, k = Kind == 0 ? 16 : 32;
  timeIt(name, kloop<Kind, Consumers, Wait0, Promote, Producer, Early>, 128 * (Consumers + Producer),
         c.sms, c.kTiles / 4 * 4, Consumers * 4 * 2.0 * 64 * n * k, Kind != 0, c.sink, c.random,
         c.cycles);
}

int main(int argc, char **argv) {
  // [k-tiles a CTA] [ones | random | both]
  int kTiles = argc > 1 ? atoi(argv[1]) : 20000;
  const char *data = argc > 2 ? argv[2] : "both";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int sms = prop.multiProcessorCount;
  if (sms > 1024 || kTiles < 40) {
    printf("usage: %s [k-tiles a CTA, at least 40] [ones | random | both]\n", argv[0]);
    return 2;
  }
  printf("%s, %d SMs, %d k-tiles a CTA\n", prop.name, sms, kTiles);
  Ctx c{sms, kTiles, 0, nullptr, nullptr};
  CK(cudaMalloc(&c.sink, sms * 512 * sizeof(float)));
  CK(cudaMalloc(&c.cycles, sms * sizeof(long long)));
  for (int random = 0; random < 2; ++random) {
    if ((random && !strcmp(data, "ones")) || (!random && !strcmp(data, "random")))
      continue;
    c.random = random;
    printf("-- operands: %s\n", random ? "random" : "all 1.0");
    // bf16's forms (128 x 256 tiles, two warpgroups).
    run<0, 2, false, false, false>("bf16 2 wg, wait_group 1", c);
    run<0, 2, true, false, false>("bf16 2 wg, wait_group 0", c);
    run<0, 2, false, false, true>("bf16 2 wg, wait_group 1, producer", c);
    // FP8's (128 x 128 tiles), step by step towards mok's k-tile.
    run<1, 2, false, false, false>("fp8 2 wg, wait_group 1 (in place)", c);
    run<1, 2, true, false, false>("fp8 2 wg, wait_group 0", c);
    run<1, 2, true, true, false>("fp8 2 wg, wait_group 0, promotion", c);
    run<1, 2, true, true, true>("fp8 2 wg, wait_group 0, promotion, producer", c);
    run<1, 2, true, true, true, true>("fp8 2 wg, wait_group 0, promotion, producer, early test", c);
    run<1, 2, false, false, true>("fp8 2 wg, wait_group 1, producer", c);
    runPipelined<2, false>("fp8 2 wg, two partial sets, promotion", c);
    runPipelined<2, true>("fp8 2 wg, two partial sets, promotion, producer", c);
    runPipelined<2, true, false, true>("fp8 2 wg, two partial sets, producer, early test", c);
    runPipelined<2, false, true>("fp8 2 wg, two partial sets, promotion, barrier", c);
    // The 128 x 256 FP8 tile, without promotion (registers).
    run<2, 2, false, false, false>("fp8 n256 2 wg, wait_group 1 (in place)", c);
    run<2, 2, true, false, false>("fp8 n256 2 wg, wait_group 0", c);
    // One and three consumer warpgroups a stage (64- and 192-row tiles).
    run<1, 1, true, true, false>("fp8 1 wg, wait_group 0, promotion", c);
    run<1, 3, true, true, false>("fp8 3 wg, wait_group 0, promotion", c);
    run<1, 3, true, true, true>("fp8 3 wg, wait_group 0, promotion, producer", c);
  }
  CK(cudaFree(c.sink));
  CK(cudaFree(c.cycles));
  return 0;
}
