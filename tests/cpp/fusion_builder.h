// A graph builder shared by the fusion and printer tests: ATen ops added the way the FX
// importer adds them (typed, named outputs, constant arguments, a source line).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "magi/ir/graph.h"
#include "test_helpers.h"

namespace magi::test {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::SymExpr;
using ir::TensorType;
using ir::Value;
using ir::ValueKind;

constexpr auto kF32 = c10::ScalarType::Float;
constexpr auto kBF16 = c10::ScalarType::BFloat16;

// Adds ATen ops to a graph the way the FX importer does: typed, named outputs, constant
// arguments, and a source line for the kernel comments.
class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}

  Value* input(const std::string& name, std::vector<SymExpr> sizes, c10::ScalarType dtype = kF32) {
    return g_.add_tensor_input(name, tensor_type(std::move(sizes), dtype));
  }
  Value* op(const char* name, const char* overload, std::vector<Value*> inputs, TensorType type,
            const std::string& out_name, int line = 0) {
    Node* n = g_.add_op(test::op(name, overload), std::move(inputs));
    if (line > 0) n->provenance().source = "model.py:" + std::to_string(line) + " in forward";
    n->output()->set_tensor_type(std::move(type));
    return test::named(n, out_name);
  }

  // Argument constants.
  Value* number(double v) {  // a Python number read as a Tensor, as the importer wraps it
    at::Tensor t = at::scalar_tensor(v, at::kDouble);
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return g_.add_constant(t, ValueKind::kTensor);
  }
  Value* scalar(double v) { return g_.add_constant(v, ValueKind::kScalar); }
  Value* floating(double v) { return g_.add_constant(v, ValueKind::kFloat); }
  Value* one() { return g_.add_constant(1, ValueKind::kScalar); }
  Value* integer(int64_t v) { return g_.add_constant(v, ValueKind::kInt); }
  Value* dims(std::vector<int64_t> d) {
    return g_.add_constant(c10::List<int64_t>(d), ValueKind::kIntList);
  }
  Value* flag(bool b) { return g_.add_constant(b, ValueKind::kBool); }
  Value* none() { return g_.add_constant(c10::IValue(), ValueKind::kNone); }
  Value* dtype(c10::ScalarType t) {
    return g_.add_constant(static_cast<int64_t>(t), ValueKind::kDtype);
  }

  // Ops, typed like `like` unless given a type.
  Value* unary(const char* name, Value* x, const std::string& out, int line = 0) {
    return op(name, "", {x}, *x->tensor_type(), out, line);
  }
  Value* binary(const char* name, Value* a, Value* b, TensorType type, const std::string& out,
                int line = 0) {
    std::string n = name;
    std::vector<Value*> in = {a, b};
    if (n == "aten::add" || n == "aten::sub") in.push_back(one());
    return op(name, "Tensor", std::move(in), std::move(type), out, line);
  }
  Value* add(Value* a, Value* b, const std::string& out, int line = 0) {
    return binary("aten::add", a, b, *a->tensor_type(), out, line);
  }
  Value* mul(Value* a, Value* b, const std::string& out, int line = 0) {
    return binary("aten::mul", a, b, *a->tensor_type(), out, line);
  }
  Value* cast(Value* x, c10::ScalarType to, const std::string& out, int line = 0) {
    TensorType t = *x->tensor_type();
    t.dtype = to;
    return op("aten::_to_copy", "", {x, dtype(to), none(), none(), none(), flag(false), none()}, t,
              out, line);
  }
  // A reduction over the leading dims 0..k-1.
  Value* column_reduce(const char* name, const char* overload, Value* x, int64_t k, bool keepdim,
                       const std::string& out, int line = 0) {
    TensorType t = *x->tensor_type();
    std::vector<int64_t> d;
    for (int64_t i = 0; i < k; ++i) {
      d.push_back(i);
      t.sizes[i] = SymExpr(1);
    }
    if (!keepdim) t.sizes.erase(t.sizes.begin(), t.sizes.begin() + k);
    std::vector<Value*> in = {x, dims(d), flag(keepdim)};
    if (std::string(name) != "aten::amax") in.push_back(none());
    return op(name, overload, std::move(in), t, out, line);
  }
  // x[..., start:end] (end past the size, as Python's x[..., start:] captures)
  Value* slice(Value* x, int64_t start, int64_t end, const std::string& out) {
    TensorType t = *x->tensor_type();
    const int64_t size = t.sizes.back().constant_value();
    t.sizes.back() = SymExpr(std::min(end, size) - start);
    return op("aten::slice", "Tensor", {x, integer(-1), integer(start), integer(end), integer(1)},
              t, out);
  }
  Value* cat_last(std::vector<Value*> pieces, const std::string& out) {
    TensorType t = *pieces[0]->tensor_type();
    int64_t width = 0;
    for (Value* p : pieces) width += p->tensor_type()->sizes.back().constant_value();
    t.sizes.back() = SymExpr(width);
    Value* list = g_.add_list(ValueKind::kTensorList, std::move(pieces))->output();
    return op("aten::cat", "", {list, integer(-1)}, t, out);
  }
  // constant_pad_nd(x, [left, right, rest...], value): `rest` pads the dims before the last.
  Value* pad(Value* x, std::vector<int64_t> widths, double value, const std::string& out) {
    TensorType t = *x->tensor_type();
    for (size_t i = 0; i + 1 < widths.size(); i += 2) {
      SymExpr& size = t.sizes[t.sizes.size() - 1 - i / 2];
      size = SymExpr(size.constant_value() + widths[i] + widths[i + 1]);
    }
    t.strides.clear();
    return op("aten::constant_pad_nd", "", {x, dims(std::move(widths)), scalar(value)}, t, out);
  }
  // x.view(sizes), the size list built as the importer builds it: a list of the graph input
  // `s0` (an int) and constants when a size is symbolic, else a constant list.
  Value* view(Value* x, std::vector<SymExpr> sizes, const std::string& out) {
    TensorType t = *x->tensor_type();
    t.sizes = sizes;
    t.strides.clear();
    std::vector<Value*> items;
    bool symbolic = false;
    for (const SymExpr& e : sizes) {
      symbolic |= !e.is_constant();
      items.push_back(e.is_constant() ? integer(e.constant_value()) : sym_input());
    }
    Value* list =
        symbolic ? g_.add_list(ValueKind::kIntList, std::move(items))->output() : dims([&] {
          std::vector<int64_t> d;
          for (const SymExpr& e : sizes) d.push_back(e.constant_value());
          return d;
        }());
    return op("aten::view", "", {x, list}, t, out);
  }
  Value* permute(Value* x, std::vector<int64_t> perm, const std::string& out) {
    TensorType t = *x->tensor_type();
    TensorType p = t;
    for (size_t d = 0; d < perm.size(); ++d) p.sizes[d] = t.sizes[perm[d]];
    p.strides.clear();
    return op("aten::permute", "", {x, dims(perm)}, p, out);
  }
  Value* sym_input() {
    if (s0_ == nullptr) s0_ = g_.add_input("s0", ValueKind::kInt);
    return s0_;
  }
  Value* row_reduce(const char* name, const char* overload, Value* x, bool keepdim,
                    const std::string& out, int line = 0) {
    TensorType t = *x->tensor_type();
    t.sizes.pop_back();
    if (keepdim) t.sizes.push_back(SymExpr(1));
    std::vector<Value*> in = {x, dims({-1}), flag(keepdim)};
    if (std::string(name) != "aten::amax") in.push_back(none());
    return op(name, overload, std::move(in), t, out, line);
  }

 private:
  Graph& g_;
  Value* s0_ = nullptr;
};

