// eliminate_dead_code: drop nodes whose results nobody reads.
//
// Requires: a verified graph. Guarantees: a verified graph with the same outputs, in which
// every remaining removable node has at least one used output.
#include "magi/passes/passes.h"

#include "magi/ir/node.h"
#include "magi/ir/op_info.h"

namespace magi::passes {
namespace {

bool has_side_effects(const ir::Node* node) {
  switch (node->kind()) {
    case ir::NodeKind::kInput:
    case ir::NodeKind::kOutput:
    case ir::NodeKind::kCallPiece:  // a piece may write its inputs in place
      return true;
    case ir::NodeKind::kAtenOp:
    case ir::NodeKind::kCustomOp: {
      const auto& schema = node->schema();
      if (schema.returns().empty() || schema.is_mutable()) return true;
      // Random ops advance the generator even when their result is unused.
      return ir::is_random_operator(*node);
    }
    default:
      return false;
  }
}

}  // namespace

bool eliminate_dead_code(ir::Graph& graph) {
  bool changed = false;
  std::vector<ir::Node*> nodes = graph.nodes();
  // Walk backwards so a chain of dead nodes goes in one sweep.
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    ir::Node* node = *it;
    if (has_side_effects(node)) continue;
    bool used = false;
    for (const ir::Value* out : node->outputs()) used |= !out->users().empty();
    if (used) continue;
    graph.erase(node);
    changed = true;
  }
  return changed;
}

}  // namespace magi::passes
