// The recompute planner: given the joint forward+backward graph of a training step (as
// AOTAutograd hands it to the partitioner), decide which forward values the forward saves for
// the backward and which forward ops the backward recomputes from them.
//
// A plan is a set R of forward nodes to recompute. Everything else follows: the backward needs
// some forward values; a needed value made by a node in R is recomputed, so that node's inputs
// become needed in turn; a needed value made by a node outside R is saved. Graph inputs
// (parameters, the step's inputs) are never counted as saved: they are alive anyway.
// Bytes are counted per storage: a view shares its base's bytes.
//
// Policies (docs/training.md):
//   - HEURISTIC: recompute every forward op except compute-bound ones (matmul, convolution,
//     attention, custom ops registered compute-sensitive), random ones and ones with side
//     effects; a saved compute-bound output read only through narrowing casts is replaced by
//     the casts' outputs.
//   - HANDCRAFT: a memory budget in [0, 1], the fraction of the bytes a plan without
//     recomputation saves. Plans come from one fixed sequence, from no recomputation to the
//     most, built greedily by bytes freed per second of recomputation; the budget picks the
//     first plan of the sequence that fits, so a smaller budget never saves more bytes.
//   - AUTOSEARCH: a budget in bytes of simulated activation peak (forward, then a backward that
//     recomputes just in time). Starts from the plan with the fewest saved bytes that keeps
//     compute-bound outputs (a minimum cut, capacities from bytes) and saves back the
//     costliest recomputations that fit a peak (knapsacks at 13 peaks from the cut's to the
//     no-recompute plan's). Those, the heuristic plan and the fewest-bytes cut are seeds:
//     each is also improved by switching single nodes between saved and recomputed while
//     that lowers the predicted step cost (step_seconds) within the seed's own simulated
//     peak. Of the seeds, their improvements and the HANDCRAFT sequence, the plan with the
//     lowest predicted cost whose simulated peak fits the budget is chosen; the candidates do
//     not depend on the budget.
// Random ops are never recomputed: their outputs are saved.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "magi/ir/graph.h"
#include "magi/ir/sym_expr.h"

namespace magi::passes {

enum class RecomputePolicy : uint8_t { kHeuristic, kHandcraft, kAutosearch };

/// The device the cost model prices recomputation for: time of an op = max(FLOPs / flops,
/// bytes moved / bandwidth). Defaults: an H100 SXM in bf16.
struct Roofline {
  double flops_per_second = 989e12;
  double bytes_per_second = 3.35e12;
};

struct RecomputeOptions {
  RecomputePolicy policy = RecomputePolicy::kHeuristic;
  double memory_budget = 0.5;     ///< HANDCRAFT: fraction in [0, 1]
  int64_t peak_budget_bytes = 0;  ///< AUTOSEARCH: simulated activation peak, > 0
  /// Operators to treat as compute-bound besides the op registry's ("ns::op[.overload]").
  std::vector<std::string> compute_sensitive_ops;
  /// Values of the symbolic dims, for counting bytes and FLOPs (PyTorch's size hints).
  ir::SymbolBindings size_hints;
  /// FX names of the forward nodes (as the partitioner sees them). Empty: every node that
  /// does not depend on a graph input named "tangents*".
  std::unordered_set<std::string> forward_names;
  /// The first this many graph outputs are the forward's; the rest are gradients.
  size_t num_forward_outputs = 0;
  /// group_query_attention runs on the forward and backward graphs: a copy that repeats
  /// grouped key/value heads for flash or cuDNN attention (is_grouped_attention_copy) is free
  /// and takes no memory, since the pass removes it wherever it is computed.
  bool grouped_attention = true;
  Roofline roofline;
};

struct RecomputePlan {
  RecomputePolicy policy = RecomputePolicy::kHeuristic;
  /// Forward nodes the backward recomputes (only those it needs), in forward order.
  std::vector<const ir::Node*> recomputed;
  /// The part of `recomputed` that does work (views, getitems and symbolic ints left out).
  std::vector<const ir::Node*> recomputed_ops;
  /// Forward nodes the plan does not recompute (the partitioner saves the outputs the backward
  /// reads), in forward order. Graph inputs are not listed.
  std::vector<const ir::Node*> kept;
  /// Forward values the backward reads as saved, in forward order.
  std::vector<const ir::Value*> saved;
  int64_t saved_bytes = 0;                   ///< storage of `saved`
  int64_t no_recompute_bytes = 0;            ///< storage a plan without recomputation saves
  int64_t recomputed_bytes = 0;              ///< storage the recomputed ops write (views excluded)
  int64_t predicted_peak_bytes = 0;          ///< simulated activation peak of forward + backward
  int64_t predicted_forward_peak_bytes = 0;  ///< the forward's part of it
  int64_t no_recompute_peak_bytes = 0;
  /// The lowest simulated peak among the plans the planner weighed (the heuristic plan and the
  /// minimum cuts, and AUTOSEARCH's candidates): about how low a peak budget can go.
  int64_t lowest_peak_bytes = 0;
  double recompute_seconds = 0;  ///< roofline time of `recomputed`
  /// What the plan is predicted to add to a step: the saved values' writes and reads and the
  /// recomputation, with memory-bound recomputation fused into the backward's kernels (the
  /// cost AUTOSEARCH minimises; see recompute_model.h).
  double step_seconds = 0;
  bool budget_met = true;  ///< false when no plan fits the budget (the smallest is used)
  std::string note;        ///< why, when the budget is not met

  /// FX names of `recomputed` (what the partitioner tags for recomputation).
  std::vector<std::string> recomputed_names() const;
  std::vector<std::string> saved_names() const;
  /// A readable report: policy, bytes saved / recomputed / of the no-recompute plan, the
  /// predicted peak, and the saved and recomputed values with their sizes.
  std::string report() const;
};

const char* recompute_policy_name(RecomputePolicy policy);
/// Parses "HEURISTIC", "HANDCRAFT" or "AUTOSEARCH"; UserError otherwise.
RecomputePolicy parse_recompute_policy(const std::string& name);

/// Plans recomputation for `joint` (not modified). UserError for a budget out of range.
RecomputePlan plan_recompute(const ir::Graph& joint, const RecomputeOptions& options);

}  // namespace magi::passes
