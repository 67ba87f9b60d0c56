// The verifier: checks the invariants listed in graph.h. Every pass leaves a graph that
// passes it; the pipeline runs it after each pass in debug builds and on request.
#pragma once

#include <string>
#include <vector>

#include "magi/ir/graph.h"

namespace magi::ir {

/// Every violated invariant, one readable line each; empty when the graph is well formed.
std::vector<std::string> verify_errors(const Graph& graph);

/// Throws InternalError listing the violations (a malformed graph is always our bug).
void verify(const Graph& graph);

}  // namespace magi::ir
