// What the compiler knows about individual operators, in one table: which ATen ops are
// pointwise (and the scalar function a generated kernel computes for them), which are row
// reductions, which are casts. The fusion pass and the code generator both read it, so an op
// is fusible exactly when the code generator can emit it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace magi::ir {

class Node;
class Value;

enum class OpClass : uint8_t {
  kOther,            ///< not fusible: runs as an ATen call
  kUnary,            ///< elementwise f(x)
  kBinary,           ///< elementwise f(x, y) with broadcasting (alpha folded in for add/sub/rsub)
  kWhere,            ///< where(cond, x, y); masked_fill(x, mask, value) as where(mask, value, x)
  kCast,             ///< _to_copy / clone that only changes dtype (or nothing)
  kReduction,        ///< sum/mean/amax/amin (var, var_mean) over the last dim
  kColumnReduction,  ///< sum/mean/amax/amin over dims 0..k-1, k < rank (bias gradients)
  kSoftmax,          ///< _softmax / _log_softmax over the last dim
  kLayerNorm,        ///< native_layer_norm over the last dim
  kSlice,            ///< slice of a constant-size last dim, step 1, constant bounds
  kCat,              ///< cat along the last dim of pieces of constant width
  kPad,              ///< constant_pad_nd of the last dim (constant width, constant value)
  kView,  ///< view/reshape/unsqueeze/squeeze (fn "view"), permute/transpose/t ("permute")
};

struct OpInfo {
  OpClass op_class = OpClass::kOther;
  std::string fn;  ///< scalar function for kUnary/kBinary ("exp", "add", "gelu_tanh", ...)
};

/// Whether `node` (an AtenOp or CustomOp) is known to draw random numbers: ATen operators
/// tagged nondeterministic_seeded, and operators named after a distribution (rand*, dropout,
/// bernoulli, normal, uniform, poisson, multinomial, exponential). Such a node advances the
/// generator even when its result is unused. Other node kinds: false. A custom op with another
/// name may still draw: callers that must be sure treat custom ops as drawing.
bool is_random_operator(const Node& node);

/// Whether `node` is an ATen operator whose results depend on its operands alone: it returns
/// something, writes no argument, draws no random numbers, and is not an `empty` of
/// uninitialised memory. The executor folds such calls on constants; common-subexpression
/// elimination merges repeats of them.
bool is_pure_operator(const Node& node);

/// Classifies `node` (an AtenOp). Checks argument values too: a reduction over a dim other
/// than the last, a cast that changes device, or a gelu with an unknown approximation are
/// kOther. `reason`, when given, says why a node is not fusible.
OpInfo op_info(const Node& node, std::string* reason = nullptr);

/// The value of input `i` of `node` when a Constant node produces it, else nullptr.
const c10::IValue* constant_input(const Node& node, size_t i);

/// [start, end) of a kSlice, clamped to its input's last dim.
std::pair<int64_t, int64_t> slice_bounds(const Node& node);

/// [left, left + input width) of a kPad: the output columns its input fills (the others hold
/// the pad value).
std::pair<int64_t, int64_t> pad_bounds(const Node& node);

/// The pieces of a kCat (the values its list is built from).
const std::vector<Value*>& cat_pieces(const Node& node);

/// The dims of a kView "permute" (permute, transpose, t), in the order of its output.
std::vector<int64_t> view_permutation(const Node& node);

/// The size argument of a kView "view" as constants: its one symbolic entry, if any, as -1
/// (which ATen infers from the element count).
std::vector<int64_t> view_constant_sizes(const Node& node);

/// Does output `k` of operator `node` alias one of its inputs (a view: aten::view, t, detach,
/// ...)? Also for _unsafe_view and _reshape_alias, which return views without saying so in
/// their schemas (AOTAutograd emits _unsafe_view after matmuls).
bool output_aliases_input(const Node& node, size_t k);

/// k for a kColumnReduction over dims 0..k-1 of its input, else 0.
int64_t column_reduced_dims(const Node& node);

/// True for float32, float64, bfloat16 and float16 tensors with a known type: what fused
/// kernels compute on.
bool is_fusible_float_tensor(const class Value& value);

}  // namespace magi::ir
