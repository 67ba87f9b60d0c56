// ValueKind names and TensorType helpers.
#include "magi/ir/types.h"

#include "magi/common/error.h"

namespace magi::ir {

const char* value_kind_name(ValueKind kind) {
  switch (kind) {
#define MAGI_KIND_NAME(name, text) \
  case ValueKind::k##name:         \
    return text;
    MAGI_VALUE_KINDS(MAGI_KIND_NAME)
#undef MAGI_KIND_NAME
  }
  return "?";
}

bool is_list_kind(ValueKind kind) {
  switch (kind) {
    case ValueKind::kIntList:
    case ValueKind::kFloatList:
    case ValueKind::kBoolList:
    case ValueKind::kTensorList:
    case ValueKind::kOptionalTensorList:
      return true;
    default:
      return false;
  }
}

std::vector<SymExpr> TensorType::contiguous_strides(const std::vector<SymExpr>& sizes) {
  std::vector<SymExpr> strides(sizes.size());
  SymExpr running(1);
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = running;
    running = running * sizes[i];
  }
  return strides;
}

int64_t TensorType::bytes(const SymbolBindings& hints) const {
  int64_t n = 1;
  for (const SymExpr& s : sizes) n *= s.try_evaluate(hints).value_or(1);
  return n * static_cast<int64_t>(c10::elementSize(dtype));
}

bool TensorType::is_contiguous() const {
  if (strides.empty()) return true;
  auto expected = contiguous_strides(sizes);
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Size-1 dims may carry any stride.
    if (sizes[i].is_constant() && sizes[i].constant_value() == 1) continue;
    if (strides[i] != expected[i]) return false;
  }
  return true;
}

std::string dtype_short_name(c10::ScalarType dtype) {
  using c10::ScalarType;
  switch (dtype) {
    case ScalarType::Float:
      return "f32";
    case ScalarType::Double:
      return "f64";
    case ScalarType::Half:
      return "f16";
    case ScalarType::BFloat16:
      return "bf16";
    case ScalarType::Long:
      return "i64";
    case ScalarType::Int:
      return "i32";
    case ScalarType::Short:
      return "i16";
    case ScalarType::Char:
      return "i8";
    case ScalarType::Byte:
      return "u8";
    case ScalarType::Bool:
      return "b8";
    case ScalarType::ComplexFloat:
      return "c64";
    case ScalarType::ComplexDouble:
      return "c128";
    case ScalarType::Float8_e4m3fn:
      return "f8e4m3";
    case ScalarType::Float8_e5m2:
      return "f8e5m2";
    default:
      return c10::toString(dtype);
  }
}

std::string TensorType::str() const {
  std::string s = dtype_short_name(dtype) + "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + sizes[i].str();
  s += "]";
  if (!is_contiguous()) {
    s += "{";
    for (size_t i = 0; i < strides.size(); ++i) s += (i ? ", " : "") + strides[i].str();
    s += "}";
  }
  if (device.type() != c10::DeviceType::CPU) s += "@" + device.str();
  return s;
}

}  // namespace magi::ir
