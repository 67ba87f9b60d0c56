// CudaGraphRunner: see cuda_graph.h for the rules.
#include "magi/runtime/cuda_graph.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "magi/common/error.h"
#include "magi/common/log.h"
#include "magi/runtime/executor.h"

#ifdef MAGI_HAVE_CUDA_GRAPHS
#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace magi::runtime {

#ifdef MAGI_HAVE_CUDA_GRAPHS
namespace {

// The signature of one call, as integers (cheap to build and compare on every call): per
// input a tag, then for a tensor its dtype, device, requires_grad, rank, sizes and strides, for
// a scalar its value.
using Signature = std::vector<int64_t>;

// A call padded into a bucket: `rows` samples run in a graph of `bucket` samples; batched
// input i has rows_per_sample[i] rows (dim 0) per sample.
struct Padding {
  int64_t rows = 0;
  int64_t bucket = 0;
  const std::vector<int64_t>* rows_per_sample = nullptr;
  int64_t k(size_t i) const { return rows == 0 ? 0 : (*rows_per_sample)[i]; }
};

// The strides of a batched input's bucket-sized buffer: its own, which do not depend on dim 0's
// size when dim 0 is outermost, except that a size-1 dim's stride (meaningless, but possibly a
// multiple of the batch, as in x.unsqueeze(0).permute(1, 0, 2)) becomes 1.
std::vector<int64_t> padded_strides(const at::Tensor& t) {
  std::vector<int64_t> strides = t.strides().vec();
  for (int64_t d = 1; d < t.dim(); ++d) {
    if (t.size(d) == 1) strides[d] = 1;
  }
  return strides;
}

// Held for the whole of a capture: captures share their stream (below), so two runners
// capturing from two threads take turns. Recursive: a graph being captured may call another
// compiled module (a custom op's body) whose runner takes it again on the same thread.
std::recursive_mutex& capture_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

// The stream every capture on `device` runs on (call with capture_mutex() held): one stream
// rather than one per capture from the pool, which hands its streams out in turn. cuBLAS's
// workspace for it (32 MiB on Hopper) is made inside each capture, in that runner's pool (see
// capture()), so each runner's pool holds one.
c10::cuda::CUDAStream capture_stream(c10::DeviceIndex device) {
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  auto it = streams.find(device);
  if (it == streams.end()) {
    it = streams.emplace(device, c10::cuda::getStreamFromPool(false, device)).first;
  }
  return it->second;
}

// With padding, batched inputs enter as their padded selves: dim 0 (or the value) bucket * k,
// padded_strides().
Signature signature_of(const std::vector<c10::IValue>& inputs, bool* all_cuda, const Padding& pad) {
  Signature sig;
  sig.reserve(inputs.size() * 8);
  *all_cuda = true;
  bool any_tensor = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    const int64_t k = pad.k(i);
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      any_tensor = true;
      *all_cuda &= t.is_cuda();
      sig.push_back(static_cast<int64_t>(t.scalar_type()) << 32 | (t.device().index() + 1) << 1 |
                    (t.requires_grad() ? 1 : 0));
      sig.push_back(t.dim());
      const size_t at = sig.size();
      for (int64_t s : t.sizes()) sig.push_back(s);
      if (k == 0) {
        for (int64_t s : t.strides()) sig.push_back(s);
      } else {
        sig[at] = pad.bucket * k;
        for (int64_t s : padded_strides(t)) sig.push_back(s);
      }
    } else if (v.isInt()) {
      sig.push_back(-1);
      sig.push_back(k == 0 ? v.toInt() : pad.bucket * k);
    } else if (v.isDouble()) {
      sig.push_back(-2);
      double d = v.toDouble();
      int64_t bits = 0;
      std::memcpy(&bits, &d, sizeof bits);
      sig.push_back(bits);
    } else if (v.isBool()) {
      sig.push_back(-3);
      sig.push_back(v.toBool());
    } else if (v.isNone()) {
      sig.push_back(-4);
    } else {
      *all_cuda = false;  // lists and others: not worth capturing
    }
  }
  *all_cuda &= any_tensor;
  return sig;
}

}  // namespace

// Host time per stage of replaying calls (set_stage_timing): a diagnostic, off by default.
struct StageClock {
  static constexpr const char* kNames[] = {"signature",    "lookup", "checks",
                                           "input_copies", "launch", "outputs"};
  static constexpr size_t kStages = sizeof(kNames) / sizeof(kNames[0]);
  bool on = false;
  std::array<double, kStages> totals_us{};
  size_t calls = 0;
  std::chrono::steady_clock::time_point last;
  void start() {
    if (on) last = std::chrono::steady_clock::now();
  }
  void lap(size_t stage) {
    if (!on) return;
    const auto now = std::chrono::steady_clock::now();
    totals_us[stage] += std::chrono::duration<double, std::micro>(now - last).count();
    last = now;
  }
};

struct CudaGraphRunner::Impl {
  // A graph executable instantiated here (the CUDAGraph owns its own).
  struct ExecDeleter {
    void operator()(CUgraphExec_st* exec) const {
      if (exec != nullptr) C10_CUDA_CHECK_WARN(cudaGraphExecDestroy(exec));
    }
  };
  using OwnedExec = std::unique_ptr<CUgraphExec_st, ExecDeleter>;

  struct EventDeleter {
    void operator()(CUevent_st* event) const {
      if (event != nullptr) C10_CUDA_CHECK_WARN(cudaEventDestroy(event));
    }
  };

