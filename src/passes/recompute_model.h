// Internal to the recompute planner (plan_recompute.cpp): the joint graph seen as forward
// nodes with a class, a roofline cost and the bytes they write; what a plan saves (closure from
// the backward's needs), its simulated activation peak, and the minimum cut of saved bytes.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "magi/ir/graph.h"
#include "magi/passes/plan_recompute.h"

namespace magi::passes::recompute {

enum class OpKind : uint8_t {
  kFree,          ///< views, lists, getitems, symbolic ints, constants: no bytes, no time
  kCheap,         ///< pointwise, reductions, norms: memory-bound, recomputable
  kComputeBound,  ///< matmul, convolution, attention, compute-sensitive custom ops
  kRandom,        ///< random ops: never recomputed
  kImpure,        ///< writes an argument or returns nothing: never recomputed
};

const char* op_kind_name(OpKind kind);

/// A set of forward nodes to recompute, by forward index.
using NodeSet = std::vector<char>;

struct Evaluation {
  NodeSet recomputed;       ///< nodes of the plan the backward needs
  std::vector<int> saved;   ///< value ids the backward reads as saved, in forward order
  int64_t saved_bytes = 0;  ///< distinct storage of `saved`
  double seconds = 0;       ///< roofline time of `recomputed`
};

class JointModel {
 public:
  JointModel(const ir::Graph& joint, const RecomputeOptions& options);

  size_t size() const { return nodes_.size(); }
  const ir::Node* node(size_t i) const { return nodes_[i]; }
  OpKind kind(size_t i) const { return kinds_[i]; }
  double seconds(size_t i) const { return seconds_[i]; }
  int64_t own_bytes(size_t i) const { return own_bytes_[i]; }
  bool recomputable(size_t i) const {
    return kinds_[i] != OpKind::kRandom && kinds_[i] != OpKind::kImpure;
  }
  /// Value ids node `i` reads (lists read through, constants left out).
  const std::vector<int>& inputs(size_t i) const { return node_inputs_[i]; }
  /// A cast to a narrower dtype (what HEURISTIC pushes saving down to).
  bool is_narrowing_cast(size_t i) const { return narrowing_[i]; }
  const ir::Value* value(int id) const { return values_[id]; }
  int64_t value_bytes(int id) const { return value_bytes_[id]; }
  int root(int id) const { return root_[id]; }
  /// Forward index of the node that makes value `id`; -1 for graph inputs and values made
  /// outside the forward.
  int producer(int id) const { return producer_[id]; }

  /// The plan with only free nodes recomputed (no recomputation).
  NodeSet no_recompute() const;
  Evaluation evaluate(const NodeSet& plan) const;
  /// Predicted seconds a plan adds to the step in memory traffic and recomputed FLOPs, for
  /// ranking plans (AUTOSEARCH). Memory-bound recomputation runs inside the backward's fused
  /// kernels, so it costs only the values it must write for a compute-bound reader in the
  /// backward or in the recomputation (a matmul's operand: written, then read) and the graph
  /// inputs it reads. A saved value costs its read
  /// in the backward, and its write in the forward unless the forward writes it anyway (it is
  /// a memory-bound op's output that only memory-bound forward ops read, which fusion keeps in
  /// registers). Recomputed compute-bound ops cost their roofline time.
  double step_seconds(const Evaluation& eval) const;
  /// Simulated activation peak: the forward, then the backward with each recomputed node
  /// run just before its first use. Graph inputs are not counted.
  /// `forward_peak`, when given, receives the forward's part.
  int64_t simulate_peak(const Evaluation& eval, int64_t* forward_peak = nullptr) const;
  /// The plan saving the fewest bytes, with random, impure and (unless allowed) compute-bound
  /// nodes kept: a minimum cut between the graph inputs and the backward's needs.
  NodeSet min_cut(bool allow_compute_bound) const;

 private:
  int id_of(const ir::Value* v) const;
  int64_t bytes_of(const ir::Value* v) const;

  const RecomputeOptions& options_;
  std::vector<const ir::Node*> nodes_;  // forward nodes in order
  std::vector<OpKind> kinds_;
  std::vector<double> seconds_;
  std::vector<int64_t> own_bytes_;
  std::vector<char> narrowing_;
  std::vector<std::vector<int>> node_inputs_;   // value ids each forward node reads
  std::vector<std::vector<int>> node_outputs_;  // value ids each forward node makes

  std::unordered_map<const ir::Value*, int> ids_;
  std::vector<const ir::Value*> values_;
  std::vector<int64_t> value_bytes_;  // own storage; 0 for aliases, inputs, non-tensors
  std::vector<int> root_;             // the value whose storage a value uses
  std::vector<int> producer_;
  std::vector<char> is_graph_output_;  // gradients (kept to the end of the backward)
  // Per root: the forward writes it to memory anyway (a forward output, or read by a forward op
  // that is not memory-bound); a compute-bound backward op reads it.
  std::vector<char> materialized_;
  std::vector<char> read_by_compute_bound_backward_;

  std::vector<int> backward_needs_;  // forward-made value ids read by the backward
  // The backward, in order: each node's input ids and output ids.
  std::vector<std::vector<int>> bw_inputs_;
  std::vector<std::vector<int>> bw_outputs_;
  std::vector<int64_t> bw_workspace_;  // bytes an op allocates for itself while it runs
  std::vector<int> forward_outputs_;   // value ids the forward returns
};

}  // namespace magi::passes::recompute
