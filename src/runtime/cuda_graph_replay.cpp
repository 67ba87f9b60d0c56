// CudaGraphRunner's replay (cuda_graph.h): which of a graph's output slots a call writes, how
// its inputs reach the graph (copy nodes pointed at the call's tensors, or copies on the
// stream), the launch, and the outputs handed to the caller.
// Without CUDA graph support in the build this file is empty (cuda_graph.cpp holds the stubs).
#ifdef MAGI_HAVE_CUDA_GRAPHS
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "cuda_graph_impl.h"
#include "magi/common/log.h"

namespace magi::runtime {

at::Tensor CudaGraphRunner::Impl::copy_out(const at::Tensor& graph_output, int64_t dim,
                                           int64_t rows, std::optional<cudaStream_t> stream) {
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

at::Tensor CudaGraphRunner::Impl::hand_out(const at::Tensor& buffer, int64_t dim, int64_t rows) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(buffer.storage()), buffer.key_set(),
                                                   buffer.dtype());
  if (rows < 0) {
    impl->set_sizes_and_strides(buffer.sizes(), buffer.strides());
  } else {
    std::vector<int64_t> sizes = buffer.sizes().vec();
    sizes[dim] = rows;
    impl->set_sizes_and_strides(sizes, buffer.strides());
  }
  return at::Tensor(std::move(impl));
}

bool CudaGraphRunner::Impl::reads(const Entry& e, const Slot& slot,
                                  const std::vector<c10::IValue>& inputs) {
  if (slot.sources.size() != inputs.size()) return false;
  for (size_t i = 0; i < inputs.size() && i < e.input_copies.size(); ++i) {
    if (e.input_copies[i].node == nullptr || !inputs[i].isTensor()) continue;
    const at::Tensor& t = inputs[i].toTensor();
    if (slot.sources[i] != std::pair<const void*, size_t>{t.data_ptr(), t.nbytes()}) return false;
  }
  return true;
}

uint64_t CudaGraphRunner::Impl::input_key(const Entry& e, const std::vector<c10::IValue>& inputs) {
  uint64_t key = 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i < inputs.size() && i < e.input_copies.size(); ++i) {
    if (e.input_copies[i].node == nullptr || !inputs[i].isTensor()) continue;
    const at::Tensor& t = inputs[i].toTensor();
    for (uint64_t part : {reinterpret_cast<uint64_t>(t.data_ptr()), uint64_t{t.nbytes()}}) {
      key ^= part + 0x9e3779b97f4a7c15ULL + (key << 6) + (key >> 2);
    }
  }
  return key == 0 ? 1 : key;
}

bool CudaGraphRunner::Impl::more_slots_help(Entry& e, uint64_t key) const {
  const bool repeats =
      std::find(e.recent_misses.begin(), e.recent_misses.end(), key) != e.recent_misses.end();
  e.recent_misses[e.misses++ % e.recent_misses.size()] = key;
  if (!repeats || e.no_more_slots || e.slots.size() >= slot_limit || !e.draws_no_rng) {
    return false;
  }
  size_t bytes = 0;
  for (const auto& b : e.slots[0].buffers) bytes += b.defined() ? b.nbytes() : 0;
  return bytes <= kMaxExtraSlotBytes;
}

