// Weight offload at run time: see offload.h.
#include "magi/runtime/offload.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>

#include "magi/common/error.h"
#include "magi/common/log.h"

#ifdef MAGI_HAVE_CUDA_GRAPHS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace magi::runtime {

namespace {

thread_local double* t_meter = nullptr;  // the step whose compute time call 1 estimates

int64_t dense_bytes(const at::Tensor& t) {
  return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
}

}  // namespace

void OffloadEngine::add_estimate(double us) {
  if (t_meter != nullptr) *t_meter += us;
}
bool OffloadEngine::estimating() { return t_meter != nullptr; }

#ifdef MAGI_HAVE_CUDA_GRAPHS
namespace {

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it for the next caller
    throw DeviceError(std::string("magi-compiler: weight offload: ") + what +
                      " failed: " + cudaGetErrorString(status));
  }
}

// --- pinned host memory --------------------------------------------------------------------

constexpr size_t kChunkBytes = size_t(256) << 20;
constexpr size_t kHostAlign = 512;

struct PinnedChunk {
  char* base = nullptr;
  size_t size = 0;
  size_t used = 0;
  ~PinnedChunk();
};

struct PinnedPool {
  std::recursive_mutex mu;             // a chunk's destructor may run while it is held
  std::weak_ptr<PinnedChunk> current;  // weak: a chunk whose tensors are gone is freed
  std::map<uintptr_t, std::weak_ptr<PinnedChunk>> by_base;
  int64_t held = 0;
};

PinnedPool& pinned_pool() {
  static auto* pool = new PinnedPool();  // never destroyed: chunks may outlive static teardown
  return *pool;
}

PinnedChunk::~PinnedChunk() {
  PinnedPool& pool = pinned_pool();
  {
    std::lock_guard<std::recursive_mutex> lock(pool.mu);
    pool.by_base.erase(reinterpret_cast<uintptr_t>(base));
    pool.held -= static_cast<int64_t>(size);
  }
  if (base != nullptr) cudaFreeHost(base);
}

std::pair<std::shared_ptr<PinnedChunk>, char*> pinned_alloc(size_t nbytes) {
  PinnedPool& pool = pinned_pool();
  std::lock_guard<std::recursive_mutex> lock(pool.mu);
  const size_t need = (nbytes + kHostAlign - 1) / kHostAlign * kHostAlign;
  auto new_chunk = [&](size_t size) {
    auto chunk = std::make_shared<PinnedChunk>();
    chunk->size = size;
    void* p = nullptr;
    cuda_check(cudaHostAlloc(&p, chunk->size, cudaHostAllocPortable | cudaHostAllocMapped),
               "allocating pinned host memory (cudaHostAlloc)");
    chunk->base = static_cast<char*>(p);
    pool.by_base[reinterpret_cast<uintptr_t>(p)] = chunk;
    pool.held += static_cast<int64_t>(chunk->size);
    return chunk;
  };
  std::shared_ptr<PinnedChunk> current = pool.current.lock();
  if (!current || current->used + need > current->size) {
    // A big tensor that does not fit gets a chunk of its own, exactly sized, and the shared
    // chunk stays for small ones: at most one chunk's tail is ever unused.
    if (need >= kChunkBytes / 4) {
      auto own = new_chunk(need);
      own->used = need;
      return {own, own->base};
    }
    current = new_chunk(kChunkBytes);
    pool.current = current;
  }
  char* at = current->base + current->used;
  current->used += need;
  return {current, at};
}

std::shared_ptr<PinnedChunk> chunk_of(const void* ptr) {
  PinnedPool& pool = pinned_pool();
  std::lock_guard<std::recursive_mutex> lock(pool.mu);
  const auto key = reinterpret_cast<uintptr_t>(ptr);
  auto it = pool.by_base.upper_bound(key);
  if (it == pool.by_base.begin()) return nullptr;
  --it;
  auto chunk = it->second.lock();
  if (!chunk || key >= it->first + chunk->size) return nullptr;
  return chunk;
}

