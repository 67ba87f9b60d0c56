// The memory a lowered graph holds at its fullest, simulated in node order the way the executor
// runs it: each node's new tensors are allocated while all of its inputs are still alive (a
// fusion group's outputs beside all the tensors it reads, except those it writes over an input
// that dies there), and a tensor is freed after the last node that reads it or a view of it. The
// recompute planner predicts peaks on the joint graph, op by op; fusion changes when tensors are
// born and die, and this is what the compiled forward and backward will actually hold (passes.h).
#include <ATen/core/function_schema.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "magi/common/error.h"
#include "magi/common/log.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

class PeakSimulation {
 public:
  explicit PeakSimulation(const ir::SymbolBindings& hints) : hints_(hints) {}

  // Peak of `graph` above the memory it starts from. Inputs flagged in `counted` are held from
  // the start until their last use; the others (parameters, tensors the caller keeps) are not
  // counted. Outputs are held to the end.
  ProgramPeak run(const ir::Graph& graph, const std::vector<bool>& counted) {
    const auto nodes = graph.nodes();
    const auto& inputs = graph.inputs();
    MAGI_CHECK(counted.empty() || counted.size() == inputs.size(),
               "simulate_peak: ", counted.size(), " input flags for a graph of ", inputs.size(),
               " inputs");
    int64_t live = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ir::Value* v = inputs[i];
      root_[v] = v;
      graph_inputs_.insert(v);
      bytes_[v] = (counted.empty() || counted[i]) ? bytes_of(v) : 0;
      live += bytes_[v];
    }
    // Roots first: which storage each value uses. Then the last node reading each storage.
    // Input nodes' values are the inputs above; constants exist before the run.
    for (const ir::Node* n : nodes) {
      if (n->kind() == ir::NodeKind::kInput) continue;
      for (size_t k = 0; k < n->outputs().size(); ++k) {
        const ir::Value* out = n->outputs()[k];
        const ir::Value* root = out;
        if (!n->inputs().empty() && aliases_input(*n, k)) {
          const ir::Value* of = root_of(n->inputs()[0]);
          // An item of a list of new tensors (not views) is a tensor of its own.
          const bool fresh_items = n->kind() == ir::NodeKind::kGetItem && of == n->inputs()[0];
          if (!fresh_items) root = of;
        }
        root_[out] = root;
        if (root == out) bytes_[out] = n->kind() == ir::NodeKind::kConstant ? 0 : bytes_of(out);
      }
    }
    std::unordered_map<const ir::Value*, size_t> last_use;
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (const ir::Value* v : nodes[i]->outputs()) last_use[root_of(v)] = i;
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (const ir::Value* v : nodes[i]->inputs()) {
        auto& at = last_use[root_of(v)];
        at = std::max(at, i);
      }
    }
    for (const ir::Value* v : graph.outputs()) last_use[root_of(v)] = nodes.size();
    // A list holds its items until its own last reader (the executor keeps the list built).
    for (size_t i = nodes.size(); i-- > 0;) {
      if (nodes[i]->kind() != ir::NodeKind::kMakeList) continue;
      const size_t list_end = last_use[root_of(nodes[i]->output())];
      for (const ir::Value* item : nodes[i]->inputs()) {
        auto& at = last_use[root_of(item)];
        at = std::max(at, list_end);
      }
    }
    std::vector<std::vector<const ir::Value*>> dies(nodes.size());
    for (const auto& [root, at] : last_use) {
      if (at < nodes.size()) dies[at].push_back(root);
    }

    ProgramPeak result{live, -1, "the inputs"};
    for (size_t i = 0; i < nodes.size(); ++i) {
      const ir::Node* n = nodes[i];
      int64_t during = live;
      if (n->kind() == ir::NodeKind::kCallPiece) {
        // The piece's own tensors come and go inside the call, on top of what is live here.
        PeakSimulation inner(hints_);
        during += inner.run(*n->piece(), std::vector<bool>(n->piece()->inputs().size())).bytes;
      }
      if (n->kind() == ir::NodeKind::kFusion) {
        // Outputs written over inputs that die here take no memory of their own.
        for (const ir::Value* root : written_over(*n, i, last_use)) {
          live -= bytes_[root];
          bytes_[root] = 0;
        }
      }
      if (n->kind() != ir::NodeKind::kInput) {
        for (const ir::Value* v : n->outputs()) {
          if (root_of(v) == v) live += bytes_[v];
        }
      }
      if (std::max(during, live) > result.bytes) {
        result = {std::max(during, live), static_cast<int64_t>(i), describe(*n)};
      }
      for (const ir::Value* root : dies[i]) live -= bytes_[root];
      MAGI_LOG_TRACE("simulate_peak: ", i, " ", describe(*n), " during ", during >> 20,
                     " MiB, live ", live >> 20, " MiB");
    }
    return result;
  }

 private:
  // The storages a fusion node's outputs are written over, as the runtime decides it for a
  // pointwise kernel (FusedKernel::reusable_input): each contiguous output, in order, takes
  // the first input that dies at this node, is the only reference to its storage, is a tensor
  // this graph made (a graph input, even one the run frees early such as a backward's saved
  // tensor, still has its Python object's reference when the kernel runs), and has the
  // output's dtype and bytes. A group with a reduction or with a slice, cat or pad (loads at a
  // column shift) writes only new tensors. Where the runtime still declines (an input laid out
  // otherwise than the output, a view chain ending in a permute, a kernel that falls back to
  // ATen), the simulation predicts low by that tensor.
  std::vector<const ir::Value*> written_over(
      const ir::Node& n, size_t at,
      const std::unordered_map<const ir::Value*, size_t>& last_use) const {
    std::vector<const ir::Value*> roots;
    const ir::Graph* group = n.piece();
    if (group == nullptr) return roots;
    for (const ir::Node* op : group->nodes()) {
      if (!op->is_operator()) continue;
      switch (ir::op_info(*op).op_class) {
        case ir::OpClass::kReduction:
        case ir::OpClass::kColumnReduction:
        case ir::OpClass::kSoftmax:
        case ir::OpClass::kLayerNorm:
        case ir::OpClass::kSlice:
        case ir::OpClass::kCat:
        case ir::OpClass::kPad:
          return roots;
        default:
          break;
      }
    }
    std::vector<bool> taken(n.inputs().size(), false);
    for (const ir::Value* out : n.outputs()) {
      const auto& ot = out->tensor_type();
      if (!ot || !ot->is_contiguous()) continue;
      for (size_t j = 0; j < n.inputs().size(); ++j) {
        const ir::Value* in = n.inputs()[j];
        const ir::Value* root = root_of(in);
        const auto& it = in->tensor_type();
        if (taken[j] || !it || it->dtype != ot->dtype || !it->is_contiguous() ||
            permuted_in(*group, j)) {
          continue;
        }
        if (graph_inputs_.count(root) != 0) continue;
        const auto dies = last_use.find(root);
        if (dies == last_use.end() || dies->second != at) continue;
        const int64_t bytes = bytes_.count(root) ? bytes_.at(root) : 0;
        if (bytes == 0 || bytes != bytes_of(out) || bytes_of(in) != bytes) continue;
        size_t readers = 0;  // the storage reached through another input of this node too
        for (const ir::Value* other : n.inputs()) readers += root_of(other) == root;
        if (readers != 1) continue;
        taken[j] = true;
        roots.push_back(root);
        break;
      }
    }
    return roots;
  }

  // Whether the group reads input `j` through a permute (not in the output's element order).
  static bool permuted_in(const ir::Graph& group, size_t j) {
    if (j >= group.inputs().size()) return true;
    for (const ir::Node* user : group.inputs()[j]->users()) {
      if (user->is_operator() && ir::op_info(*user).op_class == ir::OpClass::kView &&
          ir::op_info(*user).fn == "permute") {
        return true;
      }
    }
    return false;
  }

  const ir::Value* root_of(const ir::Value* v) const {
    auto it = root_.find(v);
    return it == root_.end() ? v : it->second;
  }

  // A view, or an item of a list (of views, unless the list is a new one: see run()).
  static bool aliases_input(const ir::Node& n, size_t k) {
    switch (n.kind()) {
      case ir::NodeKind::kAtenOp:
      case ir::NodeKind::kCustomOp:
        return ir::output_aliases_input(n, k);
      case ir::NodeKind::kGetItem:
        return true;
      default:
        return false;  // fusion groups and pieces write tensors of their own
    }
  }

  int64_t bytes_of(const ir::Value* v) const {
    if (v->kind() != ir::ValueKind::kTensor || !v->tensor_type()) return 0;
    return v->tensor_type()->bytes(hints_);
  }

  static std::string describe(const ir::Node& n) {
    std::string what = n.is_operator() ? n.op_name() : ir::node_kind_name(n.kind());
    if (!n.provenance().fx_name.empty()) what += " (FX node " + n.provenance().fx_name + ")";
    return what;
  }

  const ir::SymbolBindings& hints_;
  std::unordered_map<const ir::Value*, const ir::Value*> root_;
  std::unordered_set<const ir::Value*> graph_inputs_;
  std::unordered_map<const ir::Value*, int64_t> bytes_;
};

}  // namespace

ProgramPeak simulate_peak(const ir::Graph& graph, const ir::SymbolBindings& size_hints,
                          const std::vector<bool>& counted_inputs) {
  PeakSimulation sim(size_hints);
  return sim.run(graph, counted_inputs);
}

}  // namespace magi::passes
