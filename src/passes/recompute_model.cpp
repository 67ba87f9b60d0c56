// The recompute planner's view of a joint graph (recompute_model.h): node classes and roofline
// costs, the closure that turns a set of recomputed nodes into saved values, the simulated
// activation peak, and the minimum cut of saved bytes.
#include "recompute_model.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>

#include "magi/common/error.h"
#include "magi/ir/op_info.h"
#include "magi/ir/op_registry.h"
#include "magi/passes/passes.h"

namespace magi::passes::recompute {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kFree:
      return "view";
    case OpKind::kCheap:
      return "memory-bound";
    case OpKind::kComputeBound:
      return "compute-bound";
    case OpKind::kRandom:
      return "random";
    case OpKind::kImpure:
      return "side effect";
  }
  return "?";
}

namespace {

bool has_prefix(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool is_random_op(const ir::Node& node) {
  // Attention ops carry the tag too (for their dropout), even with dropout_p=0. They stay
  // random here: PyTorch's partitioner would wrap a recomputed tagged op in run_and_save_rng_state,
  // which the C++ importer does not take.
  if (node.op().hasTag(at::Tag::nondeterministic_seeded)) return true;
  const std::string name = node.op().operator_name().name;
  for (const char* r : {"aten::native_dropout", "aten::bernoulli", "aten::rand", "aten::randn",
                        "aten::randint", "aten::normal", "aten::uniform", "aten::randperm",
                        "aten::multinomial", "aten::exponential", "aten::poisson"}) {
    if (has_prefix(name, r)) return true;
  }
  return false;
}

bool is_named_compute_sensitive(const ir::Node& node, const std::vector<std::string>& names) {
  const auto& op = node.op().operator_name();
  const std::string full = op.overload_name.empty() ? op.name : op.name + "." + op.overload_name;
  for (const auto& n : names) {
    const std::string canonical = ir::canonical_op_name(n);
    if (canonical == op.name || canonical == full) return true;
  }
  return false;
}

double numel_of(const ir::TensorType& t, const ir::SymbolBindings& hints) {
  double n = 1;
  for (const auto& s : t.sizes) n *= static_cast<double>(s.try_evaluate(hints).value_or(1));
  return n;
}

const ir::TensorType* tensor_type(const ir::Value* v) {
  return v->kind() == ir::ValueKind::kTensor && v->tensor_type() ? &*v->tensor_type() : nullptr;
}

// FLOPs of a compute-bound op from its shapes; 0 when unknown (then bytes price it).
double flops_of(const ir::Node& node, const ir::SymbolBindings& hints) {
  auto dims = [&](size_t i) {
    std::vector<double> d;
    if (i >= node.inputs().size()) return d;
    if (const auto* t = tensor_type(node.input(i))) {
      for (const auto& s : t->sizes) d.push_back(double(s.try_evaluate(hints).value_or(1)));
    }
    return d;
  };
  const auto* out = tensor_type(node.output(0));
  if (out == nullptr) return 0;
  const double out_numel = numel_of(*out, hints);
  const std::string name = node.op().operator_name().name;
  if (name == "aten::mm" || name == "aten::bmm" || name == "aten::matmul" ||
      name == "aten::linear") {
    auto a = dims(0);
    return a.empty() ? 0 : 2 * out_numel * a.back();
  }
  if (name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::addbmm") {
    auto a = dims(1);
    return a.empty() ? 0 : 2 * out_numel * a.back();
  }
  if (has_prefix(name, "aten::convolution") || has_prefix(name, "aten::conv")) {
    auto w = dims(1);
    if (w.size() < 2) return 0;
    double per_out = 1;
    for (size_t i = 1; i < w.size(); ++i) per_out *= w[i];
    return 2 * out_numel * per_out;
  }
  if (name.find("attention") != std::string::npos) {
    // q [B, H, L, D] (or [B, L, H, D]) against k with S positions: 4 * numel(q) * S.
    auto q = dims(0), k = dims(1);
    if (q.size() < 3 || k.size() < 3) return 0;
    const bool heads_second = name.find("_flash_attention_forward") == std::string::npos;
    const double s = heads_second ? k[k.size() - 2] : k[1];
    double q_numel = 1;
    for (double d : q) q_numel *= d;
    return 4 * q_numel * s;
  }
  // Unknown compute-bound op: a matmul over its first input's last dim.
  auto a = dims(0);
  return a.empty() ? 0 : 2 * out_numel * a.back();
}

}  // namespace

int JointModel::id_of(const ir::Value* v) const {
  auto it = ids_.find(v);
  return it == ids_.end() ? -1 : it->second;
}

int64_t JointModel::bytes_of(const ir::Value* v) const {
  const auto* t = tensor_type(v);
  if (t == nullptr) return 0;
  return t->bytes(options_.size_hints);
}

JointModel::JointModel(const ir::Graph& joint, const RecomputeOptions& options)
    : options_(options) {
  // Values made by lists are read through to their items; constants are free and untracked.
  std::function<void(const ir::Value*, std::vector<int>&)> flatten = [&](const ir::Value* v,
                                                                         std::vector<int>& out) {
    const ir::Node* p = v->producer();
    if (p->kind() == ir::NodeKind::kMakeList) {
      for (const ir::Value* item : p->inputs()) flatten(item, out);
    } else if (int id = id_of(v); id >= 0) {
      out.push_back(id);
    }
  };
  auto add_value = [&](const ir::Value* v, int producer, int64_t bytes, int root) {
    const int id = static_cast<int>(values_.size());
    ids_[v] = id;
    values_.push_back(v);
    value_bytes_.push_back(bytes);
    root_.push_back(root < 0 ? id : root);
    producer_.push_back(producer);
    is_graph_output_.push_back(0);
    materialized_.push_back(0);
    read_by_compute_bound_backward_.push_back(0);
    return id;
  };

  std::unordered_map<const ir::Value*, bool> after_tangent;  // for the default forward test
  auto is_forward = [&](const ir::Node& n) {
    if (!options_.forward_names.empty())
      return options_.forward_names.count(n.provenance().fx_name) > 0;
    for (const ir::Value* in : n.inputs()) {
      if (after_tangent[in]) return false;
    }
    return true;
  };

  for (const ir::Node* n : joint.nodes()) {
    switch (n->kind()) {
      case ir::NodeKind::kInput: {
        const ir::Value* v = n->output();
        after_tangent[v] = has_prefix(v->name(), "tangents");
        add_value(v, -1, 0, -1);
        continue;
      }
      case ir::NodeKind::kConstant:
        continue;
      case ir::NodeKind::kMakeList: {
        bool t = false;
        for (const ir::Value* in : n->inputs()) t = t || after_tangent[in];
        after_tangent[n->output()] = t;
        continue;
      }
      case ir::NodeKind::kOutput: {
        for (size_t k = 0; k < n->inputs().size(); ++k) {
          std::vector<int> ids;
          flatten(n->input(k), ids);
          for (int id : ids) {
            if (k < options_.num_forward_outputs) {
              forward_outputs_.push_back(id);
              materialized_[root_[id]] = 1;
            } else {
              is_graph_output_[root_[id]] = 1;
              if (producer_[id] >= 0) backward_needs_.push_back(id);
            }
          }
        }
        continue;
      }
      default:
        break;
    }
    MAGI_ASSERT(n->kind() != ir::NodeKind::kCallPiece && n->kind() != ir::NodeKind::kFusion,
                "the recompute planner takes the joint graph before splitting and fusion");
    std::vector<int> inputs;
    for (const ir::Value* in : n->inputs()) flatten(in, inputs);
    const bool forward = is_forward(*n);
    bool tangent_dependent = !forward;
    for (const ir::Value* in : n->inputs())
      tangent_dependent = tangent_dependent || after_tangent[in];
    const int index = forward ? static_cast<int>(nodes_.size()) : -1;

    // Outputs: own storage, or an alias of the first input's storage. A grouped-head copy
    // for attention is an alias of its source: group_query_attention removes it from both
    // graphs, and the attention calls read the source itself.
    const bool vanishes = forward && options_.grouped_attention && is_grouped_attention_copy(*n);
    std::vector<int> outputs;
    int64_t own = 0;
    for (size_t k = 0; k < n->outputs().size(); ++k) {
      const ir::Value* v = n->output(k);
      after_tangent[v] = tangent_dependent;
      const bool alias = vanishes || n->kind() == ir::NodeKind::kGetItem ||
                         (n->is_operator() && ir::output_aliases_input(*n, k));
      const int root = alias && !inputs.empty() ? root_[inputs.front()] : -1;
      const int64_t bytes = root >= 0 ? 0 : bytes_of(v);
      own += bytes;
      outputs.push_back(add_value(v, index, bytes, root));
    }
    if (!forward) {
      const bool compute_bound =
          n->is_operator() && (ir::is_compute_sensitive(*n) ||
                               is_named_compute_sensitive(*n, options_.compute_sensitive_ops));
      for (int id : inputs) {
        if (producer_[id] >= 0) backward_needs_.push_back(id);
        if (compute_bound) read_by_compute_bound_backward_[root_[id]] = 1;
      }
      // Attention backwards accumulate dq in float32 in a buffer of their own.
      int64_t workspace = 0;
      if (n->is_operator() &&
          n->op().operator_name().name.find("attention_backward") != std::string::npos &&
          n->inputs().size() > 1) {
        if (const auto* q = tensor_type(n->input(1))) {
          workspace = static_cast<int64_t>(numel_of(*q, options_.size_hints)) * 4;
        }
      }
      bw_workspace_.push_back(workspace);
      bw_inputs_.push_back(std::move(inputs));
      bw_outputs_.push_back(std::move(outputs));
      continue;
    }

    OpKind kind = OpKind::kCheap;
    bool any_alias = false;
    for (int id : outputs) any_alias = any_alias || root_[id] != id;
    if (!n->is_operator()) {
      kind = OpKind::kFree;  // symbolic ints, getitems
    } else if (n->schema().is_mutable() || n->schema().returns().empty()) {
      kind = OpKind::kImpure;
    } else if (is_random_op(*n)) {
      kind = OpKind::kRandom;
    } else if (ir::is_compute_sensitive(*n) ||
               is_named_compute_sensitive(*n, options_.compute_sensitive_ops)) {
      kind = OpKind::kComputeBound;
    } else if (any_alias || own == 0) {
      kind = OpKind::kFree;
    }
    double moved = static_cast<double>(own);
    for (int id : inputs) moved += static_cast<double>(bytes_of(values_[id]));
    const double flops = kind == OpKind::kComputeBound ? flops_of(*n, options_.size_hints) : 0;
    const double seconds = kind == OpKind::kFree
                               ? 0
                               : std::max(flops / options_.roofline.flops_per_second,
                                          moved / options_.roofline.bytes_per_second);
    bool narrowing = false;
    if (kind == OpKind::kCheap && inputs.size() == 1 && outputs.size() == 1) {
      const auto* in_t = tensor_type(values_[inputs[0]]);
      const auto* out_t = tensor_type(values_[outputs[0]]);
      const std::string name = n->op().operator_name().name;
      narrowing = in_t && out_t &&
                  (name == "prims::convert_element_type" || name == "aten::_to_copy") &&
                  c10::elementSize(out_t->dtype) < c10::elementSize(in_t->dtype);
    }
    if (kind != OpKind::kCheap && kind != OpKind::kFree) {
      for (int id : inputs) materialized_[root_[id]] = 1;
    }
    nodes_.push_back(n);
    kinds_.push_back(kind);
    seconds_.push_back(seconds);
    own_bytes_.push_back(own);
    narrowing_.push_back(narrowing);
    node_inputs_.push_back(std::move(inputs));
    node_outputs_.push_back(std::move(outputs));
  }
  std::sort(backward_needs_.begin(), backward_needs_.end());
  backward_needs_.erase(std::unique(backward_needs_.begin(), backward_needs_.end()),
                        backward_needs_.end());
}

NodeSet JointModel::no_recompute() const {
  NodeSet plan(size(), 0);
  for (size_t i = 0; i < size(); ++i) plan[i] = kinds_[i] == OpKind::kFree;
  return plan;
}

Evaluation JointModel::evaluate(const NodeSet& plan) const {
  Evaluation e;
  e.recomputed.assign(size(), 0);
  std::vector<char> seen(values_.size(), 0);
  std::vector<int> stack(backward_needs_.begin(), backward_needs_.end());
  while (!stack.empty()) {
    const int id = stack.back();
    stack.pop_back();
    if (seen[id]) continue;
    seen[id] = 1;
    const int p = producer_[id];
    if (p < 0) continue;  // a graph input
    if (!plan[p]) {
      e.saved.push_back(id);
      continue;
    }
    if (e.recomputed[p]) continue;
    e.recomputed[p] = 1;
    e.seconds += seconds_[p];
    for (int in : node_inputs_[p]) stack.push_back(in);
  }
  std::sort(e.saved.begin(), e.saved.end());
  std::vector<char> counted(values_.size(), 0);
  for (int id : e.saved) {
    const int r = root_[id];
    if (!counted[r]) e.saved_bytes += value_bytes_[r];
    counted[r] = 1;
  }
  return e;
}

double JointModel::step_seconds(const Evaluation& eval) const {
  double bytes = 0, seconds = 0;
  std::vector<char> counted(values_.size(), 0);
  for (int id : eval.saved) {
    const int r = root_[id];
    if (counted[r]) continue;
    counted[r] = 1;
    const int p = producer_[r];
    const bool written_for_the_backward =
        p >= 0 && kinds_[p] == OpKind::kCheap && !materialized_[r];
    bytes += static_cast<double>(value_bytes_[r]) * (written_for_the_backward ? 2 : 1);
  }
  // Values a compute-bound op reads in the backward: the backward's own, and recomputed ones.
  std::vector<char> operand(read_by_compute_bound_backward_);
  for (size_t i = 0; i < size(); ++i) {
    if (!eval.recomputed[i] || kinds_[i] != OpKind::kComputeBound) continue;
    for (int id : node_inputs_[i]) operand[root_[id]] = 1;
  }
  for (size_t i = 0; i < size(); ++i) {
    if (!eval.recomputed[i]) continue;
    if (kinds_[i] == OpKind::kComputeBound) {
      seconds += seconds_[i];
      continue;
    }
    if (kinds_[i] != OpKind::kCheap) continue;
    for (int id : node_outputs_[i]) {
      if (root_[id] == id && operand[id]) {
        bytes += 2.0 * static_cast<double>(value_bytes_[id]);
      }
    }
    for (int id : node_inputs_[i]) {
      const int r = root_[id];
      if (producer_[r] >= 0 || counted[r]) continue;
      counted[r] = 1;
      bytes += static_cast<double>(bytes_of(values_[r]));  // a graph input (a weight)
    }
  }
  return seconds + bytes / options_.roofline.bytes_per_second;
}

int64_t JointModel::simulate_peak(const Evaluation& eval, int64_t* forward_peak) const {
  const size_t nv = values_.size();
  std::vector<char> keep(nv, 0);  // roots that outlive the forward
  for (int id : eval.saved) keep[root_[id]] = 1;

  // Forward: each root lives from its producer to its last forward use, unless kept.
  std::vector<int> last_use(nv, -1);
  for (size_t i = 0; i < size(); ++i) {
    for (int id : node_outputs_[i]) last_use[root_[id]] = std::max(last_use[root_[id]], int(i));
    for (int id : node_inputs_[i]) last_use[root_[id]] = std::max(last_use[root_[id]], int(i));
  }
  std::vector<char> forward_output(nv, 0);
  for (int id : forward_outputs_) forward_output[root_[id]] = 1;
  std::vector<std::vector<int>> dies(size());
  for (size_t r = 0; r < nv; ++r) {
    if (value_bytes_[r] > 0 && producer_[r] >= 0 && !keep[r] && !forward_output[r]) {
      dies[last_use[r]].push_back(static_cast<int>(r));
    }
  }
  int64_t live = 0, peak = 0;
  for (size_t i = 0; i < size(); ++i) {
    for (int id : node_outputs_[i]) live += value_bytes_[id];
    peak = std::max(peak, live);
    for (int r : dies[i]) live -= value_bytes_[r];
  }
  if (forward_peak != nullptr) *forward_peak = peak;

  // Backward: recomputed nodes run just before their first use.
  struct Step {
    const std::vector<int>* inputs;
    const std::vector<int>* outputs;
    int64_t workspace;
  };
  std::vector<Step> schedule;
  std::vector<char> done(size(), 0);
  std::function<void(int)> ensure = [&](int id) {
    const int p = producer_[id];
    if (p < 0 || !eval.recomputed[p] || done[p]) return;
    done[p] = 1;
    for (int in : node_inputs_[p]) ensure(in);
    schedule.push_back({&node_inputs_[p], &node_outputs_[p], 0});
  };
  for (size_t b = 0; b < bw_inputs_.size(); ++b) {
    for (int in : bw_inputs_[b]) ensure(in);
    schedule.push_back({&bw_inputs_[b], &bw_outputs_[b], bw_workspace_[b]});
  }
  std::fill(last_use.begin(), last_use.end(), -1);
  for (size_t k = 0; k < schedule.size(); ++k) {
    for (const auto* list : {schedule[k].inputs, schedule[k].outputs}) {
      for (int id : *list) last_use[root_[id]] = static_cast<int>(k);
    }
  }
  std::vector<std::vector<int>> bw_dies(schedule.size());
  std::vector<char> counted(nv, 0);
  live = 0;
  for (int id : eval.saved) {
    const int r = root_[id];
    if (counted[r]) continue;
    counted[r] = 1;
    live += value_bytes_[r];
    if (last_use[r] >= 0) bw_dies[last_use[r]].push_back(r);
  }
  for (size_t k = 0; k < schedule.size(); ++k) {
    for (int id : *schedule[k].outputs) {
      if (value_bytes_[id] == 0 || counted[id]) continue;
      counted[id] = 1;
      live += value_bytes_[id];
      if (!is_graph_output_[id]) bw_dies[last_use[id]].push_back(id);
    }
    peak = std::max(peak, live + schedule[k].workspace);
    for (int r : bw_dies[k]) live -= value_bytes_[r];
  }
  return peak;
}

namespace {

// Dinic's maximum flow, for the minimum cut.
class MaxFlow {
 public:
  static constexpr int64_t kInfinite = int64_t{1} << 60;
  explicit MaxFlow(int n) : adj_(n), level_(n), next_(n) {}
  void add_edge(int u, int v, int64_t cap) {
    adj_[u].push_back({v, static_cast<int>(adj_[v].size()), cap});
    adj_[v].push_back({u, static_cast<int>(adj_[u].size()) - 1, 0});
  }
  void run(int s, int t) {
    while (bfs(s, t)) {
      std::fill(next_.begin(), next_.end(), 0);
      while (push(s, t, kInfinite) > 0) {
      }
    }
  }
  /// After run: is `v` reachable from the source in the residual graph?
  bool source_side(int v) const { return level_[v] >= 0; }

