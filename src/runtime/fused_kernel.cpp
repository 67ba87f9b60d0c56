// FusedKernel: compilation of its variants through the codegen drivers, and launch (the choice
// of variant per call is in kernel_variant.cpp).
#include "magi/runtime/fused_kernel.h"

#include <ATen/ExpandUtils.h>
#include <ATen/TensorUtils.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <set>
#include <string>
#include <utility>

#include "kernel_variant.h"
#include "magi/codegen/compiler.h"
#include "magi/codegen/lower_group.h"
#include "magi/codegen/printers.h"
#include "magi/common/error.h"
#include "magi/common/log.h"
#include "magi/ir/op_info.h"
#include "magi/runtime/executor.h"

namespace magi::runtime {

using codegen::AccessClass;
using namespace detail;  // MagiArgs and the choice of variant (kernel_variant.h)

namespace {

constexpr int64_t kMaxGridBlocks = 0x7fffffff;  // blocks along a grid's x dim

// A C++ kernel that could not allocate its buffer of kept values (the one allocation a
// generated host kernel makes, before its parallel loop): still a std::bad_alloc, so Python
// sees a MemoryError, with the kernel named.
class KeptValuesAllocationError : public std::bad_alloc {
 public:
  explicit KeptValuesAllocationError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// A column kernel: blocks of 32 x 8 threads over tiles of 32 column vectors, and enough row
// splits for about four blocks per SM while each thread row still walks at least 8 rows; with
// more than one split, a second launch combines the splits' partials.
void launch_columns(const codegen::KernelSpec& spec, const codegen::CudaKernel& kernel,
                    MagiArgs& args, int width, const c10::Device& device) {
  const auto info = codegen::device_info(device.index());
  const int64_t tiles = (args.cols + 32 * width - 1) / (32 * width);
  const int64_t wanted = (4 * int64_t(info.sm_count) + tiles - 1) / tiles;
  const int64_t splits = std::clamp<int64_t>(std::min<int64_t>(wanted, args.rows / 64), 1, 65535);
  int64_t reductions = 0;
  for (const auto& op : spec.ops) reductions += op.kind == codegen::KOpKind::kReduce;
  at::Tensor workspace;
  if (splits > 1) {
    workspace = at::empty(
        {reductions * splits * args.cols},
        at::TensorOptions().dtype(spec.use_double ? at::kDouble : at::kFloat).device(device));
    args.workspace = workspace.data_ptr();
  }
  args.splits = splits;
  void* stream =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
  void* kernel_args[] = {&args};
  const auto grid_x = static_cast<unsigned>(tiles);
  args.phase = 0;
  codegen::launch_cuda_kernel(kernel, grid_x, static_cast<unsigned>(splits), 1, 32, 8, 1, 0, stream,
                              kernel_args, true);
  if (splits > 1) {
    args.phase = 1;  // the launch copied the arguments: this is the second launch's
    codegen::launch_cuda_kernel(kernel, grid_x, 1, 1, 32, 8, 1, 0, stream, kernel_args, true);
  }
  // `workspace` goes back to PyTorch's caching allocator on this stream: later work on the
  // stream runs after both launches.
}

}  // namespace

void division_constants(int64_t divisor, unsigned& magic, unsigned& shift) {
  const uint64_t d = static_cast<uint64_t>(std::clamp<int64_t>(divisor, 1, int64_t{1} << 31));
  uint64_t s = 0;
  while ((uint64_t{1} << s) < d) ++s;
  magic = static_cast<unsigned>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
  shift = static_cast<unsigned>(s);
}

struct FusedKernel::Variant {
  codegen::KernelVariant variant;
  std::string source;
  const codegen::CudaKernel* cuda = nullptr;
  void (*cpu)(const MagiArgs*) = nullptr;
  bool failed = false;
};

FusedKernel::FusedKernel(const ir::Graph& group, const std::string& name)
    : spec_(codegen::lower_group(group, name)) {
  const auto chains = codegen::input_view_chains(group);
  int64_t rank = 0;  // of the index space
  for (size_t i = 0; i < group.inputs().size(); ++i) {
    std::vector<ViewStep> steps;
    for (const ir::Node* view : chains[i]) {
      ViewStep step{view->input(0)->tensor_type()->sizes, view->output()->tensor_type()->sizes, {}};
      if (ir::op_info(*view).fn == "permute") step.permutation = ir::view_permutation(*view);
      steps.push_back(std::move(step));
    }
    has_views_ |= !steps.empty();
    rank = std::max<int64_t>(rank, steps.empty()
                                       ? group.inputs()[i]->tensor_type()->rank()
                                       : static_cast<int64_t>(steps.back().out_sizes.size()));
    input_views_.push_back(std::move(steps));
  }
  for (size_t k = 0; k < spec_.outputs.size(); ++k) {
    const ir::Value* out = group.outputs()[k];
    bool per_row = spec_.outputs[k].per_row;
    bool keepdim = !per_row || out->tensor_type()->rank() >= rank;
    outputs_.push_back({spec_.outputs[k].dtype, per_row, keepdim, out->tensor_type()->rank(), {}});
    const ir::TensorType& type = *out->tensor_type();
    if (!type.strides.empty() && type.strides != ir::TensorType::contiguous_strides(type.sizes)) {
      outputs_.back().traced_strides = type.strides;
      strided_outputs_ = true;
    }
  }
  shift_free_.assign(spec_.inputs.size(), true);
  for (const codegen::KOp& op : spec_.ops) {
    if (op.kind == codegen::KOpKind::kLoad && op.shift != 0) shift_free_[op.input] = false;
  }
  fallback_ = std::make_unique<Executable>(group);
  for (const ir::Value* in : group.inputs()) {
    if (!in->tensor_type()) {
      input_types_.clear();
      break;
    }
    input_types_.push_back(*in->tensor_type());
  }
  if (!group.inputs().empty() && group.inputs().front()->tensor_type()) {
    device_ = group.inputs().front()->tensor_type()->device;
  }
}

FusedKernel::~FusedKernel() = default;

void FusedKernel::keep_outputs_in_l2(const std::vector<bool>& keep) {
  MAGI_ASSERT(keep.size() == spec_.outputs.size(), "keep_outputs_in_l2: ", keep.size(),
              " flags for ", spec_.outputs.size(), " outputs of ", spec_.name);
  MAGI_ASSERT(variants_.empty(), "keep_outputs_in_l2 after ", spec_.name, " printed a variant");
  for (size_t k = 0; k < keep.size(); ++k) spec_.outputs[k].keep = keep[k];
}

ir::SymbolBindings FusedKernel::bind_symbols(const std::vector<at::Tensor>& inputs) const {
  ir::SymbolBindings bindings;
  for (size_t i = 0; i < inputs.size() && i < input_types_.size(); ++i) {
    const auto& sizes = input_types_[i].sizes;
    for (size_t d = 0; d < sizes.size() && d < static_cast<size_t>(inputs[i].dim()); ++d) {
      if (sizes[d].op() == ir::SymExpr::Op::kSymbol) {
        bindings[sizes[d].symbol_name()] = inputs[i].size(static_cast<int64_t>(d));
      }
    }
  }
  return bindings;
}

bool FusedKernel::input_layout(size_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                               const ir::SymbolBindings& bindings, std::vector<int64_t>& out_sizes,
                               std::vector<int64_t>& out_strides) const {
  out_sizes.assign(sizes.begin(), sizes.end());
  out_strides.assign(strides.begin(), strides.end());
  for (const ViewStep& step : input_views_[i]) {
    // Broadcast to the view's input shape (the values before the view have its full shape).
    std::vector<int64_t> shape;
    for (const ir::SymExpr& e : step.in_sizes) {
      auto v = e.try_evaluate(bindings);
      if (!v) return false;
      shape.push_back(*v);
    }
    if (out_sizes.size() > shape.size()) return false;
    std::vector<int64_t> expanded(shape.size(), 0);
    const size_t offset = shape.size() - out_sizes.size();
    for (size_t d = 0; d < out_sizes.size(); ++d) {
      if (out_sizes[d] == shape[offset + d]) {
        expanded[offset + d] = out_strides[d];
      } else if (out_sizes[d] != 1) {
        return false;
      }
    }
    if (!step.permutation.empty()) {
      out_sizes.clear();
      out_strides.clear();
      for (int64_t d : step.permutation) {
        out_sizes.push_back(shape[d]);
        out_strides.push_back(expanded[d]);
      }
      continue;
    }
    std::vector<int64_t> target;
    for (const ir::SymExpr& e : step.out_sizes) {
      auto v = e.try_evaluate(bindings);
      if (!v) return false;
      target.push_back(*v);
    }
    auto viewed = at::detail::computeStride(shape, expanded, target);
    if (!viewed) return false;
    out_sizes = std::move(target);
    out_strides.assign(viewed->begin(), viewed->end());
  }
  return true;
}

size_t FusedKernel::num_variants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return variants_.size();
}

std::vector<GeneratedKernel> FusedKernel::generated() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<GeneratedKernel> out;
  for (const auto& [key, v] : variants_) {
    if (v->source.empty()) continue;
    out.push_back({v->variant.symbol(), v->cuda ? "cuda" : "cpu", v->source, spec_.fused_ops});
  }
  return out;
}

