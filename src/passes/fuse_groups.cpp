// fuse_groups: groups chains of fusible ops (ir/op_info.h) into Fusion nodes, each running
// one generated kernel.
//
// Requires: a verified graph. Guarantees: a verified graph computing the same values, in
// which every group has one index space (all its per-element values share the group's full
// shape; reductions over the last dim give per-row values of the row shape), creates no cycle,
// and contains at least two operators (a single op is already one ATen kernel), except a lone
// softmax, log-softmax, layer norm or sum over leading dims (is_compound) and a lone copy of a
// non-contiguous operand (is_strided_copy): ops our kernels run faster than ATen's.
//
// Grouping is greedy in execution order: a fusible node joins the most recent group one of
// its inputs comes from when its shape fits that group and none of its other inputs depends
// on the group (which would make a cycle); otherwise it starts a group. The Fusion node is
// placed where the group's last member was; nodes between the members that read group values
// move after it. A group spans an operator that writes its arguments (a copy_, an index_copy_
// into a KV cache) only when no node in its span, member or not, reads the memory that
// operator writes: such a write orders the reads of that memory around it. Pieces (from
// split_at_boundaries) are fused recursively.
//
// Column groups reduce over leading dims instead (sum(x * y, 0), a weight gradient): one pass
// over the index space evaluates the full-size ops and accumulates the column reductions, then
// per-column ops run. So a full-size op never reads a per-column value, and a column group
// holds no row reduction (can_join_column).
//
// Groups also merge: two groups of one index space, at most one of them reducing, whose
// values meet at a node become one (can_merge says when that is safe).
//
// Views (view, reshape, squeeze, unsqueeze, permute, transpose) of a pointwise group's value
// join it when every value the group has computed so far is read only inside it: the index
// space becomes the view's shape, and the values before the view are computed at the element
// the view maps there, their operands read through strides that the runtime derives by
// applying the same views to them (FusedKernel). So no value before a view leaves the group,
// and no later op reads one except through the view.
//
// Before grouping, fold_broadcasts (its own file) removes expands and detaches that would cut
// a kernel in two, such as the expand in the middle of a norm's gradient.
//
// After grouping, two steps cut what the kernels move:
// - A value computed cheaply (casts, elementwise ops) from narrower values and read only by
//   other groups is recomputed in each of them from those values, which its group writes
//   instead (sink_cheap_outputs): a float32 copy of a bfloat16 residual, or the 2 * x of a
//   norm's gradient, is no longer written and read back.
// - Two pointwise groups of one index space that read the same full-size value merge
//   (merge_siblings): SiLU-mul's recomputation and its gradient read the gate, the up
//   projection and the incoming gradient once.
//
// One exception to "one index space": a lone cast of an operand smaller than the space (a
// norm's weight, `w.float()`) whose readers are all in one group joins that group
// (adopt_lone_casts), where it is loaded and cast per column like any broadcast operand.
//
// The Fuser's state is in fuse_groups_impl.h. This file holds the grouping and merging and the
// last adjustments of groups (adopt_lone_casts, drop_trailing_views); fuse_groups_traffic.cpp
// holds the two steps after grouping that cut what the kernels move (sink_cheap_outputs,
// merge_siblings), and fuse_groups_rewrite.cpp turns groups into Fusion nodes.
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fuse_groups_impl.h"
#include "magi/common/log.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace detail {

bool Fuser::run() {
  bool changed = fold_broadcasts(graph_);
  std::vector<Node*> nodes = graph_.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) position_[nodes[i]] = i;
  find_barriers(nodes);
  for (Node* node : nodes) consider(node);
  adopt_lone_casts();
  for (Group& g : groups_) drop_trailing_views(g);
  sink_cheap_outputs();
  merge_siblings();
  for (Group& g : groups_) {
    if (!narrow_values_closed(g)) {
      MAGI_LOG_DEBUG("not fusing ", g.members.size(),
                     " ops: a slice or an op on one is read outside the group");
      continue;
    }
    if (g.members.size() >= 2 ||
        (g.members.size() == 1 && (is_compound(*g.members[0]) || is_strided_copy(*g.members[0])))) {
      rewrite(g);
      changed = true;
    }
  }
  return changed;
}

