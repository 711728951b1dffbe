"""The floor of any M=1 GEMV on this GPU: a kernel that only reads a layer's bytes, timed as the
int4 chains are. If it costs what autoao's int4 GEMV costs, the GEMV is at the floor.

    source benchmarks/device_env.sh; python3 benchmarks/read_floor.py --out $OUT

Why: the int4 CUDA kernel's chain timings fit ~3.6 us per launch + bytes / 3.65 TB/s
(benchmarks/NOTES.md, session 7). Whether 3.65 TB/s and the 3.6 us are the kernel's or the
machine's is answered by a kernel with no math at all: each thread issues U 16-byte loads
(`ld.global.cs`, all in flight), XORs them and writes nothing (unless the XOR hits a magic value).
Three grids: "oneshot" (every thread reads U x 16 bytes once: ~N/4 KB CTAs of 256 threads),
"persistent" (SMs x 8 CTAs of 256 threads, grid-stride loop, U loads in flight per iteration): in
both, the warps running at once read one contiguous window that sweeps the buffer; and "segments"
(the GEMV's grid: tiles / RT CTAs of KW warps, each warp streaming its own contiguous segment, 512
bytes per load, U in flight), where ~2000 separate streams are read at once. Each launch may use
programmatic dependent launch (wait, then trigger, as the GEMV). Sizes: the int4 g128 layers of llama8 (weights + scales/zeros). Each size is timed as a
chain of distinct buffers (>= 256 MB, L2 flushed by a read before each repeat), time per buffer =
median / buffers, as benchmarks/int4_cuda.py times the GEMV. `--per-sm`: the segments read with at
most that many 8-warp CTAs per SM (dynamic shared memory), so the bytes in flight per SM are known.
`--gemv`: autoao's int4 GEMV (g128, a few configs, chains of packed layers as int4_cuda.py) and the
same kernel with its math replaced by an XOR of the loaded registers (spliced into a copy of
int4_mma.cu): what the math and its dependencies cost over the loads alone. `--bulk`: persistent,
warp-specialized reads as cuBLAS's GEMV does them (one producer lane issuing bulk copies into a
shared-memory ring, consumer warps reading it): whether that path streams at the floor with few
warps per SM, which the per-lane loads above cannot. Writes read_floor.md.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from autoao.evaluators.timing import time_cuda
from autoao.kernels import cuda_int4 as ci

sys.path.insert(0, str(Path(__file__).parent))
from bandwidth import copy_bandwidth  # noqa: E402
from int4_sweep import SHAPES, chain_weights  # noqa: E402  (the chains int4_sweep.py times)

SIZES_MB = {"o 4096x4096": 8.91, "qkv 6144x4096": 13.37, "down 4096x14336": 31.19, "gate/up 28672x4096": 62.39,
            "lm_head 128256x4096": 279.1}
SOURCE = r"""
#include <cuda_runtime.h>
#include <stdint.h>
template <int U, bool PERSISTENT>
__global__ void __launch_bounds__(256) read_kernel(const uint4* __restrict__ p, long long n, unsigned* out) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  unsigned acc = 0;
  const long long step = (long long)gridDim.x * U * 256;
  for (long long base = (long long)blockIdx.x * U * 256 + threadIdx.x; base < n; base += step) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = base + u * 256;
      v[u] = i < n ? __ldcs(p + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    if (!PERSISTENT) break;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;  // never in practice; keeps the loads
}
// As the GEMV reads its weights: each warp streams its own contiguous segment (n / warps 16-byte
// blocks), 512 bytes per load instruction, U loads in flight.
template <int U>
__global__ void __launch_bounds__(256) read_segments(const uint4* __restrict__ p, long long n, unsigned* out) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const long long warps = (long long)gridDim.x * (blockDim.x / 32);
  const long long w = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const long long seg = (n / 32 + warps - 1) / warps * 32, lo = w * seg, hi = min(lo + seg, n);
  unsigned acc = 0;
  for (long long base = lo + (threadIdx.x & 31); base < hi; base += U * 32) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = base + u * 32;
      v[u] = i < hi ? __ldcs(p + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}
