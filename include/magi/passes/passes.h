// Entry points of the individual passes. Each returns whether it changed the graph.
#pragma once

#include "magi/ir/graph.h"

namespace magi::passes {

/// Removes nodes none of whose outputs are used (operators without side effects, symbolic
/// arithmetic, constants, lists, getitems). Keeps inputs, the Output node and operators whose
/// schema says they mutate an argument or have no return values (asserts, in-place writes).
bool eliminate_dead_code(ir::Graph& graph);

}  // namespace magi::passes
