// int8 / fp8 (e4m3) per-channel weight-only linear for a few rows (M <= 64) on tensor cores, in
// one launch: the kernel of an eager call of int8_wo's and fp8_wo's "triton" kernel above the
// Triton GEMV's rows (a prompt's forward in transformers' uncompiled prefill).
//
// Built by kernels/cuda_rows.py with nvcc and called through ctypes on torch's current stream.
// Why: eagerly, the host's time per call is the cost. The dequantizing path launches three
// kernels (cast, bf16 GEMM, scale multiply), nn.Linear one, and a Triton kernel's Python launcher
// costs the host what three aten launches do (benchmarks/results/2026-12-04-h200/prefill/); a
// ctypes call is one C call.
//
// y [M, N] bf16 = (x [M, K] bf16 @ w [N, K]^T) * scale [N], w int8 or e4m3, scale fp32 or bf16:
// - a CTA owns 16 output columns (weight rows); its kWarps warps split K in 64-k chunks and add
//   their fp32 partials through shared memory at the end, where the scale applies once;
// - per chunk each lane loads 16 weight bytes of rows g and g + 8 (g = lane / 4, t = lane % 4;
//   k = 64c + 16t .. +16), converted exactly to bf16 in registers: its mma.m16n8k16 A operand
//   (weight rows x k) for four k-steps. The dot product does not care about k's order, so the
//   B operand (x^T, k x 8 rows of x) is permuted the same way: k-step j of lane t reads x at
//   64c + 16t + 4j .. +4, the 8 bytes that are its two B registers;
// - the weight tile's registers serve every 8-row block of x (MB = ceil(M / 8) blocks), so the
//   weight is read once whatever M; x is read once per CTA, from L2.
// Requirements (checked by the caller): N % 16 == 0, K % 64 == 0, w and x 16-byte aligned, x's
// row stride a multiple of 8 elements.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kWarps = 4;
constexpr int kMaxBlocks = 8;  // 8-row blocks: M <= 64

// c[4] (16x8 fp32 C fragment) += A (16x16 bf16, 4 registers) @ B (16x8 bf16, 2 registers)
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);  // lo in the low half
  return *reinterpret_cast<uint32_t*>(&p);
}

// Two weights (bytes 0-1 of w) -> bf16x2, exactly: int8 (|q| <= 128 fits bf16's 8 significant
// bits) or e4m3 (3 mantissa bits, exponents inside bf16's range; through f16, also exact).
template <bool kFp8>
__device__ __forceinline__ uint32_t pair(uint32_t w) {
  if constexpr (kFp8) {
    __half2 h(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3));
    float2 f = __half22float2(h);
    return bf16x2(f.x, f.y);
  } else {
    return bf16x2(static_cast<float>(static_cast<int8_t>(w & 0xffu)),
                  static_cast<float>(static_cast<int8_t>((w >> 8) & 0xffu)));
  }
}

template <int MB, bool kFp8>
__global__ void __launch_bounds__(kWarps * 32)
    wo_rows(const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ w, const void* __restrict__ scale,
            int scale_bf16, __nv_bfloat16* __restrict__ y, int m, int n, int k, long long ldx) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16;
  const uint8_t* w_lo = w + static_cast<size_t>(n0 + g) * k + 16 * t;  // weight row n0 + g
  const uint8_t* w_hi = w_lo + static_cast<size_t>(8) * k;            // weight row n0 + g + 8
  float acc[MB][4] = {};
  for (int c = warp; c < (k >> 6); c += kWarps) {
    const uint4 lo = __ldg(reinterpret_cast<const uint4*>(w_lo + 64 * c));
    const uint4 hi = __ldg(reinterpret_cast<const uint4*>(w_hi + 64 * c));
    const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w}, wh[4] = {hi.x, hi.y, hi.z, hi.w};
    uint32_t a[4][4];  // k-step j: {row g k 0-1, row g+8 k 0-1, row g k 2-3, row g+8 k 2-3}
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[j][0] = pair<kFp8>(wl[j]);
      a[j][1] = pair<kFp8>(wh[j]);
      a[j][2] = pair<kFp8>(wl[j] >> 16);
      a[j][3] = pair<kFp8>(wh[j] >> 16);
    }
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const int row = 8 * b + g;
      uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
      if (row < m) {
        const uint4* px = reinterpret_cast<const uint4*>(x + row * ldx + 64 * c + 16 * t);
        x0 = px[0];
        x1 = px[1];
      }
      mma(acc[b], a[0], x0.x, x0.y);
      mma(acc[b], a[1], x0.z, x0.w);
      mma(acc[b], a[2], x1.x, x1.y);
      mma(acc[b], a[3], x1.z, x1.w);
    }
  }
  // C fragment: acc[b][i] is weight row n0 + g + 8 (i / 2), x row 8b + 2t + (i % 2)
  __shared__ float part[kWarps][MB * 4 * 32];
#pragma unroll
  for (int b = 0; b < MB; ++b)
#pragma unroll
    for (int i = 0; i < 4; ++i) part[warp][(b * 4 + i) * 32 + lane] = acc[b][i];
  __syncthreads();
  for (int e = threadIdx.x; e < MB * 4 * 32; e += kWarps * 32) {
    const int b = e >> 7, i = (e >> 5) & 3, l = e & 31;
    const int row = 8 * b + 2 * (l & 3) + (i & 1), col = n0 + (l >> 2) + 8 * (i >> 1);
    if (row >= m) continue;
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) s += part[v][e];
    const float sc = scale_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(scale)[col])
                                : static_cast<const float*>(scale)[col];
    y[static_cast<size_t>(row) * n + col] = __float2bfloat16(s * sc);
  }
}

template <bool kFp8>
void launch(int mb, const __nv_bfloat16* x, const uint8_t* w, const void* s, int s_bf16, __nv_bfloat16* y, int m,
            int n, int k, long long ldx, cudaStream_t stream) {
  const dim3 grid(n / 16), block(kWarps * 32);
  switch (mb) {
#define AUTOAO_CASE(MB) \
  case MB: wo_rows<MB, kFp8><<<grid, block, 0, stream>>>(x, w, s, s_bf16, y, m, n, k, ldx); break;
    AUTOAO_CASE(1) AUTOAO_CASE(2) AUTOAO_CASE(3) AUTOAO_CASE(4)
    AUTOAO_CASE(5) AUTOAO_CASE(6) AUTOAO_CASE(7) AUTOAO_CASE(8)
#undef AUTOAO_CASE
  }
}

}  // namespace

extern "C" {

// y [m, n] = (x [m, k] @ w^T) * scale; w [n, k] int8 (fp8 = 0) or e4m3 (fp8 = 1); scale [n] fp32
// (scale_bf16 = 0) or bf16. 0 on success, -1 for unsupported sizes, else the CUDA error.
int autoao_wo_rows(const void* x, const void* w, const void* scale, int scale_bf16, void* y, int m, int n, int k,
                   long long ldx, int fp8, void* stream) {
  if (m < 1 || m > 8 * kMaxBlocks || n < 16 || n % 16 || k < 64 || k % 64 || ldx % 8) return -1;
  const int mb = (m + 7) / 8;
  auto xs = static_cast<const __nv_bfloat16*>(x);
  auto ws = static_cast<const uint8_t*>(w);
  auto ys = static_cast<__nv_bfloat16*>(y);
  auto st = static_cast<cudaStream_t>(stream);
  if (fp8)
    launch<true>(mb, xs, ws, scale, scale_bf16, ys, m, n, k, ldx, st);
  else
    launch<false>(mb, xs, ws, scale, scale_bf16, ys, m, n, k, ldx, st);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