CudaGraphRunner::Impl::Slot& CudaGraphRunner::Impl::pick_slot(
    Entry& e, const c10::cuda::CUDAStream& stream, const std::vector<c10::IValue>& inputs) {
  const size_t n = std::min(e.slots.size(), slot_limit);
  size_t pick = SIZE_MAX;
  size_t oldest = SIZE_MAX;
  for (size_t s = 0; s < n; ++s) {
    const Slot& candidate = e.slots[s];
    if (held(candidate)) continue;
    if (reads(e, candidate, inputs)) {
      pick = s;
      break;
    }
    if (oldest == SIZE_MAX || candidate.used < e.slots[oldest].used) oldest = s;
  }
  // A free slot never replayed is taken as it is: its copy nodes read no call's tensors yet,
  // so not reading this call's is no miss (counted, the first call after a capture and the
  // next one, with the same input, made a graph of a loop `y = f(x)` a third slot).
  if (pick == SIZE_MAX && oldest != SIZE_MAX && e.slots[oldest].used != 0 && use_input_nodes &&
      more_slots_help(e, input_key(e, inputs))) {
    if (add_slot(e)) {
      pick = e.slots.size() - 1;
      MAGI_LOG_DEBUG(
          "CUDA graphs: inputs arrive from a few addresses in turn; a graph gets "
          "executable ",
          e.slots.size());
    } else {
      e.no_more_slots = true;
    }
  }
  if (pick == SIZE_MAX) pick = oldest != SIZE_MAX ? oldest : (e.last_slot + 1) % n;
  Slot& slot = e.slots[pick];
  e.last_slot = pick;
  slot.used = replays + 1;
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
  if (std::find(slot.streams.begin(), slot.streams.end(), stream.stream()) == slot.streams.end()) {
    for (const auto& b : slot.buffers) {
      if (b.defined())
        c10::cuda::CUDACachingAllocator::recordStream(b.storage().data_ptr(), stream);
    }
    slot.streams.push_back(stream.stream());
  }
  return slot;
}

void CudaGraphRunner::Impl::launch(Entry& e, Slot& slot, cudaStream_t stream) {
  if (e.draws_no_rng) {
    C10_CUDA_CHECK(cudaGraphLaunch(exec_of(e, slot), stream));
    ++direct_launches;
  } else {
    e.graph->replay();  // one slot: the CUDAGraph's own executable
  }
}

void CudaGraphRunner::Impl::wait_for(StreamOrder& o, cudaStream_t other, cudaStream_t stream) {
  if (!o.event) {
    cudaEvent_t event = nullptr;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    o.event.reset(event);
  }
  C10_CUDA_CHECK(cudaEventRecord(o.event.get(), other));
  C10_CUDA_CHECK(cudaStreamWaitEvent(stream, o.event.get(), 0));
}

void CudaGraphRunner::Impl::feed_inputs(Entry& e, Slot& slot,
                                        const std::vector<c10::IValue>& inputs, const Padding& pad,
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

void CudaGraphRunner::Impl::idle(Entry& e, cudaGraphExec_t exec, cudaGraphNode_t node,
                                 const at::Tensor& whole) {
  if (!e.scratch.defined())
    e.scratch = at::empty_strided({16}, {1}, whole.options().dtype(at::kByte));
  C10_CUDA_CHECK(cudaGraphExecMemcpyNodeSetParams1D(exec, node, e.scratch.data_ptr(),
                                                    whole.data_ptr(), 1, cudaMemcpyDeviceToDevice));
}

std::vector<c10::IValue> CudaGraphRunner::Impl::replay(Entry& e,
                                                       const std::vector<c10::IValue>& inputs,
                                                       const Padding& pad) {
  c10::cuda::CUDAGuard device_guard(e.device);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(e.device);
  const cudaStream_t stream = current.stream();
  // The graphs of a runner, and the executables of each, share its memory pool; CUDA orders
  // the launches of one executable, not of two. A replay on another stream than the runner's
  // last one (on this device) waits for that one.
  StreamOrder& o = order[e.device];
  const std::optional<cudaStream_t> previous = o.last_stream;
  if (previous && *previous != stream) wait_for(o, *previous, stream);
  o.last_stream = stream;
  clock.lap(2);
  Slot& slot = pick_slot(e, current, inputs);
  // The caller read this slot's last outputs on the stream of that replay until it dropped
  // them, perhaps after replays on other streams (two threads, a stream each): a replay on
  // another stream waits for that stream's work so far before overwriting them.
  if (slot.last_stream && *slot.last_stream != stream && slot.last_stream != previous)
    wait_for(o, *slot.last_stream, stream);
  slot.last_stream = stream;
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

}  // namespace magi::runtime

#endif  // MAGI_HAVE_CUDA_GRAPHS
