// int4 weight-only GEMV / skinny GEMM (M <= 8 tokens) on tensor cores: autoao's "cuda" int4 kernel.
//
// Built by kernels/cuda_int4.py with nvcc (one shared library per group size, -DAUTOAO_GROUP=G) and
// called through ctypes on torch's current stream; the layouts are made by pack_mma() there.
//
// Why: at M = 1 a layer's only job is to stream its weights once. The Triton int4 kernels reach
// ~2 TB/s on the H200: the CUDA-core ones issue ~3 instructions per nibble, and Triton's
// tensor-core one routes x and the weight tile through shared memory with CTA barriers
// (benchmarks/NOTES.md, session 4). Here every weight byte goes global memory -> registers ->
// tensor core, with no shared memory and no barrier until the final cross-warp sum:
// - the weights are pre-permuted (pack_mma) so that one 16-byte load per lane is exactly its
//   mma.m16n8k16 A-operand registers for four k-steps of one 16-row tile;
// - a nibble pair becomes the bf16x2 (128 + q0, 128 + q1) by one LOP3 (0x4300 | q is bf16 128 + q);
//   3 shifts + 4 LOP3 per 8 weights, then one mma: ~1 instruction per weight;
// - scales and zeros apply once per group and row: sum_k w x = s * sum (128 + q) x + (z - 136 s) X
//   with X = sum_k x over the group, which a second mma (A = ones) gives in the C layout;
// - persistent stream-K schedule: each warp streams an equal run of the layer's (tile, unit)
//   sequence with a register ring of PU units of loads (PU - 1 in flight); tiles split between
//   warps are summed by fp32 atomics, the last contributor writing the output.
//
// Layouts (N, K: weight [N, K]; G: group size; UK = max(G, 64) k per unit; GU = UK / G):
//   qw [N/16, K/64, 32 lanes, 4] uint32: word j (k-step within the 64-chunk) of lane (g, t)
//     (g = lane / 4, t = lane % 4) holds rows 16T + g (nibbles at bits 0,16,8,24) and 16T + g + 8
//     (bits 4,20,12,28) at k = 64c + 32(j/2) + 8t + 4(j%2) + e, e = 0..3 in that bit order.
//   sz [N/16, K/UK, 8, GU, 2] uint32: (bf16 scale | bf16 zero << 16) for row 16T + g (+8 for the
//     last index = 1) and group GU*u + i.
//   x [M, K] bf16 with row stride x_stride (elements; a multiple of 8, 16-byte aligned rows);
//   y [M, N] bf16.
// So that 16-byte x loads match, the mma's k order is permuted the same way on both operands:
// lane t's loads of x[64c + 32h + 8t .. +8] give its B registers for k-steps 2h and 2h + 1.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#ifndef AUTOAO_GROUP
#error "compile with -DAUTOAO_GROUP=32|64|128"
#endif

namespace {

constexpr uint32_t kOnes = 0x3F803F80u;  // bf16x2 (1.0, 1.0)

// bits 0-3 and 16-19 of w -> bf16x2 (128 + q_lo, 128 + q_hi): (w & 0x000f000f) | 0x43004300
__device__ __forceinline__ uint32_t nib2(uint32_t w) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(w), "n"(0x000f000f), "n"(0x43004300));
  return r;
}

// c[4] (16x8 fp32 C fragment) += A (16x16 bf16, 4 registers) @ B (16x8 bf16, 2 registers)
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                    uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int GU> struct SzVec;
template <> struct SzVec<1> { using type = uint2; };
template <> struct SzVec<2> { using type = uint4; };

[[maybe_unused]] __device__ __forceinline__ uint32_t word(const uint2& v, int i) { return i == 0 ? v.x : v.y; }

