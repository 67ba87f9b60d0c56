// How a CUDA graph replay can read a new input tensor each call, and what each way costs the
// host (issue 6: host time per call). A graph of N kernels (a transformer stack's replay)
// starts by copying a 512 KiB input (4 x 32 x 2048 bf16) into its static buffer; each call
// passes one of four input buffers in turn, as a serving loop passing a new tensor does.
// The GPU is kept busy (a sleep kernel ahead of each burst), so the host never waits for it.
//
//   retarget    the graph's memcpy node re-pointed (cudaGraphExecMemcpyNodeSetParams1D)
//   same        the memcpy node left as it is (the same input every call): the floor
//   stream      cudaMemcpyAsync on the stream, then the graph without a copy node
//   kernel_set  a copy kernel node whose arguments are set (cudaGraphExecKernelNodeSetParams)
//   write_value a copy kernel node that reads the source address from device memory, written
//               before each launch by a stream memory operation (cuStreamWriteValue64)
//   mailbox     a copy kernel node that reads the source address from a ring in mapped pinned
//               host memory, indexed by a counter in device memory; the host writes the
//               address with a plain store
//
// Also: the device span of one replay with the GPU idle (mailbox against same: the cost of the
// kernel's read over PCIe), and the launch alone for graphs of 1 and N kernels.
// Build and run: nvcc -O2 -arch=sm_90 -o /tmp/feed scripts/gpu/input_feed_probe.cu -lcuda &&
// /tmp/feed (FEED_STREAM=legacy /tmp/feed: the same on the legacy default stream)
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(x)                                                                                \
  do {                                                                                          \
    cudaError_t err_ = (x);                                                                     \
    if (err_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

constexpr size_t kBytes = 4 * 32 * 2048 * 2;
constexpr int kInputs = 4;
constexpr int kRing = 256;

struct Record {
  const void* src;
  unsigned long long bytes;
};

__global__ void sleep_kernel(long long ns) {
  const long long start = clock64();
  // clock64 counts SM cycles; ~1.7 GHz: ns * 1.7 cycles.
  while (clock64() - start < ns * 17 / 10) {
  }
}

__global__ void tiny_kernel(float* p) {
  if (threadIdx.x == 0 && p != nullptr) p[blockIdx.x] += 1.0f;
}

__global__ void copy_kernel(int4* dst, const int4* src, size_t n16) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += gridDim.x * blockDim.x) {
    dst[i] = src[i];
  }
}

// The source address is read from device memory (written by a stream memory operation).
__global__ void slot_copy_kernel(int4* dst, const int4* const* src_slot, size_t n16) {
  const int4* src = *src_slot;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += gridDim.x * blockDim.x) {
    dst[i] = src[i];
  }
}

