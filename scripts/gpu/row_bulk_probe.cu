// RMSNorm over rows of 8192 bf16 values three ways, timed side by side in one process, as a
// share of the device's copy bandwidth (cudaMemcpyAsync of the same bytes):
//
//   held      the generated kernel's layout: 256 threads, each holding 4 vectors of 8 values
//             and the weight's 4 vectors in registers (one pass over memory);
//   bulk      the row reaches shared memory by one bulk copy (cp.async.bulk, completing on an
//             mbarrier), the weight is read in the output pass; few registers, so more blocks
//             (and more bytes in flight) per SM;
//   bulk512   bulk with 512 threads of 2 vectors each;
//   twopass   Inductor's scheme: 512 threads, the row read twice (the second time from L2, under
//             evict_last / evict_first hints).
//
// A question for issue 5 (RMSNorm on the H200 trails torch.compile's by 1-3 points of copy
// bandwidth): do more bytes in flight per SM close it?
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/row_bulk_probe scripts/gpu/row_bulk_probe.cu
//   /tmp/row_bulk_probe [rows] [cols]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t err_ = (x);                                                              \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

constexpr int kCols = 8192;

__device__ __forceinline__ float lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ unsigned pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < warps; ++w) v += scratch[w];
  return v;
}

__device__ __forceinline__ uint4 ldg_keep(const uint4* p) { return __ldg(p); }
__device__ __forceinline__ uint4 ldg_stream(const uint4* p) { return __ldcs(p); }
__device__ __forceinline__ void stg_stream(uint4* p, uint4 v) { __stcs(p, v); }

// ---- held: the generated kernel's layout -----------------------------------------------------
template <int K>
__global__ void __launch_bounds__(256)
    held(const uint4* __restrict__ x, const uint4* __restrict__ w, uint4* __restrict__ y,
         int cols) {
  __shared__ float scratch[32];
  const long long row = blockIdx.x;
  const int vecs = cols / 8;
  uint4 c[K], wv[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int v = k * blockDim.x + threadIdx.x;
    wv[k] = ldg_keep(w + v);
    c[k] = ldg_stream(x + row * vecs + v);
  }
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const unsigned* u = reinterpret_cast<const unsigned*>(&c[k]);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc += lo(u[j]) * lo(u[j]) + hi(u[j]) * hi(u[j]);
  }
  const float r = rsqrtf(block_sum(acc, scratch) / cols + 1e-6f);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const unsigned* u = reinterpret_cast<const unsigned*>(&c[k]);
    const unsigned* g = reinterpret_cast<const unsigned*>(&wv[k]);
    uint4 o;
    unsigned* q = reinterpret_cast<unsigned*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = pack(lo(u[j]) * r * lo(g[j]), hi(u[j]) * r * hi(g[j]));
    stg_stream(y + row * vecs + k * blockDim.x + threadIdx.x, o);
  }
}

// ---- bulk: the row in shared memory by one bulk copy -------------------------------------------
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <int K>
__global__ void __launch_bounds__(1024 / K, 2 * K)
    bulk(const uint4* __restrict__ x, const uint4* __restrict__ w, uint4* __restrict__ y,
         int cols) {
  __shared__ alignas(128) uint4 row_smem[kCols / 8];
  __shared__ alignas(8) unsigned long long bar;
  __shared__ float scratch[32];
  const long long row = blockIdx.x;
  const int vecs = cols / 8;
  const unsigned bytes = static_cast<unsigned>(cols) * 2u;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&bar)),
                 "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_addr(row_smem)),
        "l"(x + row * vecs), "r"(bytes), "r"(smem_addr(&bar))
        : "memory");
  }
  unsigned done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, "
        "p; }"
        : "=r"(done)
        : "r"(smem_addr(&bar))
        : "memory");
  } while (!done);
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const uint4 c = row_smem[k * blockDim.x + threadIdx.x];
    const unsigned* u = reinterpret_cast<const unsigned*>(&c);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc += lo(u[j]) * lo(u[j]) + hi(u[j]) * hi(u[j]);
  }
  const float r = rsqrtf(block_sum(acc, scratch) / cols + 1e-6f);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int v = k * blockDim.x + threadIdx.x;
    const uint4 c = row_smem[v];
    const uint4 wv = ldg_keep(w + v);
    const unsigned* u = reinterpret_cast<const unsigned*>(&c);
    const unsigned* g = reinterpret_cast<const unsigned*>(&wv);
    uint4 o;
    unsigned* q = reinterpret_cast<unsigned*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = pack(lo(u[j]) * r * lo(g[j]), hi(u[j]) * r * hi(g[j]));
    stg_stream(y + row * vecs + v, o);
  }
}

// ---- twopass: Inductor's scheme (two passes over the row, the second from L2) -----------------
__device__ __forceinline__ uint4 ld_hint(const uint4* p, unsigned long long policy) {
  uint4 v;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

__global__ void __launch_bounds__(512)
    twopass(const uint4* __restrict__ x, const uint4* __restrict__ w, uint4* __restrict__ y,
            int cols) {
  __shared__ float scratch[32];
  unsigned long long keep, drop;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(drop));
  const long long row = blockIdx.x;
  const int vecs = cols / 8;
  float acc = 0.f;
  for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
    const uint4 c = ld_hint(x + row * vecs + v, keep);
    const unsigned* u = reinterpret_cast<const unsigned*>(&c);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc += lo(u[j]) * lo(u[j]) + hi(u[j]) * hi(u[j]);
  }
  const float r = rsqrtf(block_sum(acc, scratch) / cols + 1e-6f);
  for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
    const uint4 c = ld_hint(x + row * vecs + v, drop);
    const uint4 wv = ld_hint(w + v, keep);
    const unsigned* u = reinterpret_cast<const unsigned*>(&c);
    const unsigned* g = reinterpret_cast<const unsigned*>(&wv);
    uint4 o;
    unsigned* q = reinterpret_cast<unsigned*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = pack(lo(u[j]) * r * lo(g[j]), hi(u[j]) * r * hi(g[j]));
    y[row * vecs + v] = o;
  }
}

