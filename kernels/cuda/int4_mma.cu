// int4 weight-only GEMV / skinny GEMM (M <= 8 tokens) on tensor cores: autoao's "cuda" int4 kernel.
//
// Built by kernels/cuda_int4.py with nvcc (one shared library per group size, -DAUTOAO_GROUP=G) and
// called through ctypes on torch's current stream; the layouts are made by pack_mma() there.
//
// Why: at M = 1 a layer's only job is to stream its weights once. The Triton int4 kernels reach
// ~2 TB/s on the H200: the CUDA-core ones issue ~3 instructions per nibble, and Triton's
// tensor-core one routes x and the weight tile through shared memory with CTA barriers
// (measured: docs/kernels.md#int4_wo). Here every weight byte goes
// global memory -> registers -> tensor core, with no shared memory and no barrier until the final
// cross-warp sum:
// - the weights are pre-permuted (pack_mma) so that one 16-byte load per lane is exactly its
//   mma.m16n8k16 A-operand registers for four k-steps of one 16-row tile;
// - a nibble pair becomes the bf16x2 (128 + q0, 128 + q1) by one LOP3 (0x4300 | q is bf16 128 + q);
//   3 shifts + 4 LOP3 per 8 weights, then one mma: ~1 instruction per weight;
// - scales and zeros apply once per group and row: sum_k w x = s * sum (128 + q) x + (z - 136 s) X
//   with X = sum_k x over the group, which a second mma (A = ones) gives in the C layout;
// - several k-chunks of loads are in flight per warp (a register ring of PU units), warps of a
//   CTA split K and add their partial sums through shared memory once at the end; optionally
//   CTAs split K too (gridDim.y), the last of a column block to finish adding the fp32 partials;
// - sm_90+: programmatic dependent launch (griddepcontrol; inside CUDA graphs the ring's first
//   weight loads go out before the wait) and an L2 bulk prefetch, by the last wave, of the next
//   layer's first weights (both optional: cuda_int4.LaunchOptions, which gives the measurements);
// - some configs cap registers (__launch_bounds__ with a minimum of CTAs per SM) for more warps per
//   SM: the weight stream's bandwidth follows warps per SM, not loads in flight per warp
//   (docs/kernels.md#the-gpus-ceilings).
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

