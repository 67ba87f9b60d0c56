// fold_broadcasts: removes ops that would cut a generated kernel in two without computing
// anything. Run by fuse_groups on each graph before grouping.
//
// - An expand of a value with size-1 dims (a per-row value) that only elementwise ops read:
//   they broadcast it themselves (x.expand(s) / n * y is (x / n) * y). A reader that reads a
//   full-size operand beside it reads the narrow value instead; a unary op (or one whose other
//   operands are numbers or one-element constants) between them is computed at the narrow
//   shape when all its readers read a full-size operand beside it. The capture writes RMSNorm's
//   gradient as a row sum, scaled per row, expanded and divided by the row length: the expand,
//   an ATen call, kept the gradient from being one row kernel.
// - A detach that only ops read: the compiled graphs compute no gradients, and a detach between
//   a row kernel's value and an op on it (the saved rsqrt of a norm's gradient) looks like a
//   path leaving the group. A detach the graph returns stays (its output would alias).
//
// Requires: a verified graph. Guarantees: a verified graph computing the same values.
#include <algorithm>
#include <string>
#include <vector>

#include "magi/ir/node.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

using ir::Node;
using ir::SymExpr;
using ir::Value;

// Does expand node `e` only broadcast size-1 dims of an operand of its own rank?
bool is_broadcast_expand(const Node& e) {
  if (e.kind() != ir::NodeKind::kAtenOp || e.op_name() != "aten::expand") return false;
  const Value* src = e.input(0);
  if (src->kind() != ir::ValueKind::kTensor || !src->tensor_type() || !e.output()->tensor_type()) {
    return false;
  }
  const auto& from = src->tensor_type()->sizes;
  const auto& to = e.output()->tensor_type()->sizes;
  if (from.size() != to.size()) return false;
  for (size_t d = 0; d < from.size(); ++d) {
    if (from[d] != to[d] && !(from[d].is_constant() && from[d].constant_value() == 1)) {
      return false;
    }
  }
  return true;
}

// Does elementwise node `u` read, besides `v`, a tensor of `shape`? Then `u` broadcasts a
// narrower operand in place of `v` to the same result. Not the ATen gradient ops
// (silu_backward, ...), which are written for operands of one shape.
bool reads_other_of_shape(const Node& u, const Value* v, const std::vector<SymExpr>& shape) {
  if (u.kind() != ir::NodeKind::kAtenOp) return false;
  const ir::OpInfo info = ir::op_info(u);
  const std::string& fn = info.fn;
  const bool gradient = fn.size() > 9 && fn.compare(fn.size() - 9, 9, "_backward") == 0;
  if ((info.op_class != ir::OpClass::kBinary && info.op_class != ir::OpClass::kWhere) || gradient) {
    return false;
  }
  return std::any_of(u.inputs().begin(), u.inputs().end(), [&](const Value* in) {
    return in != v && in->kind() == ir::ValueKind::kTensor && in->tensor_type() &&
           in->tensor_type()->sizes == shape;
  });
}

// Is `u` an elementwise op on `v` alone (its other operands numbers or one-element constants)
// with a result of `shape`?
bool is_unary_on(const Node& u, const Value* v, const std::vector<SymExpr>& shape) {
  if (u.kind() != ir::NodeKind::kAtenOp || u.outputs().size() != 1 || !u.output()->tensor_type() ||
      u.output()->tensor_type()->sizes != shape) {
    return false;
  }
  const ir::OpClass c = ir::op_info(u).op_class;
  if (c != ir::OpClass::kUnary && c != ir::OpClass::kBinary && c != ir::OpClass::kCast) {
    return false;
  }
  return std::all_of(u.inputs().begin(), u.inputs().end(), [&](const Value* in) {
    if (in == v || in->kind() != ir::ValueKind::kTensor) return true;
    const Node* p = in->producer();
    return p->kind() == ir::NodeKind::kConstant && p->constant().isTensor() &&
           p->constant().toTensor().numel() == 1;
  });
}

bool fold_detach(ir::Graph& graph, Node* d) {
  const std::vector<Node*> users = d->output()->users();
  if (users.empty() || !std::all_of(users.begin(), users.end(), [](const Node* u) {
        return u->kind() == ir::NodeKind::kAtenOp;
      })) {
    return false;
  }
  for (Node* u : users) u->replace_input(d->output(), d->input(0));
  graph.erase(d);
  return true;
}

bool fold_expand(ir::Graph& graph, Node* e) {
  Value* src = e->input(0);
  const std::vector<SymExpr> full = e->output()->tensor_type()->sizes;
  bool changed = false;
  const std::vector<Node*> users = e->output()->users();
  for (Node* u : users) {
    if (reads_other_of_shape(*u, e->output(), full)) {
      u->replace_input(e->output(), src);
      changed = true;
      continue;
    }
    if (!is_unary_on(*u, e->output(), full)) continue;
    const auto& readers = u->output()->users();
    if (readers.empty() || !std::all_of(readers.begin(), readers.end(), [&](const Node* r) {
          return reads_other_of_shape(*r, u->output(), full);
        })) {
      continue;
    }
    u->replace_input(e->output(), src);
    ir::TensorType narrow = *u->output()->tensor_type();
    narrow.sizes = src->tensor_type()->sizes;
    narrow.strides = ir::TensorType::contiguous_strides(narrow.sizes);
    u->output()->set_tensor_type(narrow);
    changed = true;
  }
  if (e->output()->users().empty()) graph.erase(e);
  return changed;
}

}  // namespace

bool fold_broadcasts(ir::Graph& graph) {
  bool changed = false;
  for (Node* n : graph.nodes()) {
    if (n->kind() == ir::NodeKind::kAtenOp && n->op_name() == "aten::detach" &&
        n->input(0)->kind() == ir::ValueKind::kTensor) {
      changed |= fold_detach(graph, n);
    } else if (is_broadcast_expand(*n)) {
      changed |= fold_expand(graph, n);
    }
  }
  return changed;
}

}  // namespace magi::passes
