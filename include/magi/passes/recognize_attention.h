// Entry point of the recognize_attention pass (src/passes/recognize_attention.cpp).
#pragma once

#include <string>
#include <vector>

#include "magi/ir/graph.h"

namespace magi::passes {

/// One decision of the pass: a softmax fed by a matmul, rewritten or left as written.
struct AttentionPattern {
  std::string where;  ///< the softmax: its FX name and source line
  bool rewritten = false;
  std::string detail;  ///< the operator and its mask, causality and scale; or why not
  /// The pass that decided when not recognize_attention: "recognize_causal_masks" (`where` is
  /// then the attention call, and `rewritten` says whether its mask became is_causal).
  std::string pass;
};

/// Every decision of recognize_attention in this process, oldest first (the dumps and
/// magi_compiler.inspection.attention_patterns() read them).
std::vector<AttentionPattern> attention_patterns();
void clear_attention_patterns();
/// Adds a decision to that record (recognize_causal_masks records its own there).
void record_attention_pattern(AttentionPattern pattern);

/// Replaces attention written out in an inference graph (matmul of the query with the
/// transposed key, constant scales, causal, boolean or additive masks, a softmax over the last
/// dim, a matmul with the value) by one fused SDPA call, so that the scores matrix is never
/// materialised. Chains it cannot prove equivalent are left alone; every softmax fed by a
/// matmul is logged at INFO with the decision and its reason, and recorded (attention_patterns).
bool recognize_attention(ir::Graph& graph);

}  // namespace magi::passes
