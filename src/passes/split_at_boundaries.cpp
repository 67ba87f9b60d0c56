// split_at_boundaries: cut the graph into pieces around calls of boundary operators.
//
// A boundary is an operator the compiler must not see across: a FlashAttention build, an MoE
// router, anything registered with is_subgraph_boundary=True (ir::OpRegistry) or named in the
// config's splitting_ops. The nodes between two boundaries (in execution order) become one
// piece: a graph whose inputs are the values it reads from outside (graph inputs, boundary
// results, earlier pieces' results; in order of first use) and whose outputs are the values it
// defines that anything outside reads (in order of definition). Constants are copied into each
// piece that reads them. The graph keeps its inputs, its Output node, the boundary calls and a
// CallPiece node where each piece's nodes used to end, so the original order is kept.
// Structurally identical pieces (ir::structural_key) are stored once and called several times:
// that is what makes the repeated layers of a transformer compile once.
//
// Requires: a verified graph without pieces. Guarantees: a verified graph computing the same
// outputs, whose non-constant nodes are inputs, boundary calls, piece calls and the Output
// node. Returns false (and changes nothing) when the graph has no boundary call, no node to
// put in a piece, or pieces already.
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "magi/common/log.h"
#include "magi/ir/op_registry.h"
#include "magi/ir/structural_hash.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::Value;

// Does the dispatcher know an operator of this canonical name (any overload when none given)?
bool dispatcher_knows(const std::string& canonical) {
  auto& dispatcher = c10::Dispatcher::singleton();
  auto dot = canonical.find('.', canonical.find("::") + 2);
  std::string name = canonical.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : canonical.substr(dot + 1);
  if (dispatcher.findSchema({name, overload}).has_value()) return true;
  if (!overload.empty()) return false;
  for (const auto& op : dispatcher.getAllOpNames()) {
    if (op.name == name) return true;
  }
  return false;
}

// Logs a warning for `name` the first time this process sees it.
void warn_once(const std::string& name, const std::string& why) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(name).second) return;
  }
  MAGI_LOG_WARN("splitting_ops: ignoring '", name, "': ", why);
}

// Which calls are boundaries: registry flags, plus the names in splitting_ops.
class BoundaryMatcher {
 public:
  BoundaryMatcher(const std::vector<std::string>& splitting_ops, bool warn) {
    for (const auto& raw : splitting_ops) {
      std::string name;
      try {
        name = ir::canonical_op_name(raw);
      } catch (const UserError& e) {
        if (warn) warn_once(raw, e.what());
        continue;
      }
      if (warn && !dispatcher_knows(name)) {
        warn_once(raw,
                  "no operator of that name is registered (register it with "
                  "magi_register_custom_op or torch.library before compiling)");
      }
      names_.insert(name);
    }
  }

  bool operator()(const Node& node) const {
    if (!node.is_operator()) return false;
    if (ir::is_subgraph_boundary(node)) return true;
    if (names_.empty()) return false;
    const auto& name = node.op().operator_name();
    return names_.count(name.name) > 0 ||
           (!name.overload_name.empty() && names_.count(name.name + "." + name.overload_name) > 0);
  }

 private:
  std::unordered_set<std::string> names_;
};

// Copies `segment` (nodes of `graph`, in order) into a new piece graph. `call_inputs` receives
// the outside values the piece reads, `exported` the segment's values read outside it.
std::unique_ptr<Graph> build_piece(const std::vector<Node*>& segment,
                                   const std::unordered_set<const Node*>& in_segment,
                                   std::vector<Value*>& call_inputs,
                                   std::vector<Value*>& exported) {
  auto piece = std::make_unique<Graph>();
  std::unordered_map<const Value*, Value*> inside;
  auto map_operand = [&](Value* v) -> Value* {
    if (auto it = inside.find(v); it != inside.end()) return it->second;
    Value* mapped;
    if (v->producer()->kind() == NodeKind::kConstant) {
      mapped = piece->clone_node(*v->producer(), {})->output();
    } else {
      mapped = piece->add_input(v->name(), v->kind());
      if (v->tensor_type()) mapped->set_tensor_type(*v->tensor_type());
      if (v->sym()) mapped->set_sym(*v->sym());
      call_inputs.push_back(v);
    }
    inside[v] = mapped;
    return mapped;
  };
  for (Node* node : segment) {
    std::vector<Value*> operands;
    for (Value* v : node->inputs()) operands.push_back(map_operand(v));
    Node* copy = piece->clone_node(*node, std::move(operands));
    for (size_t i = 0; i < node->outputs().size(); ++i) inside[node->output(i)] = copy->output(i);
  }
  std::vector<Value*> results;
  for (Node* node : segment) {
    for (Value* out : node->outputs()) {
      for (const Node* user : out->users()) {
        if (!in_segment.count(user)) {
          exported.push_back(out);
          results.push_back(inside.at(out));
          break;
        }
      }
    }
  }
  piece->set_outputs(std::move(results));
  return piece;
}

