// The operator table behind op_info(). Entries are keyed by "aten::name.overload".
#include "magi/ir/op_info.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "magi/ir/node.h"

namespace magi::ir {
namespace {

const std::unordered_map<std::string, OpInfo>& table() {
  static const std::unordered_map<std::string, OpInfo> kTable = {
      {"aten::neg", {OpClass::kUnary, "neg"}},
      {"aten::exp", {OpClass::kUnary, "exp"}},
      {"aten::log", {OpClass::kUnary, "log"}},
      {"aten::sqrt", {OpClass::kUnary, "sqrt"}},
      {"aten::rsqrt", {OpClass::kUnary, "rsqrt"}},
      {"aten::reciprocal", {OpClass::kUnary, "reciprocal"}},
      {"aten::abs", {OpClass::kUnary, "abs"}},
      {"aten::sin", {OpClass::kUnary, "sin"}},
      {"aten::cos", {OpClass::kUnary, "cos"}},
      {"aten::tanh", {OpClass::kUnary, "tanh"}},
      {"aten::sigmoid", {OpClass::kUnary, "sigmoid"}},
      {"aten::relu", {OpClass::kUnary, "relu"}},
      {"aten::silu", {OpClass::kUnary, "silu"}},
      {"aten::erf", {OpClass::kUnary, "erf"}},
      {"aten::log1p", {OpClass::kUnary, "log1p"}},
      {"aten::expm1", {OpClass::kUnary, "expm1"}},
      {"aten::gelu", {OpClass::kUnary, "gelu"}},
      {"aten::silu_backward", {OpClass::kBinary, "silu_backward"}},
      {"aten::sigmoid_backward", {OpClass::kBinary, "sigmoid_backward"}},
      {"aten::tanh_backward", {OpClass::kBinary, "tanh_backward"}},
      {"aten::gelu_backward", {OpClass::kBinary, "gelu_backward"}},
      {"aten::pow.Tensor_Scalar", {OpClass::kBinary, "pow"}},
      {"aten::add.Tensor", {OpClass::kBinary, "add"}},
      {"aten::sub.Tensor", {OpClass::kBinary, "sub"}},
      {"aten::add.Scalar", {OpClass::kBinary, "add"}},
      {"aten::sub.Scalar", {OpClass::kBinary, "sub"}},
      {"aten::mul.Scalar", {OpClass::kBinary, "mul"}},
      {"aten::div.Scalar", {OpClass::kBinary, "div"}},
      {"aten::rsub.Scalar", {OpClass::kBinary, "rsub"}},
      {"aten::rsub.Tensor", {OpClass::kBinary, "rsub"}},
      {"aten::mul.Tensor", {OpClass::kBinary, "mul"}},
      {"aten::div.Tensor", {OpClass::kBinary, "div"}},
      {"aten::maximum", {OpClass::kBinary, "max"}},
      {"aten::minimum", {OpClass::kBinary, "min"}},
      {"aten::where.self", {OpClass::kWhere, ""}},
      {"aten::masked_fill.Scalar", {OpClass::kWhere, "masked_fill"}},
      {"aten::masked_fill.Tensor", {OpClass::kWhere, "masked_fill"}},
      {"aten::_to_copy", {OpClass::kCast, ""}},
      {"aten::clone", {OpClass::kCast, ""}},
      {"aten::sum.dim_IntList", {OpClass::kReduction, "sum"}},
      {"aten::mean.dim", {OpClass::kReduction, "mean"}},
      {"aten::amax", {OpClass::kReduction, "max"}},
      {"aten::amin", {OpClass::kReduction, "min"}},
      {"aten::var.correction", {OpClass::kReduction, "var"}},
      {"aten::var_mean.correction", {OpClass::kReduction, "var_mean"}},
      {"aten::_softmax", {OpClass::kSoftmax, "softmax"}},
      {"aten::_log_softmax", {OpClass::kSoftmax, "log_softmax"}},
      {"aten::native_layer_norm", {OpClass::kLayerNorm, "layer_norm"}},
      {"aten::slice.Tensor", {OpClass::kSlice, "slice"}},
      {"aten::cat", {OpClass::kCat, "cat"}},
      {"aten::constant_pad_nd", {OpClass::kPad, "pad"}},
      {"aten::view", {OpClass::kView, "view"}},
      {"aten::_unsafe_view", {OpClass::kView, "view"}},
      {"aten::reshape", {OpClass::kView, "view"}},
      {"aten::unsqueeze", {OpClass::kView, "view"}},
      {"aten::squeeze", {OpClass::kView, "view"}},
      {"aten::squeeze.dim", {OpClass::kView, "view"}},
      {"aten::squeeze.dims", {OpClass::kView, "view"}},
      {"aten::permute", {OpClass::kView, "permute"}},
      {"aten::transpose.int", {OpClass::kView, "permute"}},
      {"aten::t", {OpClass::kView, "permute"}},
  };
  return kTable;
}

OpInfo reject(std::string* reason, std::string why) {
  if (reason) *reason = std::move(why);
  return {};
}

// Is the reduction argument exactly the last dim of `input`?
bool reduces_last_dim(const Node& node, size_t dim_arg) {
  const c10::IValue* dims = constant_input(node, dim_arg);
  const auto& type = node.input(0)->tensor_type();
  if (!dims || !type || !dims->isIntList()) return false;
  auto list = dims->toIntList();
  if (list.size() != 1) return false;
  int64_t d = list.get(0);
  return d == -1 || d == type->rank() - 1;
}

// The number k of leading dims a reduction reduces when they are exactly dims 0..k-1 of its
// input, 1 <= k < rank; else 0.
int64_t leading_prefix(const Node& node, size_t dim_arg) {
  const c10::IValue* dims = constant_input(node, dim_arg);
  const auto& type = node.input(0)->tensor_type();
  if (!dims || !type || !dims->isIntList() || type->rank() < 2) return 0;
  const int64_t rank = type->rank();
  const auto list = dims->toIntList();
  const int64_t k = static_cast<int64_t>(list.size());
  if (k < 1 || k >= rank) return 0;
  std::vector<bool> seen(rank, false);
  for (int64_t d : list) {
    if (d < 0) d += rank;
    if (d < 0 || d >= k || seen[d]) return 0;
    seen[d] = true;
  }
  return k;
}

}  // namespace

const c10::IValue* constant_input(const Node& node, size_t i) {
  const Node* p = node.input(i)->producer();
  return p->kind() == NodeKind::kConstant ? &p->constant() : nullptr;
}

std::pair<int64_t, int64_t> slice_bounds(const Node& node) {
  // slice(self, dim, start, end, step); op_info checked that they are constants
  const int64_t size = node.input(0)->tensor_type()->sizes.back().constant_value();
  auto bound = [&](size_t i, int64_t fallback) {
    const c10::IValue* v = constant_input(node, i);
    int64_t b = v->isNone() ? fallback : v->toInt();
    if (b < 0) b += size;
    return std::clamp<int64_t>(b, 0, size);
  };
  const int64_t start = bound(2, 0);
  return {start, std::max(start, bound(3, size))};
}

std::pair<int64_t, int64_t> pad_bounds(const Node& node) {
  // constant_pad_nd(self, pad, value); op_info checked that pad is [left, right, 0...]
  const int64_t left = constant_input(node, 1)->toIntList().get(0);
  return {left, left + node.input(0)->tensor_type()->sizes.back().constant_value()};
}

const std::vector<Value*>& cat_pieces(const Node& node) {
  return node.input(0)->producer()->inputs();
}

std::vector<int64_t> view_permutation(const Node& node) {
  // op_info checked that the dims are constants.
  const int64_t rank = node.input(0)->tensor_type()->rank();
  auto wrap = [rank](int64_t d) { return d < 0 ? d + rank : d; };
  std::vector<int64_t> perm(rank);
  for (int64_t d = 0; d < rank; ++d) perm[d] = d;
  const std::string& op = node.op_name();
  if (op == "aten::permute") {
    const auto dims = constant_input(node, 1)->toIntList();
    for (int64_t d = 0; d < rank; ++d) perm[d] = wrap(dims.get(d));
  } else if (op == "aten::transpose.int") {
    std::swap(perm[wrap(constant_input(node, 1)->toInt())],
              perm[wrap(constant_input(node, 2)->toInt())]);
  } else if (rank == 2) {  // aten::t
    std::swap(perm[0], perm[1]);
  }
  return perm;
}

std::vector<int64_t> view_constant_sizes(const Node& node) {
  std::vector<int64_t> sizes;
  for (const SymExpr& s : node.output()->tensor_type()->sizes) {
    sizes.push_back(s.is_constant() ? s.constant_value() : -1);
  }
  return sizes;
}

int64_t column_reduced_dims(const Node& node) {
  return op_info(node).op_class == OpClass::kColumnReduction ? leading_prefix(node, 1) : 0;
}

bool is_pure_operator(const Node& node) {
  if (node.kind() != NodeKind::kAtenOp) return false;
  const c10::FunctionSchema& schema = node.schema();
  if (schema.returns().empty() || schema.is_mutable()) return false;
  if (is_random_operator(node)) return false;
  return node.op().operator_name().name.find("empty") == std::string::npos;  // uninitialised
}

bool is_random_operator(const Node& node) {
  if (node.kind() != NodeKind::kAtenOp && node.kind() != NodeKind::kCustomOp) return false;
  if (node.op().hasTag(at::Tag::nondeterministic_seeded)) return true;
  const std::string name = node.op().operator_name().name;
  for (const char* word : {"rand", "dropout", "bernoulli", "normal", "uniform", "poisson",
                           "multinomial", "exponential"}) {
    if (name.find(word) != std::string::npos) return true;
  }
  return false;
}

bool is_fusible_float_tensor(const Value& value) {
  if (value.kind() != ValueKind::kTensor || !value.tensor_type()) return false;
  switch (value.tensor_type()->dtype) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::BFloat16:
    case c10::ScalarType::Half:
      return value.tensor_type()->rank() >= 1;
    default:
      return false;
  }
}