template <int G, int RT, int KW, int PU, int MINB>
__global__ void __launch_bounds__(KW * 32, MINB > 1 ? MINB : 0)  // 0: no minimum (nvcc picks)
int4_mma_gemv(const __nv_bfloat16* __restrict__ x, const uint4* __restrict__ qw, const uint32_t* __restrict__ sz,
              __nv_bfloat16* __restrict__ y, float* __restrict__ partials, int* __restrict__ arrived, int M, int N,
              int K, long long x_stride, const char* __restrict__ next_w, long long next_w_bytes,
              const char* __restrict__ next_s, long long next_s_bytes, int tail, int early) {
  constexpr int UK = G > 64 ? G : 64;  // k per unit: whole groups and whole 64-k chunks
  constexpr int UC = UK / 64;          // 64-k chunks per unit
  constexpr int GU = UK / G;           // groups per unit
  constexpr int SPG = G / 16;          // mma k-steps per group
  using SZ = typename SzVec<GU>::type;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ntiles = N / 16, nchunks = K / 64, nunits = K / UK;
  const int tile0 = blockIdx.x * RT;
  // This CTA's units of K (split-K over gridDim.y CTAs), then this warp's share: [u0, u0 + nu).
  const int cu0 = blockIdx.y * nunits / gridDim.y, cnu = (blockIdx.y + 1) * nunits / gridDim.y - cu0;
  const int u0 = cu0 + warp * cnu / KW, nu = cu0 + (warp + 1) * cnu / KW - u0;
  // B column g is token g (with fewer tokens the extra columns repeat the last one: never stored)
  const __nv_bfloat16* xq = x + (long long)min(g, M - 1) * x_stride + 8 * t + (long long)u0 * UK;
  const uint4* wq[RT];
  const SZ* sq[RT];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    const long long T = min(tile0 + r, ntiles - 1);  // past the last tile: a copy, never stored
    wq[r] = qw + (T * nchunks + (long long)u0 * UC) * 32 + lane;
    sq[r] = reinterpret_cast<const SZ*>(sz) + (T * nunits + u0) * 8 + g;
  }

  // The ring of weight loads: PU units; slot p holds unit u0 + i + p and is refilled right after
  // its unit is computed, so PU - 1 units of weights are in flight during each unit's math.
  // Offsets from the pointers are compile-time constants (folded into the load instructions); the
  // pointers move once per PU units. x is not in the ring (its registers would halve the weights'
  // depth; loading it one unit ahead measured no faster): each unit's x is read at its top.
  uint4 wb[PU][RT][UC];
  SZ sb[PU][RT];
  auto load = [&](uint4 (&w)[RT][UC], SZ (&s)[RT], int off) {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
#pragma unroll
      for (int ch = 0; ch < UC; ++ch) w[r][ch] = __ldcs(wq[r] + (off * UC + ch) * 32);  // streamed once
      s[r] = __ldg(sq[r] + off * 8);
    }
  };

  float acc[RT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;

  // early: the ring's first loads go out before waiting for the previous kernel, so their DRAM
  // latency overlaps its tail (the host passes early = 0 unless the weights and scales were written
  // before that kernel: cuda_int4._launch).
  if (early) {
#pragma unroll
    for (int p = 0; p < PU; ++p)
      if (p < nu) load(wb[p], sb[p], p);
  }
#if __CUDA_ARCH__ >= 900
  // x (and y, partials, arrived) may belong to the previous kernel: with programmatic dependent
  // launch (the host's pdl flag) nothing reads or writes them before it has finished. Then let the
  // next kernel launch (its own wait guards its reads). Without PDL the wait returns at once.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if (!early) {
#pragma unroll
    for (int p = 0; p < PU; ++p)
      if (p < nu) load(wb[p], sb[p], p);
  }

  for (int i = 0; i < nu; i += PU) {
#pragma unroll
    for (int p = 0; p < PU; ++p) {
      if (i + p < nu) {
        uint4 xv[UC][2];
#pragma unroll
        for (int ch = 0; ch < UC; ++ch) {
#pragma unroll
          for (int h = 0; h < 2; ++h) xv[ch][h] = __ldg(reinterpret_cast<const uint4*>(xq + p * UK + ch * 64 + 32 * h));
        }
        // Two accumulators per product, even and odd k-steps: the mma's accumulator chain (one
        // dependent HMMA per k-step, ~30 cycles each) is half as long before the group's epilogue.
        float c[RT][2][4], xs[2][4];
#pragma unroll
        for (int st = 0; st < 4 * UC; ++st) {  // k-steps of this unit
          const int ch = st / 4, j = st % 4, e = st & 1;
          if (st % SPG < 2) {
#pragma unroll
            for (int v = 0; v < 4; ++v) xs[e][v] = 0.f;
#pragma unroll
            for (int r = 0; r < RT; ++r) c[r][e][0] = c[r][e][1] = c[r][e][2] = c[r][e][3] = 0.f;
          }
          const uint4& xw = xv[ch][j / 2];
          const uint32_t b0 = word(xw, 2 * (j % 2)), b1 = word(xw, 2 * (j % 2) + 1);
          mma(xs[e], kOnes, kOnes, kOnes, kOnes, b0, b1);  // xs: sum of x over the group, C layout
#pragma unroll
          for (int r = 0; r < RT; ++r) {
            const uint32_t q = word(wb[p][r][ch], j);
            mma(c[r][e], nib2(q), nib2(q >> 4), nib2(q >> 8), nib2(q >> 12), b0, b1);
          }
          if (st % SPG == SPG - 1) {  // group done: scale, zero
            const int gi = st / SPG;
            float X[4];
#pragma unroll
            for (int v = 0; v < 4; ++v) X[v] = xs[0][v] + xs[1][v];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
              const uint32_t pa = word(sb[p][r], 2 * gi), pb = word(sb[p][r], 2 * gi + 1);  // rows g, g + 8
              const float sa = __uint_as_float(pa << 16), za = __uint_as_float(pa & 0xffff0000u);
              const float sb2 = __uint_as_float(pb << 16), zb = __uint_as_float(pb & 0xffff0000u);
              const float zza = fmaf(-136.f, sa, za), zzb = fmaf(-136.f, sb2, zb);
              acc[r][0] = fmaf(sa, c[r][0][0] + c[r][1][0], fmaf(zza, X[0], acc[r][0]));
              acc[r][1] = fmaf(sa, c[r][0][1] + c[r][1][1], fmaf(zza, X[1], acc[r][1]));
              acc[r][2] = fmaf(sb2, c[r][0][2] + c[r][1][2], fmaf(zzb, X[2], acc[r][2]));
              acc[r][3] = fmaf(sb2, c[r][0][3] + c[r][1][3], fmaf(zzb, X[3], acc[r][3]));
            }
          }
        }
        if (i + p + PU < nu) load(wb[p], sb[p], p + PU);
      }
    }