  // Where one replay leaves the outputs the graph copies itself (see cuda_graph.h): buffers of
  // the runner, one per such output, and the executable whose copy nodes write them.
  struct Slot {
    OwnedExec owned;                    // null: the CUDAGraph's own executable
    std::vector<at::Tensor> buffers;    // per output; undefined where copied after the launch
    std::vector<cudaStream_t> streams;  // streams the buffers have been used on
    // Per input, what this executable's input copy node reads now (see InputCopy): set before
    // a launch only when the call's tensor is another one than the last launch's.
    std::vector<std::pair<const void*, size_t>> sources;
  };
  // Slot::sources before the first launch (the capture's tensor), and of a node set idle.
  static constexpr std::pair<const void*, size_t> kCaptured{nullptr, SIZE_MAX};
  static constexpr std::pair<const void*, size_t> kIdle{nullptr, 0};

  // Input i's copy node at the start of the graph: it copies the caller's tensor into the
  // graph's static buffer, so that a replay is one launch and no cudaMemcpyAsync of its own.
  // Each launch points it at the call's tensor first (cudaGraphExecMemcpyNodeSetParams1D,
  // which leaves launches already queued as they were).
  struct InputCopy {
    cudaGraphNode_t node = nullptr;      // null: copied on the stream before the launch
    const void* captured_src = nullptr;  // what the node read at capture (to find it)
  };

  // Output j's copy node inside the graph (null: copied after the launch, as copy_out does).
  struct OutputCopy {
    cudaGraphNode_t node = nullptr;
    const void* src = nullptr;  // the graph's own output, which the node reads
    size_t bytes = 0;
  };

  struct Entry {
    int calls = 0;
    // The tensors of the warm-up call, held weakly: a weak reference keeps the TensorImpl's
    // memory from being reused, so "the same TensorImpl at capture" means the same tensor
    // object (a parameter or buffer), never a new activation that happens to land there.
    std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> warmup_tensors;
    // The warm-up's outputs as the graph will make them (bucket-sized when padded): what the
    // capture allocates the first slot's buffers from. Undefined for outputs the graph does
    // not copy itself.
    std::vector<at::Tensor> warmup_outputs;
    std::vector<bool> in_place;              // input used at its own address
    std::vector<c10::IValue> static_inputs;  // what the graph reads
    // Per input used in place, the address the graph reads: the parameter's own TensorImpl
    // (static_inputs[i]) follows a `.data` assignment, the captured address does not.
    std::vector<const void*> captured_ptrs;
    // The graph's own outputs: None where the graph copies the output into a slot's buffer
    // (the memory is then free in the pool, for other captures to use).
    std::vector<c10::IValue> static_outputs;
    std::vector<OutputCopy> copies;
    std::vector<InputCopy> input_copies;  // per input
    at::Tensor scratch;                   // a few bytes an unused input copy node writes (idle())
    std::vector<Slot> slots;              // two when a second executable could be made, else one
    size_t last_slot = 0;
    std::optional<cudaStream_t> last_stream;          // the stream of the last replay
    std::unique_ptr<CUevent_st, EventDeleter> order;  // orders replays across streams
    c10::DeviceIndex device = 0;
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    // No kernel of the graph uses random numbers (Executable::draws_random_numbers): replays
    // launch it directly (see launch()).
    bool draws_no_rng = false;

    void drop_graph() {
      slots.clear();  // before the graph: its executables came from the graph
      copies.clear();
      input_copies.clear();
      static_outputs.clear();
      graph.reset();
    }
  };

  Impl(const Executable& executable, size_t max, std::vector<int64_t> sizes)
      : exe(executable), max_graphs(max), ladder(std::move(sizes)) {
    std::sort(ladder.begin(), ladder.end());
    ladder.erase(std::unique(ladder.begin(), ladder.end()), ladder.end());
    const PaddingPlan& plan = exe.padding();
    if (!ladder.empty() && plan.possible()) padding = &plan;
  }

  const Executable& exe;
  size_t max_graphs;
  std::vector<int64_t> ladder;
  const PaddingPlan* padding = nullptr;  // set when calls are padded into the ladder's buckets
  std::map<Signature, Entry> entries;
  size_t captures = 0, replays = 0, padded_calls = 0, direct_launches = 0;
  size_t fresh_buffers = 0;     // output buffers allocated because the caller held both sets
  size_t input_retargets = 0;   // input copy nodes pointed at another tensor
  bool use_input_nodes = true;  // false: inputs copied on the stream (set_input_copy_nodes)
  // The entry of the last unpadded replay found through the map, and its signature (entries
  // are never erased, so both stay valid): run() tries it before building a signature.
  const Signature* last_key = nullptr;
  Entry* last_entry = nullptr;
  bool warned_full = false;
  StageClock clock;
  // The memory pool all graphs of this runner share. The allocator forgets a pool once no
  // graph uses it, so a new handle is taken whenever no captured graph is alive.
  c10::cuda::MempoolId_t pool{0, 0};

  c10::cuda::MempoolId_t shared_pool() {
    bool alive = false;
    for (const auto& [key, e] : entries) alive |= e.graph != nullptr;
    if (!alive) pool = at::cuda::graph_pool_handle();
    return pool;
  }

  bool batched(size_t i) const { return padding != nullptr && padding->input_rows[i] > 0; }

