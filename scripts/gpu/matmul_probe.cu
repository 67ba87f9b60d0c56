// Standalone check of what per-shape cuBLASLt algorithm probing buys over cuBLAS's own pick.
// For the Llama-style stack's matmuls (x @ W^T, bf16, fp32 accumulate) it times:
//   - cublasGemmEx with the default algorithm (what ATen's mm runs);
//   - each of the first `kRequested` algorithms cublasLtMatmulAlgoGetHeuristic returns;
// with the L2 cache flushed before every run (weights come from HBM in a real step), CUDA
// events around each run, median of 15. Prints one line per shape and a JSON summary.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 scripts/gpu/matmul_probe.cu -lcublasLt -lcublas -o /tmp/mp
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                      \
  do {                                                                             \
    auto st_ = (x);                                                                \
    if (st_ != 0) {                                                                \
      std::fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, int(st_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

constexpr int kRequested = 16;
constexpr int kRuns = 15;

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
};

void* g_flush = nullptr;
size_t g_flush_bytes = 0;

template <typename F>
float median_us(F&& run, cudaStream_t s) {
  std::vector<float> t;
  Timer tm;
  for (int i = 0; i < kRuns + 2; ++i) {
    CK(cudaMemsetAsync(g_flush, i, g_flush_bytes, s));
    CK(cudaEventRecord(tm.a, s));
    run();
    CK(cudaEventRecord(tm.b, s));
    CK(cudaEventSynchronize(tm.b));
    float ms;
    CK(cudaEventElapsedTime(&ms, tm.a, tm.b));
    if (i >= 2) t.push_back(ms * 1000.f);
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

int main() {
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  g_flush_bytes = size_t(l2) * 2;
  CK(cudaMalloc(&g_flush, g_flush_bytes));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t h;
  CK(cublasCreate(&h));
  CK(cublasSetStream(h, s));
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  size_t ws_bytes = 32 << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cublasSetWorkspace(h, ws, ws_bytes));

  struct Shape {
    const char* name;
    int M, K, N;
  };
  std::vector<Shape> shapes;
  for (int M : {128, 4096}) {
    shapes.push_back({"q/o", M, 2048, 2048});
    shapes.push_back({"k/v", M, 2048, 1024});
    shapes.push_back({"gate/up", M, 2048, 8192});
    shapes.push_back({"down", M, 8192, 2048});
  }
  std::printf("[");
  bool first = true;
  for (const Shape& sh : shapes) {
    const int M = sh.M, K = sh.K, N = sh.N;
    __nv_bfloat16 *A, *B, *C;  // A [M,K] row-major; B = W [N,K] row-major; C [M,N]
    CK(cudaMalloc(&A, size_t(M) * K * 2));
    CK(cudaMalloc(&B, size_t(N) * K * 2));
    CK(cudaMalloc(&C, size_t(M) * N * 2));
    CK(cudaMemset(A, 0, size_t(M) * K * 2));
    CK(cudaMemset(B, 0, size_t(N) * K * 2));
    float alpha = 1.f, beta = 0.f;
    // Column-major view: C^T (N x M) = W (N x K, stored K x N col-major: op T) * A^T (K x M)
    auto gemm = [&] {
      CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_16BF, K, A,
                      CUDA_R_16BF, K, &beta, C, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT));
    };
    const float t_cublas = median_us(gemm, s);

    cublasLtMatmulDesc_t desc;
    CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
    CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res[kRequested];
    int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, kRequested, res, &found));
    std::vector<float> t_lt;
    for (int i = 0; i < found; ++i) {
      auto run = [&] {
        CK(cublasLtMatmul(lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &res[i].algo, ws,
                          ws_bytes, s));
      };
      t_lt.push_back(median_us(run, s));
    }
    const float best = *std::min_element(t_lt.begin(), t_lt.end());
    const int best_i = int(std::min_element(t_lt.begin(), t_lt.end()) - t_lt.begin());
    const double bytes = 2.0 * (double(M) * K + double(N) * K + double(M) * N);
    std::fprintf(stderr,
                 "%-8s M=%5d K=%5d N=%5d  cublas %7.2f us (%5.0f GB/s)  lt#0 %7.2f  best lt#%d "
                 "%7.2f us (%5.0f GB/s)  %.2fx\n",
                 sh.name, M, K, N, t_cublas, bytes / t_cublas / 1e3, t_lt[0], best_i, best,
                 bytes / best / 1e3, t_cublas / best);
    std::printf("%s{\"shape\":\"%s\",\"M\":%d,\"K\":%d,\"N\":%d,\"cublas_us\":%.3f,\"lt_us\":[",
                first ? "" : ",", sh.name, M, K, N, t_cublas);
    for (size_t i = 0; i < t_lt.size(); ++i) std::printf("%s%.3f", i ? "," : "", t_lt[i]);
    std::printf("]}\n");
    first = false;
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
  }
  std::printf("]\n");
  return 0;
}