std::optional<codegen::CudaSource> FusedKernel::expected_cuda_source() const {
  if (!device_.is_cuda() || input_types_.empty()) return std::nullopt;
  // Bind every symbolic size to one value that is neither 1 (which would read as a broadcast)
  // nor odd (which would forbid vectors): the access classes depend on the layout, not on it.
  ir::SymbolBindings bindings;
  std::set<std::string> symbols;
  for (const ir::TensorType& t : input_types_) {
    for (const ir::SymExpr& e : t.sizes) e.collect_symbols(symbols);
    for (const ir::SymExpr& e : t.strides) e.collect_symbols(symbols);
  }
  for (const std::string& name : symbols) bindings[name] = 64;
  std::vector<std::vector<int64_t>> sizes, strides;
  std::vector<int64_t> space;
  for (size_t i = 0; i < input_types_.size(); ++i) {
    const ir::TensorType& t = input_types_[i];
    std::vector<int64_t> sz, st;
    for (const ir::SymExpr& e : t.sizes) sz.push_back(e.evaluate(bindings));
    const auto& stride_exprs =
        t.strides.empty() ? ir::TensorType::contiguous_strides(t.sizes) : t.strides;
    for (const ir::SymExpr& e : stride_exprs) st.push_back(e.evaluate(bindings));
    std::vector<int64_t> mapped_sz, mapped_st;
    if (!input_layout(i, sz, st, bindings, mapped_sz, mapped_st)) return std::nullopt;
    space = at::infer_size(space, mapped_sz);
    sizes.push_back(std::move(mapped_sz));
    strides.push_back(std::move(mapped_st));
  }
  if (space.empty()) space = {1};
  codegen::KernelVariant kv;
  kv.spec = &spec_;
  MagiArgs args{};  // the strides set_index_rank reads
  std::vector<int64_t> expanded;
  for (size_t i = 0; i < sizes.size(); ++i) {
    kv.access.push_back(classify(sizes[i], strides[i], space, expanded));
    if (kv.access.back() == AccessClass::kStrided && space.size() > MAGI_MAX_RANK) {
      return std::nullopt;  // runs through ATen
    }
    for (size_t d = 0; d < space.size() && d < MAGI_MAX_RANK; ++d) {
      args.strides[i][d] = expanded[d];
    }
  }
  adapt_column_access(spec_, space.size(), kv.access);
  if (space.size() > MAGI_MAX_RANK &&
      std::count(kv.access.begin(), kv.access.end(), AccessClass::kStrided) > 0) {
    return std::nullopt;
  }
  int64_t numel = 1;
  for (int64_t n : space) numel *= n;
  kv.vector_width = vector_width_for(spec_, kv.access, kernel_cols(spec_, space), numel,
                                     [](int) { return true; });
  choose_row_layout(kv, kernel_cols(spec_, space));
  kv.unroll = pointwise_unroll_for(kv, numel, sm_count_of(std::max<int>(device_.index(), 0)));
  set_index_rank(kv, space, args);
  kv.strided_vectors = strided_vectors_for(kv, space, args, [](int) { return true; });
  kv.packed_bf16 = codegen::packed_bf16_possible(kv);
  return codegen::CudaSource{codegen::cuda_preamble(kv) + codegen::print_cuda(kv), kv.symbol()};
}