  // The padding of this call: its batch and bucket when it runs in a larger bucket's graph;
  // rows 0 when it runs at its own size (no padding, above the ladder, a batched input whose
  // rows are not one run of memory each, or inputs that disagree on the batch).
  Padding padding_of(const std::vector<c10::IValue>& inputs) const {
    Padding pad;
    if (padding == nullptr || padding->input_rows.size() != inputs.size()) return pad;
    int64_t batch = -1;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int64_t k = padding->input_rows[i];
      if (k == 0) continue;
      int64_t n = -1;
      if (inputs[i].isTensor()) {
        const at::Tensor& t = inputs[i].toTensor();
        // Dense with dim 0 outermost (contiguous, or e.g. attention's [b, h, t, d] output laid
        // out as [b, t, h, d]): the first rows are a prefix of memory, and a bucket-sized
        // buffer with the same strides holds them.
        if (t.dim() == 0 || t.size(0) == 0 || !t.is_non_overlapping_and_dense() ||
            t.stride(0) * t.size(0) != t.numel()) {
          return pad;
        }
        n = t.size(0);
      } else if (inputs[i].isInt()) {
        n = inputs[i].toInt();
      }
      if (n <= 0 || n % k != 0 || (batch >= 0 && n / k != batch)) return pad;
      batch = n / k;
    }
    if (batch <= 0) return pad;
    const int64_t bucket = bucket_for(ladder, batch);
    if (bucket == batch) return pad;
    pad.rows = batch;
    pad.bucket = bucket;
    pad.rows_per_sample = &padding->input_rows;
    return pad;
  }

  // The call's inputs at the bucket's size: batched tensors in fresh buffers whose extra rows
  // repeat the call's last sample. Any values would do for the results (no valid row reads
  // them), but they must be values the graph accepts: zeros can be out-of-range indices
  // (ids - 20 into a table of 10) where the caller's rows are not.
  static std::vector<c10::IValue> padded(const std::vector<c10::IValue>& inputs,
                                         const Padding& pad) {
    std::vector<c10::IValue> out;
    out.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int64_t k = pad.k(i);
      if (k == 0) {
        out.push_back(inputs[i]);
      } else if (inputs[i].isTensor()) {
        const at::Tensor& t = inputs[i].toTensor();
        std::vector<int64_t> sizes = t.sizes().vec();
        sizes[0] = pad.bucket * k;
        at::Tensor p = at::empty_strided(sizes, padded_strides(t), t.options());
        const int64_t rows = t.size(0);
        p.narrow(0, 0, rows).copy_(t);
        std::vector<int64_t> samples = t.sizes().vec();  // [extra samples, k, rest...]
        samples[0] = k;
        samples.insert(samples.begin(), pad.bucket - pad.rows);
        p.narrow(0, rows, sizes[0] - rows)
            .view(samples)
            .copy_(t.narrow(0, rows - k, k).unsqueeze(0));
        out.emplace_back(std::move(p));
      } else {
        out.emplace_back(pad.bucket * k);
      }
    }
    return out;
  }

  static const void* ptr_of(const c10::IValue& v) {
    return v.isTensor() ? v.toTensor().data_ptr() : nullptr;
  }

  static c10::weak_intrusive_ptr<c10::TensorImpl> weak_of(const c10::IValue& v) {
    if (!v.isTensor()) {
      return c10::weak_intrusive_ptr<c10::TensorImpl>(c10::intrusive_ptr<c10::TensorImpl>());
    }
    return c10::weak_intrusive_ptr<c10::TensorImpl>(v.toTensor().getIntrusivePtr());
  }

  static bool same_tensor(const c10::weak_intrusive_ptr<c10::TensorImpl>& w, const c10::IValue& v) {
    return v.isTensor() && !w.expired() &&
           w._unsafe_get_target() == v.toTensor().unsafeGetTensorImpl();
  }

  static void remember(Entry& e, const std::vector<c10::IValue>& inputs) {
    e.warmup_tensors.clear();
    for (const auto& v : inputs) e.warmup_tensors.push_back(weak_of(v));
  }

  // Whether the graph can copy output `t` into a buffer of the runner itself: a dense CUDA
  // tensor with elements, and when the output is batched (padding), with its batch dim
  // outermost, so that a call's rows are a prefix of the buffer.
  bool copied_by_graph(const at::Tensor& t, size_t j) const {
    if (!t.is_cuda() || t.numel() == 0 || !t.is_non_overlapping_and_dense() || t.is_conj() ||
        t.is_neg()) {
      return false;
    }
    if (padding != nullptr && j < padding->output_rows.size() && padding->output_rows[j] > 0) {
      const int64_t d = padding->output_dims[j];
      return d >= 0 && d < t.dim() && t.stride(d) * t.size(d) == t.numel();
    }
    return true;
  }

  static at::Tensor buffer_like(const at::Tensor& t) {
    return at::empty_strided(t.sizes(), t.strides(), t.options());
  }

  static bool same_layout(const at::Tensor& a, const at::Tensor& b) {
    return a.scalar_type() == b.scalar_type() && a.device() == b.device() &&
           a.sizes() == b.sizes() && a.strides() == b.strides();
  }

  // Finds the copy node of each input and output the graph copies: an output's by its
  // destination (a buffer of the first slot), an input's by its destination (the static
  // buffer) and source (the capture's tensor). False when one is missing: the graph is then
  // captured again without copy nodes.
  static bool find_copy_nodes(Entry& e) {
    cudaGraph_t graph = e.graph->raw_cuda_graph();
    size_t n = 0;
    C10_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    C10_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
    std::multimap<const void*, std::pair<const void*, cudaGraphNode_t>> by_destination;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      C10_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
      if (type != cudaGraphNodeTypeMemcpy) continue;
      cudaMemcpy3DParms params{};
      C10_CUDA_CHECK(cudaGraphMemcpyNodeGetParams(node, &params));
      by_destination.emplace(params.dstPtr.ptr, std::make_pair(params.srcPtr.ptr, node));
    }
    auto find = [&](const void* dst, const void* src) -> cudaGraphNode_t {
      auto [first, last] = by_destination.equal_range(dst);
      for (auto it = first; it != last; ++it) {
        if (src == nullptr || it->second.first == src) return it->second.second;
      }
      return nullptr;
    };
    for (size_t j = 0; j < e.copies.size(); ++j) {
      if (e.copies[j].bytes == 0) continue;
      e.copies[j].node = find(e.slots[0].buffers[j].data_ptr(), nullptr);
      if (e.copies[j].node == nullptr) return false;
    }
    for (size_t i = 0; i < e.input_copies.size(); ++i) {
      InputCopy& c = e.input_copies[i];
      if (c.captured_src == nullptr) continue;
      c.node = find(e.static_inputs[i].toTensor().data_ptr(), c.captured_src);
      if (c.node == nullptr) return false;
    }
    return true;
  }

  // Points the copy nodes of `exec` at the buffers of `slot` (takes effect for later launches).
  static void retarget(const Entry& e, cudaGraphExec_t exec, const Slot& slot) {
    for (size_t j = 0; j < e.copies.size(); ++j) {
      const OutputCopy& c = e.copies[j];
      if (c.node == nullptr) continue;
      C10_CUDA_CHECK(cudaGraphExecMemcpyNodeSetParams1D(exec, c.node, slot.buffers[j].data_ptr(),
                                                        c.src, c.bytes, cudaMemcpyDeviceToDevice));
    }
  }

  cudaGraphExec_t exec_of(Entry& e, Slot& slot) const {
    return slot.owned ? slot.owned.get() : e.graph->raw_cuda_graph_exec();
  }

  // A second executable of the graph, writing its own buffers, so that calls alternate between
  // two sets of outputs without touching either executable. Only for graphs launched directly
  // (replay() launches the CUDAGraph's own), and not where CUDA refuses a second instantiation
  // (a graph with memory nodes, under the cudaMallocAsync allocator): one slot then.
  void add_second_slot(Entry& e) {
    if (!e.draws_no_rng) return;
    bool any = false;
    for (const auto& c : e.copies) any |= c.node != nullptr;
    if (!any) return;
    cudaGraphExec_t exec = nullptr;
    if (cudaGraphInstantiate(&exec, e.graph->raw_cuda_graph(), 0) != cudaSuccess) {
      (void)cudaGetLastError();
      MAGI_LOG_DEBUG("CUDA graphs: no second executable; outputs use one set of buffers");
      return;
    }
    Slot slot;
    slot.owned.reset(exec);
    for (const auto& b : e.slots[0].buffers) {
      slot.buffers.push_back(b.defined() ? buffer_like(b) : at::Tensor());
    }
    retarget(e, exec, slot);
    e.slots.push_back(std::move(slot));
  }

  // `graph_inputs`: the call's inputs at the graph's size (padded when `pad.rows` > 0). With
  // `copy_nodes`, the graph starts by copying its dense inputs into their static buffers and
  // ends by copying its outputs into the buffers of a slot.
  std::vector<c10::IValue> capture(Entry& e, const std::vector<c10::IValue>& graph_inputs,
                                   std::vector<c10::IValue> inputs, const Padding& pad,
                                   bool copy_nodes = true) {
    const size_t n = graph_inputs.size();
    e.in_place.assign(n, false);
    e.static_inputs.clear();
    e.captured_ptrs.assign(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = graph_inputs[i];
      if (v.isTensor() && !batched(i) && same_tensor(e.warmup_tensors[i], v)) {
        e.in_place[i] = true;  // a parameter or buffer: the graph reads it where it is
        e.captured_ptrs[i] = ptr_of(v);
        e.static_inputs.push_back(v);
      } else if (v.isTensor()) {
        e.static_inputs.push_back(v.toTensor().clone());
      } else {
        e.static_inputs.push_back(v);
      }
    }
    const c10::Device device = [&] {
      for (const auto& v : graph_inputs) {
        if (v.isTensor()) return v.toTensor().device();
      }
      return c10::Device(c10::DeviceType::CUDA, 0);
    }();
    e.device = device.index();
    c10::cuda::CUDAGuard device_guard(device);
    auto current = c10::cuda::getCurrentCUDAStream(device.index());
    C10_CUDA_CHECK(cudaStreamSynchronize(current.stream()));
    // The first slot's buffers, made outside the graph's pool (on the current stream) from the
    // warm-up's outputs: the outputs the caller gets must never share memory with the pool,
    // where another graph's replay could write.
    Slot first;
    if (copy_nodes) {
      for (const auto& w : e.warmup_outputs) {
        first.buffers.push_back(
            w.defined() ? at::empty_strided(w.sizes(), w.strides(), w.options().device(device))
                        : at::Tensor());
      }
      first.streams.push_back(current.stream());
    }
    c10::cuda::MempoolId_t graph_pool = shared_pool();
    e.graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
    e.draws_no_rng = !exe.draws_random_numbers();
    e.copies.clear();
    e.input_copies.assign(n, InputCopy{});
    {
      std::lock_guard<std::recursive_mutex> capturing(capture_mutex());
      const c10::cuda::CUDAStream side = capture_stream(device.index());
      c10::cuda::CUDAStreamGuard stream_guard(side);
      // cuBLAS keeps a workspace per handle and stream that outlives captures, and a graph
      // bakes in the address of the one it used. Cleared before the capture (and after it, as
      // torch's CUDA graph trees do), cuBLAS makes a new one inside the capture, from this
      // runner's pool, which lives as long as the graphs that use it. Otherwise a graph could
      // capture a workspace from another runner's pool, and once torch.compile's
      // reduce-overhead cleared the workspaces and that pool went back to the driver, its
      // replays wrote to freed memory (an illegal memory access).
      at::cuda::clearCublasWorkspaces();
      e.graph->capture_begin(graph_pool);
      try {
        ArenaOffScope no_arena;
        for (size_t i = 0; i < n && copy_nodes; ++i) {
          if (e.in_place[i] || !graph_inputs[i].isTensor()) continue;
          const at::Tensor& src = graph_inputs[i].toTensor();
          const at::Tensor& dst = e.static_inputs[i].toTensor();
          if (!src.is_cuda() || src.nbytes() == 0 || !same_dense_layout(dst, src)) continue;
          copy_dense(dst, src, side.stream());
          e.input_copies[i].captured_src = src.data_ptr();
        }
        e.static_outputs = exe.run(e.static_inputs);
        e.copies.assign(e.static_outputs.size(), OutputCopy{});
        for (size_t j = 0; j < e.static_outputs.size() && j < first.buffers.size(); ++j) {
          at::Tensor& buffer = first.buffers[j];
          const c10::IValue& v = e.static_outputs[j];
          if (!buffer.defined() || !v.isTensor() || !same_layout(v.toTensor(), buffer)) {
            buffer = at::Tensor();
            continue;
          }
          const at::Tensor& out = v.toTensor();
          e.copies[j].src = out.data_ptr();
          e.copies[j].bytes = out.nbytes();
          copy_dense(buffer, out, side.stream());
        }
      } catch (...) {
        try {
          e.graph->capture_end();
        } catch (...) {
        }
        e.graph.reset();
        at::cuda::clearCublasWorkspaces();
        throw;
      }
      e.graph->capture_end();
      at::cuda::clearCublasWorkspaces();
    }
    e.graph->instantiate();
    e.slots.clear();
    e.slots.push_back(std::move(first));
    if (copy_nodes && !find_copy_nodes(e)) {
      MAGI_LOG_DEBUG(
          "CUDA graphs: the copy nodes of inputs or outputs were not found; capturing again "
          "with inputs copied before and outputs after each replay");
      e.drop_graph();
      return capture(e, graph_inputs, std::move(inputs), pad, /*copy_nodes=*/false);
    }
    for (size_t j = 0; j < e.copies.size(); ++j) {
      if (e.copies[j].node != nullptr) e.static_outputs[j] = c10::IValue();
    }
    add_second_slot(e);
    e.last_slot = e.slots.size() - 1;  // the first replay writes slot 0
    e.last_stream.reset();
    ++captures;
    MAGI_LOG_DEBUG("captured a CUDA graph (", entries.size(), " signatures, ", e.slots.size(),
                   " output slots)");
    return replay(e, std::move(inputs), pad);
  }

  // Copies between dense tensors of one layout go straight to cudaMemcpyAsync on the current
  // stream: the same work as Tensor::copy_ / clone without their dispatch, which is most of a
  // replay's host time at small shapes.
  static bool same_dense_layout(const at::Tensor& a, const at::Tensor& b) {
    return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
           a.strides() == b.strides() && a.is_non_overlapping_and_dense() && !a.is_conj() &&
           !b.is_conj() && !a.is_neg() && !b.is_neg();
  }

  static void copy_dense(const at::Tensor& dst, const at::Tensor& src, cudaStream_t stream) {
    C10_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(),
                                   cudaMemcpyDeviceToDevice, stream));
  }

  // The caller's copy of output `t`, or of its first `rows` rows along `dim` when rows >= 0.
  // `stream`: the current stream of the output's device, which is current (nullopt: copy_).
  static at::Tensor copy_out(const at::Tensor& graph_output, int64_t dim, int64_t rows,
                             std::optional<cudaStream_t> stream) {
    const at::Tensor t = rows >= 0 ? graph_output.narrow(dim, 0, rows) : graph_output;
    if (stream && t.is_cuda() && t.is_non_overlapping_and_dense() && !t.is_conj() && !t.is_neg()) {
      at::Tensor copy = at::empty_strided(t.sizes(), t.strides(), t.options());
      copy_dense(copy, t, *stream);
      return copy;
    }
    at::Tensor copy = at::empty_like(t);  // dense, in t's dim order
    copy.copy_(t, /*non_blocking=*/true);
    return copy;
  }

  // A new tensor on `buffer`'s memory (its first `rows` along `dim` when rows >= 0): what the
  // caller gets, so that the buffer's storage counts every tensor outside the runner.
  static at::Tensor hand_out(const at::Tensor& buffer, int64_t dim, int64_t rows) {
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(buffer.storage()),
                                                     buffer.key_set(), buffer.dtype());
    if (rows < 0) {
      impl->set_sizes_and_strides(buffer.sizes(), buffer.strides());
    } else {
      std::vector<int64_t> sizes = buffer.sizes().vec();
      sizes[dim] = rows;
      impl->set_sizes_and_strides(sizes, buffer.strides());
    }
    return at::Tensor(std::move(impl));
  }

  // Whether a tensor outside the runner (the caller's output, or any view of it) still refers
  // to a buffer of `slot`.
  static bool held(const Slot& slot) {
    for (const auto& b : slot.buffers) {
      if (b.defined() && b.storage().use_count() > 1) return true;
    }
    return false;
  }

  // The slot this replay writes: the one the last replay did not write when the caller has let
  // go of it, else the last one when that is free; when the caller holds both, the first gets
  // new buffers for what is held (the held ones become the caller's alone).
  Slot& pick_slot(Entry& e, const c10::cuda::CUDAStream& stream) {
    const size_t other = (e.last_slot + 1) % e.slots.size();
    size_t pick = other;
    if (held(e.slots[other]) && !held(e.slots[e.last_slot])) pick = e.last_slot;
    Slot& slot = e.slots[pick];
    e.last_slot = pick;
    if (held(slot)) {
      for (auto& b : slot.buffers) {
        if (b.defined() && b.storage().use_count() > 1) {
          b = buffer_like(b);
          ++fresh_buffers;
        }
      }
      slot.streams.assign(1, stream.stream());
      retarget(e, exec_of(e, slot), slot);
    }
    // The caching allocator frees a block once the work of the streams it was used on is done:
    // a buffer written on a stream it was not made on is recorded there.
    if (std::find(slot.streams.begin(), slot.streams.end(), stream.stream()) ==
        slot.streams.end()) {
      for (const auto& b : slot.buffers) {
        if (b.defined())
          c10::cuda::CUDACachingAllocator::recordStream(b.storage().data_ptr(), stream);
      }
      slot.streams.push_back(stream.stream());
    }
    return slot;
  }

  // Replays `e` on `stream`, writing `slot`. CUDAGraph::replay() first brings the seed and
  // offset of each generator the capture drew from up to date (two fill kernels and their
  // dispatch on every replay of a graph whose capture took a Philox offset, as attention does
  // even at dropout 0). A graph none of whose kernels uses the numbers needs none of that: it
  // is launched directly.
  void launch(Entry& e, Slot& slot, cudaStream_t stream) {
    if (e.draws_no_rng) {
      C10_CUDA_CHECK(cudaGraphLaunch(exec_of(e, slot), stream));
      ++direct_launches;
    } else {
      e.graph->replay();  // one slot: the CUDAGraph's own executable
    }
  }

  // A run without a graph that prepares one (the first call of a signature, or the first after
  // a parameter moved): kernels load, library handles are made, and the tensors are remembered
  // to tell parameters (same tensor at capture) from activations. A padded call runs at the
  // bucket's size and returns copies of its rows, so it keeps no bucket-sized buffer alive.
  std::vector<c10::IValue> warm_up(Entry& e, std::vector<c10::IValue> inputs, const Padding& pad) {
    std::vector<c10::IValue> outputs;
    if (pad.rows == 0) {
      remember(e, inputs);
      outputs = exe.run(std::move(inputs));
    } else {
      std::vector<c10::IValue> graph_inputs = padded(inputs, pad);
      remember(e, graph_inputs);
      ++padded_calls;
      outputs = exe.run(std::move(graph_inputs));
    }
    e.warmup_outputs.clear();
    for (size_t j = 0; j < outputs.size(); ++j) {
      const c10::IValue& v = outputs[j];
      const bool copied = v.isTensor() && copied_by_graph(v.toTensor(), j);
      // Only the layout is kept (an empty tensor of it), not the output itself.
      e.warmup_outputs.push_back(
          copied ? at::empty_strided(v.toTensor().sizes(), v.toTensor().strides(),
                                     v.toTensor().options().device(at::kMeta))
                 : at::Tensor());
    }
    if (pad.rows == 0) return outputs;
    for (size_t j = 0; j < outputs.size() && j < padding->output_rows.size(); ++j) {
      const int64_t k = padding->output_rows[j];
      if (k == 0) continue;
      if (outputs[j].isInt()) {
        outputs[j] = c10::IValue(pad.rows * k);
      } else if (outputs[j].isTensor()) {
        const at::Tensor& t = outputs[j].toTensor();
        outputs[j] = copy_out(t, padding->output_dims[j], pad.rows * k, std::nullopt);
      }
    }
    return outputs;
  }

  // Makes the graph read the call's inputs that are not used in place: through the input's
  // copy node where it has one (pointed at the call's tensor when that is not the one the
  // executable's node reads already), else by a copy on the stream before the launch. A padded
  // call fills the first rows; the rest keep an earlier call's rows (or the capture's copies
  // of a real sample): valid inputs that no valid row reads (the padding plan's guarantee).
  void feed_inputs(Entry& e, Slot& slot, const std::vector<c10::IValue>& inputs, const Padding& pad,
                   cudaStream_t stream) {
    if (slot.sources.size() != inputs.size()) slot.sources.assign(inputs.size(), kCaptured);
    const cudaGraphExec_t exec = exec_of(e, slot);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].isTensor() || e.in_place[i]) continue;
      const at::Tensor& src = inputs[i].toTensor();
      const at::Tensor& whole = e.static_inputs[i].toTensor();
      const at::Tensor dst = pad.k(i) > 0 ? whole.narrow(0, 0, src.size(0)) : whole;
      const bool dense = same_dense_layout(dst, src);
      const cudaGraphNode_t node = i < e.input_copies.size() ? e.input_copies[i].node : nullptr;
      if (node != nullptr && dense && use_input_nodes) {
        const std::pair<const void*, size_t> source{src.data_ptr(), src.nbytes()};
        if (slot.sources[i] == source) continue;
        if (cudaGraphExecMemcpyNodeSetParams1D(exec, node, dst.data_ptr(), source.first,
                                               source.second,
                                               cudaMemcpyDeviceToDevice) == cudaSuccess) {
          slot.sources[i] = source;
          ++input_retargets;
          continue;
        }
        (void)cudaGetLastError();  // e.g. memory of another kind than the capture's: copy below
        MAGI_LOG_DEBUG("CUDA graphs: input ", i, "'s copy node refused the call's tensor");
      }
      if (node != nullptr && slot.sources[i] != kIdle) {
        idle(e, exec, node, whole);
        slot.sources[i] = kIdle;
      }
      if (dense) {
        copy_dense(dst, src, stream);
      } else {
        dst.copy_(src, /*non_blocking=*/true);
      }
    }
  }

  // Points an input copy node that this call does not use at a copy of one byte of the
  // static buffer into the entry's scratch, so that it cannot read a tensor the caller has
  // freed since.
  static void idle(Entry& e, cudaGraphExec_t exec, cudaGraphNode_t node, const at::Tensor& whole) {
    if (!e.scratch.defined())
      e.scratch = at::empty_strided({16}, {1}, whole.options().dtype(at::kByte));
    C10_CUDA_CHECK(cudaGraphExecMemcpyNodeSetParams1D(
        exec, node, e.scratch.data_ptr(), whole.data_ptr(), 1, cudaMemcpyDeviceToDevice));
  }

  std::vector<c10::IValue> replay(Entry& e, std::vector<c10::IValue> inputs, const Padding& pad) {
    c10::cuda::CUDAGuard device_guard(e.device);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(e.device);
    const cudaStream_t stream = current.stream();
    // Two executables of one graph share its memory; CUDA orders the launches of one
    // executable, not of two. A replay on another stream than the last waits for that one.
    if (e.last_stream && *e.last_stream != stream) {
      if (!e.order) {
        cudaEvent_t event = nullptr;
        C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
        e.order.reset(event);
      }
      C10_CUDA_CHECK(cudaEventRecord(e.order.get(), *e.last_stream));
      C10_CUDA_CHECK(cudaStreamWaitEvent(stream, e.order.get(), 0));
    }
    e.last_stream = stream;
    clock.lap(2);
    Slot& slot = pick_slot(e, current);
    feed_inputs(e, slot, inputs, pad, stream);
    clock.lap(3);
    launch(e, slot, stream);
    clock.lap(4);
    ++replays;
    padded_calls += pad.rows > 0;
    std::vector<c10::IValue> out;
    out.reserve(e.copies.size());
    for (size_t j = 0; j < e.copies.size(); ++j) {
      const int64_t k = pad.rows > 0 ? padding->output_rows[j] : 0;
      const int64_t dim = k > 0 ? padding->output_dims[j] : 0;
      const int64_t rows = k > 0 ? pad.rows * k : -1;
      if (e.copies[j].node != nullptr) {
        out.emplace_back(hand_out(slot.buffers[j], dim, rows));
        continue;
      }
      const c10::IValue& v = e.static_outputs[j];
      if (v.isTensor()) {
        out.emplace_back(copy_out(v.toTensor(), dim, rows, stream));
      } else {
        out.push_back(k > 0 ? c10::IValue(pad.rows * k) : v);
      }
    }
    clock.lap(5);
    clock.calls += clock.on;
    return out;
  }

  // Whether `inputs`, unpadded, have signature `key` (what signature_of would build, compared
  // field by field without building it) and each input `e` uses in place is the tensor it
  // was at capture: the call replays `e` as it is.
  static bool same_call(const Signature& key, const Entry& e,
                        const std::vector<c10::IValue>& inputs) {
    size_t at = 0;
    auto next = [&](int64_t value) { return at < key.size() && key[at++] == value; };
    for (size_t i = 0; i < inputs.size(); ++i) {
      const c10::IValue& v = inputs[i];
      if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        if (!t.is_cuda() ||
            !next(static_cast<int64_t>(t.scalar_type()) << 32 | (t.device().index() + 1) << 1 |
                  (t.requires_grad() ? 1 : 0)) ||
            !next(t.dim())) {
          return false;
        }
        for (int64_t d : t.sizes()) {
          if (!next(d)) return false;
        }
        for (int64_t d : t.strides()) {
          if (!next(d)) return false;
        }
        if (e.in_place[i] &&
            (t.unsafeGetTensorImpl() != e.static_inputs[i].toTensor().unsafeGetTensorImpl() ||
             t.data_ptr() != e.captured_ptrs[i])) {
          return false;
        }
      } else if (v.isInt()) {
        if (!next(-1) || !next(v.toInt())) return false;
      } else if (v.isDouble()) {
        double d = v.toDouble();
        int64_t bits = 0;
        std::memcpy(&bits, &d, sizeof bits);
        if (!next(-2) || !next(bits)) return false;
      } else if (v.isBool()) {
        if (!next(-3) || !next(v.toBool())) return false;
      } else if (v.isNone()) {
        if (!next(-4)) return false;
      } else {
        return false;
      }
    }
    return at == key.size();
  }

  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) {
    clock.start();
    const Padding pad = padding_of(inputs);
    // The common case of a serving loop: the same signature as the last replay.
    if (pad.rows == 0 && last_entry != nullptr && last_entry->graph != nullptr &&
        same_call(*last_key, *last_entry, inputs)) {
      clock.lap(0);
      clock.lap(1);
      ++last_entry->calls;
      return replay(*last_entry, std::move(inputs), pad);
    }
    bool all_cuda = false;
    Signature key = signature_of(inputs, &all_cuda, pad);
    if (!all_cuda) return exe.run(std::move(inputs));
    clock.lap(0);
    auto it = entries.find(key);
    clock.lap(1);
    if (it == entries.end()) {
      if (entries.size() >= max_graphs) {
        if (!warned_full) {
          warned_full = true;
          MAGI_LOG_WARN("CUDA graphs: ", max_graphs,
                        " input signatures captured; further ones run without graphs");
        }
        return exe.run(std::move(inputs));
      }
      Entry& e = entries[key];
      e.calls = 1;
      return warm_up(e, std::move(inputs), pad);
    }
    Entry& e = it->second;
    ++e.calls;
    if (!e.graph) {
      std::vector<c10::IValue> graph_inputs = pad.rows > 0 ? padded(inputs, pad) : inputs;
      return capture(e, graph_inputs, std::move(inputs), pad);
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      // static_inputs[i] holds the parameter itself: comparing TensorImpls needs no reference.
      if (e.in_place[i] && (!inputs[i].isTensor() ||
                            inputs[i].toTensor().unsafeGetTensorImpl() !=
                                e.static_inputs[i].toTensor().unsafeGetTensorImpl() ||
                            ptr_of(inputs[i]) != e.captured_ptrs[i])) {
        // A parameter or buffer was replaced (another tensor, or new storage through
        // `.data = ...`): this graph reads stale memory. Capture again.
        MAGI_LOG_DEBUG("CUDA graphs: input ", i, " moved; re-capturing");
        e.drop_graph();
        return warm_up(e, std::move(inputs), pad);
      }
    }
    if (pad.rows == 0) {
      last_key = &it->first;
      last_entry = &e;
    }
    return replay(e, std::move(inputs), pad);
  }
};

