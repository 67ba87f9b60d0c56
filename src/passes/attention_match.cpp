// attention_match.h's matchers: node accessors and the classification of attention masks.
#include "attention_match.h"

#include <ATen/core/Tensor.h>

#include <limits>

#include "magi/ir/op_info.h"

namespace magi::passes::attention_match {

bool is_op(const ir::Node* node, const char* name) {
  return node != nullptr && node->is_operator() && node->op_name() == name;
}

bool is_reshape(const ir::Node* node) {
  return is_op(node, "aten::view") || is_op(node, "aten::_unsafe_view") ||
         is_op(node, "aten::reshape");
}

ir::Node* only_user(const ir::Value* v) {
  return v->users().size() == 1 ? v->users().front() : nullptr;
}

std::optional<int64_t> constant_int(const ir::Node& node, size_t i) {
  const c10::IValue* v = ir::constant_input(node, i);
  if (v == nullptr || !v->isInt()) return std::nullopt;
  return v->toInt();
}

std::optional<double> number_of(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    // Read in place: the pass may run under a fake-tensor mode that intercepts dispatched ops.
    if (!t.defined() || t.numel() != 1 || !t.device().is_cpu() || !t.has_storage()) {
      return std::nullopt;
    }
    switch (t.scalar_type()) {
      case c10::kDouble:
        return *t.const_data_ptr<double>();
      case c10::kFloat:
        return *t.const_data_ptr<float>();
      case c10::kLong:
        return static_cast<double>(*t.const_data_ptr<int64_t>());
      case c10::kInt:
        return static_cast<double>(*t.const_data_ptr<int32_t>());
      case c10::kBool:
        return *t.const_data_ptr<bool>() ? 1.0 : 0.0;
      default:
        return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<double> constant_number(const ir::Node& node, size_t i) {
  if (i >= node.inputs().size()) return std::nullopt;
  const c10::IValue* v = ir::constant_input(node, i);
  if (v == nullptr || v->isBool()) return std::nullopt;
  if (v->isTensor() && v->toTensor().defined() && v->toTensor().scalar_type() == c10::kBool) {
    return std::nullopt;
  }
  return number_of(*v);
}

std::string node_location(const ir::Node& node) {
  const auto& p = node.provenance();
  std::string s = p.fx_name.empty() ? node.op_name() : p.fx_name;
  if (!p.source.empty()) s += " (" + p.source + ")";
  return s;
}

const ir::TensorType* type_of(const ir::Value* v) {
  return v->tensor_type() ? &*v->tensor_type() : nullptr;
}

bool in_last_two(int64_t dim, int64_t rank) {
  const int64_t d = dim < 0 ? dim + rank : dim;
  return d == rank - 1 || d == rank - 2;
}

std::vector<ir::SymExpr> last_two(const ir::TensorType& t) {
  return {t.sizes[t.rank() - 2], t.sizes[t.rank() - 1]};
}

bool is_masking_value(double v) {
  return v == -std::numeric_limits<double>::infinity() || v <= -65504.0;
}

std::optional<double> fill_value(const ir::Node* node) {
  if (is_op(node, "aten::ones") || is_op(node, "aten::ones_like")) return 1.0;
  if (is_op(node, "aten::zeros") || is_op(node, "aten::zeros_like")) return 0.0;
  if (is_op(node, "aten::full") || is_op(node, "aten::full_like")) {
    return constant_number(*node, 1);
  }
  if (is_op(node, "aten::_to_copy") || is_op(node, "aten::clone") ||
      is_op(node, "aten::lift_fresh_copy")) {
    const auto& out = node->output()->tensor_type();
    if (out && c10::isFloatingType(out->dtype)) return fill_value(node->input(0)->producer());
  }
  return std::nullopt;
}

Mask classify_mask(const ir::Value* v, std::string* why) {
  const ir::Node* node = v->producer();
  const ir::TensorType* out = type_of(v);
  if (node == nullptr || out == nullptr || out->rank() < 2) {
    *why = "the mask is not a tensor of rank 2 or more";
    return Mask::kUnknown;
  }
  if (node->kind() == ir::NodeKind::kInput) {
    *why = "the mask is a graph input (its contents are unknown at compile time)";
    return Mask::kUnknown;
  }
  if (!node->is_operator()) {
    *why = "the mask comes from a " + std::string(ir::node_kind_name(node->kind())) + " node";
    return Mask::kUnknown;
  }
  const std::string name = node->op_name();
  const ir::Value* in = node->inputs().empty() ? nullptr : node->input(0);
  if (name == "aten::tril" || name == "aten::triu") {
    const auto fill = fill_value(in->producer());
    const auto diagonal = constant_int(*node, 1);
    if (!fill || !diagonal || *fill == 0.0) {
      *why = name + " of something other than a constant nonzero fill";
      return Mask::kUnknown;
    }
    if (name == "aten::tril" && *diagonal == 0 && !is_masking_value(*fill)) return Mask::kKeepLower;
    if (name == "aten::triu" && *diagonal == 1) {
      return is_masking_value(*fill) ? Mask::kNegInfUpper : Mask::kMaskUpper;
    }
    *why = name + " with diagonal " + std::to_string(*diagonal) + " is not a causal mask";
    return Mask::kUnknown;
  }
  const auto flip = [](Mask m) {
    return m == Mask::kKeepLower   ? Mask::kMaskUpper
           : m == Mask::kMaskUpper ? Mask::kKeepLower
                                   : Mask::kUnknown;
  };
  if (name == "aten::eq.Scalar" || name == "aten::ne.Scalar") {
    const auto other = constant_number(*node, 1);
    if (!other || *other != 0.0) {
      *why = name + " with something other than 0";
      return Mask::kUnknown;
    }
    const Mask m = classify_mask(in, why);
    return name == "aten::eq.Scalar" ? flip(m) : (m == Mask::kNegInfUpper ? Mask::kMaskUpper : m);
  }
  if (name == "aten::logical_not" ||
      (name == "aten::bitwise_not" && type_of(in) && type_of(in)->dtype == c10::kBool)) {
    return flip(classify_mask(in, why));
  }
  // Casts keep which entries are nonzero; -inf survives only a floating-point one.
  if (name == "aten::_to_copy" || name == "aten::clone" || name == "aten::alias" ||
      name == "aten::detach" || name == "aten::lift_fresh_copy") {
    const Mask m = classify_mask(in, why);
    if (m == Mask::kNegInfUpper && !c10::isFloatingType(out->dtype)) {
      return out->dtype == c10::kBool ? Mask::kMaskUpper : Mask::kUnknown;
    }
    return m;
  }
  // A base of zeros with the upper triangle filled with a masking value: an additive mask.
  if (name == "aten::masked_fill.Scalar" || name == "aten::masked_fill.Tensor") {
    const auto base = fill_value(in->producer());
    const auto value = constant_number(*node, 2);
    if (base && *base == 0.0 && value && is_masking_value(*value) &&
        classify_mask(node->input(1), why) == Mask::kMaskUpper) {
      return Mask::kNegInfUpper;
    }
    if (why->empty()) *why = "a masked_fill that is not zeros with a masked upper triangle";
    return Mask::kUnknown;
  }
  // Views that keep the last two dims as they are: leading dims added or broadcast. A slice
  // from 0 keeps the pattern on the entries it keeps (mask[:L, :L] of a larger tril).
  const ir::TensorType* in_type = in ? type_of(in) : nullptr;
  if (in_type == nullptr || in_type->rank() < 2) {
    *why = "the mask is built by " + name;
    return Mask::kUnknown;
  }
  if (name == "aten::slice.Tensor") {
    const auto start = constant_int(*node, 2), step = constant_int(*node, 4);
    if (start && step && *start == 0 && *step == 1) return classify_mask(in, why);
  } else if (name == "aten::unsqueeze") {
    const auto dim = constant_int(*node, 1);
    if (dim && !in_last_two(*dim, out->rank())) return classify_mask(in, why);
  } else if (name == "aten::expand" || is_reshape(node)) {
    if (last_two(*out) == last_two(*in_type)) return classify_mask(in, why);
  }
  *why = "the mask is built by " + name + ", which the pass does not follow";
  return Mask::kUnknown;
}

bool broadcasts_to(const ir::TensorType& m, const ir::TensorType& scores) {
  if (m.rank() > scores.rank()) return false;
  const size_t offset = scores.rank() - m.rank();
  for (size_t i = 0; i < m.rank(); ++i) {
    if (!(m.sizes[i] == scores.sizes[offset + i]) && !(m.sizes[i] == ir::SymExpr(1))) return false;
  }
  return true;
}

ir::TensorType broadcast_type(const ir::TensorType& a, const ir::TensorType& b,
                              c10::ScalarType dtype) {
  ir::TensorType t = a.rank() >= b.rank() ? a : b;
  const ir::TensorType& other = a.rank() >= b.rank() ? b : a;
  const size_t offset = t.rank() - other.rank();
  for (size_t i = 0; i < other.rank(); ++i) {
    if (t.sizes[offset + i] == ir::SymExpr(1)) t.sizes[offset + i] = other.sizes[i];
  }
  t.dtype = dtype;
  t.strides = ir::TensorType::contiguous_strides(t.sizes);
  return t;
}

bool flash_takes(const ir::TensorType& q) {
  if (q.rank() != 4 || (q.dtype != c10::kBFloat16 && q.dtype != c10::kHalf)) return false;
  const ir::SymExpr& d = q.sizes[3];
  return d.is_constant() && d.constant_value() % 8 == 0 && d.constant_value() <= 256;
}

}  // namespace magi::passes::attention_match
