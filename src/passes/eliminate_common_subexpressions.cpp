// eliminate_common_subexpressions: a node that computes what an earlier node computed (the
// same ATen operator or structural node on the same inputs) reads the earlier one's results
// instead, and goes. A model that builds its rotary tables or attention mask in every layer
// then builds them once per call: fewer kernels per call, and fewer nodes in a CUDA graph.
//
// Requires: a verified graph. Guarantees: a verified graph with the same outputs.
//
// What merges: Constant nodes with equal literals (ir::literal_key, as split_at_boundaries
// compares pieces: numbers exactly, 0.0 and -0.0 differ; small host tensors by value, others by
// identity), getitems of tensors, lists of tensors, and ATen operators that return tensors
// and are pure (ir::is_pure_operator: no written argument, no random numbers).
//
// What never merges: inputs, the Output node, piece calls and fusions; custom ops (a
// registered op may have effects its schema does not declare); `empty` ops (uninitialised
// memory); size arithmetic and lists of sizes (they cost nothing to repeat); a repeat and its
// first on two sides of a boundary call (split_at_boundaries makes each stretch between two
// boundary calls a piece, and stores alike pieces once: each piece keeps its own); nodes that read
// or produce a value that a written argument may alias (any value connected to a written one
// through views or in-place results: its contents differ before and after the write); and
// nodes whose results, or views of them, the graph returns (two outputs stay two tensors that
// share no memory, as eager returns them).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "magi/ir/node.h"
#include "magi/ir/op_info.h"
#include "magi/ir/structural_hash.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

// The alias sets an argument or result annotation names, those of a list's items included.
std::vector<c10::Symbol> alias_sets(const c10::AliasInfo* info) {
  std::vector<c10::Symbol> sets;
  if (info == nullptr) return sets;
  sets.insert(sets.end(), info->beforeSets().begin(), info->beforeSets().end());
  for (const c10::AliasInfo& item : info->containedTypes()) {
    const std::vector<c10::Symbol> inner = alias_sets(&item);
    sets.insert(sets.end(), inner.begin(), inner.end());
  }
  return sets;
}

// Whether an annotation says the argument is written (`Tensor(a!)`, `Tensor(a!)[]`).
bool writes(const c10::AliasInfo* info) {
  if (info == nullptr) return false;
  if (info->isWrite()) return true;
  for (const c10::AliasInfo& item : info->containedTypes()) {
    if (writes(&item)) return true;
  }
  return false;
}

// Union-find over the graph's values, joining each value with those it may share memory with.
class AliasSets {
 public:
  explicit AliasSets(const ir::Graph& graph) {
    for (const ir::Node* node : graph.nodes()) {
      for (const ir::Value* v : node->outputs()) index_.emplace(v, index_.size());
    }
    parent_.resize(index_.size());
    std::iota(parent_.begin(), parent_.end(), size_t{0});
    for (const ir::Node* node : graph.nodes()) join_aliases(*node);
  }
  // Marks the set of `v` (and everything joined to it) as written, or as returned. The sets
  // are final once constructed: marks and queries come after every join.
  void mark_written(const ir::Value* v) { written_.insert(find(index_.at(v))); }
  void mark_returned(const ir::Value* v) { returned_.insert(find(index_.at(v))); }
  bool written(const ir::Value* v) { return written_.count(find(index_.at(v))) > 0; }
  bool returned(const ir::Value* v) { return returned_.count(find(index_.at(v))) > 0; }

 private:
  size_t find(size_t i) {
    while (parent_[i] != i) i = parent_[i] = parent_[parent_[i]];
    return i;
  }
  void join(const ir::Value* a, const ir::Value* b) {
    parent_[find(index_.at(a))] = find(index_.at(b));
  }
  // Views, in-place results and getitems of lists share memory with what they come from; a list
  // shares with its items.
  void join_aliases(const ir::Node& node) {
    switch (node.kind()) {
      case ir::NodeKind::kGetItem:
        join(node.output(), node.input(0));
        return;
      case ir::NodeKind::kMakeList:
        for (const ir::Value* item : node.inputs()) join(node.output(), item);
        return;
      case ir::NodeKind::kAtenOp:
      case ir::NodeKind::kCustomOp: {
        const auto& args = node.schema().arguments();
        const auto& returns = node.schema().returns();
        for (size_t k = 0; k < node.outputs().size() && k < returns.size(); ++k) {
          // Views the schema does not annotate (aten::_unsafe_view) alias their first input.
          if (ir::output_aliases_input(node, k)) join(node.output(k), node.input(0));
          // The arguments in the result's alias sets: `self` of a view or an in-place op, of
          // a split or unbind (`Tensor(a)[]`: the set is on the list's items).
          const std::vector<c10::Symbol> out = alias_sets(returns[k].alias_info());
          for (size_t i = 0; i < args.size() && i < node.inputs().size(); ++i) {
            for (const c10::Symbol& set : alias_sets(args[i].alias_info())) {
              if (std::find(out.begin(), out.end(), set) != out.end()) {
                join(node.output(k), node.input(i));
                break;
              }
            }
          }
        }
        return;
      }
      default:
        return;
    }
  }

