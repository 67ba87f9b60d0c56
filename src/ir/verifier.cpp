// Graph verifier: ownership, order, SSA, arity, the Output node, and pieces (recursively).
#include "magi/ir/verifier.h"

#include <unordered_map>
#include <unordered_set>

#include "magi/common/error.h"
#include "magi/ir/printer.h"

namespace magi::ir {
namespace {

std::string describe(const Node* node) {
  std::string s = node->op_name();
  if (!node->outputs().empty() && !node->output()->name().empty()) {
    s = "%" + node->output()->name() + " = " + s;
  }
  if (!node->provenance().fx_name.empty())
    s += " (from FX node " + node->provenance().fx_name + ")";
  return s;
}

// Does a value of kind `have` fit a schema argument of type `want`?
bool fits(ValueKind have, const c10::TypePtr& want) {
  if (want->kind() == c10::TypeKind::OptionalType) {
    if (have == ValueKind::kNone) return true;
    return fits(have, want->castRaw<c10::OptionalType>()->getElementType());
  }
  ValueKind expected = value_kind_of(want);
  if (expected == ValueKind::kOther || have == ValueKind::kOther) return true;
  if (expected == have) return true;
  if (expected == ValueKind::kScalar) {
    return have == ValueKind::kInt || have == ValueKind::kFloat || have == ValueKind::kBool;
  }
  if (expected == ValueKind::kFloat) return have == ValueKind::kInt;  // ints promote
  // The dispatcher passes dtypes, layouts and memory formats as ints (the schema's fake type).
  if (expected == ValueKind::kDtype || expected == ValueKind::kLayout ||
      expected == ValueKind::kMemoryFormat) {
    return have == ValueKind::kInt;
  }
  if (expected == ValueKind::kOptionalTensorList) return have == ValueKind::kTensorList;
  return false;
}

}  // namespace

std::vector<std::string> verify_errors(const Graph& graph) {
  std::vector<std::string> errors;
  auto fail = [&](const Node* node, const std::string& what) {
    errors.push_back(describe(node) + ": " + what);
  };

  std::unordered_set<const Value*> owned_values;
  std::unordered_set<const Node*> owned_nodes;
  for (Node* node : graph.nodes()) {
    owned_nodes.insert(node);
    for (Value* v : node->outputs()) owned_values.insert(v);
  }

  std::unordered_set<const Value*> defined;
  size_t output_nodes = 0;
  std::vector<Node*> nodes = graph.nodes();
  for (size_t position = 0; position < nodes.size(); ++position) {
    Node* node = nodes[position];
    if (node->owner() != &graph) fail(node, "node records another graph as its owner");

    for (size_t i = 0; i < node->inputs().size(); ++i) {
      const Value* in = node->inputs()[i];
      if (!owned_values.count(in)) {
        fail(node, "input " + std::to_string(i) + " is a value of another graph");
        continue;
      }
      if (!defined.count(in)) {
        fail(node,
             "input " + std::to_string(i) + " (%" + in->name() + ") is used before it is produced");
      }
    }

    for (size_t i = 0; i < node->outputs().size(); ++i) {
      const Value* out = node->outputs()[i];
      if (out->producer() != node || out->index() != i) {
        fail(node, "output " + std::to_string(i) + " does not record this node at index " +
                       std::to_string(i) + " as its producer");
      }
      if (!defined.insert(out).second) fail(node, "output " + std::to_string(i) + " defined twice");
    }

    auto expect_arity = [&](size_t in, size_t out) {
      if (node->inputs().size() != in) {
        fail(node, "has " + std::to_string(node->inputs().size()) + " inputs, expected " +
                       std::to_string(in));
      }
      if (node->outputs().size() != out) {
        fail(node, "has " + std::to_string(node->outputs().size()) + " outputs, expected " +
                       std::to_string(out));
      }
    };

    switch (node->kind()) {
      case NodeKind::kInput:
      case NodeKind::kConstant:
        expect_arity(0, 1);
        break;
      case NodeKind::kOutput:
        ++output_nodes;
        if (!node->outputs().empty()) fail(node, "the Output node produces values");
        if (position + 1 != nodes.size()) fail(node, "the Output node is not the last node");
        if (graph.output_node() != node) fail(node, "is not the graph's registered Output node");
        break;
      case NodeKind::kAtenOp:
      case NodeKind::kCustomOp: {
        const auto& schema = node->schema();
        expect_arity(schema.arguments().size(), schema.returns().size());
        if (node->inputs().size() == schema.arguments().size()) {
          for (size_t i = 0; i < schema.arguments().size(); ++i) {
            const auto& arg = schema.arguments()[i];
            ValueKind have = node->inputs()[i]->kind();
            if (!fits(have, arg.real_type())) {
              fail(node, "argument '" + arg.name() + "' expects " + arg.real_type()->str() +
                             " but gets a " + value_kind_name(have));
            }
          }
        }
        break;
      }
      case NodeKind::kSymArith:
        expect_arity(sym_op_arity(node->sym_op()), 1);
        break;
      case NodeKind::kGetItem:
        expect_arity(1, 1);
        if (!node->inputs().empty() && !is_list_kind(node->input(0)->kind())) {
          fail(node, std::string("getitem of a ") + value_kind_name(node->input(0)->kind()) +
                         ", which is not a list");
        }
        break;
      case NodeKind::kMakeList:
        if (node->outputs().size() != 1 || !is_list_kind(node->output()->kind())) {
          fail(node, "a list node must produce one list value");
        }
        break;
      case NodeKind::kCallPiece:
      case NodeKind::kFusion: {
        const Graph* piece = node->piece();
        if (piece == nullptr || graph.piece_index(piece) < 0) {
          fail(node, "calls a piece this graph does not own");
          break;
        }
        expect_arity(piece->inputs().size(), piece->outputs().size());
        for (size_t i = 0; i < node->inputs().size() && i < piece->inputs().size(); ++i) {
          ValueKind have = node->inputs()[i]->kind(), want = piece->inputs()[i]->kind();
          if (have != want && have != ValueKind::kOther && want != ValueKind::kOther) {
            fail(node, "input " + std::to_string(i) + " is a " + value_kind_name(have) +
                           " but the piece's input %" + piece->inputs()[i]->name() + " is a " +
                           value_kind_name(want));
          }
        }
        for (size_t i = 0; i < node->outputs().size() && i < piece->outputs().size(); ++i) {
          if (node->outputs()[i]->kind() != piece->outputs()[i]->kind()) {
            fail(node, "output " + std::to_string(i) + " is a " +
                           value_kind_name(node->outputs()[i]->kind()) +
                           " but the piece returns a " +
                           value_kind_name(piece->outputs()[i]->kind()));
          }
        }
        if (node->chunk_rows() > 0) {
          const auto& chunked = node->chunked_inputs();
          bool any = false;
          for (size_t i = 0; i < chunked.size() && i < node->inputs().size(); ++i) {
            if (!chunked[i]) continue;
            any = true;
            if (node->inputs()[i]->kind() != ValueKind::kTensor) {
              fail(node, "chunked input " + std::to_string(i) + " is not a tensor");
            }
          }
          if (chunked.size() != node->inputs().size() || !any) {
            fail(node, "a call in row chunks must mark one flag per input, at least one set");
          }
          for (const Value* out : node->outputs()) {
            if (out->kind() != ValueKind::kTensor)
              fail(node, "a call in row chunks returns a non-tensor");
          }
          if (node->kind() != NodeKind::kCallPiece)
            fail(node, "only a piece call runs in row chunks");
        }
        break;
      }
    }

    // Use lists must mirror inputs.
    for (const Value* in : node->inputs()) {
      size_t as_input = 0, as_user = 0;
      for (const Value* x : node->inputs()) as_input += (x == in);
      for (const Node* u : in->users()) as_user += (u == node);
      if (as_input != as_user) fail(node, "use list of %" + in->name() + " is out of sync");
    }
  }
  if (output_nodes != 1) {
    errors.push_back("graph has " + std::to_string(output_nodes) + " Output nodes, expected 1");
  }
  std::vector<Graph*> pieces = graph.pieces();
  for (size_t i = 0; i < pieces.size(); ++i) {
    for (const auto& e : verify_errors(*pieces[i])) {
      errors.push_back("piece_" + std::to_string(i) + ": " + e);
    }
  }
  return errors;
}

void verify(const Graph& graph) {
  auto errors = verify_errors(graph);
  if (errors.empty()) return;
  std::string text;
  for (const auto& e : errors) text += "\n  " + e;
  MAGI_ASSERT(false, "graph verification failed:", text, "\ngraph:\n", to_string(graph));
}

}  // namespace magi::ir