bool Fuser::is_reducing(const Node& n) {
  ir::OpClass c = ir::op_info(n).op_class;
  return c == ir::OpClass::kReduction || c == ir::OpClass::kSoftmax || c == ir::OpClass::kLayerNorm;
}

bool Fuser::is_column_reduction(const Node& n) {
  return ir::op_info(n).op_class == ir::OpClass::kColumnReduction;
}

bool Fuser::is_compound(const Node& n) {
  ir::OpClass c = ir::op_info(n).op_class;
  return c == ir::OpClass::kSoftmax || c == ir::OpClass::kLayerNorm ||
         c == ir::OpClass::kColumnReduction;
}

bool Fuser::is_strided_copy(const Node& n) {
  const std::string& op = n.op_name();
  if (op != "aten::clone" && op != "aten::_to_copy") return false;
  const auto& type = n.input(0)->tensor_type();
  const auto& out = n.output()->tensor_type();
  return type && !type->strides.empty() && !type->is_contiguous() && out && out->is_contiguous();
}

bool Fuser::operands_ok(const Node& n) {
  if (is_view(n)) return n.input(0)->kind() == ir::ValueKind::kTensor;  // op_info checked the rest
  for (const Value* in : operands(n)) {
    if (in->kind() == ir::ValueKind::kTensor) {
      if (in->producer()->kind() == ir::NodeKind::kConstant) {
        const c10::IValue& c = in->producer()->constant();
        if (!c.isTensor() || c.toTensor().numel() != 1) return false;
        continue;
      }
      if (!in->tensor_type()) return false;
      continue;
    }
    if (in->producer()->kind() != ir::NodeKind::kConstant) return false;
  }
  return true;
}

std::vector<const Value*> Fuser::operands(const Node& n) {
  if (is_cat(n)) {
    const auto& pieces = ir::cat_pieces(n);
    return {pieces.begin(), pieces.end()};
  }
  return {n.inputs().begin(), n.inputs().end()};
}

bool Fuser::reads_narrow_value(const Group& g, const Node& node) const {
  for (const Value* in : operands(node)) {
    if (g.narrow_nodes.count(in->producer())) return true;
  }
  return false;
}

bool Fuser::can_join_narrow(const Group& g, const Node& node) {
  if (g.reduces() || is_reducing(node) || is_column_reduction(node)) return false;
  const auto& out = node.output()->tensor_type()->sizes;
  if (is_cat(node)) {
    if (!same_shape(out, g.full) || node.input(0)->users().size() != 1) return false;
    for (const Value* piece : ir::cat_pieces(node)) {
      if (!g.member_set.count(piece->producer())) return false;
    }
    return true;
  }
  if (is_pad(node)) {
    return same_shape(out, g.full) && g.narrow_nodes.count(node.input(0)->producer());
  }
  if (is_slice(node)) {
    const Value* src = node.input(0);
    if (!same_shape(src->tensor_type()->sizes, g.full)) return false;
    return g.member_set.count(src->producer()) || !depends_on(src->producer(), g);
  }
  for (const Value* in : node.inputs()) {
    const Node* p = in->producer();
    if (p->kind() == ir::NodeKind::kConstant) continue;
    if (in->kind() != ir::ValueKind::kTensor || !in->tensor_type()) return false;
    if (in->tensor_type()->sizes.empty()) {
      if (!g.member_set.count(p) && depends_on(p, g)) return false;
      continue;
    }
    if (!g.narrow_nodes.count(p) || !same_shape(in->tensor_type()->sizes, out)) return false;
  }
  return true;
}

bool Fuser::narrow_values_closed(const Group& g) {
  for (const Node* n : g.narrow_nodes) {
    for (const Value* out : n->outputs()) {
      for (const Node* u : out->users()) {
        if (!g.member_set.count(u)) return false;
      }
    }
  }
  return true;
}