at::Tensor view_of(const std::shared_ptr<PinnedChunk>& chunk, void* data, at::IntArrayRef sizes,
                   at::IntArrayRef strides, at::ScalarType dtype, c10::Device device) {
  auto* context = new std::shared_ptr<PinnedChunk>(chunk);
  return at::for_blob(data, sizes)
      .strides(strides)
      .context(context, [](void* c) { delete static_cast<std::shared_ptr<PinnedChunk>*>(c); })
      .target_device(device)
      .options(at::TensorOptions().dtype(dtype).device(device))
      .make_tensor();
}

// --- resident copies ------------------------------------------------------------------------

// The GPU copy of one resident weight, shared by every engine that keeps it.
struct ResidentCopy {
  std::mutex mu;  // engines of several graphs (and threads) share it
  at::Tensor gpu;
  const void* src = nullptr;
  uint32_t version = 0;
  bool valid = false;
  cudaStream_t stream = nullptr;  // where the last refresh was queued
  cudaEvent_t copied = nullptr;   // recorded after it
  ~ResidentCopy() {
    if (copied) cudaEventDestroy(copied);
  }
};

struct ResidentCache {
  std::mutex mu;
  std::map<std::pair<const void*, int64_t>, std::weak_ptr<ResidentCopy>> by_source;
};

ResidentCache& resident_cache() {
  static auto* cache = new ResidentCache();
  return *cache;
}

std::shared_ptr<ResidentCopy> resident_for(const at::Tensor& src) {
  ResidentCache& cache = resident_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto key = std::make_pair(static_cast<const void*>(src.data_ptr()), dense_bytes(src));
  auto& slot = cache.by_source[key];
  if (auto copy = slot.lock()) return copy;
  auto copy = std::make_shared<ResidentCopy>();
  copy->gpu = at::empty_strided(src.sizes(), src.strides(), src.options());
  slot = copy;
  return copy;
}

uint32_t version_of(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->version_counter().current_version();
}

// --- device rates for the cost model -------------------------------------------------------

struct DeviceRates {
  double half_flops_per_us, float_flops_per_us, bytes_per_us;
};

const DeviceRates& device_rates() {
  static const DeviceRates rates = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();
      major = 0;
    }
    // Sustained rates, below the data-sheet peaks (dense bf16/fp16 matmul, fp32, HBM).
    if (major >= 9) return DeviceRates{6.0e8, 5.0e7, 2.6e6};
    if (major == 8) return DeviceRates{2.5e8, 1.5e7, 1.5e6};
    return DeviceRates{1.0e8, 1.0e7, 0.8e6};
  }();
  return rates;
}

}  // namespace

at::Tensor offload_to_host(const at::Tensor& src, c10::Device device) {
  MAGI_CHECK(device.is_cpu() || device.is_cuda(), "weight offload: cannot view host memory as ",
             device.str());
  at::Tensor s = src.is_non_overlapping_and_dense() ? src : src.contiguous();
  auto [chunk, data] = pinned_alloc(static_cast<size_t>(dense_bytes(s)));
  at::Tensor host = view_of(chunk, data, s.sizes(), s.strides(), s.scalar_type(), at::kCPU);
  host.copy_(s);
  if (device.is_cpu()) return host;
  return view_of(chunk, data, s.sizes(), s.strides(), s.scalar_type(), device);
}

at::Tensor offloaded_view(const at::Tensor& offloaded, c10::Device device) {
  auto chunk = offloaded.has_storage() ? chunk_of(offloaded.data_ptr()) : nullptr;
  MAGI_CHECK(chunk != nullptr, "weight offload: the tensor is not in offloaded host memory");
  return view_of(chunk, offloaded.data_ptr(), offloaded.sizes(), offloaded.strides(),
                 offloaded.scalar_type(), device);
}