OpInfo op_info(const Node& node, std::string* reason) {
  if (node.kind() != NodeKind::kAtenOp) return reject(reason, "not an ATen operator");
  auto it = table().find(node.op_name());
  if (it == table().end()) return reject(reason, node.op_name() + " has no generated form");
  OpInfo info = it->second;
  for (const Value* out : node.outputs()) {
    if (out->users().empty() && out->index() > 0) continue;  // unused extra outputs
    if (!is_fusible_float_tensor(*out)) {
      return reject(reason, "its result is not a floating-point tensor of known type");
    }
  }
  for (const Value* in : node.inputs()) {
    // Scalar constants are lowered as numbers; tensors are loaded, and kernels load only
    // floating-point and bool elements, from the device they run on (eager also takes a CPU
    // scalar tensor with CUDA tensors).
    if (in->kind() != ValueKind::kTensor || !in->tensor_type() ||
        in->producer()->kind() == NodeKind::kConstant) {
      continue;
    }
    if (in->tensor_type()->device != node.output()->tensor_type()->device) {
      return reject(reason, "an operand on another device");
    }
    c10::ScalarType t = in->tensor_type()->dtype;
    if (t != c10::ScalarType::Float && t != c10::ScalarType::Double &&
        t != c10::ScalarType::BFloat16 && t != c10::ScalarType::Half &&
        t != c10::ScalarType::Bool) {
      return reject(reason, std::string("an operand of dtype ") + c10::toString(t));
    }
  }
  switch (info.op_class) {
    case OpClass::kUnary:
      if (info.fn == "gelu") {
        const c10::IValue* approx = constant_input(node, 1);
        if (!approx || !approx->isString())
          return reject(reason, "gelu approximation not constant");
        const std::string& a = approx->toStringRef();
        if (a == "tanh") {
          info.fn = "gelu_tanh";
        } else if (a != "none") {
          return reject(reason, "gelu approximation '" + a + "'");
        }
      }
      break;
    case OpClass::kBinary:
      if (info.fn == "pow" && !constant_input(node, 1)) {
        return reject(reason, "pow with a non-constant exponent");
      }
      if (info.fn == "gelu_backward") {  // gelu_backward(grad_output, self, approximate)
        const c10::IValue* approx = constant_input(node, 2);
        if (!approx || !approx->isString()) {
          return reject(reason, "gelu_backward approximation not constant");
        }
        const std::string& a = approx->toStringRef();
        if (a == "tanh") {
          info.fn = "gelu_tanh_backward";
        } else if (a != "none") {
          return reject(reason, "gelu_backward approximation '" + a + "'");
        }
      }
      break;
    case OpClass::kCast: {
      // _to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format)
      // clone(self, memory_format)
      // AOTAutograd's backward spells the defaults out (layout=torch.strided, device=the
      // tensor's own), which is still a cast.
      if (node.op_name() == "aten::_to_copy") {
        const c10::IValue* layout = constant_input(node, 2);
        const c10::IValue* device = constant_input(node, 3);
        const c10::IValue* pin = constant_input(node, 4);
        const auto& in_type = node.input(0)->tensor_type();
        const bool strided =
            layout && (layout->isNone() ||
                       (layout->isInt() && layout->toInt() == static_cast<int64_t>(at::kStrided)));
        const bool same_device =
            device && (device->isNone() ||
                       (device->isDevice() && in_type && device->toDevice() == in_type->device));
        const bool unpinned = pin && (pin->isNone() || (pin->isBool() && !pin->toBool()));
        if (!strided || !same_device || !unpinned) {
          return reject(reason, "a copy that changes layout or device");
        }
      }
      break;
    }
    case OpClass::kReduction:
      if (!reduces_last_dim(node, 1)) {
        const int64_t k = leading_prefix(node, 1);
        if (k == 0) {
          return reject(reason, "reduces neither the last dim nor a run of leading dims");
        }
        if (info.fn == "var" || info.fn == "var_mean") {
          return reject(reason, "variance over the leading dims");
        }
        bool all_ones = true;  // a sum over size-1 dims only is a copy: ATen's view does it
        const auto& sizes = node.input(0)->tensor_type()->sizes;
        for (int64_t d = 0; d < k; ++d) {
          all_ones &= sizes[d].is_constant() && sizes[d].constant_value() == 1;
        }
        if (all_ones) return reject(reason, "reduces only dims of size 1");
        info.op_class = OpClass::kColumnReduction;
      }
      if (info.fn == "var" || info.fn == "var_mean") {
        // var(self, dim, *, correction, keepdim): lowered as two reductions over the row (the
        // mean, then the squared deviations), which needs a constant correction.
        const c10::IValue* correction = constant_input(node, 2);
        if (!correction ||
            !(correction->isNone() || correction->isInt() || correction->isDouble())) {
          return reject(reason, "variance with a non-constant correction");
        }
      } else if (node.op_name() != "aten::amax" && node.op_name() != "aten::amin") {
        const c10::IValue* dtype = constant_input(node, 3);
        if (!dtype || !dtype->isNone()) return reject(reason, "reduction with an explicit dtype");
      }
      break;
    case OpClass::kSoftmax: {
      const c10::IValue* dim = constant_input(node, 1);
      const c10::IValue* half_to_float = constant_input(node, 2);
      const auto& type = node.input(0)->tensor_type();
      if (!dim || !dim->isInt() || !type ||
          !(dim->toInt() == -1 || dim->toInt() == type->rank() - 1)) {
        return reject(reason, "softmax over a dim other than the last");
      }
      if (!half_to_float || half_to_float->toBool()) return reject(reason, "half_to_float softmax");
      break;
    }
    case OpClass::kSlice: {
      const auto& type = node.input(0)->tensor_type();
      const c10::IValue* dim = constant_input(node, 1);
      const c10::IValue* step = constant_input(node, 4);
      if (!type || type->rank() < 1 || !dim || !dim->isInt() ||
          !(dim->toInt() == -1 || dim->toInt() == type->rank() - 1)) {
        return reject(reason, "a slice of a dim other than the last");
      }
      if (!type->sizes.back().is_constant()) return reject(reason, "a slice of a symbolic size");
      for (size_t i : {2u, 3u}) {
        const c10::IValue* b = constant_input(node, i);
        if (!b || !(b->isNone() || b->isInt())) return reject(reason, "non-constant slice bounds");
      }
      if (!step || !step->isInt() || step->toInt() != 1) return reject(reason, "a strided slice");
      break;
    }
    case OpClass::kCat: {
      const Node* list = node.input(0)->producer();
      const c10::IValue* dim = node.inputs().size() > 1 ? constant_input(node, 1) : nullptr;
      const int64_t rank = node.output()->tensor_type()->rank();
      if (list->kind() != NodeKind::kMakeList || !dim || !dim->isInt() ||
          !(dim->toInt() == -1 || dim->toInt() == rank - 1)) {
        return reject(reason, "cat along a dim other than the last");
      }
      for (const Value* piece : list->inputs()) {
        if (!is_fusible_float_tensor(*piece) || piece->tensor_type()->rank() != rank ||
            !piece->tensor_type()->sizes.back().is_constant()) {
          return reject(reason, "cat of pieces of symbolic width or another rank");
        }
        if (piece->tensor_type()->device != node.output()->tensor_type()->device) {
          return reject(reason, "an operand on another device");
        }
      }
      break;
    }
    case OpClass::kPad: {
      // constant_pad_nd(self, pad, value): pad lists (left, right) pairs from the last dim
      // inwards; only the last dim's, without cropping, is generated.
      const auto& type = node.input(0)->tensor_type();
      const c10::IValue* pad = constant_input(node, 1);
      const c10::IValue* value = constant_input(node, 2);
      if (!pad || !pad->isIntList() || pad->toIntList().size() < 2) {
        return reject(reason, "a pad of non-constant widths");
      }
      const auto widths = pad->toIntList();
      for (size_t i = 0; i < widths.size(); ++i) {
        if (widths.get(i) < 0) return reject(reason, "a negative pad (a crop)");
        if (i >= 2 && widths.get(i) != 0)
          return reject(reason, "a pad of a dim other than the last");
      }
      if (!type || type->rank() < 1 || !type->sizes.back().is_constant()) {
        return reject(reason, "a pad of a symbolic size");
      }
      if (!value || !(value->isDouble() || value->isInt() || value->isBool())) {
        return reject(reason, "a pad with a non-constant value");
      }
      break;
    }
    case OpClass::kView: {
      // Views of a group's values are read through strides in the index space of the ops
      // after them; the sizes come from the value types, so only constancy is checked here.
      if (info.fn == "permute") {
        const bool constant_dims = node.op_name() == "aten::t" ||
                                   (node.op_name() == "aten::permute" && constant_input(node, 1) &&
                                    constant_input(node, 1)->isIntList()) ||
                                   (node.op_name() == "aten::transpose.int" &&
                                    constant_input(node, 1) && constant_input(node, 2));
        if (!constant_dims) return reject(reason, "a permutation of non-constant dims");
        break;
      }
      const std::string& op = node.op_name();
      if (op != "aten::view" && op != "aten::_unsafe_view" && op != "aten::reshape") {
        for (size_t i = 1; i < node.inputs().size(); ++i) {  // unsqueeze/squeeze dims
          if (!constant_input(node, i)) return reject(reason, "a view over non-constant dims");
        }
        break;
      }
      int symbolic = 0;
      for (const SymExpr& s : node.output()->tensor_type()->sizes) symbolic += !s.is_constant();
      if (symbolic > 1) return reject(reason, "a view to a shape of more than one symbolic size");
      break;
    }
    case OpClass::kLayerNorm: {
      const c10::IValue* shape = constant_input(node, 1);
      if (!shape || !shape->isIntList() || shape->toIntList().size() != 1) {
        return reject(reason, "layer_norm over more than the last dim");
      }
      break;
    }
    default:
      break;
  }
  return info;
}

bool output_aliases_input(const Node& node, size_t k) {
  const std::string& name = node.op().operator_name().name;
  if (name == "aten::_unsafe_view" || name == "aten::_reshape_alias") return k == 0;
  const auto& returns = node.schema().returns();
  if (k >= returns.size()) return false;
  const auto* alias = returns[k].alias_info();
  return alias != nullptr && !alias->isWrite();
}

}  // namespace magi::ir