std::vector<SymExpr> Fuser::space_of(const Node& n) {
  if (is_reducing(n) || is_column_reduction(n) || is_slice(n)) {
    return n.input(0)->tensor_type()->sizes;
  }
  return n.output()->tensor_type()->sizes;
}

bool Fuser::fits(const Group& g, const std::vector<SymExpr>& shape) {
  if (same_shape(shape, g.full)) return true;
  if (!g.has_reduction || g.full.empty()) return false;
  std::vector<SymExpr> row(g.full.begin(), g.full.end() - 1);
  if (same_shape(shape, row)) return true;
  row.push_back(SymExpr(1));
  return same_shape(shape, row);
}

bool Fuser::depends_on(const Node* node, const Group& g) {
  std::unordered_set<const Node*> seen;
  std::function<bool(const Node*)> visit = [&](const Node* n) -> bool {
    if (g.member_set.count(n)) return true;
    // Fusion nodes of groups rewritten before this one have no position: walk them.
    auto at = position_.find(n);
    if ((at != position_.end() && at->second < g.first_position) || !seen.insert(n).second) {
      return false;
    }
    for (const Value* in : n->inputs()) {
      if (visit(in->producer())) return true;
    }
    return false;
  };
  return visit(node);
}

bool Fuser::is_column_shape(const Group& g, const std::vector<SymExpr>& shape, bool operand) {
  const size_t rank = g.full.size(), kept = rank - static_cast<size_t>(g.column_dims);
  if (shape.size() > rank || (!operand && shape.size() < kept)) return false;
  const size_t offset = rank - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) {
    const SymExpr& s = shape[d];
    const bool one = s.is_constant() && s.constant_value() == 1;
    if (offset + d < static_cast<size_t>(g.column_dims)
            ? !one
            : !(s == g.full[offset + d] || (operand && one))) {
      return false;
    }
  }
  return true;
}

bool Fuser::reads_column_value(const Group& g, const Node& node) const {
  return std::any_of(node.inputs().begin(), node.inputs().end(),
                     [&](const Value* in) { return g.column_nodes.count(in->producer()) > 0; });
}

bool Fuser::can_join_column(const Group& g, const Node& node) {
  if (is_reducing(node) || (is_column_reduction(node) && g.has_reduction)) return false;
  const bool reads_column = reads_column_value(g, node);
  if (is_column_reduction(node)) {
    if (reads_column || !same_shape(space_of(node), g.full)) return false;
    if (g.has_column && ir::column_reduced_dims(node) != g.column_dims) return false;
  } else if (reads_column) {
    for (const Value* out : node.outputs()) {
      if (!is_column_shape(g, out->tensor_type()->sizes, false)) return false;
    }
  } else if (!same_shape(space_of(node), g.full)) {
    return false;
  }
  for (const Value* in : node.inputs()) {
    const Node* p = in->producer();
    if (g.member_set.count(p) || p->kind() == ir::NodeKind::kConstant) continue;
    if (in->kind() == ir::ValueKind::kTensor && in->tensor_type()) {
      const auto& sizes = in->tensor_type()->sizes;
      if (reads_column ? !is_column_shape(g, sizes, true) : sizes.size() > g.full.size()) {
        return false;
      }
    }
    if (depends_on(p, g)) return false;
  }
  return true;
}

bool Fuser::reads_inner_value(const Group& g, const Node& node) const {
  return std::any_of(node.inputs().begin(), node.inputs().end(),
                     [&](const Value* in) { return g.region_of.count(in->producer()) > 0; });
}

bool Fuser::can_join_view(const Group& g, const Node& view) const {
  if (g.reduces() || !g.narrow_nodes.empty()) return false;
  const Node* src = view.input(0)->producer();
  if (!g.member_set.count(src) || g.region_of.count(src)) return false;
  for (const Node* m : g.members) {
    if (g.region_of.count(m)) continue;  // read only by members already
    for (const Value* out : m->outputs()) {
      for (const Node* u : out->users()) {
        if (u != &view && !g.member_set.count(u)) return false;
      }
    }
  }
  return true;
}

