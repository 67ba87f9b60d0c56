// The graph IR: a Graph owns its Nodes (in execution order) and Values.
//
// Invariants the verifier (verifier.h) checks, and every pass must keep:
//   - ownership: every node and every value it touches belongs to this graph;
//   - order: a value is produced before any node that reads it;
//   - SSA: each value has exactly one producer, at the recorded output index;
//   - arity: operator nodes have one input per schema argument and one output per return;
//     symbolic ops, getitem and constants have their fixed arity;
//   - the Output node exists exactly once, last;
//   - pieces: a CallPiece node runs a piece this graph owns, with one input per piece input
//     and one output per piece output, and every piece is itself a valid graph.
//
// Pieces are the graphs between subgraph boundaries (passes/split_at_boundaries.cpp). The
// graph that calls them owns them; structurally identical pieces are stored once and called
// from several CallPiece nodes.
// Nodes are created through the Graph; creation appends (or inserts before a given node) and
// records uses, but checks nothing beyond the arguments' basic sanity, so a malformed graph
// can be built on purpose and rejected by the verifier.
#pragma once

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "magi/ir/node.h"

namespace magi::ir {

/// The ValueKind a schema argument or return of type `type` holds.
ValueKind value_kind_of(const c10::TypePtr& type);

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Appends an Input node producing one value.
  Value* add_input(const std::string& name, ValueKind kind);
  Value* add_tensor_input(const std::string& name, TensorType type);
  /// A literal. `kind` says how to read the IValue (an int IValue may be a dtype).
  Value* add_constant(c10::IValue value, ValueKind kind);
  /// An operator call with `num_outputs` outputs (kinds set by the caller, or from the
  /// schema's return types by default). Kind is AtenOp for the aten namespace, else CustomOp.
  Node* add_op(const c10::OperatorHandle& op, std::vector<Value*> inputs);
  Node* add_sym(SymOp op, std::vector<Value*> inputs);
  Node* add_getitem(Value* list, int64_t index);
  Node* add_list(ValueKind list_kind, std::vector<Value*> items);
  /// Takes ownership of a piece graph; returns it for add_call_piece.
  Graph* add_piece(std::unique_ptr<Graph> piece);
  /// A call of `piece` (owned by this graph). Outputs take the kinds, types and symbolic values
  /// of the piece's outputs.
  Node* add_call_piece(Graph* piece, std::vector<Value*> inputs);
  /// Like add_call_piece, for a fusion group: the executor runs `group` as one generated
  /// kernel (or, if code generation fails, op by op).
  Node* add_fusion(Graph* group, std::vector<Value*> inputs);
  /// Moves `node` to just before `before` (nullptr: to the end, before the Output node). The
  /// caller keeps the order valid; the verifier checks it.
  void move_before(Node* node, Node* before);
  /// A copy of `node` (from any graph) reading `inputs`: same kind, operator, constant, piece,
  /// provenance, and output names, kinds and types. A piece pointer is kept as is, so copying a
  /// CallPiece across graphs is the caller's business.
  Node* clone_node(const Node& node, std::vector<Value*> inputs);
  /// Appends the Output node. May be called once.
  Node* set_outputs(std::vector<Value*> outputs);

  /// Makes the next created node go before `node` instead of at the end (nullptr: the end).
  void set_insert_point(Node* node) { insert_before_ = node; }
  /// Removes a node whose outputs have no users.
  void erase(Node* node);

  /// Nodes in execution order.
  std::vector<Node*> nodes() const;
  size_t num_nodes() const { return nodes_.size(); }
  const std::vector<Value*>& inputs() const { return inputs_; }
  /// The Output node's inputs; empty before set_outputs.
  const std::vector<Value*>& outputs() const;
  Node* output_node() const { return output_node_; }

  /// Pieces owned by this graph, in the order they were added.
  std::vector<Graph*> pieces() const;
  size_t num_pieces() const { return pieces_.size(); }
  /// Position of `piece` in pieces(); -1 when this graph does not own it.
  int64_t piece_index(const Graph* piece) const;

  /// For the verifier: does this graph own the node / value?
  bool owns(const Node* node) const;
  bool owns(const Value* value) const;

  /// Names values that have none ("v12"), so printing is stable.
  std::string unique_name(const std::string& hint);

 private:
  Node* create(NodeKind kind, std::vector<Value*> inputs, size_t num_outputs);

  std::vector<std::unique_ptr<Node>> nodes_;  // execution order
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<Value*> inputs_;
  std::vector<std::unique_ptr<Graph>> pieces_;
  Node* output_node_ = nullptr;
  Node* insert_before_ = nullptr;
  size_t name_counter_ = 0;
  std::unordered_set<std::string> used_names_;
};

}  // namespace magi::ir