const FusedKernel::Variant& FusedKernel::variant_for(const std::string& key,
                                                     const codegen::KernelVariant& kv,
                                                     const c10::Device& device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = variants_.find(key);
  if (it != variants_.end()) return *it->second;
  auto v = std::make_unique<Variant>();
  v->variant = kv;
  v->variant.spec = &spec_;
  (void)codegen::kernel_schedule();  // a malformed override is the user's error, not a fallback
  // Packed bf16 pairs follow from what the key holds (the access classes, the width, whole
  // strided vectors): decided once per variant, not per call.
  v->variant.packed_bf16 = device.is_cuda() && codegen::packed_bf16_possible(v->variant);
  try {
    if (device.is_cuda()) {
      v->source = codegen::print_cuda(v->variant);
      v->cuda = &codegen::get_cuda_kernel(codegen::cuda_preamble(v->variant) + v->source,
                                          v->variant.symbol(), device.index());
    } else {
      v->source = codegen::print_cpp(v->variant);
      v->cpu = reinterpret_cast<void (*)(const MagiArgs*)>(codegen::get_cpu_function(
          std::string(codegen::kCpuPreamble) + "\n" + v->source, v->variant.symbol()));
      if (verify_cuda_codegen()) {
        // Also prove the CUDA forms of this variant compile (CPU-only test runs).
        codegen::compile_cuda_to_cubin(codegen::cuda_preamble(v->variant) + cuda_forms(v->variant),
                                       v->variant.symbol(), 90);
      }
    }
  } catch (const DeviceError&) {
    throw;  // the device's fault, not the kernel's: ATen would meet it too
  } catch (const std::exception& e) {
    v->failed = true;
    MAGI_LOG_WARN("fused kernel ", v->variant.symbol(),
                  " could not be compiled; running its ops through ATen instead: ", e.what());
  }
  auto& ref = *v;
  variants_.emplace(key, std::move(v));
  return ref;
}