bool is_offloaded(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.data_ptr() != nullptr &&
         chunk_of(t.data_ptr()) != nullptr;
}

int64_t offload_host_bytes() {
  PinnedPool& pool = pinned_pool();
  std::lock_guard<std::recursive_mutex> lock(pool.mu);
  return pool.held;
}

int64_t resident_cache_bytes() {
  ResidentCache& cache = resident_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  int64_t n = 0;
  for (const auto& [key, weak] : cache.by_source) {
    if (auto copy = weak.lock()) n += dense_bytes(copy->gpu);
  }
  return n;
}

double host_link_gbps(int device) {
  static std::mutex mu;
  static std::map<int, double> measured;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = measured.find(device); it != measured.end()) return it->second;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  constexpr size_t kBytes = size_t(64) << 20;
  void* host = nullptr;
  cuda_check(cudaHostAlloc(&host, kBytes, cudaHostAllocPortable), "allocating a probe buffer");
  at::Tensor dst =
      at::empty({int64_t(kBytes)}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
  auto stream = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int i = 0; i < 4; ++i) {
    cudaEventRecord(a, stream);
    cudaMemcpyAsync(dst.data_ptr(), host, kBytes, cudaMemcpyHostToDevice, stream);
    cudaEventRecord(b, stream);
    cuda_check(cudaEventSynchronize(b), "timing a host-to-device copy");
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    if (i > 0) ms.push_back(t);  // the first copy warms up
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFreeHost(host);
  std::sort(ms.begin(), ms.end());
  const double gbps = double(kBytes) / (double(ms[1]) * 1e-3) / 1e9;
  measured[device] = gbps;
  MAGI_LOG_DEBUG("weight offload: host-to-device copies from pinned memory run at ", gbps,
                 " GB/s on device ", device);
  return gbps;
}

double estimate_operator_us(const std::string& name, const std::vector<c10::IValue>& in,
                            const std::vector<c10::IValue>& out) {
  const DeviceRates& rates = device_rates();
  double bytes = 0;
  at::ScalarType dtype = at::kFloat;
  bool any = false;
  auto count = [&](const c10::IValue& v) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) return;
      bytes += double(t.numel()) * double(t.element_size());
      if (!any) dtype = t.scalar_type(), any = true;
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) bytes += double(t.nbytes());
    }
  };
  for (const auto& v : in) count(v);
  for (const auto& v : out) count(v);
  auto dim = [&](size_t i, int64_t d) -> double {
    if (i >= in.size() || !in[i].isTensor()) return 0;
    const at::Tensor& t = in[i].toTensor();
    const int64_t k = d < 0 ? t.dim() + d : d;
    return k >= 0 && k < t.dim() ? double(t.size(k)) : 0;
  };
  auto numel_without_last = [&](size_t i) -> double {
    if (i >= in.size() || !in[i].isTensor()) return 0;
    const at::Tensor& t = in[i].toTensor();
    return t.dim() == 0 ? 1 : double(t.numel()) / std::max<double>(1, double(t.size(-1)));
  };
  double flops = 0;
  if (name == "aten::mm" || name == "aten::bmm") {
    flops = 2 * numel_without_last(0) * dim(0, -1) * dim(1, -1);
  } else if (name == "aten::addmm" || name == "aten::baddbmm") {
    flops = 2 * numel_without_last(1) * dim(1, -1) * dim(2, -1);
  } else if (name.find("scaled_dot_product") != std::string::npos) {
    // q [..., L, D], k [..., S, D]: QK^T and PV.
    flops = 4 * numel_without_last(0) * dim(1, -2) * dim(0, -1);
  }
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  const double matrix = half ? rates.half_flops_per_us : rates.float_flops_per_us;
  return std::max(flops / matrix, bytes / rates.bytes_per_us) + 2.0;
}

// --- the engine -----------------------------------------------------------------------------

std::string ratio_text(double r) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.2f", r);
  return buf;
}

