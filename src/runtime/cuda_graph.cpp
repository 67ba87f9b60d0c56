// CudaGraphRunner: see cuda_graph.h for the rules. This file holds the call path: the
// signature of a call, its bucket, the warm-up run, the lookup of its graph and the checks
// before a replay; capture and replay are in cuda_graph_capture.cpp and cuda_graph_replay.cpp.
#include "magi/runtime/cuda_graph.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "magi/common/log.h"
#include "magi/runtime/executor.h"

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#endif

#ifdef MAGI_HAVE_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty_strided.h>

#include "cuda_graph_impl.h"
#endif

namespace magi::runtime {

#ifdef MAGI_HAVE_CUDA_GRAPHS
using detail::Padding;
using detail::Signature;
using detail::StageClock;

namespace {

// Whether the reference `t` is the only one that keeps its tensor alive. From torch 2.11 on, a
// tensor's Python object is kept alive by the tensor's other C++ references and counts as one
// itself: held by us and that object alone, the tensor is dropped once the object has no other
// referent. Before, a dropped Python object gave its reference up.
bool held_only_here(const at::Tensor& t) {
  const auto n = t.use_count();
#if defined(TORCH_VERSION_MAJOR) && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 11)
  if (n == 2) return t.unsafeGetTensorImpl()->pyobj_slot()->has_unique_reference();
#endif
  return n == 1;
}

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

// The identity of a keyed input, as the signature holds it.
int64_t identity_of(const at::Tensor& t) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl()));
}

// With padding, batched inputs enter as their padded selves: dim 0 (or the value) bucket * k,
// padded_strides(). The identities of the keyed tensor inputs follow all inputs, in input
// order; `*identities` is their number.
Signature signature_of(const std::vector<c10::IValue>& inputs, bool* all_cuda, const Padding& pad,
                       const std::vector<bool>& keyed, size_t* identities) {
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
  *identities = 0;
  for (size_t i = 0; i < inputs.size() && i < keyed.size(); ++i) {
    if (keyed[i] && inputs[i].isTensor()) {
      sig.push_back(identity_of(inputs[i].toTensor()));
      ++*identities;
    }
  }
  return sig;
}

}  // namespace

Padding CudaGraphRunner::Impl::padding_of(const std::vector<c10::IValue>& inputs) const {
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

std::vector<c10::IValue> CudaGraphRunner::Impl::padded(const std::vector<c10::IValue>& inputs,
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
      p.narrow(0, rows, sizes[0] - rows).view(samples).copy_(t.narrow(0, rows - k, k).unsqueeze(0));
      out.emplace_back(std::move(p));
    } else {
      out.emplace_back(pad.bucket * k);
    }
  }
  return out;
}

