// The two steps of fuse_groups (fuse_groups.cpp) that cut what the kernels move after grouping:
// sink_cheap_outputs recomputes a cheap value in each group that reads it instead of writing
// it, and merge_siblings merges pointwise groups of one index space that read the same
// full-size value.
#include <algorithm>
#include <iterator>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fuse_groups_impl.h"
#include "magi/common/log.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"

namespace magi::passes::detail {

bool Fuser::is_cheap(const Group& g, const Node& n) {
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

size_t Fuser::weight(const Group& g, const Value* v) {
  if (v->kind() != ir::ValueKind::kTensor || !v->tensor_type()) return 0;
  const auto& type = *v->tensor_type();
  return same_shape(type.sizes, g.full) ? c10::elementSize(type.dtype) : 0;
}

const Node* Fuser::view_after(const Group& g, const Node* m) {
  auto it = g.region_of.find(m);
  return it == g.region_of.end() ? nullptr : it->second;
}

bool Fuser::reads(const Group& g, const Value* v) {
  return std::any_of(v->users().begin(), v->users().end(),
                     [&](const Node* u) { return g.member_set.count(u) > 0; });
}

bool Fuser::read_outside(const Group& g, const Value* v) {
  return std::any_of(v->users().begin(), v->users().end(),
                     [&](const Node* u) { return !g.member_set.count(u); });
}

void Fuser::recipe_of(const Group& g, Node* m, std::vector<Node*>& recipe,
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
      if (!read.count(p) && g.member_set.count(p) && is_cheap(g, *p) && seen.size() < kMaxRecipe &&
          operand_weight(p) <= weight(g, in)) {
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

bool Fuser::sink(size_t gi, Node* m) {
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
    // The clones read the recipe's operands where c's kernel runs (its last member, which may
    // lie past a write the group spans): no write may come between.
    for (const Barrier& b : barriers_) {
      if (b.position > position_.at(m) && b.position < position_.at(c.members.back())) return false;
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
    if (args.size() + twice > MAGI_MAX_KERNEL_ARGS) return false;
  }
  std::unordered_set<const Value*> args = args_of({&g}, nullptr);
  args.erase(v);
  for (const Value* a : anchors) {
    if (g.member_set.count(a->producer())) args.insert(a);
  }
  if (args.size() > MAGI_MAX_KERNEL_ARGS) return false;

  for (size_t ci : readers) recompute_in(ci, v, recipe);
  erase_unused_members(gi);
  renumber();
  MAGI_LOG_DEBUG("recomputing ", v->name(), " (", recipe.size(), " ops) in ", readers.size(),
                 " reading group(s) instead of writing it");
  return true;
}

void Fuser::recompute_in(size_t ci, Value* v, const std::vector<Node*>& recipe) {
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
        position_.at(known->second) < position_.at(first) && view_after(c, known->second) == view) {
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

void Fuser::erase_unused_members(size_t gi) {
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

void Fuser::renumber() {
  std::vector<Node*> nodes = graph_.nodes();
  position_.clear();
  for (size_t i = 0; i < nodes.size(); ++i) position_[nodes[i]] = i;
  find_barriers(nodes);
  for (Group& g : groups_) {
    if (g.members.empty()) continue;
    std::sort(g.members.begin(), g.members.end(),
              [this](const Node* a, const Node* b) { return position_[a] < position_[b]; });
    g.first_position = position_[g.members.front()];
  }
}

void Fuser::sink_cheap_outputs() {
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    if (groups_[gi].members.empty() || !groups_[gi].region_of.empty()) continue;
    const std::vector<Node*> members = groups_[gi].members;  // sink() may erase some
    for (Node* m : members) {
      if (groups_[gi].member_set.count(m)) sink(gi, m);
    }
  }
}

bool Fuser::is_sibling_candidate(const Group& g) {
  return !g.members.empty() && !g.reduces() && g.narrow_nodes.empty();
}

std::vector<const Value*> Fuser::full_inputs(const Group& g) {
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

void Fuser::merge_siblings() {
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

}  // namespace magi::passes::detail
