// Graph construction, use lists and removal.
#include "magi/ir/graph.h"

#include <algorithm>

#include "magi/common/error.h"

namespace magi::ir {

const char* node_kind_name(NodeKind kind) {
  switch (kind) {
#define MAGI_NODE_KIND_NAME(name, text) \
  case NodeKind::k##name:               \
    return text;
    MAGI_NODE_KINDS(MAGI_NODE_KIND_NAME)
#undef MAGI_NODE_KIND_NAME
  }
  return "?";
}

const char* sym_op_name(SymOp op) {
  switch (op) {
#define MAGI_SYM_OP_NAME(name, text, arity) \
  case SymOp::k##name:                      \
    return text;
    MAGI_SYM_OPS(MAGI_SYM_OP_NAME)
#undef MAGI_SYM_OP_NAME
  }
  return "?";
}

int sym_op_arity(SymOp op) {
  switch (op) {
#define MAGI_SYM_OP_ARITY(name, text, arity) \
  case SymOp::k##name:                       \
    return arity;
    MAGI_SYM_OPS(MAGI_SYM_OP_ARITY)
#undef MAGI_SYM_OP_ARITY
  }
  return -1;
}

ValueKind value_kind_of(const c10::TypePtr& type) {
  using c10::TypeKind;
  switch (type->kind()) {
    case TypeKind::TensorType:
      return ValueKind::kTensor;
    case TypeKind::IntType:
    case TypeKind::SymIntType:
      return ValueKind::kInt;
    case TypeKind::FloatType:
    case TypeKind::SymFloatType:
      return ValueKind::kFloat;
    case TypeKind::BoolType:
    case TypeKind::SymBoolType:
      return ValueKind::kBool;
    case TypeKind::NumberType:
      return ValueKind::kScalar;
    case TypeKind::NoneType:
      return ValueKind::kNone;
    case TypeKind::StringType:
      return ValueKind::kString;
    case TypeKind::ScalarTypeType:
      return ValueKind::kDtype;
    case TypeKind::DeviceObjType:
      return ValueKind::kDevice;
    case TypeKind::LayoutType:
      return ValueKind::kLayout;
    case TypeKind::MemoryFormatType:
      return ValueKind::kMemoryFormat;
    case TypeKind::OptionalType:
      return value_kind_of(type->castRaw<c10::OptionalType>()->getElementType());
    case TypeKind::ListType: {
      const auto& elem = type->castRaw<c10::ListType>()->getElementType();
      if (elem->kind() == TypeKind::OptionalType) {
        auto inner = value_kind_of(elem);
        return inner == ValueKind::kTensor ? ValueKind::kOptionalTensorList : ValueKind::kOther;
      }
      switch (value_kind_of(elem)) {
        case ValueKind::kInt:
          return ValueKind::kIntList;
        case ValueKind::kFloat:
          return ValueKind::kFloatList;
        case ValueKind::kBool:
          return ValueKind::kBoolList;
        case ValueKind::kTensor:
          return ValueKind::kTensorList;
        default:
          return ValueKind::kOther;
      }
    }
    default:
      return ValueKind::kOther;
  }
}

std::string Value::type_str() const {
  if (kind_ == ValueKind::kTensor && tensor_type_) return tensor_type_->str();
  return value_kind_name(kind_);
}

void Node::set_input(size_t i, Value* value) {
  MAGI_ASSERT(i < inputs_.size(), "input ", i, " of a node with ", inputs_.size());
  Value* old = inputs_[i];
  auto& users = old->users_;
  auto it = std::find(users.begin(), users.end(), this);
  MAGI_ASSERT(it != users.end(), "use list out of sync");
  users.erase(it);
  inputs_[i] = value;
  value->users_.push_back(this);
}

void Node::replace_input(const Value* from, Value* to) {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (inputs_[i] == from) set_input(i, to);
  }
}

const c10::OperatorHandle& Node::op() const {
  MAGI_ASSERT(op_.has_value(), "op() of a ", node_kind_name(kind_), " node");
  return *op_;
}