bool Fuser::can_join(const Group& g, const Node& node) {
  return can_join_shape(g, node) && within_arity({&g}, &node);
}

bool Fuser::within_arity(std::initializer_list<const Group*> groups, const Node* extra) const {
  return args_of(groups, extra).size() <= MAGI_MAX_KERNEL_ARGS;
}

std::unordered_set<const Value*> Fuser::args_of(std::initializer_list<const Group*> groups,
                                                const Node* extra) const {
  auto inside = [&](const Node* n) {
    if (n == extra) return true;
    for (const Group* g : groups) {
      if (g->member_set.count(n)) return true;
    }
    return false;
  };
  std::unordered_set<const Value*> args;
  auto visit = [&](const Node* m) {
    for (const Value* in : m->inputs()) {
      if (in->kind() == ir::ValueKind::kTensor && !inside(in->producer())) args.insert(in);
    }
    for (const Value* out : m->outputs()) {
      for (const Node* user : out->users()) {
        if (!inside(user)) {
          args.insert(out);
          break;
        }
      }
    }
  };
  for (const Group* g : groups) {
    for (const Node* m : g->members) visit(m);
  }
  if (extra != nullptr) visit(extra);
  return args;
}

namespace {

// The value `v` is a view of, through views and items of lists of views (split, unbind).
const Value* viewed_tensor(const Value* v) {
  for (;;) {
    const Node* p = v->producer();
    if (p->kind() == ir::NodeKind::kGetItem) {
      v = p->input(0);
    } else if (p->is_operator() && !p->inputs().empty() &&
               ir::output_aliases_input(*p, v->index())) {
      v = p->input(0);
    } else {
      return v;
    }
  }
}

}  // namespace

Fuser::Barrier Fuser::barrier_at(const Node& node, size_t position) const {
  Barrier b;
  b.position = position;
  std::vector<const Value*> work;
  const auto& args = node.schema().arguments();
  for (size_t j = 0; j < args.size() && j < node.inputs().size(); ++j) {
    const auto* alias = args[j].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    const Value* v = viewed_tensor(node.input(j));
    if (v->kind() == ir::ValueKind::kTensor) {
      work.push_back(v);
    } else if (v->producer()->kind() == ir::NodeKind::kMakeList) {
      // A list the call writes the tensors of (Tensor(a!)[]): each item is written.
      for (const Value* item : v->producer()->inputs()) work.push_back(viewed_tensor(item));
    } else {
      b.total = true;  // written memory we cannot follow: no group spans the call
    }
  }
  // Down from each written tensor to all its views and the lists holding them; every other
  // node reading one is a reader.
  std::unordered_set<const Value*> seen;
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    if (!seen.insert(v).second) continue;
    for (const Node* user : v->users()) {
      if (user == &node) continue;
      auto at = position_.find(user);
      if (at != position_.end()) b.readers.push_back(at->second);
      const bool carries =
          user->kind() == ir::NodeKind::kGetItem || user->kind() == ir::NodeKind::kMakeList;
      if (!carries && (!user->is_operator() || user->inputs().empty() || user->input(0) != v)) {
        continue;
      }
      for (size_t k = 0; k < user->outputs().size(); ++k) {
        if (carries || ir::output_aliases_input(*user, k)) work.push_back(user->output(k));
      }
    }
  }
  std::sort(b.readers.begin(), b.readers.end());
  return b;
}

bool Fuser::may_span(const Barrier& b, size_t lo, size_t hi) {
  if (b.position <= lo || b.position >= hi) return true;  // not inside: nothing crosses it
  if (b.total) return false;
  auto first = std::lower_bound(b.readers.begin(), b.readers.end(), lo);
  return first == b.readers.end() || *first > hi;
}

void Fuser::find_barriers(const std::vector<Node*>& nodes) {
  barriers_.clear();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i]->is_operator() && nodes[i]->schema().is_mutable())
      barriers_.push_back(barrier_at(*nodes[i], i));
  }
}