// Points every use of `from` outside `in_segment` at `to`.
void replace_outside_uses(Value* from, Value* to,
                          const std::unordered_set<const Node*>& in_segment) {
  std::vector<Node*> users = from->users();
  for (Node* user : users) {
    if (!in_segment.count(user)) user->replace_input(from, to);
  }
}

}  // namespace

bool is_boundary_call(const ir::Node& node, const std::vector<std::string>& splitting_ops) {
  return BoundaryMatcher(splitting_ops, /*warn=*/false)(node);
}

bool split_at_boundaries(ir::Graph& graph, const std::vector<std::string>& splitting_ops) {
  if (graph.num_pieces() > 0) return false;
  BoundaryMatcher is_boundary(splitting_ops, /*warn=*/true);

  // Segment the nodes: everything between two boundaries (inputs, constants and the Output
  // node stay where they are).
  std::vector<Node*> boundaries;
  std::vector<std::vector<Node*>> segments(1);
  std::vector<Node*> used_constants;
  for (Node* node : graph.nodes()) {
    switch (node->kind()) {
      case NodeKind::kInput:
      case NodeKind::kOutput:
        continue;
      case NodeKind::kConstant:
        if (!node->output()->users().empty()) used_constants.push_back(node);
        continue;
      default:
        break;
    }
    if (is_boundary(*node)) {
      boundaries.push_back(node);
      segments.emplace_back();
    } else {
      segments.back().push_back(node);
    }
  }
  if (boundaries.empty()) return false;

  std::unordered_map<std::string, Graph*> piece_of_key;
  size_t calls = 0;
  for (size_t k = 0; k < segments.size(); ++k) {
    const std::vector<Node*>& segment = segments[k];
    if (segment.empty()) continue;
    std::unordered_set<const Node*> in_segment(segment.begin(), segment.end());
    std::vector<Value*> call_inputs, exported;
    std::unique_ptr<Graph> piece = build_piece(segment, in_segment, call_inputs, exported);

    std::string key = ir::structural_key(*piece);
    auto [it, is_new] = piece_of_key.try_emplace(key, nullptr);
    if (is_new) it->second = graph.add_piece(std::move(piece));

    // The call goes where the segment ended: before the next boundary (or the Output node).
    graph.set_insert_point(k < boundaries.size() ? boundaries[k] : graph.output_node());
    Node* call = graph.add_call_piece(it->second, call_inputs);
    graph.set_insert_point(nullptr);
    auto& where = call->provenance();
    where.fx_name = segment.front()->provenance().fx_name;
    if (segment.size() > 1) where.fx_name += ".." + segment.back()->provenance().fx_name;
    where.source = segment.front()->provenance().source;
    for (size_t i = 0; i < exported.size(); ++i) {
      call->output(i)->set_name(exported[i]->name());  // the old value is erased below
      replace_outside_uses(exported[i], call->output(i), in_segment);
    }
    for (auto node = segment.rbegin(); node != segment.rend(); ++node) graph.erase(*node);
    ++calls;
  }
  for (Node* constant : used_constants) {
    if (constant->output()->users().empty()) graph.erase(constant);
  }
  MAGI_LOG_DEBUG("split_at_boundaries: ", boundaries.size(), " boundary calls, ", calls,
                 " piece calls, ", graph.num_pieces(), " unique pieces");
  return calls > 0;
}

}  // namespace magi::passes