CudaGraphRunner::CudaGraphRunner(const Executable& executable, size_t max_graphs,
                                 std::vector<int64_t> ladder)
    : impl_(std::make_unique<Impl>(executable, max_graphs, std::move(ladder))) {}
CudaGraphRunner::~CudaGraphRunner() = default;
std::vector<c10::IValue> CudaGraphRunner::run(std::vector<c10::IValue> inputs) {
  return impl_->run(std::move(inputs));
}
size_t CudaGraphRunner::num_graphs() const {
  size_t n = 0;
  for (const auto& [k, e] : impl_->entries) n += e.graph != nullptr;
  return n;
}
size_t CudaGraphRunner::num_captures() const { return impl_->captures; }
size_t CudaGraphRunner::num_replays() const { return impl_->replays; }
size_t CudaGraphRunner::num_padded_calls() const { return impl_->padded_calls; }
size_t CudaGraphRunner::num_direct_launches() const { return impl_->direct_launches; }
size_t CudaGraphRunner::num_fresh_output_buffers() const { return impl_->fresh_buffers; }
size_t CudaGraphRunner::num_input_retargets() const { return impl_->input_retargets; }
bool CudaGraphRunner::pads() const { return impl_->padding != nullptr; }
void CudaGraphRunner::set_input_copy_nodes(bool on) { impl_->use_input_nodes = on; }
void CudaGraphRunner::set_stage_timing(bool on) {
  impl_->clock = StageClock{};
  impl_->clock.on = on;
}
std::vector<std::pair<std::string, double>> CudaGraphRunner::stage_times() const {
  std::vector<std::pair<std::string, double>> out;
  const StageClock& c = impl_->clock;
  for (size_t i = 0; i < StageClock::kStages; ++i)
    out.emplace_back(StageClock::kNames[i], c.totals_us[i]);
  out.emplace_back("calls", static_cast<double>(c.calls));
  return out;
}
bool CudaGraphRunner::available() { return true; }

