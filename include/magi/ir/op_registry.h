// What the compiler knows about operators beyond their schemas: whether an operator is a
// subgraph boundary (the graph is cut around its calls) and whether it is compute-sensitive
// (its outputs are worth saving rather than recomputing).
//
// Flags are keyed by operator name: "ns::op" applies to every overload, "ns::op.overload" to
// one (and wins over the name). magi_register_custom_op records its flags here; passes read
// them when a graph is compiled, not when a model is decorated, so an operator registered
// after the model was decorated still counts. The registry is process-wide and thread-safe.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace magi::ir {

class Node;

struct OpFlags {
  bool compute_sensitive = false;
  bool subgraph_boundary = false;

  bool operator==(const OpFlags& o) const {
    return compute_sensitive == o.compute_sensitive && subgraph_boundary == o.subgraph_boundary;
  }
};

/// The canonical spelling of an operator name: "ns::op" or "ns::op.overload". Accepts Python's
/// spellings too ("ns.op", "ns.op.overload", "torch.ops.ns.op.default"); ".default" is
/// dropped, since the default overload's name is empty. Throws UserError for a name without a
/// namespace.
std::string canonical_op_name(const std::string& name);

class OpRegistry {
 public:
  /// The registry that magi_register_custom_op writes and the pipeline reads.
  static OpRegistry& global();

  /// Records (replaces) the flags of `name` (any spelling canonical_op_name accepts).
  void set_flags(const std::string& name, OpFlags flags);
  /// Forgets `name`; returns whether it was registered.
  bool erase(const std::string& name);
  /// The flags registered under exactly this name, if any.
  std::optional<OpFlags> registered(const std::string& name) const;
  /// The flags that apply to operator `name` ("ns::op") with overload `overload` ("" for the
  /// default): the overload's entry, else the name's, else nullopt.
  std::optional<OpFlags> lookup(const std::string& name, const std::string& overload) const;
  /// Every entry, sorted by name.
  std::vector<std::pair<std::string, OpFlags>> entries() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, OpFlags> flags_;
};

/// ATen operators that are compute-sensitive without being registered: matmuls (mm, bmm,
/// addmm, baddbmm, matmul, linear, ...), the convolution family and the attention family
/// (scaled_dot_product_*, _flash_attention_*, _efficient_attention_*, cuDNN attention).
bool is_default_compute_sensitive(const std::string& name);

/// Is `node` an operator call whose outputs are expensive to recompute? Registered flags
/// first, then the ATen defaults. Non-operator nodes are never compute-sensitive.
bool is_compute_sensitive(const Node& node, const OpRegistry& registry = OpRegistry::global());

/// Is `node` a call of an operator registered as a subgraph boundary?
bool is_subgraph_boundary(const Node& node, const OpRegistry& registry = OpRegistry::global());

}  // namespace magi::ir