std::vector<at::Tensor> FusedKernel::run_fallback(const std::vector<at::Tensor>& inputs) const {
  std::vector<c10::IValue> in(inputs.begin(), inputs.end());
  std::vector<c10::IValue> out = fallback_->run(std::move(in));
  std::vector<at::Tensor> result;
  for (auto& v : out) result.push_back(v.toTensor());
  return result;
}

namespace {

// The dims of a dense layout from outermost to innermost (size-1 dims where they stand), or
// empty when `strides` are not a permutation of a contiguous layout of `sizes` with the last dim
// innermost (what a pointwise kernel can write by relabelling its index space).
std::vector<int64_t> memory_order(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  const int64_t rank = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> order;
  for (int64_t d = 0; d < rank; ++d) {
    if (sizes[d] != 1) order.push_back(d);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t expected = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (strides[*it] != expected) return {};
    expected *= sizes[*it];
  }
  if (order.empty() || order.back() != rank - 1) return {};
  // Size-1 dims go back in front of the first dim after them in the original order.
  for (int64_t d = 0; d < rank; ++d) {
    if (sizes[d] == 1) {
      auto at = std::find_if(order.begin(), order.end(), [d](int64_t e) { return e > d; });
      order.insert(at, d);
    }
  }
  return order;
}

bool same_layout(const at::Tensor& t, c10::IntArrayRef strides) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1 && t.stride(d) != strides[d]) return false;
  }
  return true;
}

}  // namespace

std::vector<at::Tensor> FusedKernel::run(std::vector<at::Tensor> inputs,
                                         std::vector<at::Tensor> presets) const {
  MAGI_ASSERT(inputs.size() == spec_.inputs.size(), spec_.name, " takes ", spec_.inputs.size(),
              " inputs, got ", inputs.size());
  MAGI_ASSERT(!strided_outputs_ && presets.size() == outputs_.size(), spec_.name,
              ": preset outputs need contiguous outputs, one per output");
  return run_kernel(inputs, {}, std::move(presets));
}