std::vector<c10::IValue> CudaGraphRunner::Impl::warm_up(Entry& e, std::vector<c10::IValue> inputs,
                                                        const Padding& pad) {
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
    e.warmup_outputs.push_back(copied
                                   ? at::empty_strided(v.toTensor().sizes(), v.toTensor().strides(),
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

bool CudaGraphRunner::Impl::same_call(const Signature& key, const Entry& e,
                                      const std::vector<c10::IValue>& inputs,
                                      const std::vector<bool>* steady) const {
  size_t at = 0;
  auto next = [&](int64_t value) { return at < key.size() && key[at++] == value; };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (steady != nullptr && i < steady->size() && (*steady)[i]) {
        at += 2 + 2 * static_cast<size_t>(t.dim());  // checked on the call that began it
        continue;
      }
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
  for (size_t i = 0; i < inputs.size() && i < keyed.size(); ++i) {
    if (!keyed[i] || !inputs[i].isTensor()) continue;
    if (steady != nullptr && i < steady->size() && (*steady)[i]) {
      ++at;
    } else if (!next(identity_of(inputs[i].toTensor()))) {
      return false;
    }
  }
  return at == key.size();
}

std::map<Signature, CudaGraphRunner::Impl::Entry>::iterator CudaGraphRunner::Impl::erase(
    std::map<Signature, Entry>::iterator it) {
  const Entry& e = it->second;
  if (last_entry == &e) {
    last_entry = nullptr;
    last_key = nullptr;
  }
  // The identities are the key's tail; what precedes them is the entry's shape.
  const Signature shape(it->first.begin(),
                        it->first.end() - static_cast<long>(e.keyed_tensors.size()));
  auto s = shapes.find(shape);
  if (s != shapes.end() && --s->second == 0) shapes.erase(s);
  return entries.erase(it);
}

void CudaGraphRunner::Impl::erase_orphans() {
  for (auto it = entries.begin(); it != entries.end();) {
    const Entry& e = it->second;
    bool orphan = false;
    for (size_t i : e.keyed_tensors) {
      if (e.graph != nullptr && e.in_place[i]) {
        orphan = held_only_here(e.static_inputs[i].toTensor());
      } else if (e.graph == nullptr && i < e.warmup_tensors.size()) {
        orphan = e.warmup_tensors[i].expired();
      }
      if (orphan) break;
    }
    if (!orphan) {
      ++it;
      continue;
    }
    MAGI_LOG_DEBUG("CUDA graphs: the weights of a graph were dropped; erasing it");
    short_lived += e.graph == nullptr;
    it = erase(it);
  }
}

void CudaGraphRunner::Impl::drop_keys() {
  MAGI_LOG_INFO("CUDA graphs: parameters arrive as new tensors call after call; graphs are ",
                "no longer keyed by them (each replay copies them into the graph)");
  keyed.clear();
  for (auto it = entries.begin(); it != entries.end();) {
    it = it->second.keyed_tensors.empty() ? std::next(it) : erase(it);
  }
}

std::vector<c10::IValue> CudaGraphRunner::Impl::run(const std::vector<c10::IValue>& inputs,
                                                    std::vector<c10::IValue>* owned,
                                                    const SteadyInputs& steady) {
  // What the paths that run the executable consume (it frees each input after its last use):
  // the caller's vector when it gave it away, else a copy. Taken last: `inputs` may be it.
  auto take = [&]() -> std::vector<c10::IValue> {
    return owned != nullptr ? std::move(*owned) : inputs;
  };
  if (short_lived >= kMaxShortLived && !keyed.empty()) drop_keys();
  clock.start();
  const Padding pad = padding_of(inputs);
  // The steady inputs were checked against last_entry by the last call of this generation;
  // any way out other than a replay of last_entry forgets that.
  const bool trusted =
      use_steady && steady.generation != 0 && steady.generation == steady_generation;
  steady_generation = 0;
  // The common case of a serving loop: the same signature as the last replay.
  if (pad.rows == 0 && last_entry != nullptr && last_entry->graph != nullptr &&
      same_call(*last_key, *last_entry, inputs, trusted ? steady.steady : nullptr)) {
    clock.lap(0);
    clock.lap(1);
    ++last_entry->calls;
    steady_generation = steady.generation;
    return replay(*last_entry, inputs, pad);
  }
  bool all_cuda = false;
  size_t identities = 0;
  Signature key = signature_of(inputs, &all_cuda, pad, keyed, &identities);
  if (!all_cuda) return exe.run(take());
  clock.lap(0);
  auto it = entries.find(key);
  clock.lap(1);
  if (it == entries.end()) {
    if (identities > 0) erase_orphans();
    Signature shape(key.begin(), key.end() - static_cast<long>(identities));
    if (shapes.size() >= max_graphs && shapes.count(shape) == 0) {
      if (!warned_full) {
        warned_full = true;
        MAGI_LOG_WARN("CUDA graphs: ", max_graphs,
                      " input signatures captured; further ones run without graphs");
      }
      return exe.run(take());
    }
    // More instances of one signature than any model has layers: weights the caller keeps
    // making anew. The next call stops keying.
    if (++shapes[std::move(shape)] > kMaxKeyedPerShape) short_lived = kMaxShortLived;
    Entry& e = entries[key];
    e.calls = 1;
    for (size_t i = 0; i < inputs.size() && i < keyed.size(); ++i) {
      if (keyed[i] && inputs[i].isTensor()) e.keyed_tensors.push_back(i);
    }
    return warm_up(e, take(), pad);
  }
  Entry& e = it->second;
  ++e.calls;
  if (!e.graph) {
    std::vector<c10::IValue> graph_inputs = pad.rows > 0 ? padded(inputs, pad) : inputs;
    return capture(e, graph_inputs, take(), pad);
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
      return warm_up(e, take(), pad);
    }
  }
  if (pad.rows == 0) {
    last_key = &it->first;
    last_entry = &e;
    steady_generation = steady.generation;
  }
  return replay(e, inputs, pad);
}

CudaGraphRunner::CudaGraphRunner(const Executable& executable, size_t max_graphs,
                                 std::vector<int64_t> ladder, std::vector<bool> keyed)
    : impl_(std::make_unique<Impl>(executable, max_graphs, std::move(ladder), std::move(keyed))) {}
CudaGraphRunner::~CudaGraphRunner() = default;

namespace {
using Lock = std::lock_guard<std::recursive_mutex>;

// `read()` under the runners' lock.
template <typename F>
auto locked(std::recursive_mutex& mutex, F&& read) {
  Lock lock(mutex);
  return read();
}
}  // namespace

std::recursive_mutex& CudaGraphRunner::Impl::lock() {
  static std::recursive_mutex mutex;
  return mutex;
}

std::vector<c10::IValue> CudaGraphRunner::run(std::vector<c10::IValue> inputs,
                                              const SteadyInputs& steady) {
  Lock lock(Impl::lock());
  return impl_->run(inputs, &inputs, steady);
}
std::vector<c10::IValue> CudaGraphRunner::run_borrowed(const std::vector<c10::IValue>& inputs,
                                                       const SteadyInputs& steady) {
  Lock lock(Impl::lock());
  return impl_->run(inputs, nullptr, steady);
}
size_t CudaGraphRunner::num_graphs() const {
  Lock lock(Impl::lock());
  size_t n = 0;
  for (const auto& [k, e] : impl_->entries) n += e.graph != nullptr;
  return n;
}
size_t CudaGraphRunner::num_captures() const {
  return locked(Impl::lock(), [this] { return impl_->captures; });
}
size_t CudaGraphRunner::num_replays() const {
  return locked(Impl::lock(), [this] { return impl_->replays; });
}
size_t CudaGraphRunner::num_padded_calls() const {
  return locked(Impl::lock(), [this] { return impl_->padded_calls; });
}
size_t CudaGraphRunner::num_direct_launches() const {
  return locked(Impl::lock(), [this] { return impl_->direct_launches; });
}
size_t CudaGraphRunner::num_fresh_output_buffers() const {
  return locked(Impl::lock(), [this] { return impl_->fresh_buffers; });
}
size_t CudaGraphRunner::num_input_retargets() const {
  return locked(Impl::lock(), [this] { return impl_->input_retargets; });
}
size_t CudaGraphRunner::num_ungraphed_calls() const {
  return locked(Impl::lock(), [this] { return impl_->ungraphed_calls; });
}
size_t CudaGraphRunner::num_executables() const {
  Lock lock(Impl::lock());
  size_t n = 0;
  for (const auto& [k, e] : impl_->entries) n += e.graph != nullptr ? e.slots.size() : 0;
  return n;
}
bool CudaGraphRunner::pads() const { return impl_->padding != nullptr; }
void CudaGraphRunner::set_input_copy_nodes(bool on) {
  Lock lock(Impl::lock());
  impl_->use_input_nodes = on;
}
void CudaGraphRunner::set_steady_inputs(bool on) {
  Lock lock(Impl::lock());
  impl_->use_steady = on;
}
void CudaGraphRunner::set_max_executables(size_t n) {
  Lock lock(Impl::lock());
  impl_->slot_limit = std::clamp<size_t>(n, 1, Impl::kMaxSlots);
}
void CudaGraphRunner::set_stage_timing(bool on) {
  Lock lock(Impl::lock());
  impl_->clock = StageClock{};
  impl_->clock.on = on;
}
std::vector<std::pair<std::string, double>> CudaGraphRunner::stage_times() const {
  Lock lock(Impl::lock());
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
CudaGraphRunner::CudaGraphRunner(const Executable& executable, size_t, std::vector<int64_t>,
                                 std::vector<bool>)
    : impl_(std::make_unique<Impl>(Impl{executable})) {}
CudaGraphRunner::~CudaGraphRunner() = default;
std::vector<c10::IValue> CudaGraphRunner::run(std::vector<c10::IValue> inputs,
                                              const SteadyInputs& /*steady*/) {
  return impl_->exe.run(std::move(inputs));
}
std::vector<c10::IValue> CudaGraphRunner::run_borrowed(const std::vector<c10::IValue>& inputs,
                                                       const SteadyInputs& /*steady*/) {
  return impl_->exe.run(inputs);
}
size_t CudaGraphRunner::num_graphs() const { return 0; }
size_t CudaGraphRunner::num_captures() const { return 0; }
size_t CudaGraphRunner::num_replays() const { return 0; }
size_t CudaGraphRunner::num_padded_calls() const { return 0; }
size_t CudaGraphRunner::num_direct_launches() const { return 0; }
size_t CudaGraphRunner::num_fresh_output_buffers() const { return 0; }
size_t CudaGraphRunner::num_input_retargets() const { return 0; }
size_t CudaGraphRunner::num_ungraphed_calls() const { return 0; }
size_t CudaGraphRunner::num_executables() const { return 0; }
bool CudaGraphRunner::pads() const { return false; }
void CudaGraphRunner::set_input_copy_nodes(bool) {}
void CudaGraphRunner::set_steady_inputs(bool) {}
void CudaGraphRunner::set_max_executables(size_t) {}
void CudaGraphRunner::set_stage_timing(bool) {}
std::vector<std::pair<std::string, double>> CudaGraphRunner::stage_times() const { return {}; }
bool CudaGraphRunner::available() { return false; }

#endif

}  // namespace magi::runtime
