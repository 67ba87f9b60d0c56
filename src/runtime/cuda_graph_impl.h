// The state of a CudaGraphRunner (cuda_graph.h) and what its three files share. Private to the
// runtime layer. cuda_graph.cpp holds the call path (signatures, buckets, warm-up, lookup),
// cuda_graph_capture.cpp the capture (copy nodes, executables and their output slots) and
// cuda_graph_replay.cpp the replay (which slot a call writes, feeding inputs, the launch, the
// outputs handed to the caller).
#pragma once
#ifdef MAGI_HAVE_CUDA_GRAPHS

#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/intrusive_ptr.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "magi/runtime/cuda_graph.h"
#include "magi/runtime/executor.h"

namespace magi::runtime {
namespace detail {

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

}  // namespace detail

struct CudaGraphRunner::Impl {
  using Signature = detail::Signature;
  using Padding = detail::Padding;
  using StageClock = detail::StageClock;

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
    uint64_t used = 0;  // when it was last replayed (the runner's replay count): 0 never
    // The stream of its last replay, where the caller may have read its outputs until it
    // dropped them.
    std::optional<cudaStream_t> last_stream;
  };
  // Executables a graph may have (slots), each with its own output buffers: two from the
  // capture when the graph copies its outputs itself (else one), more added while its inputs
  // arrive from a few addresses in turn (see pick_slot).
  static constexpr size_t kMaxSlots = 4;
  // A graph gets more slots only when one slot's output buffers take at most this many bytes
  // (a decode step's outputs, not a prefill's).
  static constexpr size_t kMaxExtraSlotBytes = size_t{4} << 20;
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
    // The keyed tensor inputs whose identities end the entry's signature (signature_of).
    std::vector<size_t> keyed_tensors;
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
    std::vector<Slot> slots;              // see kMaxSlots
    size_t last_slot = 0;
    // The inputs (input_key) of the last kMaxSlots calls that found no free slot reading them:
    // a miss whose inputs are among them comes from addresses that repeat, which another slot
    // can keep. `no_more_slots`: CUDA refused another executable of the graph.
    std::array<uint64_t, kMaxSlots> recent_misses{};
    size_t misses = 0;
    bool no_more_slots = false;
    c10::DeviceIndex device = 0;
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    // No kernel of the graph uses random numbers (Executable::draws_random_numbers): replays
    // launch it directly (see launch()).
    bool draws_no_rng = false;