std::string Node::op_name() const {
  if (!is_operator()) {
    if (kind_ == NodeKind::kSymArith) return sym_op_name(sym_op_);
    if (kind_ == NodeKind::kCallPiece || kind_ == NodeKind::kFusion) {
      int64_t index = owner_->piece_index(piece_);
      return index < 0 ? std::string("piece_?") : "piece_" + std::to_string(index);
    }
    return node_kind_name(kind_);
  }
  const auto& name = op_->operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::string Graph::unique_name(const std::string& hint) {
  std::string base = hint.empty() ? "v" : hint;
  std::string name = base;
  while (used_names_.count(name)) name = base + "_" + std::to_string(++name_counter_);
  used_names_.insert(name);
  return name;
}

Node* Graph::create(NodeKind kind, std::vector<Value*> inputs, size_t num_outputs) {
  MAGI_CHECK(output_node_ == nullptr || insert_before_ != nullptr,
             "cannot append a node after the graph's Output node");
  auto node = std::unique_ptr<Node>(new Node(this, kind));
  Node* raw = node.get();
  for (Value* v : inputs) {
    MAGI_ASSERT(v != nullptr, "null input to a ", node_kind_name(kind), " node");
    v->users_.push_back(raw);
  }
  raw->inputs_ = std::move(inputs);
  for (size_t i = 0; i < num_outputs; ++i) {
    auto value = std::unique_ptr<Value>(new Value(this, raw, i));
    // Every value is named from birth ("v12"), so printed graphs and messages never show a
    // bare "%"; add_input and importers rename values after what they stand for.
    if (kind != NodeKind::kInput) value->name_ = unique_name("v" + std::to_string(values_.size()));
    raw->outputs_.push_back(value.get());
    values_.push_back(std::move(value));
  }
  if (insert_before_ != nullptr) {
    auto it = std::find_if(nodes_.begin(), nodes_.end(),
                           [&](const auto& n) { return n.get() == insert_before_; });
    MAGI_ASSERT(it != nodes_.end(), "insert point is not in this graph");
    nodes_.insert(it, std::move(node));
  } else {
    nodes_.push_back(std::move(node));
  }
  return raw;
}

Value* Graph::add_input(const std::string& name, ValueKind kind) {
  Node* node = create(NodeKind::kInput, {}, 1);
  Value* v = node->output();
  v->set_name(unique_name(name));
  v->set_kind(kind);
  node->provenance().fx_name = name;
  inputs_.push_back(v);
  return v;
}

Value* Graph::add_tensor_input(const std::string& name, TensorType type) {
  Value* v = add_input(name, ValueKind::kTensor);
  v->set_tensor_type(std::move(type));
  return v;
}

Value* Graph::add_constant(c10::IValue value, ValueKind kind) {
  Node* node = create(NodeKind::kConstant, {}, 1);
  node->constant_ = std::move(value);
  Value* v = node->output();
  v->set_kind(kind);
  if (node->constant_.isInt() && kind == ValueKind::kInt)
    v->set_sym(SymExpr(node->constant_.toInt()));
  return v;
}

Node* Graph::add_op(const c10::OperatorHandle& op, std::vector<Value*> inputs) {
  const auto& schema = op.schema();
  bool is_aten = schema.name().rfind("aten::", 0) == 0;
  Node* node = create(is_aten ? NodeKind::kAtenOp : NodeKind::kCustomOp, std::move(inputs),
                      schema.returns().size());
  node->op_ = op;
  for (size_t i = 0; i < schema.returns().size(); ++i) {
    node->outputs_[i]->set_kind(value_kind_of(schema.returns()[i].real_type()));
  }
  return node;
}

Node* Graph::add_sym(SymOp op, std::vector<Value*> inputs) {
  Node* node = create(NodeKind::kSymArith, std::move(inputs), 1);
  node->sym_op_ = op;
  ValueKind kind = ValueKind::kInt;
  switch (op) {
    case SymOp::kEq:
    case SymOp::kNe:
    case SymOp::kLt:
    case SymOp::kLe:
    case SymOp::kGt:
    case SymOp::kGe:
      kind = ValueKind::kBool;
      break;
    case SymOp::kTrueDiv:
      kind = ValueKind::kFloat;
      break;
    default:
      break;
  }
  node->output()->set_kind(kind);
  return node;
}

Node* Graph::add_getitem(Value* list, int64_t index) {
  Node* node = create(NodeKind::kGetItem, {list}, 1);
  node->item_index_ = index;
  ValueKind kind = ValueKind::kOther;
  switch (list->kind()) {
    case ValueKind::kTensorList:
    case ValueKind::kOptionalTensorList:
      kind = ValueKind::kTensor;
      break;
    case ValueKind::kIntList:
      kind = ValueKind::kInt;
      break;
    case ValueKind::kFloatList:
      kind = ValueKind::kFloat;
      break;
    case ValueKind::kBoolList:
      kind = ValueKind::kBool;
      break;
    default:
      break;
  }
  node->output()->set_kind(kind);
  return node;
}

Node* Graph::add_list(ValueKind list_kind, std::vector<Value*> items) {
  MAGI_ASSERT(is_list_kind(list_kind), value_kind_name(list_kind), " is not a list kind");
  Node* node = create(NodeKind::kMakeList, std::move(items), 1);
  node->output()->set_kind(list_kind);
  return node;
}

Graph* Graph::add_piece(std::unique_ptr<Graph> piece) {
  MAGI_ASSERT(piece != nullptr && piece.get() != this, "add_piece() of a null or self graph");
  pieces_.push_back(std::move(piece));
  return pieces_.back().get();
}

Node* Graph::add_fusion(Graph* group, std::vector<Value*> inputs) {
  Node* node = add_call_piece(group, std::move(inputs));
  node->kind_ = NodeKind::kFusion;
  return node;
}

void Graph::move_before(Node* node, Node* before) {
  auto find = [&](const Node* n) {
    return std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& p) { return p.get() == n; });
  };
  auto it = find(node);
  MAGI_ASSERT(it != nodes_.end(), "move_before() of a node of another graph");
  std::unique_ptr<Node> owned = std::move(*it);
  nodes_.erase(it);
  auto pos = before ? find(before) : (output_node_ ? find(output_node_) : nodes_.end());
  MAGI_ASSERT(before == nullptr || pos != nodes_.end(), "move_before() target not in this graph");
  nodes_.insert(pos, std::move(owned));
}

