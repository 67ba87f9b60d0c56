// FusedKernel: runs one fusion group as a generated kernel.
//
// At each call the input tensors decide the variant: the index space (their broadcast
// shape), how each input is addressed (contiguous, per-row, per-column, scalar, strided) and
// the vector width. A variant is printed and compiled once (CUDA through NVRTC, CPU through
// the host compiler) and reused for every later call with the same signature, whatever the
// sizes: a new batch size or sequence length compiles nothing. If a variant cannot be
// compiled, the group runs op by op through ATen instead (with one warning), so correctness
// never depends on code generation.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "magi/codegen/compiler.h"
#include "magi/codegen/kernel_ir.h"
#include "magi/ir/graph.h"

namespace magi::runtime {

class Executable;

/// A kernel source the runtime generated and compiled.
struct GeneratedKernel {
  std::string symbol;
  std::string target;  ///< "cuda" or "cpu"
  std::string source;  ///< the printed kernel (without the shared preamble)
  std::vector<std::string> fused_ops;
};

/// Constants for dividing by `divisor` (1 to 2^31) as a multiply and a shift, as generated
/// GPU kernels do their index arithmetic: for 0 <= n < 2^31,
/// n / divisor == (umulhi(n, magic) + n) >> shift, umulhi the high 32 bits of the 64-bit
/// product (Granlund-Montgomery; shift = ceil(log2(divisor))).
void division_constants(int64_t divisor, unsigned& magic, unsigned& shift);

class FusedKernel {
 public:
  FusedKernel(const ir::Graph& group, const std::string& name);
  ~FusedKernel();

  /// Runs the kernel. The inputs are taken by value: a tensor whose only reference the caller
  /// moves in may have an output written over it (pointwise kernels); one the caller still
  /// holds (a copied vector) never does.
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs) const;
  /// The same, writing output k into `presets[k]` where that is defined, contiguous and of
  /// the output's dtype, device and sizes (the memory arena's place for it); other outputs
  /// are allocated as usual, and so are all of them when the group runs through ATen.
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs,
                              std::vector<at::Tensor> presets) const;
  /// Whether an output the size and dtype of input `i` may be written over it: a pointwise
  /// kernel reads each element of the input at the index it writes, and nothing else of it.
  bool can_write_over_input(size_t i) const;
  /// Whether some output is laid out otherwise than contiguous (as traced).
  bool has_strided_outputs() const { return strided_outputs_; }

  const codegen::KernelSpec& spec() const { return spec_; }
  /// Marks output k as read by a library operator where keep[k] (KOutput::keep): stored
  /// without the streaming hint. Before the first call.
  void keep_outputs_in_l2(const std::vector<bool>& keep);
  /// The device the captured graph ran this group on.
  const c10::Device& device() const { return device_; }
  std::vector<GeneratedKernel> generated() const;
  size_t num_variants() const;
  /// Calls so far that wrote an output over an input at its last use instead of a new buffer
  /// (see reusable_input in fused_kernel.cpp).
  size_t num_in_place_outputs() const { return in_place_outputs_.load(std::memory_order_relaxed); }
  /// The CUDA source of the variant a call is expected to need: inputs laid out as the
  /// captured graph traced them, 16-byte aligned. nullopt off CUDA. Compiling these for a whole
  /// graph at once, on a thread pool, before its first call (Executable::precompile_kernels)
  /// turns the first call's compiles into cache hits; a call that needs another variant still
  /// compiles it then.
  std::optional<codegen::CudaSource> expected_cuda_source() const;

 private:
  struct Variant;
  struct OutputInfo {
    c10::ScalarType dtype;
    bool per_row;
    bool keepdim;
    int64_t rank;  ///< as traced (a column kernel's per-column outputs are [1, ..., 1, cols])
    /// The strides the trace gave it when not contiguous (eager's elementwise ops lay their
    /// result out like their inputs, and a later view may rely on it); empty otherwise.
    std::vector<ir::SymExpr> traced_strides;
  };

  const Variant& variant_for(const std::string& key, const codegen::KernelVariant& v,
                             const c10::Device& device) const;
  std::vector<at::Tensor> run_fallback(const std::vector<at::Tensor>& inputs) const;
  /// The kernel call. With `first_output_strides` (the first output's traced layout) a
  /// pointwise kernel whose index space can be relabelled to that layout's dim order writes
  /// its outputs in it (returned permuted back, so with those strides).
  std::vector<at::Tensor> run_kernel(const std::vector<at::Tensor>& inputs,
                                     c10::IntArrayRef first_output_strides,
                                     std::vector<at::Tensor> presets = {}) const;

  /// One view between where an input is read and the index space (see input_view_chains).
  struct ViewStep {
    std::vector<ir::SymExpr> in_sizes, out_sizes;
    std::vector<int64_t> permutation;  ///< permute/transpose/t; empty for a reshape
  };
  /// Sizes and strides of input `i` in the index space: its own, or through its views; false
  /// when a view cannot be expressed with strides (eager would copy) or a size is unknown.
  bool input_layout(size_t i, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                    const ir::SymbolBindings& bindings, std::vector<int64_t>& out_sizes,
                    std::vector<int64_t>& out_strides) const;
  /// Values of the symbols that size the inputs (bare symbols in their traced sizes).
  ir::SymbolBindings bind_symbols(const std::vector<at::Tensor>& inputs) const;
  /// The input output `k` of a pointwise call may be written over, or -1.
  int reusable_input(const std::vector<at::Tensor>& inputs,
                     const std::vector<codegen::AccessClass>& access,
                     const std::vector<bool>& taken, size_t k, int64_t numel) const;

  codegen::KernelSpec spec_;
  std::vector<std::vector<ViewStep>> input_views_;  ///< per input; all empty without views
  bool has_views_ = false;
  bool strided_outputs_ = false;  ///< some output has traced_strides
  c10::Device device_{c10::DeviceType::CPU};
  std::vector<ir::TensorType> input_types_;  ///< as traced; empty when one is not a tensor
  std::vector<OutputInfo> outputs_;
  std::vector<bool> shift_free_;  ///< per input: every load reads it at the lane's own column
  mutable std::atomic<size_t> in_place_outputs_{0};
  std::unique_ptr<Executable> fallback_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::unique_ptr<Variant>> variants_;
};

}  // namespace magi::runtime
