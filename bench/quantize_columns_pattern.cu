// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The bandwidth of mk.quantize_columns' access pattern outside the
// megakernel: dsv3-shard's d_y (32768 x 7168 bf16) quantized in 128 x 1
// column blocks and stored transposed, as the lowering does it (a warp a
// block of 128 rows x 32 columns, 16-byte loads and stores, the scale by
// a reciprocal and two Newton steps), at several CTA sizes, with the
// read-only loads nvcc picks and with plain ld.global as the megakernel's;
// against a plain stream of the same bytes and a shared-memory staged
// variant. The codes are not checked: the GPU tests check the lowering's.
// On the GPU machine:
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/qpattern bench/quantize_columns_pattern.cu
//   /tmp/qpattern
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cstdio>
#include <cstdint>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)
constexpr int R = 32768, C = 7168;

__device__ __forceinline__ float q(float x, float y, float d) {
  float a = fabsf(x), v = a * y;
  for (int s = 0; s < 2; ++s) { float r = fmaf(-v, d, a); v = fmaf(r, y, v); }
  return copysignf(v, x);
}
// A plain ld.global.v4 (the megakernel's loads), not the read-only path
// that const __restrict__ gives nvcc.
__device__ __forceinline__ uint4 ldPlain(const uint4 *p) {
  uint4 v;
  asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void unpack(uint4 p, float *f) {
  uint32_t w[4] = {p.x, p.y, p.z, p.w};
  for (int i = 0; i < 4; ++i) { f[2*i] = __uint_as_float(w[i] << 16); f[2*i+1] = __uint_as_float(w[i] & 0xffff0000u); }
}
// A lane's 16 rows x 8 columns (from column c0, rows from `first`) of a
// 128-row block rb: each column's amax over the 8 lanes of its columns
// (xor shuffles), its scale, and its 16 codes in one 16-byte store.
__device__ __forceinline__ void quantizeColumns(const uint4 *p, int h, int c0, int first, int rb,
                                                uint8_t *__restrict__ vals,
                                                float *__restrict__ scales) {
  float f[16][8];
#pragma unroll
  for (int j = 0; j < 16; ++j) unpack(p[j], f[j]);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) m = fmaxf(m, fabsf(f[j][c]));
    for (int o = 1; o < 8; o <<= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
    float s = m == 0.f ? 1.f : m / 448.f, y = 1.f / s;
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 16; j += 4) {
      __nv_fp8x2_storage_t a = __nv_cvt_float2_to_fp8x2(make_float2(q(f[j][c], y, s), q(f[j+1][c], y, s)), __NV_SATFINITE, __NV_E4M3);
      __nv_fp8x2_storage_t b = __nv_cvt_float2_to_fp8x2(make_float2(q(f[j+2][c], y, s), q(f[j+3][c], y, s)), __NV_SATFINITE, __NV_E4M3);
      w[j/4] = a | (uint32_t(b) << 16);
    }
    *(uint4 *)(vals + (size_t)(c0 + c) * R + first) = make_uint4(w[0], w[1], w[2], w[3]);
    if (h == 0) scales[rb * C + c0 + c] = s;
  }
}
// The current lowering: a warp a tile of 128 rows x 32 columns, a lane 16
// rows x 8 columns (16-byte loads), the 8 lanes of a column group reduce
// with shuffles; a lane stores 16 codes (16 bytes) a column.
template <bool Prefetch, int MaxT, bool Plain = false>
__global__ void __launch_bounds__(MaxT) warpTiles(const uint4 *__restrict__ src, uint8_t *__restrict__ vals, float *__restrict__ scales) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int groups = C / 32, tiles = (R / 128) * groups;
  const int stride = gridDim.x * blockDim.x / 32;
  int i = warp * gridDim.x + blockIdx.x;
  auto fetch = [&](int i, uint4 *p) {
    int rb = i / groups, h = lane % 8, qd = lane / 8;
    int c0 = (i % groups) * 32 + qd * 8, first = rb * 128 + h * 16;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint4 *at = src + ((size_t)(first + j) * C + c0) / 8;
      p[j] = Plain ? ldPlain(at) : *at;
    }
  };
  uint4 p[16], n[16];
  if (i < tiles) fetch(i, p);
  for (; i < tiles; i += stride) {
    if (Prefetch && i + stride < tiles) fetch(i + stride, n);
    int rb = i / groups, h = lane % 8, qd = lane / 8;
    int c0 = (i % groups) * 32 + qd * 8, first = rb * 128 + h * 16;
    quantizeColumns(p, h, c0, first, rb, vals, scales);
    if (Prefetch)
#pragma unroll
      for (int j = 0; j < 16; ++j) p[j] = n[j];
    else if (i + stride < tiles) fetch(i + stride, p);
  }
}
// Shared-memory staged: a CTA a tile of 128 rows x 256 columns (64 KiB),
// loaded with 512-byte row runs (a warp a row piece), then each warp
// quantizes 32 columns from shared memory.
__global__ void __launch_bounds__(256) smemTiles(const uint4 *__restrict__ src, uint8_t *__restrict__ vals, float *__restrict__ scales) {
  extern __shared__ uint4 sm[];  // [128][256 bf16] = 128 x 32 uint4
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int groups = C / 256, tiles = (R / 128) * groups;
  for (int i = blockIdx.x; i < tiles; i += gridDim.x) {
    int rb = i / groups, cb = (i % groups) * 256;
    __syncthreads();
#pragma unroll 4
    for (int r = warp; r < 128; r += 8) sm[r * 32 + lane] = src[((size_t)(rb * 128 + r) * C + cb) / 8 + lane];
    __syncthreads();
    // warp: columns cb + 32 warp .. +32; lane: column group qd (8 cols), rows 16 h..
    int h = lane % 8, qd = lane / 8, c0 = warp * 32 + qd * 8, first = rb * 128 + h * 16;
    uint4 p[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) p[j] = sm[(h * 16 + j) * 32 + c0 / 8];
    quantizeColumns(p, h, cb + c0, first, rb, vals, scales);
  }
}
// Plain streaming: read src, write half as many bytes (the same traffic,
// no transpose).
__global__ void stream(const uint4 *__restrict__ src, uint2 *__restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = src[i]; dst[i] = make_uint2(v.x ^ v.y, v.z ^ v.w);
  }
}
int main() {
  uint4 *src; uint8_t *vals; float *scales;
  CK(cudaMalloc(&src, (size_t)R * C * 2)); CK(cudaMalloc(&vals, (size_t)R * C)); CK(cudaMalloc(&scales, (size_t)R / 128 * C * 4));
  CK(cudaMemset(src, 0x3c, (size_t)R * C * 2));
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  CK(cudaFuncSetAttribute(smemTiles, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  double bytes = (double)R * C * 3;
  auto time = [&](const char *name, auto launch) {
    for (int w = 0; w < 3; ++w) launch();
    cudaEventRecord(a); for (int it = 0; it < 10; ++it) launch(); cudaEventRecord(b);
    cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); ms /= 10;
    printf("%-44s %.3f ms  %.2f TB/s  (%s)\n", name, ms, bytes / ms / 1e9, cudaGetErrorString(cudaGetLastError()));
  };
  time("stream (read 2 B, write 1 B an element)", [&] { stream<<<sms * 8, 256>>>(src, (uint2 *)vals, (size_t)R * C / 8); });
  time("warp tiles, 132 x 256", [&] { warpTiles<false, 256><<<sms, 256>>>(src, vals, scales); });
  time("warp tiles, 132 x 384", [&] { warpTiles<false, 384><<<sms, 384>>>(src, vals, scales); });
  time("warp tiles, 132 x 384, plain loads", [&] { warpTiles<false, 384, true><<<sms, 384>>>(src, vals, scales); });
  time("warp tiles, 132 x 1024", [&] { warpTiles<false, 1024><<<sms, 1024>>>(src, vals, scales); });
  time("warp tiles prefetched, 132 x 256", [&] { warpTiles<true, 256><<<sms, 256>>>(src, vals, scales); });
  time("warp tiles, 2 x 132 x 256", [&] { warpTiles<false, 256><<<2 * sms, 256>>>(src, vals, scales); });
  time("smem tiles 128x256, 132 x 256", [&] { smemTiles<<<sms, 256, 65536>>>(src, vals, scales); });
  time("smem tiles 128x256, 3 x 132 x 256", [&] { smemTiles<<<3 * sms, 256, 65536>>>(src, vals, scales); });
  return 0;
}