// ---- timing ----------------------------------------------------------------------------------
struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
  }
};

template <typename F>
float median_ms(F launch, int reps) {
  Timer t;
  std::vector<float> ms;
  for (int i = 0; i < 5; ++i) launch(i);
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(t.a));
    launch(i);
    CHECK(cudaEventRecord(t.b));
    CHECK(cudaEventSynchronize(t.b));
    float m;
    CHECK(cudaEventElapsedTime(&m, t.a, t.b));
    ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 16384;
  const int cols = argc > 2 ? std::atoi(argv[2]) : kCols;
  if (cols != kCols) {
    std::fprintf(stderr, "cols must be %d\n", kCols);
    return 1;
  }
  const size_t n = size_t(rows) * cols, bytes = n * 2;
  std::vector<uint16_t> hx(n), hw(cols);
  uint32_t s = 12345;
  auto rnd = [&] {
    s = s * 1664525u + 1013904223u;
    float f = ((s >> 8) & 0xffff) / 32768.0f - 1.0f;
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return static_cast<uint16_t>(b >> 16);
  };
  for (auto& v : hx) v = rnd();
  for (auto& v : hw) v = rnd();
  uint4 *x[2], *y[2], *w;
  for (int i = 0; i < 2; ++i) {
    CHECK(cudaMalloc(&x[i], bytes));
    CHECK(cudaMalloc(&y[i], bytes));
    CHECK(cudaMemcpy(x[i], hx.data(), bytes, cudaMemcpyHostToDevice));
  }
  CHECK(cudaMalloc(&w, cols * 2));
  CHECK(cudaMemcpy(w, hw.data(), cols * 2, cudaMemcpyHostToDevice));
  CHECK(cudaFuncSetAttribute(bulk<4>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  CHECK(cudaFuncSetAttribute(bulk<2>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));

  // Correctness of each kernel against the held one.
  std::vector<uint16_t> ref(n), got(n);
  held<4><<<rows, 256>>>(x[0], w, y[0], cols);
  CHECK(cudaMemcpy(ref.data(), y[0], bytes, cudaMemcpyDeviceToHost));
  auto check = [&](const char* name) {
    CHECK(cudaMemcpy(got.data(), y[0], bytes, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += got[i] != ref[i];
    std::printf("%-8s mismatches against held: %zu of %zu\n", name, bad, n);
  };
  CHECK(cudaMemset(y[0], 0, bytes));
  bulk<4><<<rows, 256>>>(x[0], w, y[0], cols);
  CHECK(cudaGetLastError());
  check("bulk");
  CHECK(cudaMemset(y[0], 0, bytes));
  bulk<2><<<rows, 512>>>(x[0], w, y[0], cols);
  CHECK(cudaGetLastError());
  check("bulk512");
  CHECK(cudaMemset(y[0], 0, bytes));
  twopass<<<rows, 512>>>(x[0], w, y[0], cols);
  CHECK(cudaGetLastError());
  check("twopass");

  int dev = 0, blocks_held = 0, blocks_bulk = 0, blocks_bulk512 = 0;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_held, held<4>, 256, 0));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_bulk, bulk<4>, 256, 0));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_bulk512, bulk<2>, 512, 0));
  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, held<4>));
  const int regs_held = fa.numRegs;
  CHECK(cudaFuncGetAttributes(&fa, bulk<4>));
  const int regs_bulk = fa.numRegs;
  CHECK(cudaFuncGetAttributes(&fa, bulk<2>));
  const int regs_bulk512 = fa.numRegs;
  std::printf("%s, %d SMs; rows %d x %d bf16\n", prop.name, prop.multiProcessorCount, rows, cols);
  std::printf("blocks per SM: held %d (%d regs), bulk %d (%d regs), bulk512 %d (%d regs)\n",
              blocks_held, regs_held, blocks_bulk, regs_bulk, blocks_bulk512, regs_bulk512);

  const double moved = 2.0 * bytes + cols * 2;
  for (int round = 0; round < 3; ++round) {
    const float copy = median_ms(
        [&](int i) { CHECK(cudaMemcpyAsync(y[i & 1], x[i & 1], bytes, cudaMemcpyDeviceToDevice)); },
        60);
    const float t_held =
        median_ms([&](int i) { held<4><<<rows, 256>>>(x[i & 1], w, y[i & 1], cols); }, 60);
    const float t_bulk =
        median_ms([&](int i) { bulk<4><<<rows, 256>>>(x[i & 1], w, y[i & 1], cols); }, 60);
    const float t_bulk512 =
        median_ms([&](int i) { bulk<2><<<rows, 512>>>(x[i & 1], w, y[i & 1], cols); }, 60);
    const float t_two =
        median_ms([&](int i) { twopass<<<rows, 512>>>(x[i & 1], w, y[i & 1], cols); }, 60);
    const double copy_gbs = 2.0 * bytes / copy / 1e6;
    auto pct = [&](float ms) { return 100.0 * (moved / ms / 1e6) / copy_gbs; };
    std::printf(
        "round %d: copy %.1f GB/s (%.3f ms); held %.3f ms %.1f%%; bulk %.3f ms %.1f%%; "
        "bulk512 %.3f ms %.1f%%; twopass %.3f ms %.1f%%\n",
        round, copy_gbs, copy, t_held, pct(t_held), t_bulk, pct(t_bulk), t_bulk512, pct(t_bulk512),
        t_two, pct(t_two));
  }
  return 0;
}