#pragma unroll
    for (int r = 0; r < RT; ++r) wq[r] += PU * UC * 32, sq[r] += PU * 8;
    xq += PU * UK;
  }

#if __CUDA_ARCH__ >= 900
  // Bring the first bytes of the next layer's weights (the GEMV that runs after this one; the host
  // passes them) into L2 while this kernel's tail wave, and the kernels between the two GEMVs (norms,
  // attention), leave DRAM idle. Only the last `tail` CTAs (the host's estimate of the last wave)
  // issue it, each one bulk prefetch of its share: issued earlier, it takes bandwidth from this
  // layer's own stream (issued by every CTA, 24 MB of prefetch took llama8's linear layers at M=1
  // from 0.460 to 0.482 ms per forward; docs/kernels.md#int4_wo). A prefetch is only a hint (L2 is coherent,
  // nothing is read early), so a wrong guess of the next layer costs bandwidth, never correctness.
  const long long ctas = (long long)gridDim.x * gridDim.y, cta = (long long)blockIdx.y * gridDim.x + blockIdx.x;
  const long long first = ctas > tail ? ctas - tail : 0;
  if (threadIdx.x == 0 && cta >= first) {
    const char* base[2] = {next_w, next_s};
    const long long bytes[2] = {next_w_bytes, next_s_bytes};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const long long n = ctas - first, share = ((bytes[i] + n - 1) / n + 15) & ~15LL, lo = (cta - first) * share;
      const long long len = min(share, bytes[i] - lo);  // share: whole 16-byte blocks
      if (base[i] != nullptr && len > 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base[i] + lo), "r"((unsigned)len) : "memory");
    }
  }
#endif

  // C fragment: acc[r][0] = (row g, token 2t), [1] = (g, 2t + 1), [2] = (g + 8, 2t), [3] = (g + 8, 2t + 1)
  __shared__ float red[KW][RT][16][8];
  __shared__ bool last;
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    red[warp][r][g][2 * t] = acc[r][0];
    red[warp][r][g][2 * t + 1] = acc[r][1];
    red[warp][r][g + 8][2 * t] = acc[r][2];
    red[warp][r][g + 8][2 * t + 1] = acc[r][3];
  }
  __syncthreads();
  // outputs i < RT * 16 * M: row r * 16 + i % 16 of this CTA, token (i / 16) % M
  const int split = gridDim.y, outs = RT * 16 * M;
  for (int i = threadIdx.x; i < outs; i += KW * 32) {
    const int r = i / (16 * M), m = (i / 16) % M, row = i % 16;
    if (tile0 + r >= ntiles) continue;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < KW; ++w) v += red[w][r][row][m];
    const long long o = (long long)m * N + (tile0 + r) * 16 + row;
    if (split == 1)
      y[o] = __float2bfloat16(v);
    else
      partials[(long long)blockIdx.y * M * N + o] = v;
  }
  if (split == 1) return;
  // Split-K: partials [split, M, N] fp32; the last CTA of this column block to arrive adds them up,
  // writes y and re-arms the counter (so the next call, or a CUDA graph's next replay, starts at 0).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrived + blockIdx.x, 1) == split - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < outs; i += KW * 32) {
    const int r = i / (16 * M), m = (i / 16) % M, row = i % 16;
    if (tile0 + r >= ntiles) continue;
    const long long o = (long long)m * N + (tile0 + r) * 16 + row;
    float sum = 0.f;
    for (int s2 = 0; s2 < split; ++s2) sum += __ldcg(partials + (long long)s2 * M * N + o);
    y[o] = __float2bfloat16(sum);
  }
  if (threadIdx.x == 0) arrived[blockIdx.x] = 0;
}