bool Fuser::can_join_shape(const Group& g, const Node& node) {
  for (const Barrier& b : barriers_) {
    if (!may_span(b, g.first_position, position_[&node])) return false;
  }
  if (is_view(node)) return can_join_view(g, node);
  if (reads_inner_value(g, node)) return false;
  if (is_slice(node) || widens(node) || reads_narrow_value(g, node)) {
    return can_join_narrow(g, node);
  }
  if (!g.narrow_nodes.empty() && (is_reducing(node) || is_column_reduction(node))) return false;
  if (g.has_column || is_column_reduction(node)) return can_join_column(g, node);
  bool reducing = is_reducing(node);
  if (reducing) {
    if (!same_shape(space_of(node), g.full)) return false;
  } else {
    for (const Value* out : node.outputs()) {
      if (!out->users().empty() && !fits(g, out->tensor_type()->sizes)) return false;
    }
    // A per-row value must not be widened by a full-size operand in a pointwise-only group.
    if (!g.has_reduction && !same_shape(space_of(node), g.full)) return false;
  }
  if (reducing && g.has_reduction) {
    // A second reduction must not read per-row values only (its row would be 1 long).
    if (!same_shape(node.input(0)->tensor_type()->sizes, g.full)) return false;
  }
  // Per-row values without the reduced dim ([..., rows] of an index space [..., rows, cols])
  // are addressed by row, but an operand from outside would be read by element of the index
  // space: only 0-dim operands may join them.
  const bool per_row_without_dim =
      !reducing && node.output()->tensor_type()->rank() < static_cast<int64_t>(g.full.size());
  for (const Value* in : node.inputs()) {
    const Node* p = in->producer();
    if (g.member_set.count(p) || p->kind() == ir::NodeKind::kConstant) continue;
    if (in->kind() == ir::ValueKind::kTensor && in->tensor_type() &&
        in->tensor_type()->rank() >
            (per_row_without_dim ? 0 : static_cast<int64_t>(g.full.size()))) {
      return false;  // an operand larger than the index space, or not addressable by row
    }
    if (depends_on(p, g)) return false;
  }
  return true;
}

void Fuser::consider(Node* node) {
  if (node->kind() != ir::NodeKind::kAtenOp) return;
  std::string reason;
  if (ir::op_info(*node, &reason).op_class == ir::OpClass::kOther || !operands_ok(*node)) {
    return;
  }
  // Candidate groups: those of the producers, most recent first.
  std::vector<size_t> candidates;
  for (const Value* in : operands(*node)) {
    auto it = group_of_.find(in->producer());
    if (it != group_of_.end()) candidates.push_back(it->second);
  }
  std::sort(candidates.rbegin(), candidates.rend());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  auto merge_others = [&](size_t gi, bool per_row) {
    for (size_t other : candidates) {
      if (other == gi || groups_[other].members.empty()) continue;
      if (can_merge(gi, other)) {
        merge(gi, other);
      } else if (per_row && can_merge_per_row(other, gi)) {
        merge(other, gi);  // the row group takes gi's per-row values
        gi = other;
      }
    }
  };
  for (size_t gi : candidates) {
    Group& g = groups_[gi];
    if (can_join(g, *node)) {
      add(gi, node);
      merge_others(gi, true);
      return;
    }
  }
  // A cat (or an op on narrow values) reads several groups: the slices of x each start one.
  // They merge first, and then it can join.
  if (candidates.size() > 1 &&
      (is_cat(*node) || std::any_of(candidates.begin(), candidates.end(), [&](size_t gi) {
         return reads_narrow_value(groups_[gi], *node);
       }))) {
    merge_others(candidates.front(), false);
    if (can_join(groups_[candidates.front()], *node)) {
      add(candidates.front(), node);
      return;
    }
  }
  // A cat (or a pad) reads its pieces where a group computes them: it starts no group. Nor
  // does a view: ATen's costs nothing, and a kernel is needed only to compute through one.
  if (widens(*node) || is_view(*node)) return;
  Group g;
  g.full = space_of(*node);
  g.first_position = position_[node];
  groups_.push_back(std::move(g));
  add(groups_.size() - 1, node);
}

