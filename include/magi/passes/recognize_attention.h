// Entry point of the recognize_attention pass (src/passes/recognize_attention.cpp).
#pragma once

#include "magi/ir/graph.h"

namespace magi::passes {

/// Replaces attention written out in an inference graph (matmul of the query with the
/// transposed key, a constant scale, an optional causal mask built in the graph, a softmax over
/// the last dim, a matmul with the value) by one fused SDPA call, so that the scores matrix is
/// never materialised. Chains it cannot prove equivalent are left alone; every softmax fed by a
/// matmul is logged at INFO with the decision and its reason.
bool recognize_attention(ir::Graph& graph);

}  // namespace magi::passes
