// Which ATen operator calls a compiled graph still makes through the dispatcher, and why each
// was not fused into a generated kernel. The dumps' summary table and DEBUG logging use it.
#pragma once

#include <string>
#include <vector>

#include "magi/ir/graph.h"

namespace magi::ir {

struct AtenFallback {
  std::string op;      ///< "aten::mm"
  std::string name;    ///< the result's value name ("mm_1")
  std::string source;  ///< user source line, empty when unknown
  std::string where;   ///< "" for the graph itself, "piece_2" inside a piece
  std::string reason;  ///< why it is not part of a fusion group
};

/// ATen calls of `graph` and of the pieces it calls (each distinct piece once), in order.
/// Calls inside fusion groups are not listed: they run in generated kernels.
std::vector<AtenFallback> aten_fallbacks(const Graph& graph);

}  // namespace magi::ir
