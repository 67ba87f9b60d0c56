// Values and nodes of the graph IR.
//
// A Graph (graph.h) owns every Node and Value; everything else holds raw pointers. A Node
// has an ordered list of input Values and produces zero or more output Values. Values are
// SSA: each has exactly one producer, and uses are tracked so passes can ask who reads a
// value. Operator nodes are normalised at construction: their inputs correspond one to one
// to the operator schema's arguments (defaults filled in as Constant nodes), and their
// outputs to its returns. A CallPiece node's inputs and outputs correspond one to one to its
// piece's inputs and outputs. Every node remembers where it came from (Provenance) so errors and
// dumps can point at the user's model.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "magi/ir/node_kinds.h"
#include "magi/ir/types.h"

namespace magi::ir {

class Graph;
class Node;

/// An SSA value: one producer, any number of users.
class Value {
 public:
  Node* producer() const { return producer_; }
  size_t index() const { return index_; }  ///< position in the producer's outputs
  Graph* owner() const { return owner_; }
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  ValueKind kind() const { return kind_; }
  void set_kind(ValueKind kind) { kind_ = kind; }
  /// Tensor values: dtype, device, symbolic sizes and strides (absent when unknown).
  const std::optional<TensorType>& tensor_type() const { return tensor_type_; }
  void set_tensor_type(TensorType t) { tensor_type_ = std::move(t); }
  /// Integer values whose symbolic value is known (e.g. `s0*4096`).
  const std::optional<SymExpr>& sym() const { return sym_; }
  void set_sym(SymExpr e) { sym_ = std::move(e); }

  /// Nodes reading this value, once per use (a node reading it twice appears twice).
  const std::vector<Node*>& users() const { return users_; }
  /// "f32[s0, 16]", "int = s0", "Tensor[]", ...
  std::string type_str() const;

 private:
  friend class Graph;
  friend class Node;
  Value(Graph* owner, Node* producer, size_t index)
      : owner_(owner), producer_(producer), index_(index) {}

  Graph* owner_;
  Node* producer_;
  size_t index_;
  std::string name_;
  ValueKind kind_ = ValueKind::kOther;
  std::optional<TensorType> tensor_type_;
  std::optional<SymExpr> sym_;
  std::vector<Node*> users_;
};

/// Where a node came from in the user's program.
struct Provenance {
  std::string fx_name;      ///< name of the FX node it was imported from
  std::string source;       ///< "model.py:42 in forward", empty when unknown
  std::string source_code;  ///< the line of user code, when known
};

class Node {
 public:
  NodeKind kind() const { return kind_; }
  Graph* owner() const { return owner_; }
  const std::vector<Value*>& inputs() const { return inputs_; }
  Value* input(size_t i) const { return inputs_.at(i); }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* output(size_t i = 0) const { return outputs_.at(i); }
  /// Replaces input i, keeping use lists right.
  void set_input(size_t i, Value* value);
  /// Replaces every input that is `from` with `to`.
  void replace_input(const Value* from, Value* to);

  bool is_operator() const { return kind_ == NodeKind::kAtenOp || kind_ == NodeKind::kCustomOp; }
  /// AtenOp / CustomOp: the dispatcher handle and its schema.
  const c10::OperatorHandle& op() const;
  const c10::FunctionSchema& schema() const { return op().schema(); }
  /// "aten::add.Tensor" for operators, the kind's name otherwise.
  std::string op_name() const;

  SymOp sym_op() const { return sym_op_; }                   ///< SymArith only
  int64_t item_index() const { return item_index_; }         ///< GetItem only
  const c10::IValue& constant() const { return constant_; }  ///< Constant only
  /// CallPiece only: the piece it runs, owned by this node's graph (several calls may share it).
  Graph* piece() const { return piece_; }
  /// CallPiece only: when above 0, the call runs its piece over chunks of at most this many rows
  /// (passes/chunk_rows.cpp): the inputs marked in chunked_inputs() are row tensors [rows, ...]
  /// cut along dim 0, the others are passed whole, and every output is a row tensor the chunks'
  /// results are stacked into. A call with no more rows than that runs the piece once.
  int64_t chunk_rows() const { return chunk_rows_; }
  const std::vector<bool>& chunked_inputs() const { return chunked_inputs_; }
  void set_row_chunks(int64_t rows, std::vector<bool> chunked_inputs) {
    chunk_rows_ = rows;
    chunked_inputs_ = std::move(chunked_inputs);
  }

  Provenance& provenance() { return provenance_; }
  const Provenance& provenance() const { return provenance_; }

 private:
  friend class Graph;
  Node(Graph* owner, NodeKind kind) : owner_(owner), kind_(kind) {}

  Graph* owner_;
  NodeKind kind_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  std::optional<c10::OperatorHandle> op_;
  SymOp sym_op_ = SymOp::kAdd;
  int64_t item_index_ = 0;
  c10::IValue constant_;
  Graph* piece_ = nullptr;
  int64_t chunk_rows_ = 0;
  std::vector<bool> chunked_inputs_;
  Provenance provenance_;
};

}  // namespace magi::ir