struct OffloadEngine::Impl {
  struct Weight {
    OffloadInputUse use;
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype = at::kFloat;
    int64_t bytes = 0;
    at::Tensor slot;                         // streamed: its place in the buffer
    std::shared_ptr<ResidentCopy> resident;  // resident: its GPU copy
    const void* src = nullptr;               // this call's host memory
    uint32_t version = 0;
    bool through = false;  // this call's input is not offloaded memory: passed as it is
    const void* prefetched_src = nullptr;  // what the previous call copied for this one
    uint32_t prefetched_version = 0;
  };

  OffloadOptions options;
  std::vector<OffloadInputUse> uses;
  size_t steps = 0;
  std::mutex mu;

  int device = -1;
  std::optional<c10::cuda::CUDAStream> copy_stream;
  cudaStream_t compute = nullptr;
  std::vector<Weight> weights;
  OffloadPlan plan;
  std::string source;
  int plan_version = 0;
  at::Tensor buffer;
  std::vector<std::vector<size_t>> first_reads;  // per step: groups first read there
  std::vector<std::vector<size_t>> gated;        // per gate + 1: groups whose copy starts there
  std::vector<cudaEvent_t> ready;                // per group
  std::vector<cudaEvent_t> gate_events;          // per gate + 1
  std::vector<bool> prefetched;                  // per group

  // Timing of calls 1-3.
  bool timing = false;
  std::vector<cudaEvent_t> t_begin, t_end;
  std::vector<bool> stepped;
  cudaEvent_t t_start = nullptr, t_final = nullptr;
  cudaEvent_t done = nullptr;  // recorded at the end of every call, on its compute stream
  std::vector<double> estimate_us, measured_us;
  size_t calls = 0;
  OffloadReport report;
  bool warned = false;

  ~Impl() {
    if (copy_stream) cudaStreamSynchronize(copy_stream->stream());
    for (auto* list : {&ready, &gate_events, &t_begin, &t_end}) {
      for (cudaEvent_t e : *list) {
        if (e) cudaEventDestroy(e);
      }
    }
    if (t_start) cudaEventDestroy(t_start);
    if (t_final) cudaEventDestroy(t_final);
    if (done) cudaEventDestroy(done);
  }