// kernel<<<grid, block, smem, s>>>(args...) through cudaLaunchKernelEx, with programmatic
// dependent launch when pdl (the GEMV's launches use it)
template <typename... Params, typename... Args>
int launch(void (*kernel)(Params...), int grid, int block, int smem, int pdl, cudaStream_t s, Args... args) {
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(grid);
  c.blockDim = dim3(block);
  c.dynamicSmemBytes = smem;
  c.stream = s;
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a[0].val.programmaticStreamSerializationAllowed = 1;
  c.attrs = a;
  c.numAttrs = pdl ? 1 : 0;
  return (int)cudaLaunchKernelEx(&c, kernel, static_cast<Params>(args)...);
}
// P: 0 oneshot, 1 persistent, 2 segments (block = warps x 32); smem: bytes of dynamic shared
// memory per CTA (unused: it only caps the CTAs per SM)
template <int U, int P>
int go(const void* p, long long n, void* out, int ctas, int warps, int pdl, int smem, cudaStream_t s) {
  if (P == 2) return launch(read_segments<U>, ctas, warps * 32, smem, pdl, s, p, n, out);
  return launch(read_kernel<U, P == 1>, ctas, 256, smem, pdl, s, p, n, out);
}
// Persistent and warp-specialized, as cuBLAS's GEMV reads (132 CTAs, bulk copies into a deep
// shared-memory ring): CTA b reads its contiguous share of the buffer in chunks of `chunk` bytes
// (cp.async.bulk by lane 0 of warp 0, the producer) into a `stages`-deep ring with a full and an
// empty mbarrier per stage; the other warps (consumers) wait for each chunk, read every 16 bytes
// of it from shared memory when `touch` (as a GEMV's math would) and release the stage.
__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_wait(uint64_t* b, uint32_t parity) {
  asm volatile("{\n .reg .pred P1;\n W:\n mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               " @P1 bra D;\n bra W;\n D:\n}" ::"r"(sa(b)), "r"(parity) : "memory");
}
__global__ void read_bulk(const char* __restrict__ p, long long n, unsigned* out, int chunk, int stages, int touch) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[16], empty[16];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, consumers = blockDim.x / 32 - 1;
  const long long per = ((n + gridDim.x - 1) / gridDim.x + 15) & ~15LL, lo = blockIdx.x * per;
  const long long hi = min(lo + per, n);
  const int chunks = lo < hi ? (int)((hi - lo + chunk - 1) / chunk) : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(&empty[s])), "r"(consumers));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if (warp == 0) {
    if (lane == 0)
      for (int i = 0; i < chunks; ++i) {
        const int s = i % stages;
        if (i >= stages) bar_wait(&empty[s], ((i / stages) - 1) & 1);
        const unsigned bytes = (unsigned)min((long long)chunk, hi - lo - (long long)i * chunk);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&full[s])), "r"(bytes)
                     : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(sa(ring + (size_t)s * chunk)), "l"(p + lo + (long long)i * chunk), "r"(bytes),
                     "r"(sa(&full[s])) : "memory");
      }
    return;
  }
  unsigned acc = 0;
  for (int i = 0; i < chunks; ++i) {
    const int s = i % stages;
    bar_wait(&full[s], (i / stages) & 1);
    if (touch) {
      const int bytes = (int)min((long long)chunk, hi - lo - (long long)i * chunk);
      for (int o = ((warp - 1) * 32 + lane) * 16; o < bytes; o += consumers * 512) {
        const uint4 v = *reinterpret_cast<const uint4*>(ring + (size_t)s * chunk + o);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    }
    __syncwarp();
    if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(&empty[s])) : "memory");
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}
extern "C" int read_bulk_launch(const void* p, long long n, void* out, int ctas, int consumers, int chunk,
                                int stages, int touch, int pdl, void* s) {
  if (stages > 16) return -1;  // the kernel's mbarrier arrays
  return launch(read_bulk, ctas, 32 * (consumers + 1), chunk * stages, pdl, (cudaStream_t)s, p, n, out, chunk,
                stages, touch);
}
extern "C" int read_floor(const void* p, long long n, void* out, int u, int mode, int ctas, int warps, int pdl,
                          int smem, void* s) {
  cudaStream_t st = (cudaStream_t)s;
#define C(U) \
  if (u == U) return mode == 2 ? go<U, 2>(p, n, out, ctas, warps, pdl, smem, st)                     \
                   : mode == 1 ? go<U, 1>(p, n, out, ctas, warps, pdl, smem, st)                     \
                               : go<U, 0>(p, n, out, ctas, warps, pdl, smem, st);
  C(2) C(3) C(4) C(8) C(16)
  return -1;
}
"""


def compile_so(source: str, *flags: str) -> ctypes.CDLL:
    """`source` compiled by nvcc for this GPU (extra nvcc `flags`) into a temporary shared library, loaded."""
    major, minor = torch.cuda.get_device_capability()
    d = Path(tempfile.mkdtemp())
    (d / "k.cu").write_text(source)
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                    f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}", *flags, "-o", str(d / "k.so"),
                    str(d / "k.cu")], check=True)
    return ctypes.CDLL(str(d / "k.so"))


def build() -> ctypes.CDLL:
    lib = compile_so(SOURCE)
    lib.read_floor.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p] + [ctypes.c_int] * 6 + \
        [ctypes.c_void_p]
    lib.read_bulk_launch.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p] + [ctypes.c_int] * 6 + \
        [ctypes.c_void_p]
    return lib


# The int4 GEMV with its math replaced by an XOR of each ring slot (weights and scales): the same
# grid, loads, ring and epilogue. Spliced into kernels/cuda/int4_mma.cu between these two lines.
MATH_FROM, MATH_TO = "        uint4 xv[UC][2];\n", "        if (i + p + PU < nu) load(wb[p], sb[p], p + PU);\n"
NO_MATH = """#pragma unroll
        for (int r = 0; r < RT; ++r) {
          uint32_t h = word(sb[p][r], 0);
#pragma unroll
          for (int ch = 0; ch < UC; ++ch) h ^= wb[p][r][ch].x ^ wb[p][r][ch].y ^ wb[p][r][ch].z ^ wb[p][r][ch].w;
          acc[r][0] += __uint_as_float(h & 0x3f7fffffu);
        }