#else  // no CUDA graph support in this build

struct CudaGraphRunner::Impl {
  const Executable& exe;
};
CudaGraphRunner::CudaGraphRunner(const Executable& executable, size_t, std::vector<int64_t>)
    : impl_(std::make_unique<Impl>(Impl{executable})) {}
CudaGraphRunner::~CudaGraphRunner() = default;
std::vector<c10::IValue> CudaGraphRunner::run(std::vector<c10::IValue> inputs) {
  return impl_->exe.run(std::move(inputs));
}
size_t CudaGraphRunner::num_graphs() const { return 0; }
size_t CudaGraphRunner::num_captures() const { return 0; }
size_t CudaGraphRunner::num_replays() const { return 0; }
size_t CudaGraphRunner::num_padded_calls() const { return 0; }
size_t CudaGraphRunner::num_direct_launches() const { return 0; }
size_t CudaGraphRunner::num_fresh_output_buffers() const { return 0; }
size_t CudaGraphRunner::num_input_retargets() const { return 0; }
bool CudaGraphRunner::pads() const { return false; }
void CudaGraphRunner::set_input_copy_nodes(bool) {}
void CudaGraphRunner::set_stage_timing(bool) {}
std::vector<std::pair<std::string, double>> CudaGraphRunner::stage_times() const { return {}; }
bool CudaGraphRunner::available() { return false; }

#endif

}  // namespace magi::runtime