  static cudaEvent_t new_event(bool timed) {
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, timed ? cudaEventDefault : cudaEventDisableTiming),
               "creating an event");
    return e;
  }

  // The offloaded inputs of this call; false when there are none.
  bool collect(const std::vector<c10::IValue>& inputs) {
    weights.clear();
    for (const OffloadInputUse& use : uses) {
      if (use.mutated || use.input >= inputs.size() || !inputs[use.input].isTensor()) continue;
      const at::Tensor& t = inputs[use.input].toTensor();
      if (!t.is_cuda() || !t.is_non_overlapping_and_dense() || !is_offloaded(t)) continue;
      Weight w;
      w.use = use;
      w.sizes = t.sizes().vec();
      w.strides = t.strides().vec();
      w.dtype = t.scalar_type();
      w.bytes = dense_bytes(t);
      weights.push_back(std::move(w));
      device = t.device().index();
    }
    return !weights.empty();
  }

  std::vector<OffloadWeight> plan_inputs() const {
    std::vector<OffloadWeight> out;
    for (const Weight& w : weights) {
      OffloadWeight o;
      o.bytes = w.bytes;
      o.first_use = w.use.first_use;
      o.last_use = w.use.last_use;
      o.must_stay = w.use.escapes;
      out.push_back(o);
    }
    return out;
  }

  // Installs a plan: the buffer, the slots, the resident copies, the events. Only called when
  // no copy or compute of this engine is in flight (before the first call, after a timed one).
  void install(OffloadPlan next, std::string from) {
    plan = std::move(next);
    source = std::move(from);
    ++plan_version;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    if (!buffer.defined() || buffer.numel() != std::max<int64_t>(plan.buffer_bytes, 1)) {
      buffer = at::Tensor();
      buffer = at::empty({std::max<int64_t>(plan.buffer_bytes, 1)},
                         at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
    }
    for (size_t k = 0; k < weights.size(); ++k) {
      Weight& w = weights[k];
      w.slot = at::Tensor();
      w.resident.reset();
      w.prefetched_src = nullptr;
      if (plan.resident[k]) continue;
      at::Tensor slot =
          at::empty({0}, at::TensorOptions().dtype(w.dtype).device(at::kCUDA, device));
      const int64_t item = c10::elementSize(w.dtype);
      slot.set_(buffer.storage(), plan.offset[k] / item, w.sizes, w.strides);
      w.slot = std::move(slot);
    }
    for (cudaEvent_t e : ready) cudaEventDestroy(e);
    ready.clear();
    for (size_t g = 0; g < plan.groups.size(); ++g) ready.push_back(new_event(false));
    if (gate_events.empty()) {
      for (size_t i = 0; i <= steps; ++i) gate_events.push_back(new_event(false));
    }
    first_reads.assign(steps, {});
    gated.assign(steps + 1, {});
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      first_reads[plan.groups[g].first_use].push_back(g);
      gated[size_t(plan.groups[g].gate + 1)].push_back(g);
    }
    prefetched.assign(plan.groups.size(), false);
    report.policy = offload_policy_name(plan.policy);
    report.source = source;
    report.plan_version = plan_version;
    report.weights = weights.size();
    report.groups = plan.groups.size();
    report.total_bytes = plan.total_bytes;
    report.resident_bytes = plan.resident_bytes;
    report.streamed_bytes = plan.streamed_bytes;
    report.buffer_bytes = plan.buffer_bytes;
    report.predicted_compute_ms = plan.compute_us / 1e3;
    report.predicted_copy_ms = plan.copy_us / 1e3;
    report.predicted_call_ms = plan.call_us / 1e3;
    report.predicted_overlap = plan.overlap;
    report.ratio_to_hide = plan.ratio_to_hide;
    report.hidden = plan.hidden();
    report.measured_call_ms = report.measured_compute_ms = report.measured_overlap = -1;
  }

  void start_call(std::vector<c10::IValue>& inputs);  // begin() once its weights are known

  void issue(size_t g, cudaEvent_t after) {
    cudaStream_t copy = copy_stream->stream();
    cuda_check(cudaStreamWaitEvent(copy, after, 0), "ordering a weight copy");
    for (size_t k : plan.groups[g].weights) {
      const Weight& w = weights[k];
      if (w.through) continue;
      cuda_check(
          cudaMemcpyAsync(w.slot.data_ptr(), w.src, size_t(w.bytes), cudaMemcpyDefault, copy),
          "copying a weight to the GPU");
    }
    cuda_check(cudaEventRecord(ready[g], copy), "recording a weight copy");
  }

  void warn_if_exposed() {
    if (warned || plan.hidden() || plan.copy_us <= 0) return;
    warned = true;
    const double more = plan.copy_us / std::max(1.0, plan.compute_us);
    MAGI_LOG_WARN(
        "weight offload cannot hide its copies at these shapes: ", plan.streamed_bytes / 1e6,
        " MB streamed per call take ", plan.copy_us / 1e3, " ms at ", report.link_gbps,
        " GB/s, but the call computes for only ", plan.compute_us / 1e3, " ms (", source,
        "); predicted ", plan.call_us / 1e3, " ms per call, ",
        plan.call_us / std::max(1.0, plan.compute_us), "x the compute. What would help: ",
        plan.policy == OffloadPolicy::kBase
            ? "offload_policy=COST_EFFECTIVE or HEURISTIC with gpu_resident_weight_ratio >= " +
                  ratio_text(plan.ratio_to_hide) + " (BASE keeps nothing resident), or "
            : "gpu_resident_weight_ratio >= " + ratio_text(plan.ratio_to_hide) + " (now " +
                  ratio_text(options.resident_ratio) + "), or ",
        "about ", more, "x more tokens per call (a larger batch or longer sequences).");
  }

  void finish_timed() {
    cuda_check(cudaEventRecord(t_final, compute), "timing the call");
    cuda_check(cudaEventSynchronize(t_final), "waiting for the timed call");
    cuda_check(cudaStreamSynchronize(copy_stream->stream()), "waiting for weight copies");
    std::vector<double> step_us(steps, 0.0);
    double compute_ms = 0;
    for (size_t i = 0; i < steps; ++i) {
      if (!stepped[i]) continue;
      float ms = 0;
      cudaEventElapsedTime(&ms, t_begin[i], t_end[i]);
      step_us[i] = double(ms) * 1e3;
      compute_ms += ms;
    }
    float call_ms = 0;
    cudaEventElapsedTime(&call_ms, t_start, t_final);
    if (calls == 2 || calls == 4) {  // the plan of this call was made for it: judge it
      report.measured_call_ms = call_ms;
      report.measured_compute_ms = compute_ms;
      const double copy_ms = plan.copy_us / 1e3;
      const double stall = std::max(0.0, double(call_ms) - compute_ms);
      report.measured_overlap = copy_ms > 0 ? std::clamp(1.0 - stall / copy_ms, 0.0, 1.0) : 1.0;
      MAGI_LOG_INFO("weight offload, measured (plan ", plan_version, ", ", source, "): ", call_ms,
                    " ms per call, ", compute_ms, " ms of compute, ", report.measured_overlap * 100,
                    "% of ", copy_ms, " ms of copies hidden");
    }
    OffloadOptions o = options;
    o.link_bytes_per_us = report.link_gbps * 1e3;
    if (calls == 1) {
      install(plan_offload(estimate_us, plan_inputs(), o), "cost model");
    } else if (calls == 2) {
      measured_us = step_us;  // piece CUDA graphs capture in this call: also time the next
      return;
    } else if (calls == 3) {
      for (size_t i = 0; i < steps; ++i) measured_us[i] = std::min(measured_us[i], step_us[i]);
      install(plan_offload(measured_us, plan_inputs(), o), "measured");
    } else {
      return;
    }
    MAGI_LOG_INFO("weight offload plan ", plan_version, " (", source, "): ", plan.summary());
    warn_if_exposed();
  }
};