// Every block reads record ring[*counter % kRing]; the last block to finish bumps the counter.
__global__ void mailbox_copy_kernel(int4* dst, const volatile Record* ring, unsigned* counter,
                                    unsigned* finished) {
  __shared__ Record r;
  const unsigned k = *counter;
  if (threadIdx.x == 0) {
    r.src = ring[k % kRing].src;
    r.bytes = ring[k % kRing].bytes;
  }
  __syncthreads();
  const int4* src = static_cast<const int4*>(r.src);
  const size_t n16 = r.bytes / 16;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += gridDim.x * blockDim.x) {
    dst[i] = src[i];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(finished, 1u) == gridDim.x - 1) {
      *finished = 0;
      *counter = k + 1;
      __threadfence();
    }
  }
}

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Probe {
  cudaStream_t stream{};
  void* inputs[kInputs]{};
  void* dst{};
  float* scratch{};
  Record* ring{};  // mapped pinned
  unsigned* counter{};
  unsigned* finished{};
  void** src_slot{};
  unsigned host_count = 0;

  // A graph: optional first node (memcpy from inputs[0], copy kernel, mailbox kernel), then n
  // tiny kernels in a chain.
  cudaGraphExec_t build(int first, int n, cudaGraphNode_t* first_node) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t prev = nullptr;
    *first_node = nullptr;
    if (first == 1) {
      CHECK(cudaGraphAddMemcpyNode1D(&prev, g, nullptr, 0, dst, inputs[0], kBytes,
                                     cudaMemcpyDeviceToDevice));
    } else if (first >= 2) {
      cudaKernelNodeParams p{};
      size_t n16 = kBytes / 16;
      void* src = inputs[0];
      void* args_copy[] = {&dst, &src, &n16};
      void* args_mail[] = {&dst, &ring, &counter, &finished};
      void* args_slot[] = {&dst, &src_slot, &n16};
      p.func = first == 2   ? (void*)copy_kernel
               : first == 3 ? (void*)mailbox_copy_kernel
                            : (void*)slot_copy_kernel;
      p.gridDim = dim3(64);
      p.blockDim = dim3(256);
      p.kernelParams = first == 2 ? args_copy : first == 3 ? args_mail : args_slot;
      CHECK(cudaGraphAddKernelNode(&prev, g, nullptr, 0, &p));
    }
    *first_node = prev;
    for (int i = 0; i < n; ++i) {
      cudaKernelNodeParams p{};
      void* args[] = {&scratch};
      p.func = (void*)tiny_kernel;
      p.gridDim = dim3(1);
      p.blockDim = dim3(32);
      p.kernelParams = args;
      cudaGraphNode_t node;
      CHECK(cudaGraphAddKernelNode(&node, g, prev ? &prev : nullptr, prev ? 1 : 0, &p));
      prev = node;
    }
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    return exec;
  }

  // Host microseconds per call (median over bursts), the GPU busy behind a sleep kernel.
  template <class F>
  double host_us(F&& call, int bursts = 20, int per_burst = 100) {
    std::vector<double> per_call;
    for (int b = 0; b < bursts + 2; ++b) {
      sleep_kernel<<<1, 1, 0, stream>>>(3'000'000);
      for (int i = 0; i < per_burst; ++i) {
        const auto t0 = Clock::now();
        call(i);
        const auto t1 = Clock::now();
        if (b >= 2) per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      CHECK(cudaStreamSynchronize(stream));
    }
    return median(per_call);
  }

  // Device microseconds of one call with the GPU idle before it (events around it).
  template <class F>
  double device_us(F&& call, int iters = 200) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<double> v;
    for (int i = 0; i < iters; ++i) {
      CHECK(cudaStreamSynchronize(stream));
      CHECK(cudaEventRecord(a, stream));
      call(i);
      CHECK(cudaEventRecord(b, stream));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      v.push_back(ms * 1000.0);
    }
    return median(v);
  }
};