bool Fuser::can_merge(size_t gi, size_t oi) {
  return can_merge_shape(gi, oi) && within_arity({&groups_[gi], &groups_[oi]}, nullptr);
}

bool Fuser::can_merge_shape(size_t gi, size_t oi) {
  const Group& g = groups_[gi];
  const Group& o = groups_[oi];
  if ((g.reduces() && o.reduces()) || !same_shape(g.full, o.full)) return false;
  // A group with a view computes its earlier values at the elements the view maps to the
  // index space: a merged member reading one of them after the view (or a value of the other
  // group read on both sides) would get it at the wrong element.
  if (!g.region_of.empty() || !o.region_of.empty()) return false;
  if ((!g.narrow_nodes.empty() && o.reduces()) || (!o.narrow_nodes.empty() && g.reduces())) {
    return false;
  }
  return can_merge_barriers_and_paths(g, o);
}

bool Fuser::can_merge_barriers_and_paths(const Group& g, const Group& o) {
  const size_t lo = std::min(g.first_position, o.first_position);
  const size_t hi = std::max(position_[g.members.back()], position_[o.members.back()]);
  for (const Barrier& b : barriers_) {
    if (!may_span(b, lo, hi)) return false;
  }
  for (const Group* a : {&g, &o}) {
    const Group& other = a == &g ? o : g;
    for (const Node* m : a->members) {
      for (const Value* in : m->inputs()) {
        const Node* p = in->producer();
        if (g.member_set.count(p) || o.member_set.count(p) ||
            p->kind() == ir::NodeKind::kConstant) {
          continue;
        }
        if (depends_on(p, other)) return false;
      }
    }
    if (std::any_of(a->members.begin(), a->members.end(),
                    [&](const Node* m) { return reads_column_value(other, *m); })) {
      return false;  // a full-size op would read a per-column value
    }
  }
  return true;
}

bool Fuser::can_merge_per_row(size_t ri, size_t pi) {
  const Group& r = groups_[ri];
  const Group& p = groups_[pi];
  if (!r.has_reduction || r.has_column || !r.region_of.empty() || !r.narrow_nodes.empty() ||
      p.reduces() || !p.region_of.empty() || !p.narrow_nodes.empty() || r.full.empty() ||
      p.full.size() != r.full.size() || same_shape(p.full, r.full) || !fits(r, p.full)) {
    return false;  // (the row shape with its last dim kept: operands load per row)
  }
  for (const Node* m : p.members) {
    for (const Value* in : m->inputs()) {
      if (p.member_set.count(in->producer()) || r.member_set.count(in->producer()) ||
          in->producer()->kind() == ir::NodeKind::kConstant ||
          in->kind() != ir::ValueKind::kTensor || !in->tensor_type()) {
        continue;
      }
      // An operand from outside is loaded per row: of the row shape, or 0-dim.
      if (in->tensor_type()->rank() > 0 && !same_shape(in->tensor_type()->sizes, p.full)) {
        return false;
      }
    }
  }
  return can_merge_barriers_and_paths(r, p) && within_arity({&r, &p}, nullptr);
}

void Fuser::merge(size_t into, size_t from) {
  Group& g = groups_[into];
  Group& o = groups_[from];
  for (Node* m : o.members) {
    g.member_set.insert(m);
    group_of_[m] = into;
  }
  g.members.insert(g.members.end(), o.members.begin(), o.members.end());
  std::sort(g.members.begin(), g.members.end(),
            [this](const Node* a, const Node* b) { return position_[a] < position_[b]; });
  g.first_position = std::min(g.first_position, o.first_position);
  g.has_reduction |= o.has_reduction;
  if (o.has_column) {
    g.has_column = true;
    g.column_dims = o.column_dims;
  }
  g.column_nodes.insert(o.column_nodes.begin(), o.column_nodes.end());
  g.narrow_nodes.insert(o.narrow_nodes.begin(), o.narrow_nodes.end());
  g.region_of.insert(o.region_of.begin(), o.region_of.end());
  o.members.clear();
  o.member_set.clear();
  o.column_nodes.clear();
  o.narrow_nodes.clear();
  o.region_of.clear();
}