OffloadEngine::OffloadEngine(const OffloadOptions& options, std::vector<OffloadInputUse> uses,
                             size_t num_steps)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->uses = std::move(uses);
  impl_->steps = num_steps;
}

OffloadEngine::~OffloadEngine() = default;

std::mutex& OffloadEngine::lock() { return impl_->mu; }

bool OffloadEngine::begin(std::vector<c10::IValue>& inputs) {
  Impl& s = *impl_;
  if (s.plan_version == 0 || s.weights.empty()) {
    if (!s.collect(inputs)) return false;
    try {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(s.device));
      s.copy_stream = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(s.device));
      s.report.link_gbps = host_link_gbps(s.device);
      if (s.t_start == nullptr) {
        s.t_begin.resize(s.steps);
        s.t_end.resize(s.steps);
        for (size_t i = 0; i < s.steps; ++i) {
          s.t_begin[i] = Impl::new_event(true);
          s.t_end[i] = Impl::new_event(true);
        }
        s.t_start = Impl::new_event(true);
        s.t_final = Impl::new_event(true);
        s.done = Impl::new_event(false);
      }
      OffloadOptions o = s.options;
      o.policy = OffloadPolicy::kBase;  // call 1: stream everything, estimate, time
      o.link_bytes_per_us = s.report.link_gbps * 1e3;
      s.install(plan_offload(std::vector<double>(s.steps, 1.0), s.plan_inputs(), o),
                "calibration call");
      s.calls = 0;
    } catch (...) {
      // Out of memory for the buffer, say: the next call starts over rather than run on a
      // half-made plan.
      s.plan_version = 0;
      s.weights.clear();
      s.buffer = at::Tensor();
      throw;
    }
  }
  // This call's weights: the planned shapes, in offloaded memory (else passed as they are).
  bool any = false;
  for (Impl::Weight& w : s.weights) {
    const c10::IValue& v = inputs[w.use.input];
    w.through = true;
    w.src = nullptr;  // so that no prefetch is recorded as having copied it
    if (!v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (t.sizes() != at::IntArrayRef(w.sizes) || t.strides() != at::IntArrayRef(w.strides) ||
        t.scalar_type() != w.dtype || !t.is_cuda() || t.device().index() != s.device ||
        !is_offloaded(t)) {
      continue;
    }
    w.through = false;
    w.src = t.data_ptr();
    w.version = version_of(t);
    any = true;
  }
  if (!any) return false;
  try {
    s.start_call(inputs);
  } catch (...) {
    abort();
    throw;
  }
  return true;
}