int main() {
  Probe p;
  CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("device %s, driver %d, runtime %d\n", prop.name, driver, runtime);
  // FEED_STREAM=legacy: CUDA's legacy default stream (PyTorch's default stream), with two other
  // blocking streams in the context as a PyTorch process has; else a non-blocking stream.
  const char* which = std::getenv("FEED_STREAM");
  if (which != nullptr && std::string(which) == "legacy") {
    cudaStream_t others[2];
    for (auto& o : others) CHECK(cudaStreamCreate(&o));
    p.stream = cudaStreamLegacy;
    std::printf("stream: legacy default stream\n");
  } else {
    CHECK(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
    std::printf("stream: non-blocking stream\n");
  }
  for (auto& in : p.inputs) {
    CHECK(cudaMalloc(&in, kBytes));
    CHECK(cudaMemset(in, 1, kBytes));
  }
  CHECK(cudaMalloc(&p.dst, kBytes));
  CHECK(cudaMalloc(&p.scratch, 1024));
  CHECK(cudaMemset(p.scratch, 0, 1024));
  CHECK(cudaHostAlloc(&p.ring, sizeof(Record) * kRing, cudaHostAllocMapped));
  CHECK(cudaMalloc(&p.counter, 8));
  CHECK(cudaMemset(p.counter, 0, 8));
  p.finished = p.counter + 1;
  CHECK(cudaMalloc(&p.src_slot, 8));

  const int ns[] = {1, 60};
  for (int n : ns) {
    std::printf("== graph of %d kernels after the input copy\n", n);
    cudaGraphNode_t node;
    cudaGraphExec_t plain = p.build(0, n, &node);
    const double launch_only = p.host_us([&](int) { CHECK(cudaGraphLaunch(plain, p.stream)); });
    std::printf("  launch alone (no input)        %6.2f us host\n", launch_only);

    cudaGraphNode_t mnode;
    cudaGraphExec_t mexec = p.build(1, n, &mnode);
    const double same = p.host_us([&](int) { CHECK(cudaGraphLaunch(mexec, p.stream)); });
    const double retarget = p.host_us([&](int i) {
      CHECK(cudaGraphExecMemcpyNodeSetParams1D(mexec, mnode, p.dst, p.inputs[i % kInputs], kBytes,
                                               cudaMemcpyDeviceToDevice));
      CHECK(cudaGraphLaunch(mexec, p.stream));
    });
    const double stream = p.host_us([&](int i) {
      CHECK(cudaMemcpyAsync(p.dst, p.inputs[i % kInputs], kBytes, cudaMemcpyDeviceToDevice,
                            p.stream));
      CHECK(cudaGraphLaunch(plain, p.stream));
    });
    cudaGraphNode_t knode;
    cudaGraphExec_t kexec = p.build(2, n, &knode);
    const double kernel_set = p.host_us([&](int i) {
      cudaKernelNodeParams kp{};
      size_t n16 = kBytes / 16;
      void* src = p.inputs[i % kInputs];
      void* args[] = {&p.dst, &src, &n16};
      kp.func = (void*)copy_kernel;
      kp.gridDim = dim3(64);
      kp.blockDim = dim3(256);
      kp.kernelParams = args;
      CHECK(cudaGraphExecKernelNodeSetParams(kexec, knode, &kp));
      CHECK(cudaGraphLaunch(kexec, p.stream));
    });
    cudaGraphNode_t bnode;
    cudaGraphExec_t bexec = p.build(3, n, &bnode);
    CHECK(cudaMemset(p.counter, 0, 8));
    CHECK(cudaDeviceSynchronize());
    p.host_count = 0;
    auto mailbox = [&](int i) {
      Record& r = p.ring[p.host_count % kRing];
      r.src = p.inputs[i % kInputs];
      r.bytes = kBytes;
      ++p.host_count;
      CHECK(cudaGraphLaunch(bexec, p.stream));
    };
    const double mail = p.host_us(mailbox, 20, 100);  // 100 per burst < kRing: no overrun
    cudaGraphNode_t wnode;
    cudaGraphExec_t wexec = p.build(4, n, &wnode);
    auto write_value = [&](int i) {
      if (cuStreamWriteValue64(p.stream, reinterpret_cast<CUdeviceptr>(p.src_slot),
                               reinterpret_cast<cuuint64_t>(p.inputs[i % kInputs]),
                               CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
        std::fprintf(stderr, "cuStreamWriteValue64 failed\n");
        std::exit(1);
      }
      CHECK(cudaGraphLaunch(wexec, p.stream));
    };
    const double wv = p.host_us(write_value);
    std::printf("  write_value + launch           %6.2f us host\n", wv);
    const double d_wv = p.device_us(write_value);
    std::printf("  device span write_value %.2f us\n", d_wv);
    std::printf("  same input (no update)         %6.2f us host\n", same);
    std::printf("  memcpy node retarget           %6.2f us host\n", retarget);
    std::printf("  cudaMemcpyAsync + launch       %6.2f us host\n", stream);
    std::printf("  kernel node set params         %6.2f us host\n", kernel_set);
    std::printf("  mailbox (pinned ring)          %6.2f us host\n", mail);
    // Check the mailbox copied what the ring named: input i%4 was memset to 1 for all; set
    // input 2 to 7, feed it, compare.
    CHECK(cudaMemset(p.inputs[2], 7, kBytes));
    CHECK(cudaDeviceSynchronize());
    mailbox(2);
    CHECK(cudaStreamSynchronize(p.stream));
    unsigned char probe_byte = 0;
    CHECK(
        cudaMemcpy(&probe_byte, static_cast<char*>(p.dst) + kBytes - 1, 1, cudaMemcpyDeviceToHost));
    std::printf("  mailbox copied the named input: %s\n", probe_byte == 7 ? "yes" : "NO");
    CHECK(cudaMemset(p.inputs[2], 1, kBytes));
    const double d_same = p.device_us([&](int) { CHECK(cudaGraphLaunch(mexec, p.stream)); });
    const double d_mail = p.device_us(mailbox);
    const double d_stream = p.device_us([&](int i) {
      CHECK(cudaMemcpyAsync(p.dst, p.inputs[i % kInputs], kBytes, cudaMemcpyDeviceToDevice,
                            p.stream));
      CHECK(cudaGraphLaunch(plain, p.stream));
    });
    std::printf(
        "  device span, GPU idle before: memcpy node %.2f us, mailbox %.2f us, "
        "stream copy %.2f us\n",
        d_same, d_mail, d_stream);
  }
  return 0;
}
