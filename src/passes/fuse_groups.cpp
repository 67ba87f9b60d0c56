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
// move after it. A group never spans an operator that writes its arguments (such a write
// orders the reads around it). Pieces (from split_at_boundaries) are fused recursively.
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
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "magi/common/log.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::SymExpr;
using ir::Value;

bool same_shape(const std::vector<SymExpr>& a, const std::vector<SymExpr>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

struct Group {
  std::vector<Node*> members;
  std::unordered_set<const Node*> member_set;
  std::vector<SymExpr> full;   // the index space
  bool has_reduction = false;  // a row reduction (over the last dim)
  bool has_column = false;     // column reductions, all over dims 0..column_dims-1
  int64_t column_dims = 0;
  // Members computing per-column values: column reductions and the ops reading them.
  std::unordered_set<const Node*> column_nodes;
  // Members computing values narrower than the index space: slices of its last dim and the
  // ops on them, until a cat of the last dim restores the full width. Read only by members.
  std::unordered_set<const Node*> narrow_nodes;
  // Members computed before a view that joined (in that view's input shape), each mapped to
  // the first view after it. Read only by members.
  std::unordered_map<const Node*, const Node*> region_of;
  size_t first_position = 0;
  bool reduces() const { return has_reduction || has_column; }
};

class Fuser {
 public:
  explicit Fuser(Graph& graph) : graph_(graph) {}

  bool run() {
    bool changed = fold_broadcasts(graph_);
    std::vector<Node*> nodes = graph_.nodes();
    for (size_t i = 0; i < nodes.size(); ++i) {
      position_[nodes[i]] = i;
      // Calls that write their arguments order reads around them: a group never spans one.
      if (nodes[i]->is_operator() && nodes[i]->schema().is_mutable()) barriers_.push_back(i);
    }
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
      if (g.members.size() >= 2 || (g.members.size() == 1 && (is_compound(*g.members[0]) ||
                                                              is_strided_copy(*g.members[0])))) {
        rewrite(g);
        changed = true;
      }
    }
    return changed;
  }

 private:
  static bool is_reducing(const Node& n) {
    ir::OpClass c = ir::op_info(n).op_class;
    return c == ir::OpClass::kReduction || c == ir::OpClass::kSoftmax ||
           c == ir::OpClass::kLayerNorm;
  }

  static bool is_column_reduction(const Node& n) {
    return ir::op_info(n).op_class == ir::OpClass::kColumnReduction;
  }

  static bool is_slice(const Node& n) { return ir::op_info(n).op_class == ir::OpClass::kSlice; }
  static bool is_cat(const Node& n) { return ir::op_info(n).op_class == ir::OpClass::kCat; }
  static bool is_pad(const Node& n) { return ir::op_info(n).op_class == ir::OpClass::kPad; }
  // Ops that give narrow values the full width back: a cat of the last dim, a pad of it.
  static bool widens(const Node& n) { return is_cat(n) || is_pad(n); }

  static bool is_view(const Node& n) { return ir::op_info(n).op_class == ir::OpClass::kView; }

  // Single ops that a generated kernel runs faster than ATen: softmax, log-softmax and layer
  // norm (our row kernel reads the row once where ATen's may not), and sums over leading dims
  // (a weight gradient: on the H100 ATen's reduction ran the training step's [4096, 2048]
  // float32 column sums at about half the copy bandwidth, the column kernel 17% faster, and at
  // 16384 x 8192 the column kernel reaches 93% of copy).
  static bool is_compound(const Node& n) {
    ir::OpClass c = ir::op_info(n).op_class;
    return c == ir::OpClass::kSoftmax || c == ir::OpClass::kLayerNorm ||
           c == ir::OpClass::kColumnReduction;
  }

  // A copy (clone, or a cast) of an operand that is not contiguous: grouped-query attention's
  // repeat_kv (the clone of an expand) or a cast of a transposed tensor. ATen's general copy
  // kernel ran such copies at about a third of the copy bandwidth on the H100; a generated
  // kernel reads the operand through its strides, a vector at a time along its last dim.
  // Only into a contiguous result: a copy that keeps the operand's layout (preserve_format of
  // a transposed tensor) is one dense pass in ATen, where the kernel would write contiguously
  // and then copy into the traced layout.
  static bool is_strided_copy(const Node& n) {
    const std::string& op = n.op_name();
    if (op != "aten::clone" && op != "aten::_to_copy") return false;
    const auto& type = n.input(0)->tensor_type();
    const auto& out = n.output()->tensor_type();
    return type && !type->strides.empty() && !type->is_contiguous() && out && out->is_contiguous();
  }

  // Every non-tensor operand must be a constant: runtime scalars stay out of kernels.
  static bool operands_ok(const Node& n) {
    if (is_view(n))
      return n.input(0)->kind() == ir::ValueKind::kTensor;  // op_info checked the rest
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

  // The values a node reads: a cat's pieces instead of its list.
  static std::vector<const Value*> operands(const Node& n) {
    if (is_cat(n)) {
      const auto& pieces = ir::cat_pieces(n);
      return {pieces.begin(), pieces.end()};
    }
    return {n.inputs().begin(), n.inputs().end()};
  }

  bool reads_narrow_value(const Group& g, const Node& node) const {
    for (const Value* in : operands(node)) {
      if (g.narrow_nodes.count(in->producer())) return true;
    }
    return false;
  }

  // Slices, cats and the ops between them (rotate_half: cat(-x[..., h:], x[..., :h])). A
  // slice reads a value of the full index space; an op on narrow values reads only narrow
  // values of its own shape (and 0-dim operands); a cat of the last dim reads members only and
  // gives the full shape back, and so does a pad of the last dim (its gradient: slice_backward
  // is decomposed into one). No reduction shares such a group.
  bool can_join_narrow(const Group& g, const Node& node) {
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

  // Does every narrow value of `g` stay inside it?
  static bool narrow_values_closed(const Group& g) {
    for (const Node* n : g.narrow_nodes) {
      for (const Value* out : n->outputs()) {
        for (const Node* u : out->users()) {
          if (!g.member_set.count(u)) return false;
        }
      }
    }
    return true;
  }

  // The index space a node iterates: its input's shape for reductions, else its output's.
  static std::vector<SymExpr> space_of(const Node& n) {
    if (is_reducing(n) || is_column_reduction(n) || is_slice(n)) {
      return n.input(0)->tensor_type()->sizes;
    }
    return n.output()->tensor_type()->sizes;
  }

  // Does a value of `shape` fit group `g` (full shape, or per-row shape after a reduction)?
  static bool fits(const Group& g, const std::vector<SymExpr>& shape) {
    if (same_shape(shape, g.full)) return true;
    if (!g.has_reduction || g.full.empty()) return false;
    std::vector<SymExpr> row(g.full.begin(), g.full.end() - 1);
    if (same_shape(shape, row)) return true;
    row.push_back(SymExpr(1));
    return same_shape(shape, row);
  }

  // Does `node` (outside g) depend on a member of g?
  bool depends_on(const Node* node, const Group& g) {
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

  // Shapes in a column group, right-aligned to its index space `full` with the dims
  // 0..k-1 reduced: a per-column value has every kept dim of `full` and 1 (or nothing) in the
  // reduced ones; an operand of per-column ops may also broadcast in the kept dims.
  static bool is_column_shape(const Group& g, const std::vector<SymExpr>& shape, bool operand) {
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

  bool reads_column_value(const Group& g, const Node& node) const {
    return std::any_of(node.inputs().begin(), node.inputs().end(),
                       [&](const Value* in) { return g.column_nodes.count(in->producer()) > 0; });
  }

  // Column groups: a pass over the index space evaluates the full-size ops and accumulates the
  // column reductions; per-column ops run after it. So a full-size op must not read a
  // per-column value, and an op reading one must produce one, from per-column or 0-dim
  // operands only.
  bool can_join_column(const Group& g, const Node& node) {
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

  bool reads_inner_value(const Group& g, const Node& node) const {
    return std::any_of(node.inputs().begin(), node.inputs().end(),
                       [&](const Value* in) { return g.region_of.count(in->producer()) > 0; });
  }

  // A view of a value the pointwise group `g` computed joins when every value `g` has
  // computed is read only by members and the view: they all move before the view.
  bool can_join_view(const Group& g, const Node& view) const {
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

  bool can_join(const Group& g, const Node& node) {
    return can_join_shape(g, node) && within_arity({&g}, &node);
  }

  // A generated kernel takes at most kMaxKernelArgs tensors (inputs and outputs together;
  // MagiArgs holds that many pointers). Counts the tensors the members of `groups` (and
  // `extra`) would read from outside them and the values they make that are read outside.
  bool within_arity(std::initializer_list<const Group*> groups, const Node* extra) const {
    return args_of(groups, extra).size() <= kMaxKernelArgs;
  }

  // The tensors a kernel of the members of `groups` (and `extra`) would take: the values they
  // read from outside them and the values they make that are read outside.
  std::unordered_set<const Value*> args_of(std::initializer_list<const Group*> groups,
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

  bool can_join_shape(const Group& g, const Node& node) {
    for (size_t b : barriers_) {
      if (b > g.first_position && b < position_[&node]) return false;
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

  void consider(Node* node) {
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

  // Two groups over one index space whose values meet at a node (exp(x) * sin(y), or
  // x.amin(-1) + x * 3) become one kernel, so the meeting reads no value the other kernel
  // wrote; at most one of them reduces (a pointwise group's ops run in the row kernel's output
  // pass). Refused when a mutation lies between their members, or when an operand of one
  // depends on the other through a node outside both (the merged group would both feed and
  // wait for that node).
  bool can_merge(size_t gi, size_t oi) {
    return can_merge_shape(gi, oi) && within_arity({&groups_[gi], &groups_[oi]}, nullptr);
  }

  bool can_merge_shape(size_t gi, size_t oi) {
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

  // No mutation lies between the members of `g` and `o`, no operand of one depends on the other
  // through a node outside both, and no full-size op of one reads a per-column value of the
  // other.
  bool can_merge_barriers_and_paths(const Group& g, const Group& o) {
    const size_t lo = std::min(g.first_position, o.first_position);
    const size_t hi = std::max(position_[g.members.back()], position_[o.members.back()]);
    for (size_t b : barriers_) {
      if (b > lo && b < hi) return false;
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

  // A pointwise group over the per-row shape of row group `ri` (pow(r, 3) * the row sum, in a
  // norm's gradient) joins it: its values are per-row values of the row kernel, computed once
  // a row, instead of a kernel of their own between two row kernels. The same safety checks
  // as can_merge (no mutation between, no path through other nodes, the arity).
  bool can_merge_per_row(size_t ri, size_t pi) {
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

  void merge(size_t into, size_t from) {
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

  void add(size_t gi, Node* node) {
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

  // The first view member after `m` (its values are computed in that view's input shape), or
  // nullptr when none is: members before a view are read only by members, up to the view.
  const Node* region(const Group& g, const Node* m,
                     std::unordered_map<const Node*, const Node*>& memo) const {
    if (g.region_of.empty()) return nullptr;
    auto it = memo.find(m);
    if (it != memo.end()) return it->second;
    const Node* r = nullptr;
    for (const Value* out : m->outputs()) {
      for (const Node* u : out->users()) {
        if (!g.member_set.count(u)) continue;
        r = is_view(*u) ? u : region(g, u, memo);
        break;
      }
      if (r != nullptr) break;
    }
    return memo[m] = r;
  }

  void rewrite(Group& g) {
    // Inputs: tensors from outside, in first-use order, once per region reading them (an input
    // read before and after a view is addressed two ways). Outputs: member values read outside.
    std::vector<Value*> inputs;
    std::unordered_map<const Value*, Value*> inner;  // member values and constants
    std::map<std::pair<const Value*, const Node*>, Value*> inner_inputs;
    std::unordered_map<const Node*, const Node*> regions;
    auto group = std::make_unique<Graph>();
    for (Node* m : g.members) {
      const Node* r = region(g, m, regions);
      std::vector<Value*> mapped;
      for (size_t i = 0; i < m->inputs().size(); ++i) {
        Value* in = m->input(i);
        if (g.member_set.count(in->producer())) {
          mapped.push_back(inner.at(in));
        } else if (in->producer()->kind() == ir::NodeKind::kConstant) {
          if (!inner.count(in)) inner[in] = group->clone_node(*in->producer(), {})->output();
          mapped.push_back(inner.at(in));
        } else if (is_view(*m) && i == 1 && ir::op_info(*m).fn == "view") {
          // A view's symbolic size list: constants, with -1 for the symbolic size.
          std::vector<int64_t> sizes = ir::view_constant_sizes(*m);
          mapped.push_back(group->add_constant(c10::List<int64_t>(sizes), ir::ValueKind::kIntList));
        } else {
          Value*& slot = inner_inputs[{in, r}];
          if (slot == nullptr) {
            inputs.push_back(in);
            slot = group->add_tensor_input(in->name(), *in->tensor_type());
          }
          mapped.push_back(slot);
        }
      }
      Node* copy = group->clone_node(*m, mapped);
      for (size_t i = 0; i < m->outputs().size(); ++i) inner[m->output(i)] = copy->output(i);
    }
    std::vector<Value*> outputs;
    for (Node* m : g.members) {
      for (Value* out : m->outputs()) {
        bool outside = std::any_of(out->users().begin(), out->users().end(),
                                   [&](const Node* u) { return !g.member_set.count(u); });
        if (outside) outputs.push_back(out);
      }
    }
    std::vector<Value*> inner_outputs;
    for (Value* out : outputs) inner_outputs.push_back(inner.at(out));
    group->set_outputs(inner_outputs);

    // Place the Fusion node after the last member; move readers in between after it.
    Node* last = g.members.back();
    std::vector<Node*> nodes = graph_.nodes();
    auto last_it = std::find(nodes.begin(), nodes.end(), last);
    Node* after_last = (last_it + 1 != nodes.end()) ? *(last_it + 1) : nullptr;
    graph_.set_insert_point(after_last);
    Graph* piece = graph_.add_piece(std::move(group));
    Node* fusion = graph_.add_fusion(piece, inputs);
    graph_.set_insert_point(nullptr);
    fusion->provenance() = last->provenance();
    for (size_t i = 0; i < outputs.size(); ++i) fusion->output(i)->set_name(outputs[i]->name());

    std::vector<Node*> delayed;
    for (auto it = std::find(nodes.begin(), nodes.end(), g.members.front()); it != last_it; ++it) {
      if (!g.member_set.count(*it) && depends_on(*it, g)) delayed.push_back(*it);
    }
    Node* insert_before = after_last;
    for (Node* d : delayed) graph_.move_before(d, insert_before);

    for (size_t i = 0; i < outputs.size(); ++i) {
      std::vector<Node*> users = outputs[i]->users();
      for (Node* u : users) {
        if (!g.member_set.count(u)) u->replace_input(outputs[i], fusion->output(i));
      }
    }
    std::unordered_set<Node*> constants;  // and the size lists of views
    for (Node* m : g.members) {
      for (Value* in : m->inputs()) {
        if (in->producer()->kind() == ir::NodeKind::kConstant ||
            (is_view(*m) && in->producer()->kind() == ir::NodeKind::kMakeList)) {
          constants.insert(in->producer());
        }
      }
    }
    for (auto it = g.members.rbegin(); it != g.members.rend(); ++it) {
      // Members may still read each other; erase consumers first (reverse order). A later
      // node may take an erased one's address: it must not inherit its position.
      position_.erase(*it);
      graph_.erase(*it);
    }
    for (Node* c : constants) {
      if (c->output()->users().empty()) {  // copied into the group
        position_.erase(c);
        graph_.erase(c);
      }
    }
    MAGI_LOG_DEBUG("fused ", g.members.size(), " ops into ", fusion->op_name());
  }

  // A view that no member reads computes nothing through it: ATen's costs nothing, and in
  // the kernel it would only make the writes follow the view's order (a transpose's writes
  // strided against its reads). It leaves the group, and the values before it are the index
  // space again, when it is the group's only member after them. Repeated: a chain of views
  // at the end (`.view(b, s, -1)`, then a matmul's flattening) leaves one view at a time.
  void drop_trailing_views(Group& g) {
    while (drop_trailing_view(g)) {
    }
  }

  bool drop_trailing_view(Group& g) {
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

  // A cast of an operand smaller than the index space (`w.float()` of a norm's weight) starts a
  // group of its own, whose shape no later op fits. When every reader of it is in one group, it
  // moves into that group: the kernel loads the narrow operand and casts it in registers,
  // instead of an extra kernel writing the cast copy that the group then reads.
  void adopt_lone_casts() {
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
      for (size_t b : barriers_) ok &= !(b > position_[cast] && b < g.first_position);
      for (const Value* in : cast->inputs()) {
        if (in->kind() == ir::ValueKind::kTensor &&
            in->producer()->kind() != ir::NodeKind::kConstant)
          ok &= !depends_on(in->producer(), g);
      }
      if (ok) merge(gi, si);
    }
  }

  // ---- sink_cheap_outputs ------------------------------------------------------------------

  // At most this many members are recomputed for one value in a reading group.
  static constexpr size_t kMaxRecipe = 8;

  // An elementwise member (a cast, a unary or binary op, a where) computing a value of the
  // full index space: cheap to compute again where it is read.
  static bool is_cheap(const Group& g, const Node& n) {
    const ir::OpClass c = ir::op_info(n).op_class;
    if (c != ir::OpClass::kUnary && c != ir::OpClass::kBinary && c != ir::OpClass::kWhere &&
        c != ir::OpClass::kCast) {
      return false;
    }
    if (n.outputs().size() != 1 || g.column_nodes.count(&n) || g.narrow_nodes.count(&n)) {
      return false;
    }
    return same_shape(n.output()->tensor_type()->sizes, g.full);
  }

  // Bytes per element of the index space that writing or reading `v` costs: its element size
  // when it has the full shape; a per-row or broadcast value counts as nothing.
  static size_t weight(const Group& g, const Value* v) {
    if (v->kind() != ir::ValueKind::kTensor || !v->tensor_type()) return 0;
    const auto& type = *v->tensor_type();
    return same_shape(type.sizes, g.full) ? c10::elementSize(type.dtype) : 0;
  }

  static const Node* view_after(const Group& g, const Node* m) {
    auto it = g.region_of.find(m);
    return it == g.region_of.end() ? nullptr : it->second;
  }

  static bool reads(const Group& g, const Value* v) {
    return std::any_of(v->users().begin(), v->users().end(),
                       [&](const Node* u) { return g.member_set.count(u) > 0; });
  }

  static bool read_outside(const Group& g, const Value* v) {
    return std::any_of(v->users().begin(), v->users().end(),
                       [&](const Node* u) { return !g.member_set.count(u); });
  }

  // The members of `g` that `m`'s value is recomputed from (m among them, in graph order) and
  // the tensors they read from elsewhere (anchors): other members' values and the group's
  // inputs. A cheap member whose operands are no wider than its value is recomputed too (the
  // float32 cast of a bfloat16 value, 2 * that cast), up to kMaxRecipe members; a wider one
  // (a sum of two values) is read.
  void recipe_of(const Group& g, Node* m, std::vector<Node*>& recipe,
                 std::vector<Value*>& anchors) const {
    auto operand_weight = [&](const Node* n) {
      size_t w = 0;
      for (const Value* in : n->inputs()) {
        if (in->producer()->kind() != ir::NodeKind::kConstant) w += weight(g, in);
      }
      return w;
    };
    std::unordered_set<const Node*> seen = {m}, read;
    std::vector<Node*> stack = {m};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      recipe.push_back(n);
      for (Value* in : n->inputs()) {
        Node* p = in->producer();
        if (p->kind() == ir::NodeKind::kConstant || in->kind() != ir::ValueKind::kTensor) continue;
        if (seen.count(p)) continue;  // recomputed
        if (!read.count(p) && g.member_set.count(p) && is_cheap(g, *p) &&
            seen.size() < kMaxRecipe && operand_weight(p) <= weight(g, in)) {
          seen.insert(p);
          stack.push_back(p);
        } else if (std::find(anchors.begin(), anchors.end(), in) == anchors.end()) {
          read.insert(p);
          anchors.push_back(in);
        }
      }
    }
    std::sort(recipe.begin(), recipe.end(),
              [this](const Node* a, const Node* b) { return position_.at(a) < position_.at(b); });
  }

  // Group `g` computes `m`'s value cheaply from values narrower than it (a float32 cast of a
  // bfloat16 tensor, 2 * that cast), and only other groups read it. Counted in bytes per
  // element, writing it and reading it back in each reading group costs more than writing the
  // narrower values (where `g` does not already) and reading them there: each reading group
  // then computes the value itself and `g` stops writing it.
  bool sink(size_t gi, Node* m) {
    Group& g = groups_[gi];
    if (!is_cheap(g, *m)) return false;
    Value* v = m->output();
    std::vector<size_t> readers;  // the groups reading v, in order
    for (const Node* u : v->users()) {
      if (g.member_set.count(u)) continue;
      auto it = group_of_.find(u);
      if (it == group_of_.end()) return false;  // an ATen call reads it: it stays written
      const Group& c = groups_[it->second];
      // Where `u` is computed: before a view of its group, in that view's input shape.
      const Node* view = view_after(c, u);
      const auto& space = view != nullptr ? view->input(0)->tensor_type()->sizes : c.full;
      if (c.narrow_nodes.count(u) || reads_column_value(c, *u) || !same_shape(space, g.full)) {
        return false;
      }
      for (const Node* other : v->users()) {
        if (c.member_set.count(other) && view_after(c, other) != view) return false;
      }
      // The clones read the recipe's operands where `u` is: no write may come between.
      for (size_t b : barriers_) {
        if (b > position_.at(m) && b < position_.at(u)) return false;
      }
      if (std::find(readers.begin(), readers.end(), it->second) == readers.end()) {
        readers.push_back(it->second);
      }
    }
    if (readers.empty()) return false;
    std::vector<Node*> recipe;
    std::vector<Value*> anchors;
    recipe_of(g, m, recipe, anchors);

    size_t before = weight(g, v) * (1 + readers.size()), after = 0;
    for (const Value* a : anchors) {
      if (g.member_set.count(a->producer()) && !read_outside(g, a)) after += weight(g, a);
      for (size_t ci : readers) after += reads(groups_[ci], a) ? 0 : weight(g, a);
    }
    if (after >= before) return false;
    for (size_t ci : readers) {
      std::unordered_set<const Value*> args = args_of({&groups_[ci]}, nullptr);
      args.erase(v);
      args.insert(anchors.begin(), anchors.end());
      // Before a view an operand is a kernel argument of its own (addressed through the view):
      // count each anchor twice there, at the most.
      const size_t twice = groups_[ci].region_of.empty() ? 0 : anchors.size();
      if (args.size() + twice > kMaxKernelArgs) return false;
    }
    std::unordered_set<const Value*> args = args_of({&g}, nullptr);
    args.erase(v);
    for (const Value* a : anchors) {
      if (g.member_set.count(a->producer())) args.insert(a);
    }
    if (args.size() > kMaxKernelArgs) return false;

    for (size_t ci : readers) recompute_in(ci, v, recipe);
    erase_unused_members(gi);
    renumber();
    MAGI_LOG_DEBUG("recomputing ", v->name(), " (", recipe.size(), " ops) in ", readers.size(),
                   " reading group(s) instead of writing it");
    return true;
  }

  // Clones `recipe` (computing `v`) into group `ci`, before its first member reading `v`, and
  // points those members at the clone. A member a previous sink already cloned there, before
  // that point, is reused.
  void recompute_in(size_t ci, Value* v, const std::vector<Node*>& recipe) {
    Group& c = groups_[ci];
    std::vector<Node*> users;
    for (Node* u : v->users()) {
      if (c.member_set.count(u)) users.push_back(u);
    }
    Node* first = *std::min_element(users.begin(), users.end(), [this](Node* a, Node* b) {
      return position_.at(a) < position_.at(b);
    });
    const Node* view = view_after(c, first);
    std::unordered_map<const Value*, Value*> env;
    graph_.set_insert_point(first);
    for (Node* r : recipe) {
      auto known = clones_.find({r, ci});
      if (known != clones_.end() && position_.count(known->second) &&
          position_.at(known->second) < position_.at(first) &&
          view_after(c, known->second) == view) {
        env[r->output()] = known->second->output();
        continue;
      }
      std::vector<Value*> inputs;
      for (Value* in : r->inputs()) {
        auto it = env.find(in);
        inputs.push_back(it == env.end() ? in : it->second);
      }
      Node* copy = graph_.clone_node(*r, inputs);
      env[r->output()] = copy->output();
      clones_[{r, ci}] = copy;
      c.members.push_back(copy);
      c.member_set.insert(copy);
      if (view != nullptr) c.region_of.emplace(copy, view);
      group_of_[copy] = ci;
    }
    graph_.set_insert_point(nullptr);
    for (Node* u : users) u->replace_input(v, env.at(v));
  }

  // Members whose values nothing reads any more leave the group and the graph.
  void erase_unused_members(size_t gi) {
    Group& g = groups_[gi];
    for (bool erased = true; erased;) {
      erased = false;
      for (auto it = g.members.begin(); it != g.members.end(); ++it) {
        Node* m = *it;
        const bool unused = std::all_of(m->outputs().begin(), m->outputs().end(),
                                        [](const Value* out) { return out->users().empty(); });
        if (!unused || !is_cheap(g, *m)) continue;
        g.members.erase(it);
        g.member_set.erase(m);
        group_of_.erase(m);
        position_.erase(m);
        for (auto c = clones_.begin(); c != clones_.end();) {
          c = c->first.first == m || c->second == m ? clones_.erase(c) : std::next(c);
        }
        graph_.erase(m);
        erased = true;
        break;
      }
    }
  }

  // Positions (and the barriers between them) after nodes were added or erased; members in
  // graph order.
  void renumber() {
    std::vector<Node*> nodes = graph_.nodes();
    position_.clear();
    barriers_.clear();
    for (size_t i = 0; i < nodes.size(); ++i) {
      position_[nodes[i]] = i;
      if (nodes[i]->is_operator() && nodes[i]->schema().is_mutable()) barriers_.push_back(i);
    }
    for (Group& g : groups_) {
      if (g.members.empty()) continue;
      std::sort(g.members.begin(), g.members.end(),
                [this](const Node* a, const Node* b) { return position_[a] < position_[b]; });
      g.first_position = position_[g.members.front()];
    }
  }

  void sink_cheap_outputs() {
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      if (groups_[gi].members.empty() || !groups_[gi].region_of.empty()) continue;
      const std::vector<Node*> members = groups_[gi].members;  // sink() may erase some
      for (Node* m : members) {
        if (groups_[gi].member_set.count(m)) sink(gi, m);
      }
    }
  }

  // ---- merge_siblings --------------------------------------------------------------------

  static bool is_sibling_candidate(const Group& g) {
    return !g.members.empty() && !g.reduces() && g.narrow_nodes.empty();
  }

  // The full-size tensors the members of `g` read from outside it, in first-use order.
  static std::vector<const Value*> full_inputs(const Group& g) {
    std::vector<const Value*> out;
    for (const Node* m : g.members) {
      for (const Value* in : m->inputs()) {
        if (!g.member_set.count(in->producer()) && weight(g, in) > 0 &&
            std::find(out.begin(), out.end(), in) == out.end()) {
          out.push_back(in);
        }
      }
    }
    return out;
  }

  // Two pointwise groups of one index space reading a full-size value in common become one
  // kernel, which reads it once; can_merge says when that is safe (no path between them
  // through other nodes, no mutation between them, the arity).
  void merge_siblings() {
    std::unordered_map<const Value*, std::vector<size_t>> readers;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      if (!is_sibling_candidate(groups_[gi])) continue;
      for (const Value* v : full_inputs(groups_[gi])) readers[v].push_back(gi);
    }
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      if (!is_sibling_candidate(groups_[gi])) continue;
      for (const Value* v : full_inputs(groups_[gi])) {
        for (size_t oi : readers[v]) {
          if (oi <= gi || !is_sibling_candidate(groups_[oi]) ||
              !same_shape(groups_[gi].full, groups_[oi].full) || !can_merge(gi, oi)) {
            continue;
          }
          MAGI_LOG_DEBUG("merging two pointwise groups that read ", v->name());
          merge(gi, oi);
        }
      }
    }
  }

  Graph& graph_;
  std::unordered_map<const Node*, size_t> position_;
  std::unordered_map<const Node*, size_t> group_of_;
  std::vector<Group> groups_;
  std::vector<size_t> barriers_;
  // Members sink() cloned into a reading group: (original, group) -> clone.
  std::map<std::pair<const Node*, size_t>, Node*> clones_;
};

}  // namespace

bool fuse_groups(ir::Graph& graph) {
  bool changed = false;
  std::unordered_set<ir::Graph*> pieces;  // identical pieces are shared: fuse each once
  for (ir::Node* node : graph.nodes()) {
    if (node->kind() == ir::NodeKind::kCallPiece && pieces.insert(node->piece()).second) {
      changed |= fuse_groups(*node->piece());
    }
  }
  changed |= Fuser(graph).run();
  return changed;
}

}  // namespace magi::passes