inline std::vector<Node*> nodes_of_kind(const Graph& g, NodeKind kind) {
  std::vector<Node*> out;
  for (Node* n : g.nodes()) {
    if (n->kind() == kind) out.push_back(n);
  }
  return out;
}

// Grouped-query attention's repeat_kv as the capture records it, for x: [b, hkv, s, d] (hkv,
// s and d constant): view(clone(expand(unsqueeze(x, 2), [b, hkv, r, s, d])), [b, hkv * r, s, d]).
inline Value* repeat_heads(Builder& b, Value* x, int64_t r, const std::string& name) {
  const auto& t = *x->tensor_type();
  const SymExpr n = t.sizes[0];
  const int64_t hkv = t.sizes[1].constant_value(), s = t.sizes[2].constant_value(),
                d = t.sizes[3].constant_value();
  Value* u = b.op("aten::unsqueeze", "", {x, b.integer(2)}, tensor_type({n, hkv, 1, s, d}, t.dtype),
                  name + "_unsqueeze");
  Value* e = b.op("aten::expand", "", {u, b.dims({-1, hkv, r, s, d}), b.flag(false)},
                  tensor_type({n, hkv, r, s, d}, t.dtype), name + "_expand");
  Value* c = b.op("aten::clone", "", {e, b.none()}, tensor_type({n, hkv, r, s, d}, t.dtype),
                  name + "_clone");
  return b.view(c, {n, hkv * r, s, d}, name + "_rep");
}

// The capture's form of repeat_heads' gradient, for a bf16 grad: [b, hkv * r, s, d]:
// view(grad, [b, hkv, r, s, d]), its r selects along dim 2 widened to float32 and added in order
// (`swapped`: the second add's operands the other way round), rounded back to bf16.
inline Value* sum_head_groups(Builder& b, Value* grad, int64_t hkv, const std::string& name,
                              bool swapped = false) {
  const auto& t = *grad->tensor_type();
  const SymExpr n = t.sizes[0];
  const int64_t r = t.sizes[1].constant_value() / hkv, s = t.sizes[2].constant_value(),
                d = t.sizes[3].constant_value();
  Value* grouped = b.view(grad, {n, hkv, r, s, d}, name + "_grouped");
  Value* total = nullptr;
  for (int64_t i = 0; i < r; ++i) {
    Value* head = b.op("aten::select", "int", {grouped, b.integer(2), b.integer(i)},
                       tensor_type({n, hkv, s, d}, kBF16), name + "_select");
    Value* wide = b.cast(head, c10::ScalarType::Float, name + "_wide");
    total = total == nullptr      ? wide
            : (swapped && i == 1) ? b.add(wide, total, name + "_add")
                                  : b.add(total, wide, name + "_add");
  }
  return b.cast(total, c10::ScalarType::BFloat16, name + "_sum");
}

// "aten::add.Tensor aten::silu ..." of the operators of `g`, in order.
inline std::string op_list(const Graph& g) {
  std::string s;
  for (const Node* n : g.nodes()) {
    if (n->is_operator()) s += (s.empty() ? "" : " ") + n->op_name();
  }
  return s;
}

// How many calls of operator `name` ("aten::copy_", "aten::scatter.src") `g` makes.
inline size_t count_ops(const Graph& g, const std::string& name) {
  size_t n = 0;
  for (const Node* node : g.nodes()) n += node->is_operator() && node->op_name() == name;
  return n;
}

}  // namespace magi::test