  std::unordered_map<const ir::Value*, size_t> index_;
  std::vector<size_t> parent_;
  std::unordered_set<size_t> written_;
  std::unordered_set<size_t> returned_;
};

// The arguments an operator node writes (schema alias annotations with a write); every input
// of a piece call (a piece may write its inputs in place).
std::vector<const ir::Value*> written_arguments(const ir::Node& node) {
  std::vector<const ir::Value*> out;
  if (node.kind() == ir::NodeKind::kCallPiece) return {node.inputs().begin(), node.inputs().end()};
  if (!node.is_operator()) return out;
  const auto& args = node.schema().arguments();
  for (size_t i = 0; i < args.size() && i < node.inputs().size(); ++i) {
    if (writes(args[i].alias_info())) out.push_back(node.input(i));
  }
  return out;
}

// What makes two nodes compute the same thing, or "" when `node` may not merge.
std::string node_key(const ir::Node& node, AliasSets& aliases) {
  std::string key = std::to_string(static_cast<int>(node.kind())) + "|";
  switch (node.kind()) {
    case ir::NodeKind::kConstant: {
      const std::string literal = ir::literal_key(node.constant());
      if (literal.empty()) return "";
      key += literal;
      break;
    }
    case ir::NodeKind::kGetItem:
      if (node.output()->kind() != ir::ValueKind::kTensor) return "";
      key += std::to_string(node.item_index());
      break;
    case ir::NodeKind::kMakeList:  // of tensors: what a cat or a stack reads
      if (node.output()->kind() != ir::ValueKind::kTensorList &&
          node.output()->kind() != ir::ValueKind::kOptionalTensorList)
        return "";
      break;
    case ir::NodeKind::kAtenOp: {
      if (!ir::is_pure_operator(node)) return "";
      for (const ir::Value* out : node.outputs()) {
        if (out->kind() != ir::ValueKind::kTensor && out->kind() != ir::ValueKind::kTensorList)
          return "";
      }
      key += node.op_name();
      break;
    }
    default:  // inputs, the Output node, sizes, lists, custom ops, piece calls, fusions
      return "";
  }
  for (const ir::Value* in : node.inputs()) {
    if (aliases.written(in)) return "";
    key += "|" + std::to_string(reinterpret_cast<uintptr_t>(in));
  }
  for (const ir::Value* out : node.outputs()) {
    if (aliases.written(out)) return "";
    // The kind tells an int from a dtype or a scalar with the same literal.
    key += "|" + std::to_string(static_cast<int>(out->kind()));
  }
  return key;
}

// Whether the graph returns a result of `node` or a view of one.
bool is_returned(const ir::Node& node, AliasSets& aliases) {
  for (const ir::Value* out : node.outputs()) {
    if (aliases.returned(out)) return true;
  }
  return false;
}

}  // namespace

bool eliminate_common_subexpressions(ir::Graph& graph,
                                     const std::vector<std::string>& splitting_ops) {
  AliasSets aliases(graph);
  const std::vector<ir::Node*> nodes = graph.nodes();
  for (const ir::Node* node : nodes) {
    for (const ir::Value* v : written_arguments(*node)) aliases.mark_written(v);
  }
  for (const ir::Value* v : graph.outputs()) aliases.mark_returned(v);
  // The first node of each key, and the stretch between boundary calls it is in. Each stretch
  // becomes a piece (split_at_boundaries): a repeat in a later stretch is left to compute its
  // own result and becomes the first of its stretch. Merged, it would be an input of its piece
  // (copied in by a piecewise CUDA graph each call), and pieces that were alike would differ.
  std::unordered_map<std::string, std::pair<ir::Node*, int>> first;
  int stretch = 0;
  bool changed = false;
  // In execution order: a node's inputs are already the first of their kind when it is keyed.
  for (ir::Node* node : nodes) {
    if (node->is_operator() && is_boundary_call(*node, splitting_ops)) {
      ++stretch;
      continue;
    }
    const std::string key = node_key(*node, aliases);
    if (key.empty()) continue;
    auto [it, inserted] = first.emplace(key, std::make_pair(node, stretch));
    if (inserted) continue;
    if (it->second.second != stretch) {
      it->second = {node, stretch};
      continue;
    }
    if (is_returned(*node, aliases)) continue;
    ir::Node* earlier = it->second.first;
    for (size_t k = 0; k < node->outputs().size(); ++k) {
      ir::Value* from = node->output(k);
      const std::vector<ir::Node*> users = from->users();
      for (ir::Node* user : users) user->replace_input(from, earlier->output(k));
    }
    graph.erase(node);
    changed = true;
  }
  return changed;
}

}  // namespace magi::passes
