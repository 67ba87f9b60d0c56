// fuse_groups (fuse_groups.cpp) turning each group into a Fusion node: the group's members
// move into the node's subgraph, values read outside it become its outputs, and nodes between
// the members that depend on the group move after it.
#include <algorithm>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fuse_groups_impl.h"
#include "magi/common/log.h"
#include "magi/ir/op_info.h"

namespace magi::passes::detail {

const Node* Fuser::region(const Group& g, const Node* m,
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

void Fuser::rewrite(Group& g) {
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

  // Place the Fusion node after the last member; move readers in between after it. First and
  // last in the graph's order now: a group rewritten before this one may have moved some of
  // these members (after its own Fusion node), so the order of the positions taken before any
  // rewrite, which g.members follows, no longer holds.
  std::vector<Node*> nodes = graph_.nodes();
  auto first_it = std::find_if(nodes.begin(), nodes.end(),
                               [&](const Node* n) { return g.member_set.count(n) > 0; });
  auto last_it = std::find_if(nodes.rbegin(), nodes.rend(),
                              [&](const Node* n) { return g.member_set.count(n) > 0; })
                     .base() -
                 1;
  Node* last = *last_it;
  Node* after_last = (last_it + 1 != nodes.end()) ? *(last_it + 1) : nullptr;
  graph_.set_insert_point(after_last);
  Graph* piece = graph_.add_piece(std::move(group));
  Node* fusion = graph_.add_fusion(piece, inputs);
  graph_.set_insert_point(nullptr);
  fusion->provenance() = last->provenance();
  for (size_t i = 0; i < outputs.size(); ++i) fusion->output(i)->set_name(outputs[i]->name());

  std::vector<Node*> delayed;
  for (auto it = first_it; it != last_it; ++it) {
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

}  // namespace magi::passes::detail