template <int RT, int KW, int PU, int MINB>
int launch(const void* x, const void* qw, const void* sz, void* y, void* partials, void* arrived, int M, int N, int K,
           long long x_stride, int split, const void* next_w, long long next_w_bytes, const void* next_s,
           long long next_s_bytes, int pdl, int early, cudaStream_t stream) {
  const int tiles = N / 16;
  // the CTAs the GPU holds at once: the last wave, which prefetches the next layer (once per config;
  // assumes one GPU model per process)
  static int wave = 0;
  if (wave == 0 && next_w != nullptr) {
    int device = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, int4_mma_gemv<AUTOAO_GROUP, RT, KW, PU, MINB>, KW * 32, 0);
    wave = sms * per_sm > 0 ? sms * per_sm : 1;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((tiles + RT - 1) / RT, split);
  config.blockDim = dim3(KW * 32);
  config.stream = stream;
  // pdl: programmatic dependent launch (sm_90+): this grid may start while the previous kernel in
  // the stream finishes (the kernel waits for it before touching x); captured by CUDA graphs.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  return static_cast<int>(cudaLaunchKernelEx(
      &config, int4_mma_gemv<AUTOAO_GROUP, RT, KW, PU, MINB>, static_cast<const __nv_bfloat16*>(x),
      static_cast<const uint4*>(qw), static_cast<const uint32_t*>(sz), static_cast<__nv_bfloat16*>(y),
      static_cast<float*>(partials), static_cast<int*>(arrived), M, N, K, x_stride,
      static_cast<const char*>(next_w), next_w_bytes, static_cast<const char*>(next_s), next_s_bytes, wave,
      pdl ? early : 0));
}

// The weight [N, K] bf16 from the layouts, w = (q - 8) * scale + zero rounded as torch's
// dequantize_mma computes it (fp32 multiply, fp32 add, one rounding to bf16; no FMA): the "cuda"
// kernel's path for more than 8 rows, which runs one bf16 GEMM on it. One thread per 32-bit word
// of qw: its 8 nibbles are rows 16T + g and 16T + g + 8 at 4 consecutive k, stored as one 8-byte
// write per row (16 threads cover a row's 64 k of a chunk: whole 128-byte lines). Two numbers per
// weight: 0.5 byte read (+ scales), 2 bytes written; no math to speak of: a copy-bound kernel.
constexpr int kDequantChunks = 8;  // 64-k chunks per CTA (grid.y = K / 64 / 8)

template <int G>
__global__ void __launch_bounds__(128) int4_mma_dequant(const uint32_t* __restrict__ qw,
                                                        const uint32_t* __restrict__ sz,
                                                        __nv_bfloat16* __restrict__ w, int K) {
  constexpr int UK = G > 64 ? G : 64;
  constexpr int GU = UK / G;
  const int nchunks = K / 64, nunits = K / UK;
  const long long T = blockIdx.x;
  const int i = threadIdx.x;  // the word of a (tile, chunk) block: lane i / 4, word j = i % 4
  const int lane = i >> 2, j = i & 3;
  const int g = lane >> 2, t = lane & 3, h = j >> 1, s = j & 1;
  const int c_end = min(nchunks, (int)(blockIdx.y + 1) * kDequantChunks);
#pragma unroll 4
  for (int c = blockIdx.y * kDequantChunks; c < c_end; ++c) {
    const uint32_t q = __ldg(qw + (T * nchunks + c) * 128 + i);
    const int k = c * 64 + 32 * h + 8 * t + 4 * s;  // this word's first k; its 4 k share a group
    const int grp = k / G;
    const uint32_t* p = sz + ((T * nunits + grp / GU) * 8 + g) * (GU * 2) + (grp % GU) * 2;
#pragma unroll
    for (int ro = 0; ro < 2; ++ro) {
      const uint32_t pair = __ldg(p + ro);
      const float scale = __uint_as_float(pair << 16), zero = __uint_as_float(pair & 0xFFFF0000u);
      // nibble bit positions of k offsets e = 0..3: 0, 16, 8, 24 for row g; + 4 for row g + 8
      const uint32_t qr = q >> (4 * ro);
      const float v0 = __fadd_rn(__fmul_rn((float)(qr & 15) - 8.f, scale), zero);
      const float v1 = __fadd_rn(__fmul_rn((float)((qr >> 16) & 15) - 8.f, scale), zero);
      const float v2 = __fadd_rn(__fmul_rn((float)((qr >> 8) & 15) - 8.f, scale), zero);
      const float v3 = __fadd_rn(__fmul_rn((float)((qr >> 24) & 15) - 8.f, scale), zero);
      __nv_bfloat162 lo = __floats2bfloat162_rn(v0, v1), hi = __floats2bfloat162_rn(v2, v3);
      uint2 out;
      out.x = *reinterpret_cast<uint32_t*>(&lo);
      out.y = *reinterpret_cast<uint32_t*>(&hi);
      *reinterpret_cast<uint2*>(w + (T * 16 + g + 8 * ro) * K + k) = out;
    }
  }
}

}  // namespace

