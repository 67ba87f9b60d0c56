// Entry points of the individual passes. Each returns whether it changed the graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "magi/ir/graph.h"

namespace magi::passes {

/// Removes nodes none of whose outputs are used (operators without side effects, symbolic
/// arithmetic, constants, lists, getitems). Keeps inputs, the Output node, piece calls and
/// operators whose schema says they mutate an argument or have no return values (asserts,
/// in-place writes).
bool eliminate_dead_code(ir::Graph& graph);

/// Makes a node that computes what an earlier node computed (a pure ATen operator returning
/// tensors, a constant, a tensor list or a getitem of one, on the same inputs) read the earlier
/// node's results instead, and removes it: a model that builds its rotary tables or mask in
/// every layer builds them once. Leaves custom ops, nodes touching memory some op writes,
/// results the graph returns (or views of them), and repeats on the other side of a boundary
/// call (`splitting_ops` as split_at_boundaries takes them) from their first.
/// See src/passes/eliminate_common_subexpressions.cpp.
bool eliminate_common_subexpressions(ir::Graph& graph,
                                     const std::vector<std::string>& splitting_ops = {});

/// Gives an op that copies a tensor argument into its first argument's memory (index_put's
/// values, index_copy's source, copy_'s src, ...) a copy on that argument's device of the host
/// tensor constant it would copy each call (`mask[pos] = True` on a CUDA mask): no copy from
/// host memory per call, and none for CUDA graph capture to refuse.
/// See src/passes/constants_to_device.cpp.
bool constants_to_device(ir::Graph& graph);

/// Runs stretches of row-wise work (matmuls with weights, pointwise ops, norms, reshapes that
/// keep the rows) whose materialised intermediates need more bytes per row than their inputs and
/// outputs (a transformer's MLP) in chunks of at most `rows` rows: each such stretch becomes a
/// piece called in row chunks (ir::Node::chunk_rows) when it is long: a constant row count of at
/// least twice `rows`, or a symbolic one whose value in `size_hints` (the compiling call's) is
/// above `rows`. Recurses into pieces. `rows` 0: no change. See src/passes/chunk_rows.cpp.
bool chunk_rows(ir::Graph& graph, int64_t rows, const ir::SymbolBindings& size_hints = {});

/// Gives an attention call (SDPA and its CPU, memory-efficient and cuDNN forms) whose only used
/// output is the attention output is_causal instead of a mask the graph computes from token
/// positions alone when that mask is the causal one (Hugging Face models build it this way under
/// a trace), and drops a mask that keeps every entry; other masks stay. Each call with a mask is
/// logged at INFO and recorded with recognize_attention's decisions.
/// See src/passes/recognize_causal_masks.cpp.
bool recognize_causal_masks(ir::Graph& graph);

/// Hands CUDA flash and cuDNN attention calls whose key and value are repeated grouped-query
/// heads (repeat_interleave along dim 1, Hugging Face's repeat_kv) the unrepeated tensors;
/// both backends read grouped heads themselves. Forward calls whose logsumexp or RNG state is
/// used only at dropout 0; backward calls at dropout 0 whose key and value gradients are read
/// only through the sum over each group, which they then return themselves.
/// See src/passes/group_query_attention.cpp.
bool group_query_attention(ir::Graph& graph);

/// Makes a functional indexing update of a graph input (index_copy, index_put, scatter, ...)
/// that the graph writes back into that input (aten::copy_) the in-place update of the input
/// itself, when nothing else reads the input: a static KV cache then changes only the rows
/// written instead of being copied twice per call. Graphs with a call where
/// split_at_boundaries cuts (`splitting_ops` as there) are left as they are.
/// See src/passes/write_inputs_in_place.cpp.
bool write_inputs_in_place(ir::Graph& graph, const std::vector<std::string>& splitting_ops = {});

/// Is `node` the aten::clone of a repeat of grouped key/value heads that group_query_attention
/// removes: every reader of the repeat is a flash or cuDNN attention call (forward or backward)
/// at dropout 0, without a bias, reading it as its key or value, with both repeats alike, and
/// each backward's key and value gradients are read only through the group sums the pass
/// bypasses? The recompute planner takes such a copy as an alias of its source.
bool is_grouped_attention_copy(const ir::Node& node);

/// Cuts an unsplit graph at every call of a boundary operator (flagged in ir::OpRegistry, or
/// named in `splitting_ops`) into pieces that the graph owns and calls in the original order;
/// boundary calls stay in the graph between the calls. Structurally identical pieces are stored
/// once. Unknown names in `splitting_ops` are logged once and ignored.
bool split_at_boundaries(ir::Graph& graph, const std::vector<std::string>& splitting_ops = {});

/// Folds away ops that would cut a generated kernel in two without computing anything: an
/// expand of a value with size-1 dims that only elementwise ops read (they broadcast it), and a
/// detach that only ops read. Run by fuse_groups on each graph before grouping; does not
/// recurse into pieces. See src/passes/fold_broadcasts.cpp.
bool fold_broadcasts(ir::Graph& graph);

/// Groups chains of fusible ops (ir/op_info.h) with one index space into Fusion nodes, each
/// run as one generated kernel; recurses into pieces. See src/passes/fuse_groups.cpp.
bool fuse_groups(ir::Graph& graph);

/// The most tensor memory a lowered graph holds at once, and the node where it does.
struct ProgramPeak {
  int64_t bytes = 0;
  int64_t node = -1;  ///< index in graph.nodes(); -1: the inputs alone
  std::string where;  ///< that node's op and FX name
};

/// Simulates `graph` in node order as the executor runs it: each node allocates its new tensors
/// while everything it reads is alive, a piece call adds the piece's own peak, and a tensor is
/// freed after the last node reading it or a view of it; outputs stay. Inputs flagged in
/// `counted_inputs` (all when empty) are held from the start; the others cost nothing
/// (parameters). Sizes come from `size_hints`. See src/passes/program_peak.cpp.
ProgramPeak simulate_peak(const ir::Graph& graph, const ir::SymbolBindings& size_hints,
                          const std::vector<bool>& counted_inputs = {});

/// Is `node` a call where split_at_boundaries cuts?
bool is_boundary_call(const ir::Node& node, const std::vector<std::string>& splitting_ops = {});

}  // namespace magi::passes