// Output of one tile's partial sums (C fragment acc: [0] = (row g, token 2t), [1] = (g, 2t + 1),
// [2] = (g + 8, 2t), [3] = (g + 8, 2t + 1)). A warp that ran the whole tile writes y; otherwise it
// adds into the fp32 scratch and the last of the tile's `parts` contributors to arrive converts
// the sums to y and zeroes the scratch and the counter behind it (ready for the next call, or a
// CUDA graph's next replay).
__device__ __forceinline__ void flush(const float (&acc)[4], int tile, int parts, int g, int t, int lane, int M, int N,
                                      __nv_bfloat16* __restrict__ y, float* __restrict__ sums, int* __restrict__ arrived) {
  const long long n0 = (long long)tile * 16 + g, n1 = n0 + 8;
  const int m0 = 2 * t, m1 = 2 * t + 1;
  if (parts == 1) {
    if (m0 < M) y[m0 * N + n0] = __float2bfloat16(acc[0]), y[m0 * N + n1] = __float2bfloat16(acc[2]);
    if (m1 < M) y[m1 * N + n0] = __float2bfloat16(acc[1]), y[m1 * N + n1] = __float2bfloat16(acc[3]);
    return;
  }
  if (m0 < M) atomicAdd(sums + m0 * N + n0, acc[0]), atomicAdd(sums + m0 * N + n1, acc[2]);
  if (m1 < M) atomicAdd(sums + m1 * N + n0, acc[1]), atomicAdd(sums + m1 * N + n1, acc[3]);
  __threadfence();
  __syncwarp();
  int last = 0;
  if (lane == 0) last = atomicAdd(arrived + tile, 1) == parts - 1;
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();
  if (m0 < M) {
    y[m0 * N + n0] = __float2bfloat16(atomicExch(sums + m0 * N + n0, 0.f));
    y[m0 * N + n1] = __float2bfloat16(atomicExch(sums + m0 * N + n1, 0.f));
  }
  if (m1 < M) {
    y[m1 * N + n0] = __float2bfloat16(atomicExch(sums + m1 * N + n0, 0.f));
    y[m1 * N + n1] = __float2bfloat16(atomicExch(sums + m1 * N + n1, 0.f));
  }
  if (lane == 0) arrived[tile] = 0;
}

// One warp streams `per_warp` consecutive units of the layer's (tile, unit) sequence: a persistent,
// stream-K schedule over as many warps as fit on the GPU at once, so every warp's pipeline fills once
// and stays full across tile boundaries (a warp per tile-slice restarted it for each short slice,
// and the last wave ran half empty).
template <int G, int KW, int PU>
__global__ void __launch_bounds__(KW * 32)
int4_mma_gemv(const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ qw, const uint32_t* __restrict__ sz,
              __nv_bfloat16* __restrict__ y, float* __restrict__ sums, int* __restrict__ arrived, int M, int N, int K,
              long long x_stride, int per_warp) {
  constexpr int UK = G > 64 ? G : 64;  // k per unit: whole groups and whole 64-k chunks
  constexpr int UC = UK / 64;          // 64-k chunks per unit
  constexpr int GU = UK / G;           // groups per unit
  constexpr int SPG = G / 16;          // mma k-steps per group
  using SZ = typename SzVec<GU>::type;

  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int units = K / UK;                                 // per tile
  const long long total = (long long)(N / 16) * units;      // in the layer
  const long long f0 = ((long long)blockIdx.x * KW + (threadIdx.x >> 5)) * per_warp;
  if (f0 >= total) return;
  const int nu = (int)min((long long)per_warp, total - f0);
  int tile = (int)(f0 / units), u = (int)(f0 % units);  // the unit being computed
  // B column g is token g (with fewer tokens the extra columns repeat the last one: never stored)
  const __nv_bfloat16* xrow = x + (long long)min(g, M - 1) * x_stride + 8 * t;
  // the layouts are [tile][unit] contiguous: unit f of the layer sits at f * (unit size)
  const uint4* wq = qw + f0 * UC * 32 + lane;
  const SZ* sq = reinterpret_cast<const SZ*>(sz) + f0 * 8 + g;
  auto parts = [&](int tl) {  // warps contributing to tile tl
    return (int)(((long long)tl * units + units - 1) / per_warp - (long long)tl * units / per_warp + 1);
  };

  // The ring: PU units of loads in registers; slot p holds the unit i + p and is refilled right
  // after its unit is computed, so PU - 1 units are in flight during each unit's math. Offsets
  // from the pointers are compile-time constants; the pointers move once per PU units. x is not in
  // the ring (its registers would halve the weights' depth): it is read per unit from L1, where the
  // whole of x (<= 8 x K bf16) stays after first use.
  uint4 wb[PU][UC];
  SZ sb[PU];
  auto load = [&](uint4 (&w)[UC], SZ& s, int off) {
#pragma unroll
    for (int ch = 0; ch < UC; ++ch) w[ch] = __ldcs(wq + (off * UC + ch) * 32);  // streamed once
    s = __ldg(sq + off * 8);
  };
#pragma unroll
  for (int p = 0; p < PU; ++p)
    if (p < nu) load(wb[p], sb[p], p);

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < nu; i += PU) {
#pragma unroll
    for (int p = 0; p < PU; ++p) {
      if (i + p < nu) {
        uint4 xv[UC][2];
#pragma unroll
        for (int ch = 0; ch < UC; ++ch) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            xv[ch][h] = __ldg(reinterpret_cast<const uint4*>(xrow + u * UK + ch * 64 + 32 * h));
        }
        float c[4], xs[4];
#pragma unroll
        for (int st = 0; st < 4 * UC; ++st) {  // k-steps of this unit
          const int ch = st / 4, j = st % 4;
          if (st % SPG == 0) xs[0] = xs[1] = xs[2] = xs[3] = c[0] = c[1] = c[2] = c[3] = 0.f;
          const uint4& xw = xv[ch][j / 2];
          const uint32_t b0 = word(xw, 2 * (j % 2)), b1 = word(xw, 2 * (j % 2) + 1);
          mma(xs, kOnes, kOnes, kOnes, kOnes, b0, b1);  // xs: sum of x over the group, C layout
          const uint32_t q = word(wb[p][ch], j);
          mma(c, nib2(q), nib2(q >> 4), nib2(q >> 8), nib2(q >> 12), b0, b1);
          if (st % SPG == SPG - 1) {  // group done: scale, zero
            const int gi = st / SPG;
            const uint32_t pa = word(sb[p], 2 * gi), pb = word(sb[p], 2 * gi + 1);  // rows g, g + 8
            const float sa = __uint_as_float(pa << 16), za = __uint_as_float(pa & 0xffff0000u);
            const float sb2 = __uint_as_float(pb << 16), zb = __uint_as_float(pb & 0xffff0000u);
            const float zza = fmaf(-136.f, sa, za), zzb = fmaf(-136.f, sb2, zb);
            acc[0] = fmaf(sa, c[0], fmaf(zza, xs[0], acc[0]));
            acc[1] = fmaf(sa, c[1], fmaf(zza, xs[1], acc[1]));
            acc[2] = fmaf(sb2, c[2], fmaf(zzb, xs[2], acc[2]));
            acc[3] = fmaf(sb2, c[3], fmaf(zzb, xs[3], acc[3]));
          }
        }
        if (i + p + PU < nu) load(wb[p], sb[p], p + PU);
        if (++u == units || i + p + 1 == nu) {  // the tile ends here, or this warp's share does
          flush(acc, tile, parts(tile), g, t, lane, M, N, y, sums, arrived);
          acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
          ++tile;
          u = 0;
        }
      }
    }
    wq += PU * UC * 32;
    sq += PU * 8;
  }
}

