// CudaGraphRunner's capture (cuda_graph.h): a graph per signature, recorded on one stream per
// device with the copy nodes that feed its inputs and write its outputs into the runner's
// buffers, and more executables of it, each writing its own set of buffers (add_slot: a second
// at capture, more while a graph's inputs arrive from a few addresses in turn).
// Without CUDA graph support in the build this file is empty (cuda_graph.cpp holds the stubs).
#ifdef MAGI_HAVE_CUDA_GRAPHS
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <exception>
#include <map>
#include <string>

#include "cuda_graph_impl.h"
#include "magi/codegen/compiler.h"
#include "magi/common/error.h"
#include "magi/common/log.h"

namespace magi::runtime {
namespace {

// The stream every capture on `device` runs on (called with Impl::lock() held, which makes
// two runners' captures from two threads take turns on it): one stream
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

// Whether `stream`'s capture was invalidated (by an operation the capture does not allow).
bool capture_invalidated(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status == cudaStreamCaptureStatusInvalidated;
}

// After CUDA invalidated a capture, CUDAGraph::capture_end throws at cudaStreamEndCapture,
// before it tells the allocators that the capture is over, and its reset() skips releasing the
// pool of a capture that never ended. Left so, PyTorch's caching allocator would believe a
// capture under way for the rest of the process (torch.cuda.empty_cache() then fails an
// internal assert), and the pool's use count would never drop. A pool is released only by the
// allocator that was recording to it; one that was not refuses (logged at debug level).
void release_invalidated_capture(c10::DeviceIndex device, c10::cuda::MempoolId_t pool) {
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
    c10::cuda::CUDACachingAllocator::releasePool(device, pool);
  } catch (const std::exception& e) {
    MAGI_LOG_DEBUG("after a failed CUDA graph capture, the device allocator kept its pool: ",
                   e.what());
  }
  try {
    at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
    host->end_allocate_to_pool(pool);
    host->release_pool(pool);
  } catch (const std::exception& e) {
    MAGI_LOG_DEBUG("after a failed CUDA graph capture, the host allocator kept its pool: ",
                   e.what());
  }
}

// An error thrown inside a capture that CUDA invalidated, or CUDA's own refusal of an
// operation during a capture (a synchronisation such as .item(), an allocation outside
// PyTorch's allocator, work on a stream the capture does not join), most often from a custom
// op in the captured code: the user's to fix, rethrown as a UserError saying how. Others are
// rethrown as they are.
[[noreturn]] void rethrow_capture_failure(std::exception_ptr error, bool invalidated) {
  try {
    std::rethrow_exception(error);
  } catch (const UserError&) {
    throw;  // a driver call of ours already said what to do (codegen::throw_driver_error)
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (!invalidated && what.find("stream is capturing") == std::string::npos) throw;
    magi::detail::throw_user_error(magi::detail::str_cat(
        "capturing a CUDA graph (cudagraph_mode FULL or PIECEWISE) failed: ", what, "\n",
        codegen::capture_advice()));
  }
}

}  // namespace

c10::cuda::MempoolId_t CudaGraphRunner::Impl::shared_pool() {
  bool alive = false;
  for (const auto& [key, e] : entries) alive |= e.graph != nullptr;
  if (!alive) pool = at::cuda::graph_pool_handle();
  return pool;
}