bool FusedKernel::can_write_over_input(size_t i) const {
  return spec_.schedule == codegen::Schedule::kPointwise && i < shift_free_.size() &&
         shift_free_[i] && i < input_views_.size() && input_views_[i].empty();
}

std::vector<at::Tensor> FusedKernel::run(std::vector<at::Tensor> inputs) const {
  MAGI_ASSERT(inputs.size() == spec_.inputs.size(), spec_.name, " takes ", spec_.inputs.size(),
              " inputs, got ", inputs.size());
  if (!strided_outputs_) return run_kernel(inputs, {});
  // Outputs the trace laid out otherwise than contiguous get that layout: a pointwise kernel
  // writes the first one's directly (its index space relabelled to the memory order), and any
  // other is copied into it.
  const ir::SymbolBindings bindings = bind_symbols(inputs);
  std::vector<std::vector<int64_t>> traced(outputs_.size());
  for (size_t k = 0; k < outputs_.size(); ++k) {
    for (const ir::SymExpr& e : outputs_[k].traced_strides) {
      const auto v = e.try_evaluate(bindings);
      // A stride in a symbol no input's sizes bind: ATen's ops give eager's layout.
      if (!v) return run_fallback(inputs);
      traced[k].push_back(*v);
    }
  }
  std::vector<at::Tensor> outputs = run_kernel(inputs, traced[0]);
  for (size_t k = 0; k < outputs.size(); ++k) {
    at::Tensor& t = outputs[k];
    if (outputs_[k].traced_strides.empty()) {  // traced contiguous
      if (!t.is_contiguous()) t = t.contiguous();
      continue;
    }
    if (traced[k].empty() || t.dim() != static_cast<int64_t>(traced[k].size()) ||
        same_layout(t, traced[k])) {
      continue;
    }
    at::Tensor laid_out = at::empty_strided(t.sizes(), traced[k], t.options());
    laid_out.copy_(t);
    t = laid_out;
  }
  return outputs;
}

// A pointwise kernel reads each element of a contiguous input at the index it writes, into
// registers, before it stores there; no other lane reads it (loads at a column shift are
// excluded). So an output may be written over such an input when nothing else can see that
// input's memory: the executor moved its last reference into this call (the tensor and its
// storage have no other owner, so no view, caller, saved value or kept constant reads it
// later) and the output has its dtype and size. The silu(gate) * up of a SwiGLU MLP then
// needs two wide buffers at once instead of three.
int FusedKernel::reusable_input(const std::vector<at::Tensor>& inputs,
                                const std::vector<AccessClass>& access,
                                const std::vector<bool>& taken, size_t k, int64_t numel) const {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (taken[i] || access[i] != AccessClass::kContiguous || !shift_free_[i] ||
        t.scalar_type() != outputs_[k].dtype || t.use_count() != 1 || !t.has_storage() ||
        t.is_conj() || t.is_neg() ||
        t.storage().nbytes() != static_cast<size_t>(numel) * t.element_size()) {
      continue;
    }
    // A view made outside inference mode keeps its base (autograd's view record), which owns
    // the storage too; that base must have no other owner.
    size_t owners = 1;
    if (t.is_view()) {
      if (t._base().use_count() != 1) continue;
      owners = 2;
    }
    if (t.storage().use_count() == owners) return static_cast<int>(i);
  }
  return -1;
}