void OffloadEngine::Impl::start_call(std::vector<c10::IValue>& inputs) {
  Impl& s = *this;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(s.device));
  s.compute = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(s.device)).stream();
  // The previous call may have run on another stream: this one starts after it.
  if (s.calls > 0) cuda_check(cudaStreamWaitEvent(s.compute, s.done, 0), "ordering calls");
  cudaEvent_t start = s.gate_events[0];
  cuda_check(cudaEventRecord(start, s.compute), "starting a call");
  for (size_t k = 0; k < s.weights.size(); ++k) {
    Impl::Weight& w = s.weights[k];
    if (w.through) continue;
    const at::Tensor& t = inputs[w.use.input].toTensor();
    if (s.plan.resident[k]) {
      if (!w.resident || w.resident->src != w.src) w.resident = resident_for(t);
      ResidentCopy& r = *w.resident;
      std::lock_guard<std::mutex> lock(r.mu);
      // Refreshed (or being refreshed) on another stream: wait for that copy first.
      if (r.valid && r.stream != s.compute && r.copied != nullptr) {
        cuda_check(cudaStreamWaitEvent(s.compute, r.copied, 0), "waiting for a resident copy");
      }
      if (!r.valid || r.src != w.src || r.version != w.version) {
        cuda_check(
            cudaMemcpyAsync(r.gpu.data_ptr(), w.src, size_t(w.bytes), cudaMemcpyDefault, s.compute),
            "copying a resident weight to the GPU");
        if (r.copied == nullptr) r.copied = new_event(false);
        cuda_check(cudaEventRecord(r.copied, s.compute), "recording a resident copy");
        r.src = w.src, r.version = w.version, r.valid = true, r.stream = s.compute;
      }
      inputs[w.use.input] = r.gpu;
    } else {
      inputs[w.use.input] = w.slot;
    }
  }
  // Copies the previous call did not start for this one (or started from other memory).
  for (size_t g = 0; g < s.plan.groups.size(); ++g) {
    const OffloadGroup& group = s.plan.groups[g];
    bool stale = !s.prefetched[g];
    for (size_t k : group.weights) {
      const Impl::Weight& w = s.weights[k];
      stale |= !w.through && (w.prefetched_src != w.src || w.prefetched_version != w.version);
    }
    if ((group.wraps && stale) || (!group.wraps && group.gate == -1)) s.issue(g, start);
    s.prefetched[g] = false;
  }
  s.timing = s.calls < 4;
  if (s.timing) {
    s.stepped.assign(s.steps, false);
    cuda_check(cudaEventRecord(s.t_start, s.compute), "timing a call");
    if (s.calls == 0) s.estimate_us.assign(s.steps, 0.0);
  }
}