template <int KW, int PU>
int launch(const void* x, const void* qw, const void* sz, void* y, void* sums, void* arrived, int M, int N, int K,
           long long x_stride, int fill, cudaStream_t stream) {
  auto kernel = int4_mma_gemv<AUTOAO_GROUP, KW, PU>;
  static int resident = 0;  // warps of this kernel the whole GPU holds at once (asked once)
  if (resident == 0) {
    int device, sms, blocks;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, KW * 32, 0);
    resident = sms * blocks * KW;
  }
  constexpr int UK = AUTOAO_GROUP > 64 ? AUTOAO_GROUP : 64;
  const long long total = (long long)(N / 16) * (K / UK);
  const long long warps = (long long)resident * fill;
  const int per_warp = (int)((total + warps - 1) / warps);
  const long long used = (total + per_warp - 1) / per_warp;
  kernel<<<(unsigned)((used + KW - 1) / KW), KW * 32, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<const uint4*>(qw), static_cast<const uint32_t*>(sz),
      static_cast<__nv_bfloat16*>(y), static_cast<float*>(sums), static_cast<int*>(arrived), M, N, K, x_stride,
      per_warp);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

// The configurations built (cuda_int4.CONFIGS lists the same; autoao's tuner times them with
// fill 1 and 2): KW warps per CTA, PU units in each warp's register ring (PU - 1 in flight).
#define AUTOAO_CONFIGS(X) X(4, 2) X(4, 3) X(4, 4) X(8, 2) X(8, 3) X(8, 4)

extern "C" {

// Returns 0 on success, -1 for a configuration not built, else a cudaError_t. Launches `fill` x
// as many warps as the GPU holds at once (fewer if the layer has fewer units). sums: M * N floats,
// arrived: N / 16 ints, both zero before the first call (the kernel leaves them so).
int autoao_int4_mma_gemv(const void* x, const void* qw, const void* sz, void* y, void* sums, void* arrived, int M,
                         int N, int K, long long x_stride, int kw, int ring, int fill, void* stream) {
#define AUTOAO_CASE(W, P)                                                                                     \
  if (kw == W && ring == P)                                                                                   \
    return launch<W, P>(x, qw, sz, y, sums, arrived, M, N, K, x_stride, fill, static_cast<cudaStream_t>(stream));
  AUTOAO_CONFIGS(AUTOAO_CASE)
#undef AUTOAO_CASE
  return -1;
}

int autoao_int4_mma_group() { return AUTOAO_GROUP; }

}  // extern "C"
