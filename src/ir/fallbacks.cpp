// ATen calls left outside fusion groups, with the reason op_info() gives for each.
#include "magi/ir/fallbacks.h"

#include "magi/ir/op_info.h"

namespace magi::ir {
namespace {

void collect(const Graph& graph, const std::string& where, std::vector<AtenFallback>& out) {
  for (const Node* node : graph.nodes()) {
    if (node->kind() == NodeKind::kCallPiece) continue;  // pieces are listed after the graph
    if (node->kind() != NodeKind::kAtenOp) continue;
    std::string reason;
    if (op_info(*node, &reason).op_class == OpClass::kOther) {
      reason = "not fusible: " + reason;
    } else {
      reason =
          "fusible, but left alone: no fusible neighbour with the same index space, or a "
          "runtime scalar operand (a lone op is already one ATen kernel)";
    }
    std::string name = node->outputs().empty() ? "" : node->output(0)->name();
    out.push_back({node->op_name(), name, node->provenance().source, where, reason});
  }
}

}  // namespace

std::vector<AtenFallback> aten_fallbacks(const Graph& graph) {
  std::vector<AtenFallback> out;
  collect(graph, "", out);
  std::vector<bool> called(graph.num_pieces(), false);
  for (const Node* node : graph.nodes()) {
    if (node->kind() == NodeKind::kCallPiece) called[graph.piece_index(node->piece())] = true;
  }
  std::vector<Graph*> pieces = graph.pieces();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (called[i]) collect(*pieces[i], "piece_" + std::to_string(i), out);
  }
  return out;
}

}  // namespace magi::ir
