// What a Value holds: a ValueKind, and for tensors a TensorType whose sizes and strides are
// SymExprs over the graph's input symbols. An integer value may carry the SymExpr it equals.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <vector>

#include "magi/ir/sym_expr.h"

namespace magi::ir {

/// Value kinds, listed once. The second column is the printed name.
#define MAGI_VALUE_KINDS(_)          \
  _(Tensor, "Tensor")                \
  _(Int, "int")                      \
  _(Float, "float")                  \
  _(Bool, "bool")                    \
  _(Scalar, "Scalar")                \
  _(None, "None")                    \
  _(String, "str")                   \
  _(Dtype, "dtype")                  \
  _(Device, "Device")                \
  _(Layout, "Layout")                \
  _(MemoryFormat, "MemoryFormat")    \
  _(IntList, "int[]")                \
  _(FloatList, "float[]")            \
  _(BoolList, "bool[]")              \
  _(TensorList, "Tensor[]")          \
  _(OptionalTensorList, "Tensor?[]") \
  _(Other, "Any")

enum class ValueKind : uint8_t {
#define MAGI_DECLARE_KIND(name, text) k##name,
  MAGI_VALUE_KINDS(MAGI_DECLARE_KIND)
#undef MAGI_DECLARE_KIND
};

const char* value_kind_name(ValueKind kind);
bool is_list_kind(ValueKind kind);

/// dtype, device and symbolic layout of a tensor value.
struct TensorType {
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  std::vector<SymExpr> sizes;
  std::vector<SymExpr> strides;  ///< empty when unknown
  bool requires_grad = false;

  int64_t rank() const { return static_cast<int64_t>(sizes.size()); }
  /// Row-major strides for `sizes`.
  static std::vector<SymExpr> contiguous_strides(const std::vector<SymExpr>& sizes);
  bool is_contiguous() const;
  /// Bytes of a dense tensor of this type, symbolic sizes taken from `hints` (1 when a size
  /// has no hint): what the recompute planner and the peak simulation charge for it.
  int64_t bytes(const SymbolBindings& hints) const;
  /// e.g. "f32[s0, 4096]", "bf16[8, 4]{1, 8}" (strides shown when not contiguous),
  /// "f32[4]@cuda:0" (device shown when not the CPU).
  std::string str() const;
};

/// Short dtype names used by the printer: f32, bf16, i64, b8, ...
std::string dtype_short_name(c10::ScalarType dtype);

}  // namespace magi::ir