Node* Graph::add_call_piece(Graph* piece, std::vector<Value*> inputs) {
  MAGI_ASSERT(piece_index(piece) >= 0, "add_call_piece() of a piece this graph does not own");
  Node* node = create(NodeKind::kCallPiece, std::move(inputs), piece->outputs().size());
  node->piece_ = piece;
  for (size_t i = 0; i < piece->outputs().size(); ++i) {
    const Value* result = piece->outputs()[i];
    Value* out = node->outputs_[i];
    out->set_kind(result->kind());
    if (result->tensor_type()) out->set_tensor_type(*result->tensor_type());
    if (result->sym()) out->set_sym(*result->sym());
  }
  return node;
}

Node* Graph::clone_node(const Node& node, std::vector<Value*> inputs) {
  MAGI_ASSERT(node.kind() != NodeKind::kInput && node.kind() != NodeKind::kOutput,
              "clone_node() of an ", node_kind_name(node.kind()),
              " node; use add_input / set_outputs");
  Node* copy = create(node.kind(), std::move(inputs), node.outputs().size());
  copy->op_ = node.op_;
  copy->sym_op_ = node.sym_op_;
  copy->item_index_ = node.item_index_;
  copy->constant_ = node.constant_;
  copy->piece_ = node.piece_;
  copy->chunk_rows_ = node.chunk_rows_;
  copy->chunked_inputs_ = node.chunked_inputs_;
  copy->provenance_ = node.provenance_;
  for (size_t i = 0; i < node.outputs().size(); ++i) {
    const Value* from = node.outputs()[i];
    Value* to = copy->outputs_[i];
    to->set_name(unique_name(from->name()));
    to->set_kind(from->kind());
    if (from->tensor_type()) to->set_tensor_type(*from->tensor_type());
    if (from->sym()) to->set_sym(*from->sym());
  }
  return copy;
}

Node* Graph::set_outputs(std::vector<Value*> outputs) {
  MAGI_CHECK(output_node_ == nullptr, "the graph already has an Output node");
  Node* saved = insert_before_;
  insert_before_ = nullptr;
  Node* node = create(NodeKind::kOutput, std::move(outputs), 0);
  insert_before_ = saved;
  output_node_ = node;
  return node;
}

void Graph::erase(Node* node) {
  MAGI_ASSERT(node->owner() == this, "erase() of a node of another graph");
  for (Value* out : node->outputs()) {
    MAGI_ASSERT(out->users().empty(), "erase() of ", node->op_name(), " whose output ", out->name(),
                " is still used");
  }
  MAGI_ASSERT(node->kind() != NodeKind::kInput, "graph inputs cannot be erased");
  for (Value* in : node->inputs_) {
    auto& users = in->users_;
    users.erase(std::find(users.begin(), users.end(), node));
  }
  if (node == output_node_) output_node_ = nullptr;
  if (node == insert_before_) insert_before_ = nullptr;
  for (Value* out : node->outputs_) {
    values_.erase(std::find_if(values_.begin(), values_.end(),
                               [&](const auto& v) { return v.get() == out; }));
  }
  nodes_.erase(
      std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.get() == node; }));
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_) out.push_back(n.get());
  return out;
}

const std::vector<Value*>& Graph::outputs() const {
  static const std::vector<Value*> kEmpty;
  return output_node_ ? output_node_->inputs() : kEmpty;
}

std::vector<Graph*> Graph::pieces() const {
  std::vector<Graph*> out;
  out.reserve(pieces_.size());
  for (const auto& p : pieces_) out.push_back(p.get());
  return out;
}

int64_t Graph::piece_index(const Graph* piece) const {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (pieces_[i].get() == piece) return static_cast<int64_t>(i);
  }
  return -1;
}

bool Graph::owns(const Node* node) const {
  return std::any_of(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.get() == node; });
}

bool Graph::owns(const Value* value) const {
  return std::any_of(values_.begin(), values_.end(),
                     [&](const auto& v) { return v.get() == value; });
}

}  // namespace magi::ir