void OffloadEngine::before_step(size_t step) {
  Impl& s = *impl_;
  for (size_t g : s.first_reads[step]) {
    cuda_check(cudaStreamWaitEvent(s.compute, s.ready[g], 0), "waiting for a weight copy");
  }
  if (s.timing) {
    cudaEventRecord(s.t_begin[step], s.compute);
    s.stepped[step] = true;
    if (s.calls == 0) t_meter = &s.estimate_us[step];
  }
}

void OffloadEngine::after_step(size_t step) {
  Impl& s = *impl_;
  if (s.timing) {
    cudaEventRecord(s.t_end[step], s.compute);
    t_meter = nullptr;
  }
  const auto& groups = s.gated[step + 1];
  if (groups.empty()) return;
  cudaEvent_t gate = s.gate_events[step + 1];
  cuda_check(cudaEventRecord(gate, s.compute), "recording a copy gate");
  for (size_t g : groups) {
    if (!s.plan.groups[g].wraps) {
      s.issue(g, gate);
    } else if (!s.timing && s.options.prefetch_across_calls) {
      // For the next call: it checks that its weights are the memory copied here.
      s.issue(g, gate);
      for (size_t k : s.plan.groups[g].weights) {
        Impl::Weight& w = s.weights[k];
        w.prefetched_src = w.src;
        w.prefetched_version = w.version;
      }
      s.prefetched[g] = true;
    }
  }
}

void OffloadEngine::finish() {
  Impl& s = *impl_;
  t_meter = nullptr;
  cuda_check(cudaEventRecord(s.done, s.compute), "ending a call");
  ++s.calls;
  s.report.calls = s.calls;
  if (s.timing) s.finish_timed();
  s.timing = false;
}

void OffloadEngine::abort() {
  Impl& s = *impl_;
  t_meter = nullptr;
  s.timing = false;
  if (!s.copy_stream || s.compute == nullptr) return;
  // Later copies wait for everything the failed call enqueued; nothing counts as prefetched.
  cudaEvent_t e = s.gate_events[0];
  if (cudaEventRecord(e, s.compute) == cudaSuccess) {
    cudaStreamWaitEvent(s.copy_stream->stream(), e, 0);
  }
  if (s.done != nullptr) cudaEventRecord(s.done, s.compute);
  cudaGetLastError();
  std::fill(s.prefetched.begin(), s.prefetched.end(), false);
}

std::optional<OffloadReport> OffloadEngine::report() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->plan_version == 0) return std::nullopt;
  return impl_->report;
}

#else  // no CUDA: offloaded memory cannot exist, the engine never takes part

at::Tensor offload_to_host(const at::Tensor&, c10::Device) {
  MAGI_CHECK(false, "weight offload needs a CUDA build of magi-compiler");
  return {};
}
at::Tensor offloaded_view(const at::Tensor& t, c10::Device) { return t; }
bool is_offloaded(const at::Tensor&) { return false; }
int64_t offload_host_bytes() { return 0; }
int64_t resident_cache_bytes() { return 0; }
double host_link_gbps(int) { return 0; }
double estimate_operator_us(const std::string&, const std::vector<c10::IValue>&,
                            const std::vector<c10::IValue>&) {
  return 0;
}

struct OffloadEngine::Impl {
  std::mutex mu;
};
OffloadEngine::OffloadEngine(const OffloadOptions&, std::vector<OffloadInputUse>, size_t)
    : impl_(std::make_unique<Impl>()) {}
OffloadEngine::~OffloadEngine() = default;
std::mutex& OffloadEngine::lock() { return impl_->mu; }
bool OffloadEngine::begin(std::vector<c10::IValue>&) { return false; }
void OffloadEngine::before_step(size_t) {}
void OffloadEngine::after_step(size_t) {}
void OffloadEngine::finish() {}
void OffloadEngine::abort() {}
std::optional<OffloadReport> OffloadEngine::report() const { return std::nullopt; }

#endif

}  // namespace magi::runtime