// The configurations built (cuda_int4.CONFIGS lists each with the split-K values its tuner times,
// split-K being a launch parameter): RT row tiles of 16 per warp, KW warps splitting K, CIF 64-k chunks of
// weights in flight per warp while one unit is computed (the ring holds CIF / UC + 1 units; CIF 0:
// one unit, nothing in flight during its math), MB: at least MB CTAs per SM (__launch_bounds__),
// which caps the registers per thread. Why MB: a warp's stream of weights runs at a rate that
// more loads in flight per warp do not raise, so bandwidth comes from warps per SM (measured with a
// read-only kernel, docs/kernels.md#the-gpus-ceilings), and registers bound the warps.
#define AUTOAO_CONFIGS(X) \
  X(1, 2, 0, 16) X(1, 4, 0, 8) X(1, 8, 0, 4) X(1, 8, 2, 1) X(1, 8, 2, 4) X(2, 8, 2, 1)

extern "C" {

// Returns 0 on success, -1 for a configuration not built, else the cudaError_t of the launch.
// split > 1: partials must hold split * M * N floats and arrived N / 16 ints, zero
// before the first call (the kernel leaves them so). next_w/next_s (sm_90+; null: none): the first
// bytes of the next GEMV's weights and scales, prefetched into L2 (a multiple of 16 bytes from
// 16-byte aligned addresses). pdl (sm_90+ only): launched with programmatic stream serialization;
// early (with pdl): the first weight loads go out before the wait for the previous kernel, which must
// not be the one that wrote qw or sz. (rt, kw, cif, minb): the configuration (AUTOAO_CONFIGS).
int autoao_int4_mma_gemv(const void* x, const void* qw, const void* sz, void* y, void* partials, void* arrived,
                         int M, int N, int K, long long x_stride, int rt, int kw, int cif, int minb, int split,
                         const void* next_w, long long next_w_bytes, const void* next_s, long long next_s_bytes,
                         int pdl, int early, void* stream) {
  constexpr int UC = (AUTOAO_GROUP > 64 ? AUTOAO_GROUP : 64) / 64;  // chunks per unit
#define AUTOAO_CASE(R, W, C, MB)                                                                   \
  if (rt == R && kw == W && cif == C && minb == MB)                                                \
    return launch<R, W, C == 0 ? 1 : (C / UC > 0 ? C / UC : 1) + 1, MB>(                           \
        x, qw, sz, y, partials, arrived, M, N, K, x_stride, split, next_w, next_w_bytes, next_s,    \
        next_s_bytes, pdl, early, static_cast<cudaStream_t>(stream));
  AUTOAO_CONFIGS(AUTOAO_CASE)
#undef AUTOAO_CASE
  return -1;
}

// w [N, K] bf16 (8-byte aligned) = the weight qw, sz hold (int4_mma_dequant). Returns the
// cudaError_t of the launch (0: launched).
int autoao_int4_mma_dequant(const void* qw, const void* sz, void* w, int N, int K, void* stream) {
  const dim3 grid(N / 16, (K / 64 + kDequantChunks - 1) / kDequantChunks);
  int4_mma_dequant<AUTOAO_GROUP><<<grid, 128, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint32_t*>(qw), static_cast<const uint32_t*>(sz), static_cast<__nv_bfloat16*>(w), K);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
