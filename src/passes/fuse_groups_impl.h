// The Fuser of fuse_groups (fuse_groups.cpp, whose opening comment describes the pass): a
// group's state and the Fuser's methods. The small ones are defined here; the others in three
// files by the steps of the pass: grouping, merging and the last adjustments of groups
// (fuse_groups.cpp), the two steps after grouping that cut what the kernels move,
// sink_cheap_outputs and merge_siblings (fuse_groups_traffic.cpp), and the rewrite of each group
// into a Fusion node (fuse_groups_rewrite.cpp). Private to the passes layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "magi/ir/graph.h"
#include "magi/ir/op_info.h"
#include "magi_kernel_abi.h"

namespace magi::passes::detail {

using ir::Graph;
using ir::Node;
using ir::SymExpr;
using ir::Value;

// Whether two symbolic shapes are equal, dim by dim.
inline bool same_shape(const std::vector<SymExpr>& a, const std::vector<SymExpr>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// A group being formed: the nodes that become one Fusion node, run by one generated kernel.
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

// fuse_groups over one graph (the entry point fuses its pieces first): groups its fusible nodes,
// cuts what the groups move, and rewrites each group into a Fusion node.
class Fuser {
 public:
  explicit Fuser(Graph& graph) : graph_(graph) {}

  bool run();

 private:
  static bool is_reducing(const Node& n);

  static bool is_column_reduction(const Node& n);

  static bool is_slice(const Node& n) { return ir::op_info(n).op_class == ir::OpClass::kSlice; }

  static bool is_cat(const Node& n) { return ir::op_info(n).op_class == ir::OpClass::kCat; }

  static bool is_pad(const Node& n) { return ir::op_info(n).op_class == ir::OpClass::kPad; }

  // Ops that give narrow values the full width back: a cat of the last dim, a pad of it.
  static bool widens(const Node& n) { return is_cat(n) || is_pad(n); }

  static bool is_view(const Node& n) { return ir::op_info(n).op_class == ir::OpClass::kView; }

  // Single ops that a generated kernel runs faster than ATen: softmax, log-softmax and layer
  // norm (our row kernel reads the row once where ATen's may not), and sums over leading dims
  // (a weight gradient: ATen's general reduction stays well under the copy bandwidth on such
  // column sums, which the column kernel reads in one coalesced pass).
  static bool is_compound(const Node& n);

  // A copy (clone, or a cast) of an operand that is not contiguous: grouped-query attention's
  // repeat_kv (the clone of an expand) or a cast of a transposed tensor. ATen's general copy
  // kernel handles such copies an element at a time; a generated kernel reads the operand
  // through its strides, a vector at a time along its last dim.
  // Only into a contiguous result: a copy that keeps the operand's layout (preserve_format of
  // a transposed tensor) is one dense pass in ATen, where the kernel would write contiguously
  // and then copy into the traced layout.
  static bool is_strided_copy(const Node& n);

  // Every non-tensor operand must be a constant: runtime scalars stay out of kernels.
  static bool operands_ok(const Node& n);

  // The values a node reads: a cat's pieces instead of its list.
  static std::vector<const Value*> operands(const Node& n);

  bool reads_narrow_value(const Group& g, const Node& node) const;

  // Slices, cats and the ops between them (rotate_half: cat(-x[..., h:], x[..., :h])). A
  // slice reads a value of the full index space; an op on narrow values reads only narrow
  // values of its own shape (and 0-dim operands); a cat of the last dim reads members only and
  // gives the full shape back, and so does a pad of the last dim (its gradient: slice_backward
  // is decomposed into one). No reduction shares such a group.
  bool can_join_narrow(const Group& g, const Node& node);

  // Does every narrow value of `g` stay inside it?
  static bool narrow_values_closed(const Group& g);

  // The index space a node iterates: its input's shape for reductions, else its output's.
  static std::vector<SymExpr> space_of(const Node& n);

  // Does a value of `shape` fit group `g` (full shape, or per-row shape after a reduction)?
  static bool fits(const Group& g, const std::vector<SymExpr>& shape);

  // Does `node` (outside g) depend on a member of g?
  bool depends_on(const Node* node, const Group& g);

  // Shapes in a column group, right-aligned to its index space `full` with the dims
  // 0..k-1 reduced: a per-column value has every kept dim of `full` and 1 (or nothing) in the
  // reduced ones; an operand of per-column ops may also broadcast in the kept dims.
  static bool is_column_shape(const Group& g, const std::vector<SymExpr>& shape, bool operand);

  bool reads_column_value(const Group& g, const Node& node) const;

  // Column groups: a pass over the index space evaluates the full-size ops and accumulates the
  // column reductions; per-column ops run after it. So a full-size op must not read a
  // per-column value, and an op reading one must produce one, from per-column or 0-dim
  // operands only.
  bool can_join_column(const Group& g, const Node& node);

  bool reads_inner_value(const Group& g, const Node& node) const;

  // A view of a value the pointwise group `g` computed joins when every value `g` has
  // computed is read only by members and the view: they all move before the view.
  bool can_join_view(const Group& g, const Node& view) const;

  bool can_join(const Group& g, const Node& node);

  // A generated kernel takes at most MAGI_MAX_KERNEL_ARGS tensors (inputs and outputs
  // together; MagiArgs holds that many pointers, kernels/magi_kernel_abi.h). Counts the tensors the
  // members of `groups` (and `extra`) would read from outside them and the values they make that
  // are read outside.
  bool within_arity(std::initializer_list<const Group*> groups, const Node* extra) const;

  // The tensors a kernel of the members of `groups` (and `extra`) would take: the values they
  // read from outside them and the values they make that are read outside.
  std::unordered_set<const Value*> args_of(std::initializer_list<const Group*> groups,
                                           const Node* extra) const;

  // A call that writes some of its arguments (aten::copy_, index_copy_, a custom op that
  // mutates). A group's kernel runs where its last member was, and nodes between its members
  // that read its values move after it: so a group may span such a write only when nothing in
  // its span, members or not, reads the memory the write changes.
  struct Barrier {
    size_t position = 0;
    // Positions of the other nodes reading that memory (sorted): through the written arguments,
    // the tensors they are views of, or any view of those. The call's own results are not
    // counted: only nodes after it read them.
    std::vector<size_t> readers;
    bool total = false;  // writes memory the walk cannot follow (a list of unknown origin)
  };
  Barrier barrier_at(const Node& node, size_t position) const;
  // Whether a group covering positions [lo, hi] may span `b`.
  static bool may_span(const Barrier& b, size_t lo, size_t hi);
  // The barriers of `nodes` (the graph in order, position_ set), into barriers_.
  void find_barriers(const std::vector<Node*>& nodes);

  bool can_join_shape(const Group& g, const Node& node);

  void consider(Node* node);

  // Two groups over one index space whose values meet at a node (exp(x) * sin(y), or
  // x.amin(-1) + x * 3) become one kernel, so the meeting reads no value the other kernel
  // wrote; at most one of them reduces (a pointwise group's ops run in the row kernel's output
  // pass). Refused when a write between their members forbids it (may_span), or when an operand of
  // one depends on the other through a node outside both (the merged group would both feed and wait
  // for that node).
  bool can_merge(size_t gi, size_t oi);

  bool can_merge_shape(size_t gi, size_t oi);

  // No write between the members of `g` and `o` that may_span refuses, no operand of one depends on
  // the other through a node outside both, and no full-size op of one reads a per-column value of
  // the other.
  bool can_merge_barriers_and_paths(const Group& g, const Group& o);

  // A pointwise group over the per-row shape of row group `ri` (pow(r, 3) * the row sum, in a
  // norm's gradient) joins it: its values are per-row values of the row kernel, computed once
  // a row, instead of a kernel of their own between two row kernels. The same safety checks
  // as can_merge (no write between that may_span forbids, no path through other nodes, the arity).
  bool can_merge_per_row(size_t ri, size_t pi);

  void merge(size_t into, size_t from);

  void add(size_t gi, Node* node);

  // The first view member after `m` (its values are computed in that view's input shape), or
  // nullptr when none is: members before a view are read only by members, up to the view.
  const Node* region(const Group& g, const Node* m,
                     std::unordered_map<const Node*, const Node*>& memo) const;

  // Replaces the members of `g` by one Fusion node running them (fuse_groups_rewrite.cpp).
  void rewrite(Group& g);

  // A view that no member reads computes nothing through it: ATen's costs nothing, and in
  // the kernel it would only make the writes follow the view's order (a transpose's writes
  // strided against its reads). It leaves the group, and the values before it are the index
  // space again, when it is the group's only member after them. Repeated: a chain of views
  // at the end (`.view(b, s, -1)`, then a matmul's flattening) leaves one view at a time.
  void drop_trailing_views(Group& g);

  bool drop_trailing_view(Group& g);

  // A cast of an operand smaller than the index space (`w.float()` of a norm's weight) starts a
  // group of its own, whose shape no later op fits. When every reader of it is in one group, it
  // moves into that group: the kernel loads the narrow operand and casts it in registers,
  // instead of an extra kernel writing the cast copy that the group then reads.
  void adopt_lone_casts();

  // ---- sink_cheap_outputs ------------------------------------------------------------------

  // At most this many members are recomputed for one value in a reading group.
  static constexpr size_t kMaxRecipe = 8;

  // An elementwise member (a cast, a unary or binary op, a where) computing a value of the
  // full index space: cheap to compute again where it is read.
  static bool is_cheap(const Group& g, const Node& n);

  // Bytes per element of the index space that writing or reading `v` costs: its element size
  // when it has the full shape; a per-row or broadcast value counts as nothing.
  static size_t weight(const Group& g, const Value* v);

  static const Node* view_after(const Group& g, const Node* m);

  static bool reads(const Group& g, const Value* v);

  static bool read_outside(const Group& g, const Value* v);

  // The members of `g` that `m`'s value is recomputed from (m among them, in graph order) and
  // the tensors they read from elsewhere (anchors): other members' values and the group's
  // inputs. A cheap member whose operands are no wider than its value is recomputed too (the
  // float32 cast of a bfloat16 value, 2 * that cast), up to kMaxRecipe members; a wider one
  // (a sum of two values) is read.
  void recipe_of(const Group& g, Node* m, std::vector<Node*>& recipe,
                 std::vector<Value*>& anchors) const;

  // Group `g` computes `m`'s value cheaply from values narrower than it (a float32 cast of a
  // bfloat16 tensor, 2 * that cast), and only other groups read it. Counted in bytes per
  // element, writing it and reading it back in each reading group costs more than writing the
  // narrower values (where `g` does not already) and reading them there: each reading group
  // then computes the value itself and `g` stops writing it.
  bool sink(size_t gi, Node* m);

  // Clones `recipe` (computing `v`) into group `ci`, before its first member reading `v`, and
  // points those members at the clone. A member a previous sink already cloned there, before
  // that point, is reused.
  void recompute_in(size_t ci, Value* v, const std::vector<Node*>& recipe);

  // Members whose values nothing reads any more leave the group and the graph.
  void erase_unused_members(size_t gi);

  // Positions (and the barriers between them) after nodes were added or erased; members in
  // graph order.
  void renumber();

  void sink_cheap_outputs();

  // ---- merge_siblings --------------------------------------------------------------------

  static bool is_sibling_candidate(const Group& g);

  // The full-size tensors the members of `g` read from outside it, in first-use order.
  static std::vector<const Value*> full_inputs(const Group& g);

  // Two pointwise groups of one index space reading a full-size value in common become one
  // kernel, which reads it once; can_merge says when that is safe (no path between them
  // through other nodes, no write between them that may_span forbids, the arity).
  void merge_siblings();

  Graph& graph_;
  std::unordered_map<const Node*, size_t> position_;
  std::unordered_map<const Node*, size_t> group_of_;
  std::vector<Group> groups_;
  std::vector<Barrier> barriers_;
  // Members sink() cloned into a reading group: (original, group) -> clone.
  std::map<std::pair<const Node*, size_t>, Node*> clones_;
};

}  // namespace magi::passes::detail
