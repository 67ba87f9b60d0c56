// The graph matchers recognize_attention and group_query_attention share: small accessors of
// operator nodes and their constant arguments, and the classification of attention masks (which
// entries a mask built in the graph hides, and whether a mask broadcasts to the scores).
// Private to the passes layer; defined in attention_match.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "magi/ir/graph.h"
#include "magi/ir/node.h"

namespace magi::passes::attention_match {

/// `node` is an operator named `name` (overload included, e.g. "aten::slice.Tensor").
bool is_op(const ir::Node* node, const char* name);
/// view, _unsafe_view or reshape.
bool is_reshape(const ir::Node* node);
/// The only reader of `v`, or null.
ir::Node* only_user(const ir::Value* v);
/// Input `i` of `node` as a constant int.
std::optional<int64_t> constant_int(const ir::Node& node, size_t i);
/// A literal as a number: an int, a float, a bool (1 or 0), or a one-element CPU tensor of
/// such a dtype.
std::optional<double> number_of(const c10::IValue& v);
/// Input `i` of `node` as a constant number: an int, a float, or a one-element tensor constant
/// (the capture turns the Python float of `x * scale` into a 0-d float64 tensor); not a bool.
std::optional<double> constant_number(const ir::Node& node, size_t i);
/// "fx_name (model.py:12 in forward)": where a node came from, for logs and decisions.
std::string node_location(const ir::Node& node);
const ir::TensorType* type_of(const ir::Value* v);
/// Does `dim` of a tensor of rank `rank` name one of its last two dims?
bool in_last_two(int64_t dim, int64_t rank);
std::vector<ir::SymExpr> last_two(const ir::TensorType& t);

/// Masked entries get a value whose exp is 0 next to any score: -inf, or a finite value at least
/// as low as the lowest bf16/f16/f32 one (torch.finfo(dtype).min).
bool is_masking_value(double v);

/// What a mask value holds at (row i, column j) of its last two dims, the same for every index
/// of its leading dims.
enum class Mask {
  kUnknown,
  kKeepLower,    // nonzero where j <= i: tril(ones)
  kMaskUpper,    // nonzero where j > i: triu(ones, 1), tril(ones) == 0
  kNegInfUpper,  // a masking value where j > i, 0 elsewhere: triu(full(-inf), 1)
};

/// A tensor filled with one constant by a factory op: its value.
std::optional<double> fill_value(const ir::Node* node);
/// Classifies a mask value built in the graph; `why` says what stopped the walk.
Mask classify_mask(const ir::Value* v, std::string* why);
/// Does a tensor of type `m` broadcast to `scores` (rank at most 4, each dim equal or 1)?
bool broadcasts_to(const ir::TensorType& m, const ir::TensorType& scores);
/// The broadcast of two tensor types' sizes (each dim equal or 1), contiguous, of `dtype`.
ir::TensorType broadcast_type(const ir::TensorType& a, const ir::TensorType& b,
                              c10::ScalarType dtype);
/// Does CUDA flash attention take a query of type `q` ([b, h, s, d])? bf16 or f16, and a
/// constant head dim that is a multiple of 8 up to 256.
bool flash_takes(const ir::TensorType& q);

}  // namespace magi::passes::attention_match