"""


def no_math_library(group: int) -> ctypes.CDLL:
    """The CUDA int4 GEMV library (same entry point) with NO_MATH spliced in; raises if the markers moved."""
    src = ci._SOURCE.read_text()
    a, b = src.index(MATH_FROM), src.index(MATH_TO)
    lib = compile_so(src[:a] + NO_MATH + src[b:], f"-DAUTOAO_GROUP={group}")
    real = ci.library(group)
    lib.autoao_int4_mma_gemv.argtypes = real.autoao_int4_mma_gemv.argtypes
    lib.autoao_int4_mma_gemv.restype = ctypes.c_int
    lib.sm90 = real.sm90
    return lib


def gemv_rows(group: int = 128) -> list[str]:
    """us per layer of the GEMV and of its no-math twin, chains of llama8's shapes, M = 1, a few configs."""
    real, nomath = ci.library(group), no_math_library(group)
    key = (group, torch.cuda.current_device())
    out = ["", "| layer | config | GEMV us | no-math us | MB |", "|---|---|---|---|---|"]
    for n, k in SHAPES:
        torch.manual_seed(0)
        mma = [ci.pack_mma(q, s, z, group) for _, q, s, z in chain_weights(n, k, group)]
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        for cfg in (ci.Config(1, 8, 2), ci.Config(2, 2, 4), ci.Config(2, 4, 2), ci.Config(2, 8, 2)):
            us = []
            for lib in (real, nomath):
                ci._LIBS[key] = lib
                us.append(time_cuda(lambda cfg=cfg: [ci._launch(x, qw, sz, group, cfg, next_qw=nq, next_sz=ns)
                                                     for (qw, sz), (nq, ns) in zip(mma, mma[1:] + mma[:1])])[0]
                          / len(mma))
            ci._LIBS[key] = real
            out.append(f"| {n}x{k} | {cfg.rows}/{cfg.warps}/{cfg.chunks} | {us[0]:.2f} | {us[1]:.2f} | "
                       f"{(n * k / 2 + 4 * n * k / group) / 1e6:.1f} |")
            print(out[-1], flush=True)
        mma.clear()
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--u", default="2,4,8,16", help="loads in flight per thread (oneshot, persistent grids)")
    ap.add_argument("--pdl", default="1,0")
    ap.add_argument("--per-sm", default="", help="also the segments read capped at these CTAs (of 8 warps) per SM")
    ap.add_argument("--gemv", action="store_true", help="also the int4 GEMV and the same kernel without its math")
    ap.add_argument("--bulk", default="", help="also the persistent bulk-copy read, configs 'cps/consumers/chunk "
                    "KB/stages' separated by ';' (CTAs per SM, consumer warps, chunk, ring depth), each with and "
                    "without the consumers reading the chunks from shared memory")
    args = ap.parse_args()
    args.u = [int(v) for v in args.u.split(",")]
    args.pdl = [int(v) for v in args.pdl.split(",")]
    args.per_sm = [int(v) for v in args.per_sm.split(",") if v]
    args.bulk = [tuple(int(v) for v in c.split("/")) for c in args.bulk.split(";") if c]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lib = build()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth("cuda")
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    lines = [f"# read floor, {torch.cuda.get_device_name()}", "",
             f"command: python {' '.join(sys.argv)}; torch {torch.__version__}; date {time.strftime('%Y-%m-%d')}; "
             f"copy bandwidth {bw / 1e12:.2f} TB/s; {sms} SMs", "",
             "| layer | MB | grid | U | PDL | us per buffer | TB/s |", "|---|---|---|---|---|---|---|"]
    for name, mb in SIZES_MB.items():
        n16 = int(mb * 1e6) // 16
        bufs = [torch.empty(n16 * 16, dtype=torch.uint8, device="cuda").random_(0, 255)
                for _ in range(max(1, min(32, math.ceil(256 / mb))))]
        runs = [(mode, u, sms * 8 if mode else math.ceil(n16 / (u * 256)), 8, pdl, 0)
                for mode in (0, 1) for u in args.u for pdl in args.pdl]
        # segments: the GEMV's grids (CTAs x warps: one warp per 16-row tile and K slice)
        tiles = {"o": 256, "qkv": 384, "down": 256, "gate/up": 1792, "lm_head": 8016}[name.split()[0]]
        runs += [(2, u, tiles // rt, kw, pdl, 0) for rt, kw in ((1, 8), (2, 2), (2, 4)) for u in (2, 3, 4)
                 for pdl in args.pdl]
        # segments of 8-warp CTAs, at most `per_sm` CTAs per SM (dynamic shared memory): bytes in flight
        # per SM = per_sm x 8 warps x U x 512
        smem_per_sm = torch.cuda.get_device_properties(0).shared_memory_per_multiprocessor
        runs += [(2, u, tiles, 8, 1, smem_per_sm // per_sm - 2048) for per_sm in args.per_sm for u in (2, 4, 8)]
        def row(grid: str, u: str, pdl: int, launch) -> None:
            """Time `launch(buffer, stream)` (an error code, 0 = ok) over the chain of buffers; add the row."""
            def run():
                for b in bufs:
                    err = launch(b, torch.cuda.current_stream().cuda_stream)
                    assert err == 0, err
            us = time_cuda(run)[0] / len(bufs)
            lines.append(f"| {name} | {mb} | {grid} | {u} | {pdl} | {us:.2f} | {mb * 1e6 / us / 1e6:.2f} |")
            print(lines[-1], flush=True)

        for mode, u, ctas, warps, pdl, smem in runs:
            grid = ("oneshot", "persistent", f"segments {warps} warps x")[mode]
            if smem:
                grid += f" (<= {smem_per_sm // (smem + 2048)} CTAs/SM)"
            row(f"{grid} {ctas}", str(u), pdl,
                lambda b, st, mode=mode, u=u, ctas=ctas, warps=warps, pdl=pdl, smem=smem:
                lib.read_floor(b.data_ptr(), n16, sink.data_ptr(), u, mode, ctas, warps, pdl, smem, st))
        for (cps, consumers, chunk_kb, stages), touch in ((c, t) for c in args.bulk for t in (0, 1)):
            row(f"bulk {consumers}+1 warps x {sms * cps}, {chunk_kb} KB x {stages}{' read' if touch else ''}", "-", 1,
                lambda b, st, cps=cps, consumers=consumers, chunk_kb=chunk_kb, stages=stages, touch=touch:
                lib.read_bulk_launch(b.data_ptr(), n16 * 16, sink.data_ptr(), sms * cps, consumers, chunk_kb * 1024,
                                     stages, touch, 1, st))
        bufs.clear()
        torch.cuda.empty_cache()
        (out / "read_floor.md").write_text("\n".join(lines) + "\n")
    if args.gemv:
        lines += gemv_rows()
        (out / "read_floor.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