    void drop_graph() {
      recent_misses.fill(0);
      misses = 0;
      no_more_slots = false;
      last_slot = 0;
      slots.clear();  // before the graph: its executables came from the graph
      copies.clear();
      input_copies.clear();
      static_outputs.clear();
      graph.reset();
    }
  };

  Impl(const Executable& executable, size_t max, std::vector<int64_t> sizes,
       std::vector<bool> keyed_inputs)
      : exe(executable), max_graphs(max), ladder(std::move(sizes)), keyed(std::move(keyed_inputs)) {
    std::sort(ladder.begin(), ladder.end());
    ladder.erase(std::unique(ladder.begin(), ladder.end()), ladder.end());
    const PaddingPlan& plan = exe.padding();
    if (!ladder.empty() && plan.possible()) padding = &plan;
  }

  // Held by every public member of every runner of the process (cuda_graph.h: calls from
  // several threads take turns). One lock for all runners, so that a capture, which may call
  // another compiled module from a custom op, never waits for a lock another thread holds
  // while waiting for this one. Recursive: a warm-up or capture runs the executable, whose
  // custom ops may call back into Python code that calls a compiled module again.
  static std::recursive_mutex& lock();
  const Executable& exe;
  size_t max_graphs;
  std::vector<int64_t> ladder;
  const PaddingPlan* padding = nullptr;  // set when calls are padded into the ladder's buckets
  std::vector<bool> keyed;               // per input: its identity is part of the signature
  std::map<Signature, Entry> entries;
  // The signatures of the entries without their keyed inputs' identities (what max_graphs
  // counts), with the number of entries of each.
  std::map<Signature, size_t> shapes;
  size_t captures = 0, replays = 0, padded_calls = 0, direct_launches = 0;
  size_t fresh_buffers = 0;       // output buffers allocated because the caller held every set
  size_t input_retargets = 0;     // input copy nodes pointed at another tensor
  bool use_input_nodes = true;    // false: inputs copied on the stream (set_input_copy_nodes)
  bool use_steady = true;         // false: SteadyInputs ignored (set_steady_inputs)
  size_t slot_limit = kMaxSlots;  // slots a replay picks from (set_max_executables)
  // The entry of the last unpadded replay found through the map, and its signature (reset
  // when erase() removes it): run() tries it before building a signature.
  const Signature* last_key = nullptr;
  Entry* last_entry = nullptr;
  // The SteadyInputs generation of the last call that replayed last_entry, 0 when the last
  // call did something else: a call of the same generation need not compare its steady inputs.
  uint64_t steady_generation = 0;
  bool warned_full = false;
  bool warned_written = false;
  // Calls run without a graph because it would have written its copy of an input (capture()).
  size_t ungraphed_calls = 0;
  StageClock clock;
  // Per device, the stream of this runner's last replay there and an event that orders a
  // replay on another stream after it: the graphs of a runner share its memory pool, so a
  // replay of any of them must not overlap the last one (of the same graph or another).
  struct StreamOrder {
    std::optional<cudaStream_t> last_stream;
    std::unique_ptr<CUevent_st, EventDeleter> event;
  };
  std::map<c10::DeviceIndex, StreamOrder> order;
  // The memory pool all graphs of this runner share. The allocator forgets a pool once no
  // graph uses it, so a new handle is taken whenever no captured graph is alive.
  c10::cuda::MempoolId_t pool{0, 0};

  c10::cuda::MempoolId_t shared_pool();

  bool batched(size_t i) const { return padding != nullptr && padding->input_rows[i] > 0; }

  // The padding of this call: its batch and bucket when it runs in a larger bucket's graph;
  // rows 0 when it runs at its own size (no padding, above the ladder, a batched input whose
  // rows are not one run of memory each, or inputs that disagree on the batch).
  Padding padding_of(const std::vector<c10::IValue>& inputs) const;

  // The call's inputs at the bucket's size: batched tensors in fresh buffers whose extra rows
  // repeat the call's last sample. Any values would do for the results (no valid row reads
  // them), but they must be values the graph accepts: zeros can be out-of-range indices
  // (ids - 20 into a table of 10) where the caller's rows are not.
  static std::vector<c10::IValue> padded(const std::vector<c10::IValue>& inputs,
                                         const Padding& pad);

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
  bool copied_by_graph(const at::Tensor& t, size_t j) const;

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
  static bool find_copy_nodes(Entry& e);

  // Points the copy nodes of `exec` at the buffers of `slot` (takes effect for later launches).
  static void retarget(const Entry& e, cudaGraphExec_t exec, const Slot& slot);

  cudaGraphExec_t exec_of(Entry& e, Slot& slot) const {
    return slot.owned ? slot.owned.get() : e.graph->raw_cuda_graph_exec();
  }

  // Another executable of the graph, writing its own buffers (like the first slot's), so that
  // calls alternate between sets of outputs without touching either executable, and calls
  // whose inputs arrive at a few addresses in turn find one whose copy nodes read them. Only
  // for graphs launched directly (replay() launches the CUDAGraph's own), and not where CUDA
  // refuses another instantiation (a graph with memory nodes, under the cudaMallocAsync
  // allocator). False when none was added.
  bool add_slot(Entry& e);

  // Whether the input copy nodes of `slot`'s executable read the call's tensors already (an
  // input without a node reads nothing there and matches any slot).
  static bool reads(const Entry& e, const Slot& slot, const std::vector<c10::IValue>& inputs);

  // The addresses and sizes of the call's tensors that reach the graph through copy nodes, as
  // one number (nonzero).
  static uint64_t input_key(const Entry& e, const std::vector<c10::IValue>& inputs);

  // Whether a call that found no free slot reading its inputs (`key`) should get a new slot:
  // its inputs were among the last misses', the graph has fewer than slot_limit slots and its
  // outputs are small. Records the miss.
  bool more_slots_help(Entry& e, uint64_t key) const;

  // `graph_inputs`: the call's inputs at the graph's size (padded when `pad.rows` > 0). With
  // `copy_nodes`, the graph starts by copying its dense inputs into their static buffers and
  // ends by copying its outputs into the buffers of a slot.
  std::vector<c10::IValue> capture(Entry& e, const std::vector<c10::IValue>& graph_inputs,
                                   std::vector<c10::IValue> inputs, const Padding& pad,
                                   bool copy_nodes = true);

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
                             std::optional<cudaStream_t> stream);

  // A new tensor on `buffer`'s memory (its first `rows` along `dim` when rows >= 0): what the
  // caller gets, so that the buffer's storage counts every tensor outside the runner.
  static at::Tensor hand_out(const at::Tensor& buffer, int64_t dim, int64_t rows);

  // Whether a tensor outside the runner (the caller's output, or any view of it) still refers
  // to a buffer of `slot`.
  static bool held(const Slot& slot) {
    for (const auto& b : slot.buffers) {
      if (b.defined() && b.storage().use_count() > 1) return true;
    }
    return false;
  }

  // The slot this replay writes, among those the caller has let go of (no tensor outside the
  // runner on their buffers): one whose input copy nodes read the call's tensors already,
  // else a new slot when inputs from the same addresses missed recently (more_slots_help),
  // else the one replayed longest ago. So a loop `y = f(x)` over one tensor alternates
  // between two slots, and inputs arriving from up to kMaxSlots addresses in turn (more than
  // the outputs the caller holds) each keep a slot whose nodes need no update; inputs from
  // more addresses, or new ones every call, add no slot. When the caller holds every
  // slot, the one after the last gets new buffers for what is held (the held ones become the
  // caller's alone).
  Slot& pick_slot(Entry& e, const c10::cuda::CUDAStream& stream,
                  const std::vector<c10::IValue>& inputs);

  // Replays `e` on `stream`, writing `slot`. CUDAGraph::replay() first brings the seed and
  // offset of each generator the capture drew from up to date (two fill kernels and their
  // dispatch on every replay of a graph whose capture took a Philox offset, as attention does
  // even at dropout 0). A graph none of whose kernels uses the numbers needs none of that: it
  // is launched directly.
  void launch(Entry& e, Slot& slot, cudaStream_t stream);
  // Makes `stream` wait for the work queued on `other` so far.
  static void wait_for(StreamOrder& o, cudaStream_t other, cudaStream_t stream);

  // A run without a graph that prepares one (the first call of a signature, or the first after
  // a parameter moved): kernels load, library handles are made, and the tensors are remembered
  // to tell parameters (same tensor at capture) from activations. A padded call runs at the
  // bucket's size and returns copies of its rows, so it keeps no bucket-sized buffer alive.
  std::vector<c10::IValue> warm_up(Entry& e, std::vector<c10::IValue> inputs, const Padding& pad);

  // Makes the graph read the call's inputs that are not used in place: through the input's
  // copy node where it has one (pointed at the call's tensor when that is not the one the
  // executable's node reads already), else by a copy on the stream before the launch. A padded
  // call fills the first rows; the rest keep an earlier call's rows (or the capture's copies
  // of a real sample): valid inputs that no valid row reads (the padding plan's guarantee).
  void feed_inputs(Entry& e, Slot& slot, const std::vector<c10::IValue>& inputs, const Padding& pad,
                   cudaStream_t stream);

  // Points an input copy node that this call does not use at a copy of one byte of the
  // static buffer into the entry's scratch, so that it cannot read a tensor the caller has
  // freed since.
  static void idle(Entry& e, cudaGraphExec_t exec, cudaGraphNode_t node, const at::Tensor& whole);

  // One replay of `e` for a call: ordered after the runner's last replay when that was on
  // another stream, into the slot pick_slot chooses (ordered after the stream of that slot's
  // last replay too), the inputs fed, the graph launched, and the outputs handed out (a padded
  // call's rows: views of the slot's buffers, or copies).
  std::vector<c10::IValue> replay(Entry& e, const std::vector<c10::IValue>& inputs,
                                  const Padding& pad);

  // Whether `inputs`, unpadded, have signature `key` (what signature_of would build, compared
  // field by field without building it) and each input `e` uses in place is the tensor it
  // was at capture: the call replays `e` as it is. Inputs marked in `steady` are taken as
  // they were on the call that last passed this check (SteadyInputs) and not compared.
  bool same_call(const Signature& key, const Entry& e, const std::vector<c10::IValue>& inputs,
                 const std::vector<bool>* steady = nullptr) const;

  // Entries erased before their capture because their keyed tensors were gone: keyed inputs
  // that are new tensors on every call (weights re-created per call). From kMaxShortLived on,
  // identities leave the signature (drop_keys), as without keys.
  size_t short_lived = 0;
  static constexpr size_t kMaxShortLived = 4;
  // Entries of one signature (identities aside) past which keying stops too.
  static constexpr size_t kMaxKeyedPerShape = 512;

  // Erases the entries whose keyed tensors only the entry still holds (or, before a capture,
  // nobody holds): the weights they were captured for are gone. Called before an entry is
  // made, so a model that replaces its weights does not keep the old ones alive.
  void erase_orphans();
  // Erases entry `it` (forgetting it as the last entry and in `shapes`); the next iterator.
  std::map<Signature, Entry>::iterator erase(std::map<Signature, Entry>::iterator it);
  // Stops keying: clears `keyed` and erases the entries made with identities.
  void drop_keys();

  // CudaGraphRunner::run and run_borrowed: `owned`, when given, is `inputs` itself, which the
  // paths that run the executable may consume.
  std::vector<c10::IValue> run(const std::vector<c10::IValue>& inputs,
                               std::vector<c10::IValue>* owned, const SteadyInputs& steady);
};

}  // namespace magi::runtime

#endif  // MAGI_HAVE_CUDA_GRAPHS