std::vector<at::Tensor> FusedKernel::run_kernel(const std::vector<at::Tensor>& inputs,
                                                c10::IntArrayRef first_output_strides,
                                                std::vector<at::Tensor> presets) const {
  // MagiArgs has room for MAGI_MAX_KERNEL_ARGS pointers; a larger group runs through ATen.
  if (inputs.size() + outputs_.size() > MAGI_MAX_KERNEL_ARGS) return run_fallback(inputs);
  // Each input's sizes and strides in the index space: its own, or through its views.
  std::vector<std::vector<int64_t>> mapped_sizes, mapped_strides;
  if (has_views_) {
    const ir::SymbolBindings bindings = bind_symbols(inputs);
    mapped_sizes.resize(inputs.size());
    mapped_strides.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!input_layout(i, inputs[i].sizes(), inputs[i].strides(), bindings, mapped_sizes[i],
                        mapped_strides[i])) {
        MAGI_LOG_DEBUG(spec_.name, ": input ", i,
                       " is not addressable with strides through its views; running through ATen");
        return run_fallback(inputs);
      }
    }
  }
  bool mapped = has_views_;
  auto sizes_of = [&](size_t i) -> c10::IntArrayRef {
    return mapped ? c10::IntArrayRef(mapped_sizes[i]) : inputs[i].sizes();
  };
  auto strides_of = [&](size_t i) -> c10::IntArrayRef {
    return mapped ? c10::IntArrayRef(mapped_strides[i]) : inputs[i].strides();
  };
  std::vector<int64_t> space;
  for (size_t i = 0; i < inputs.size(); ++i) space = at::infer_size(space, sizes_of(i));
  if (space.empty()) space = {1};
  // A pointwise kernel's elements are independent: its index space may run in any dim order.
  // In the first output's traced one, it writes that layout (the others take it too).
  std::vector<int64_t> order;
  if (spec_.schedule == codegen::Schedule::kPointwise && !spec_.outputs.empty() &&
      first_output_strides.size() == space.size()) {
    order = memory_order(space, first_output_strides);
    bool identity = true;
    for (size_t d = 0; d < order.size(); ++d) identity &= order[d] == static_cast<int64_t>(d);
    if (identity) order.clear();
  }
  if (!order.empty()) {
    std::vector<std::vector<int64_t>> sizes(inputs.size()), strides(inputs.size());
    std::vector<int64_t> expanded;
    for (size_t i = 0; i < inputs.size(); ++i) {
      classify(sizes_of(i), strides_of(i), space, expanded);
      for (int64_t d : order) {
        sizes[i].push_back(space[d]);
        strides[i].push_back(expanded[d]);
      }
    }
    mapped_sizes = std::move(sizes);
    mapped_strides = std::move(strides);
    mapped = true;
    std::vector<int64_t> relabelled;
    for (int64_t d : order) relabelled.push_back(space[d]);
    space = std::move(relabelled);
  }
  // Outputs made in the relabelled space, with the caller's dim order.
  auto in_caller_order = [&](std::vector<at::Tensor> outputs) {
    if (order.empty()) return outputs;
    std::vector<int64_t> inverse(order.size());
    for (size_t d = 0; d < order.size(); ++d) inverse[order[d]] = static_cast<int64_t>(d);
    for (at::Tensor& t : outputs) t = t.permute(inverse);
    return outputs;
  };
  const int64_t rank = static_cast<int64_t>(space.size());
  int64_t numel = 1;
  for (int64_t s : space) numel *= s;
  const int64_t cols = kernel_cols(spec_, space);
  const int64_t rows = cols == 0 ? 0 : numel / cols;
  const c10::Device device = inputs.front().device();

  std::vector<std::vector<int64_t>> shapes;
  for (const OutputInfo& o : outputs_) {
    std::vector<int64_t> shape = space;
    if (o.per_row && spec_.schedule == codegen::Schedule::kColumn) {
      // [1, ..., 1, kept dims...]
      const int64_t kept = rank - spec_.column_dims;
      shape.assign(std::max<int64_t>(o.rank - kept, 0), 1);
      shape.insert(shape.end(), space.begin() + spec_.column_dims, space.end());
    } else if (o.per_row) {
      shape.pop_back();
      if (o.keepdim) shape.push_back(1);
    }
    shapes.push_back(std::move(shape));
  }
  // Allocated after the inputs' access classes are known (an output may take over an input's
  // memory, see reusable_input); left undefined until then.
  std::vector<at::Tensor> outputs(outputs_.size());
  for (size_t k = 0; k < presets.size() && k < outputs.size(); ++k) {
    const at::Tensor& t = presets[k];
    if (t.defined() && t.scalar_type() == outputs_[k].dtype && t.device() == device &&
        t.sizes() == c10::IntArrayRef(shapes[k]) && t.is_contiguous()) {
      outputs[k] = t;
    }
  }
  auto allocate_outputs = [&] {
    for (size_t k = 0; k < outputs.size(); ++k) {
      if (outputs[k].defined()) continue;
      outputs[k] =
          at::empty(shapes[k], at::TensorOptions().dtype(outputs_[k].dtype).device(device));
    }
  };
  if (numel == 0) {
    allocate_outputs();
    // Reductions over an empty dim give ATen's values (0 for sums, an error for amax).
    const bool empty = std::all_of(outputs.begin(), outputs.end(),
                                   [](const at::Tensor& t) { return t.numel() == 0; });
    return empty ? in_caller_order(std::move(outputs)) : run_fallback(inputs);
  }

  MagiArgs args{};
  codegen::KernelVariant kv;
  kv.spec = &spec_;
  std::vector<int64_t> expanded;
  for (size_t i = 0; i < inputs.size(); ++i) {
    MAGI_ASSERT(inputs[i].device() == device, spec_.name, ": inputs on different devices");
    kv.access.push_back(classify(sizes_of(i), strides_of(i), space, expanded));
    for (int64_t d = 0; d < rank && d < MAGI_MAX_RANK; ++d) args.strides[i][d] = expanded[d];
    args.ptr[i] = const_cast<void*>(inputs[i].data_ptr());
  }
  adapt_column_access(spec_, space.size(), kv.access);
  const bool any_strided =
      std::count(kv.access.begin(), kv.access.end(), AccessClass::kStrided) > 0;
  if (any_strided && rank > MAGI_MAX_RANK) return run_fallback(inputs);
  size_t written_over = 0;
  for (const at::Tensor& out : outputs) {  // presets the arena placed over a dying input
    if (!out.defined()) continue;
    for (const at::Tensor& in : inputs) written_over += in.data_ptr() == out.data_ptr();
  }
  if (spec_.schedule == codegen::Schedule::kPointwise) {
    std::vector<bool> taken(inputs.size(), false);
    for (size_t k = 0; k < outputs.size(); ++k) {
      if (outputs[k].defined()) continue;  // a preset
      const int i = reusable_input(inputs, kv.access, taken, k, numel);
      if (i < 0) continue;
      taken[i] = true;
      std::vector<int64_t> strides(shapes[k].size(), 1);
      for (size_t d = strides.size(); d-- > 1;) strides[d - 1] = strides[d] * shapes[k][d];
      // A tensor of its own on the input's storage, not a view of the input: autograd would
      // refuse a caller's in-place write to a view made inside a compiled function.
      outputs[k] = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(inputs[i].storage()),
                                                            inputs[i].key_set(), inputs[i].dtype());
      outputs[k].unsafeGetTensorImpl()->set_sizes_and_strides(shapes[k], strides,
                                                              inputs[i].storage_offset());
      ++written_over;
    }
  }
  allocate_outputs();
  for (size_t k = 0; k < outputs.size(); ++k) args.ptr[inputs.size() + k] = outputs[k].data_ptr();
  args.numel = numel;
  args.splits = 1;
  args.rows = rows;
  args.cols = cols;
  args.rank = rank;
  for (int64_t d = 0; d < rank && d < MAGI_MAX_RANK; ++d) {
    args.sizes[d] = space[d];
    division_constants(space[d], args.div_magic[d], args.div_shift[d]);
  }
  division_constants(cols, args.cols_magic, args.cols_shift);

  // Vector width: 16-byte accesses when every vectorised pointer and the row length allow it.
  int width = 1;
  codegen::DeviceInfo info;
  if (device.is_cuda()) {
    info = codegen::device_info(device.index());
    width = vector_width_for(spec_, kv.access, cols, numel, [&](int w) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        if ((kv.access[i] == AccessClass::kContiguous || kv.access[i] == AccessClass::kColumn) &&
            reinterpret_cast<uintptr_t>(inputs[i].data_ptr()) % (w * inputs[i].element_size()) !=
                0) {
          return false;
        }
      }
      return true;
    });
  }
  kv.vector_width = width;
  if (device.is_cuda()) {
    choose_row_layout(kv, cols);
    kv.unroll = pointwise_unroll_for(kv, numel, info.sm_count);
  }
  set_index_rank(kv, space, args);
  if (device.is_cuda()) {
    kv.strided_vectors = strided_vectors_for(kv, space, args, [&](int i) {
      return reinterpret_cast<uintptr_t>(inputs[i].data_ptr()) %
                 (kv.vector_width * inputs[i].element_size()) ==
             0;
    });
  }

  // Per-call key: access classes, vector width, device, row layout, index rank and width,
  // vectors per thread, whole strided vectors and the loop over rows (the spec is fixed per
  // FusedKernel, so its fingerprint need not be part of it; packed bf16 pairs follow from these,
  // variant_for).
  std::string key(kv.access.size() + 10, ' ');
  for (size_t i = 0; i < kv.access.size(); ++i) key[i] = static_cast<char>(kv.access[i]);
  key[kv.access.size()] = '|';
  key[kv.access.size() + 1] = static_cast<char>('0' + width);
  key[kv.access.size() + 2] = device.is_cuda() ? 'g' : 'c';
  key[kv.access.size() + 3] = static_cast<char>('0' + (device.is_cuda() ? device.index() : 0));
  key[kv.access.size() + 4] =
      kv.rows_in_warps ? 'w' : (kv.streamed_rows ? 's' : (kv.wide_rows ? 'h' : 'b'));
  key[kv.access.size() + 5] = static_cast<char>('0' + kv.index_rank);
  key[kv.access.size() + 6] = kv.narrow_index ? 'n' : 'w';
  key[kv.access.size() + 7] = static_cast<char>('0' + kv.unroll);
  key[kv.access.size() + 8] = kv.strided_vectors ? 'v' : 's';
  key[kv.access.size() + 9] = kv.row_loop ? 'l' : 'g';
  const Variant& v = variant_for(key, kv, device);
  if (v.failed) return run_fallback(inputs);
  in_place_outputs_.fetch_add(written_over, std::memory_order_relaxed);

  if (device.is_cuda()) {
    const codegen::KernelSchedule& schedule = codegen::kernel_schedule();
    unsigned threads, blocks, rows_per_block = 1;
    if (spec_.schedule == codegen::Schedule::kColumn) {
      launch_columns(spec_, *v.cuda, args, width, device);
      return outputs;
    }
    if (spec_.schedule == codegen::Schedule::kPointwise) {
      threads = std::min(256, schedule.block_threads);
      const int64_t vectors = (numel / width + kv.unroll - 1) / kv.unroll;
      const int64_t needed = (vectors + threads - 1) / threads;
      // A pointwise kernel of one vector per thread has no stride loop: the grid covers all.
      MAGI_ASSERT(needed <= kMaxGridBlocks || kv.unroll > 1, "pointwise launch of ", needed,
                  " blocks over ", vectors, " vectors exceeds a grid");
      blocks = static_cast<unsigned>(std::min<int64_t>(needed, kMaxGridBlocks));
    } else {
      const int64_t row_threads =
          kv.streamed_rows ? schedule.stream_threads : threads_per_row(cols, width);
      if (kv.rows_in_warps) {
        rows_per_block = static_cast<unsigned>(schedule.block_threads / row_threads);
      }
      threads = static_cast<unsigned>(row_threads);
      const int64_t needed = (rows + rows_per_block - 1) / rows_per_block;
      // Printed without a loop over rows (codegen::row_grid_loop), a kernel reaches only the
      // rows of its grid.
      MAGI_CHECK(needed <= kMaxGridBlocks || kv.row_loop, "a row kernel over ", rows,
                 " rows needs ", needed, " blocks, more than a grid has");
      blocks = static_cast<unsigned>(std::min<int64_t>(needed, kMaxGridBlocks));
    }
    blocks = std::max(blocks, 1u);
    void* stream =
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
    void* kernel_args[] = {&args};
    codegen::launch_cuda_kernel(*v.cuda, blocks, 1, 1, threads, rows_per_block, 1, 0, stream,
                                kernel_args, true);
  } else {
    try {
      v.cpu(&args);
    } catch (const std::bad_alloc&) {
      throw KeptValuesAllocationError(
          "the C++ kernel " + v.variant.symbol() +
          " could not allocate the values it keeps between passes over a row: " +
          std::to_string(args.cols) +
          " columns per kept value for each of its OpenMP threads (OMP_NUM_THREADS)");
    }
  }
  return in_caller_order(std::move(outputs));
}

}  // namespace magi::runtime
