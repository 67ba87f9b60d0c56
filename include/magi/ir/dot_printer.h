// Graphviz DOT form of a graph, for the compile dumps (MAGI_ENABLE_FX_GRAPH_VIZ=1).
//
// One DOT node per operator, symbolic op, getitem, graph input and output; constants and
// literal lists are left out, as the text printer inlines them. Edges run from producer to
// user. Subgraph-boundary calls are drawn red. Each fusion group is drawn where it runs, as a
// coloured cluster holding the ops it fuses; each distinct piece is drawn once as a cluster of
// its own, in the colour of the calls that run it. DOT node ids are the value names
// ("mm_1", "piece_0/mul_3"), so a rendered SVG can be searched for the names in the text dump.
#pragma once

#include <functional>
#include <string>

#include "magi/ir/graph.h"

namespace magi::ir {

/// How much each node's label shows (MAGI_FX_GRAPH_VIZ_NODE_DESC).
enum class DotDetail {
  kOp,      ///< the operator only: "aten::mm"
  kShape,   ///< plus its result, name and type: "%mm: f32[s0, 16]"
  kSource,  ///< plus the user source line it came from
};

/// "op", "shape" or "source" (any case); throws UserError naming the choices otherwise.
DotDetail parse_dot_detail(const std::string& text);

struct DotOptions {
  DotDetail detail = DotDetail::kShape;
  /// Which operator calls to draw as subgraph boundaries; default: is_subgraph_boundary().
  std::function<bool(const Node&)> is_boundary;
};

std::string to_dot(const Graph& graph, const DotOptions& options = {});

}  // namespace magi::ir
