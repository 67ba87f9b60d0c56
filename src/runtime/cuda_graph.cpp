// CudaGraphRunner: see cuda_graph.h for the rules.
#include "magi/runtime/cuda_graph.h"

#include <cstring>
#include <map>

#include "magi/common/error.h"
#include "magi/common/log.h"
#include "magi/runtime/executor.h"

#ifdef MAGI_HAVE_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty_strided.h>
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

Signature signature_of(const std::vector<c10::IValue>& inputs, bool* all_cuda) {
  Signature sig;
  sig.reserve(inputs.size() * 8);
  *all_cuda = true;
  bool any_tensor = false;
  for (const auto& v : inputs) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      any_tensor = true;
      *all_cuda &= t.is_cuda();
      sig.push_back(static_cast<int64_t>(t.scalar_type()) << 32 | (t.device().index() + 1) << 1 |
                    (t.requires_grad() ? 1 : 0));
      sig.push_back(t.dim());
      for (int64_t s : t.sizes()) sig.push_back(s);
      for (int64_t s : t.strides()) sig.push_back(s);
    } else if (v.isInt()) {
      sig.push_back(-1);
      sig.push_back(v.toInt());
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

struct CudaGraphRunner::Impl {
  struct Entry {
    int calls = 0;
    // The tensors of the warm-up call, held weakly: a weak reference keeps the TensorImpl's
    // memory from being reused, so "the same TensorImpl at capture" means the same tensor
    // object (a parameter or buffer), never a new activation that happens to land there.
    std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> warmup_tensors;
    std::vector<bool> in_place;              // input used at its own address
    std::vector<c10::IValue> static_inputs;  // what the graph reads
    std::vector<c10::IValue> static_outputs;
    std::unique_ptr<at::cuda::CUDAGraph> graph;
  };

  const Executable& exe;
  size_t max_graphs;
  std::map<Signature, Entry> entries;
  size_t captures = 0, replays = 0;
  bool warned_full = false;
  // The memory pool all graphs of this runner share. The allocator forgets a pool once no
  // graph uses it, so a new handle is taken whenever no captured graph is alive.
  c10::cuda::MempoolId_t pool{0, 0};

  c10::cuda::MempoolId_t shared_pool() {
    bool alive = false;
    for (const auto& [key, e] : entries) alive |= e.graph != nullptr;
    if (!alive) pool = at::cuda::graph_pool_handle();
    return pool;
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

  std::vector<c10::IValue> capture(Entry& e, std::vector<c10::IValue> inputs) {
    const size_t n = inputs.size();
    e.in_place.assign(n, false);
    e.static_inputs.clear();
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = inputs[i];
      if (v.isTensor() && same_tensor(e.warmup_tensors[i], v)) {
        e.in_place[i] = true;  // a parameter or buffer: the graph reads it where it is
        e.static_inputs.push_back(v);
      } else if (v.isTensor()) {
        e.static_inputs.push_back(v.toTensor().clone());
      } else {
        e.static_inputs.push_back(v);
      }
    }
    const c10::Device device = [&] {
      for (const auto& v : inputs) {
        if (v.isTensor()) return v.toTensor().device();
      }
      return c10::Device(c10::DeviceType::CUDA, 0);
    }();
    c10::cuda::CUDAGuard device_guard(device);
    auto current = c10::cuda::getCurrentCUDAStream(device.index());
    auto side = c10::cuda::getStreamFromPool(false, device.index());
    C10_CUDA_CHECK(cudaStreamSynchronize(current.stream()));
    c10::cuda::MempoolId_t graph_pool = shared_pool();
    e.graph = std::make_unique<at::cuda::CUDAGraph>();
    {
      c10::cuda::CUDAStreamGuard stream_guard(side);
      e.graph->capture_begin(graph_pool);
      try {
        e.static_outputs = exe.run(e.static_inputs);
      } catch (...) {
        try {
          e.graph->capture_end();
        } catch (...) {
        }
        e.graph.reset();
        throw;
      }
      e.graph->capture_end();
    }
    ++captures;
    MAGI_LOG_DEBUG("captured a CUDA graph (", entries.size(), " signatures)");
    return replay(e, std::move(inputs));
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

  std::vector<c10::IValue> replay(Entry& e, std::vector<c10::IValue> inputs) {
    cudaStream_t stream = nullptr;
    for (const auto& v : e.static_outputs) {
      if (v.isTensor()) {
        stream = c10::cuda::getCurrentCUDAStream(v.toTensor().device().index()).stream();
        break;
      }
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].isTensor() || e.in_place[i]) continue;
      const at::Tensor& dst = e.static_inputs[i].toTensor();
      const at::Tensor& src = inputs[i].toTensor();
      if (stream != nullptr && same_dense_layout(dst, src)) {
        copy_dense(dst, src, stream);
      } else {
        dst.copy_(src, /*non_blocking=*/true);
      }
    }
    e.graph->replay();
    ++replays;
    std::vector<c10::IValue> out;
    out.reserve(e.static_outputs.size());
    for (const auto& v : e.static_outputs) {
      if (!v.isTensor()) {
        out.push_back(v);
        continue;
      }
      const at::Tensor& t = v.toTensor();
      if (stream != nullptr && t.is_non_overlapping_and_dense() && !t.is_conj() && !t.is_neg()) {
        at::Tensor copy = at::empty_strided(t.sizes(), t.strides(), t.options());
        copy_dense(copy, t, stream);
        out.emplace_back(std::move(copy));
      } else {
        out.emplace_back(t.clone());
      }
    }
    return out;
  }

  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) {
    bool all_cuda = false;
    Signature key = signature_of(inputs, &all_cuda);
    if (!all_cuda) return exe.run(std::move(inputs));
    auto it = entries.find(key);
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
      remember(e, inputs);
      return exe.run(std::move(inputs));  // warm-up
    }
    Entry& e = it->second;
    ++e.calls;
    if (!e.graph) return capture(e, std::move(inputs));
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (e.in_place[i] && (!same_tensor(weak_of(e.static_inputs[i]), inputs[i]) ||
                            ptr_of(inputs[i]) != ptr_of(e.static_inputs[i]))) {
        // A parameter or buffer was replaced (another tensor, or new storage): this graph
        // reads stale memory. Capture again.
        MAGI_LOG_DEBUG("CUDA graphs: input ", i, " moved; re-capturing");
        e.graph.reset();
        remember(e, inputs);
        return exe.run(std::move(inputs));
      }
    }
    return replay(e, std::move(inputs));
  }
};

CudaGraphRunner::CudaGraphRunner(const Executable& executable, size_t max_graphs)
    : impl_(std::make_unique<Impl>(Impl{executable, max_graphs})) {}
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
bool CudaGraphRunner::available() { return true; }

#else  // no CUDA graph support in this build

struct CudaGraphRunner::Impl {
  const Executable& exe;
};
CudaGraphRunner::CudaGraphRunner(const Executable& executable, size_t)
    : impl_(std::make_unique<Impl>(Impl{executable})) {}
CudaGraphRunner::~CudaGraphRunner() = default;
std::vector<c10::IValue> CudaGraphRunner::run(std::vector<c10::IValue> inputs) {
  return impl_->exe.run(std::move(inputs));
}
size_t CudaGraphRunner::num_graphs() const { return 0; }
size_t CudaGraphRunner::num_captures() const { return 0; }
size_t CudaGraphRunner::num_replays() const { return 0; }
bool CudaGraphRunner::available() { return false; }

#endif

}  // namespace magi::runtime