void Fuser::add(size_t gi, Node* node) {
  Group& g = groups_[gi];
  if (is_view(*node)) {
    for (const Node* m : g.members) g.region_of.emplace(m, node);
    g.full = node->output()->tensor_type()->sizes;
  }
  if (is_column_reduction(*node)) {
    g.has_column = true;
    g.column_dims = ir::column_reduced_dims(*node);
  }
  if (is_column_reduction(*node) || reads_column_value(g, *node)) g.column_nodes.insert(node);
  if (is_slice(*node) || (!widens(*node) && reads_narrow_value(g, *node))) {
    g.narrow_nodes.insert(node);
  }
  if (is_cat(*node)) {  // its list goes with it
    Node* list = node->input(0)->producer();
    g.members.push_back(list);
    g.member_set.insert(list);
    group_of_[list] = gi;
  }
  g.members.push_back(node);
  g.member_set.insert(node);
  g.has_reduction |= is_reducing(*node);
  group_of_[node] = gi;
}

void Fuser::drop_trailing_views(Group& g) {
  while (drop_trailing_view(g)) {
  }
}

bool Fuser::drop_trailing_view(Group& g) {
  if (g.region_of.empty() || g.members.empty()) return false;
  Node* last = nullptr;
  for (Node* m : g.members) {
    if (!g.region_of.count(m)) {
      if (last != nullptr || !is_view(*m)) return false;
      last = m;
    }
  }
  if (last == nullptr) return false;
  for (const Node* u : last->output()->users()) {
    if (g.member_set.count(u)) return false;
  }
  g.members.erase(std::find(g.members.begin(), g.members.end(), last));
  g.member_set.erase(last);
  group_of_.erase(last);
  for (auto it = g.region_of.begin(); it != g.region_of.end();) {
    it = it->second == last ? g.region_of.erase(it) : std::next(it);
  }
  g.full = last->input(0)->tensor_type()->sizes;
  return true;
}

void Fuser::adopt_lone_casts() {
  for (size_t si = 0; si < groups_.size(); ++si) {
    Group& lone = groups_[si];
    if (lone.members.size() != 1) continue;
    Node* cast = lone.members[0];
    if (ir::op_info(*cast).op_class != ir::OpClass::kCast || cast->outputs().size() != 1) {
      continue;
    }
    const std::vector<Node*>& users = cast->output()->users();
    if (users.empty()) continue;
    auto it = group_of_.find(users[0]);
    if (it == group_of_.end() || it->second == si) continue;
    const size_t gi = it->second;
    Group& g = groups_[gi];
    // Not into a group with a view: the cast's readers may lie on both sides of it.
    bool ok = g.region_of.empty() &&
              cast->output()->tensor_type()->rank() <= static_cast<int64_t>(g.full.size());
    for (const Node* u : users) ok &= group_of_.count(u) && group_of_.at(u) == gi;
    for (const Barrier& b : barriers_) {
      ok &= may_span(b, position_[cast], position_[g.members.back()]);
    }
    for (const Value* in : cast->inputs()) {
      if (in->kind() == ir::ValueKind::kTensor && in->producer()->kind() != ir::NodeKind::kConstant)
        ok &= !depends_on(in->producer(), g);
    }
    if (ok) merge(gi, si);
  }
}

}  // namespace detail

bool fuse_groups(ir::Graph& graph) {
  bool changed = false;
  std::unordered_set<ir::Graph*> pieces;  // identical pieces are shared: fuse each once
  for (ir::Node* node : graph.nodes()) {
    if (node->kind() == ir::NodeKind::kCallPiece && pieces.insert(node->piece()).second) {
      changed |= fuse_groups(*node->piece());
    }
  }
  changed |= detail::Fuser(graph).run();
  return changed;
}

}  // namespace magi::passes