 private:
  struct Edge {
    int to, rev;
    int64_t cap;
  };
  bool bfs(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::queue<int> q;
    level_[s] = 0;
    q.push(s);
    while (!q.empty()) {
      int u = q.front();
      q.pop();
      for (const Edge& e : adj_[u]) {
        if (e.cap > 0 && level_[e.to] < 0) {
          level_[e.to] = level_[u] + 1;
          q.push(e.to);
        }
      }
    }
    return level_[t] >= 0;
  }
  int64_t push(int u, int t, int64_t f) {
    if (u == t) return f;
    for (int& i = next_[u]; i < static_cast<int>(adj_[u].size()); ++i) {
      Edge& e = adj_[u][i];
      if (e.cap <= 0 || level_[e.to] != level_[u] + 1) continue;
      int64_t got = push(e.to, t, std::min(f, e.cap));
      if (got > 0) {
        e.cap -= got;
        adj_[e.to][e.rev].cap += got;
        return got;
      }
    }
    return 0;
  }
  std::vector<std::vector<Edge>> adj_;
  std::vector<int> level_, next_;
};

}  // namespace

NodeSet JointModel::min_cut(bool allow_compute_bound) const {
  // Node i is split into in (2i) and out (2i + 1); cutting in -> out saves its outputs.
  // Sink side: available in the backward (saved, or recomputed from what is).
  const int n = static_cast<int>(size());
  const int source = 2 * n, sink = 2 * n + 1;
  MaxFlow flow(2 * n + 2);
  auto banned = [&](size_t i) {
    return !recomputable(i) || (!allow_compute_bound && kinds_[i] == OpKind::kComputeBound);
  };
  for (int i = 0; i < n; ++i) {
    flow.add_edge(
        2 * i, 2 * i + 1,
        kinds_[i] == OpKind::kFree ? MaxFlow::kInfinite : std::max<int64_t>(1, own_bytes_[i]));
    if (banned(i)) flow.add_edge(source, 2 * i, MaxFlow::kInfinite);
    for (int id : node_inputs_[i]) {
      const int p = producer_[id];
      flow.add_edge(p < 0 ? source : 2 * p + 1, 2 * i, MaxFlow::kInfinite);
    }
  }
  for (int id : backward_needs_) flow.add_edge(2 * producer_[id] + 1, sink, MaxFlow::kInfinite);
  flow.run(source, sink);
  NodeSet plan(size(), 0);
  for (int i = 0; i < n; ++i) {
    const bool saved = flow.source_side(2 * i) && !flow.source_side(2 * i + 1);
    plan[i] = recomputable(i) && !saved && !banned(i);
  }
  return plan;
}

}  // namespace magi::passes::recompute