bool CudaGraphRunner::Impl::copied_by_graph(const at::Tensor& t, size_t j) const {
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

bool CudaGraphRunner::Impl::find_copy_nodes(Entry& e) {
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

void CudaGraphRunner::Impl::retarget(const Entry& e, cudaGraphExec_t exec, const Slot& slot) {
  for (size_t j = 0; j < e.copies.size(); ++j) {
    const OutputCopy& c = e.copies[j];
    if (c.node == nullptr) continue;
    C10_CUDA_CHECK(cudaGraphExecMemcpyNodeSetParams1D(exec, c.node, slot.buffers[j].data_ptr(),
                                                      c.src, c.bytes, cudaMemcpyDeviceToDevice));
  }
}

bool CudaGraphRunner::Impl::add_slot(Entry& e) {
  if (!e.draws_no_rng) return false;
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, e.graph->raw_cuda_graph(), 0) != cudaSuccess) {
    (void)cudaGetLastError();
    MAGI_LOG_DEBUG("CUDA graphs: no further executable of a graph; it keeps ", e.slots.size(),
                   " output slot(s)");
    return false;
  }
  Slot slot;
  slot.owned.reset(exec);
  for (const auto& b : e.slots[0].buffers) {
    slot.buffers.push_back(b.defined() ? buffer_like(b) : at::Tensor());
  }
  retarget(e, exec, slot);
  e.slots.push_back(std::move(slot));
  return true;
}

std::vector<c10::IValue> CudaGraphRunner::Impl::capture(
    Entry& e, const std::vector<c10::IValue>& graph_inputs, std::vector<c10::IValue> inputs,
    const Padding& pad, bool copy_nodes) {
  const size_t n = graph_inputs.size();
  e.in_place.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = graph_inputs[i];
    // A parameter or buffer (the same tensor as at the warm-up): the graph reads it in place.
    e.in_place[i] = v.isTensor() && !batched(i) && same_tensor(e.warmup_tensors[i], v);
    // Any other tensor is copied into a buffer of the graph before each replay. An input the
    // graph writes would then be written in that copy, and the caller's tensor would keep its
    // old values (say, a cache passed as an argument that differs between the warm-up and this
    // call, or a piece shared by layers with caches of their own). Such a call runs without a
    // graph and counts as the warm-up: a next call with the same tensor captures.
    if (v.isTensor() && !e.in_place[i] && exe.input_written(i)) {
      if (!warned_written) {
        warned_written = true;
        MAGI_LOG_WARN("CUDA graphs: a graph would write its input ", i,
                      " in place, and this call's tensor is another one than the last call's; "
                      "calls like it run without a graph (pass the same tensor on every call, "
                      "e.g. a buffer of the module, to have one)");
      }
      ++ungraphed_calls;
      e.static_inputs.clear();  // nothing of an earlier capture stays alive
      e.captured_ptrs.clear();
      e.scratch = at::Tensor();
      remember(e, graph_inputs);
      return exe.run(std::move(inputs));
    }
  }
  e.static_inputs.clear();
  e.captured_ptrs.assign(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = graph_inputs[i];
    if (e.in_place[i]) {
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
    // Thread-local capture mode: calls unsafe during a capture (cudaMalloc, synchronising
    // ones) are refused on this thread only. In the global mode (PyTorch's default) another
    // thread of a server allocating for its own eager work while we capture would fail, or
    // invalidate this capture.
    e.graph->capture_begin(graph_pool, cudaStreamCaptureModeThreadLocal);
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
      const std::exception_ptr failure = std::current_exception();
      const bool invalidated = capture_invalidated(side.stream());
      try {
        e.graph->capture_end();
      } catch (...) {
        if (invalidated) release_invalidated_capture(device.index(), graph_pool);
      }
      e.graph.reset();
      at::cuda::clearCublasWorkspaces();
      (void)cudaGetLastError();  // a refused call's error must not surface at a later launch
      rethrow_capture_failure(failure, invalidated);
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
  bool any_output_node = false;
  for (const auto& c : e.copies) any_output_node |= c.node != nullptr;
  if (any_output_node) add_slot(e);
  e.last_slot = e.slots.size() - 1;  // the first replay writes slot 0
  ++captures;
  MAGI_LOG_DEBUG("captured a CUDA graph (", entries.size(), " signatures, ", e.slots.size(),
                 " output slots)");
  return replay(e, inputs, pad);
}

}  // namespace magi::runtime

#endif  // MAGI_HAVE_CUDA_GRAPHS
