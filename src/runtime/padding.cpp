// plan_padding: see padding.h. Each node that touches the batch symbol (in a tensor's sizes,
// an integer's value or a list's items) must match one of the rules below; a node that does not
// touch it cannot see the batch rows (its inputs carry no data derived from them: the only
// ways from batched data to unbatched data are reductions over the batch dim, which no rule
// admits, and operators' extra outputs such as attention's RNG state, which carry no row data).
#include "magi/runtime/padding.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "magi/ir/graph.h"
#include "magi/ir/node.h"

namespace magi::runtime {
namespace {

using ir::Node;
using ir::NodeKind;
using ir::SymExpr;
using ir::Value;
using ir::ValueKind;

// Where a tensor value carries the symbol: `dim` -1 when nowhere, `bad` when not as one dim of
// size k * symbol.
struct BatchDim {
  int64_t dim = -1;
  int64_t k = 0;
  bool bad = false;
};

class Analysis {
 public:
  explicit Analysis(std::string symbol) : s_(std::move(symbol)) {}

  bool mentions(const SymExpr& e) const {
    std::set<std::string> names;
    e.collect_symbols(names);
    return names.count(s_) > 0;
  }

  // k when e is k * symbol (k >= 1), else 0.
  int64_t linear(const SymExpr& e) const {
    if (e.op() == SymExpr::Op::kSymbol) return e.symbol_name() == s_ ? 1 : 0;
    if (e.op() == SymExpr::Op::kMul && e.operands().size() == 2) {
      const SymExpr& c = e.operands()[0];
      const SymExpr& x = e.operands()[1];
      if (c.is_constant() && c.constant_value() > 0 && x.op() == SymExpr::Op::kSymbol &&
          x.symbol_name() == s_) {
        return c.constant_value();
      }
    }
    return 0;
  }

  BatchDim batch_dim(const Value* v) const {
    BatchDim b;
    if (!v->tensor_type()) {
      // A tensor of unknown shape may be batched (assume the worst), unless it is a literal.
      b.bad = v->kind() == ValueKind::kTensor && v->producer()->kind() != NodeKind::kConstant;
      return b;
    }
    const auto& sizes = v->tensor_type()->sizes;
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (!mentions(sizes[d])) continue;
      const int64_t k = linear(sizes[d]);
      if (b.dim >= 0 || k == 0) {
        b.bad = true;
        return b;
      }
      b.dim = static_cast<int64_t>(d);
      b.k = k;
    }
    return b;
  }

  // Whether a value's type, integer value or list items involve the symbol.
  bool touches(const Value* v) {
    auto it = touches_.find(v);
    if (it != touches_.end()) return it->second;
    // A tensor of unknown shape may be batched, unless it is a literal.
    bool t = v->kind() == ValueKind::kTensor && !v->tensor_type() &&
             v->producer()->kind() != NodeKind::kConstant;
    if (v->tensor_type()) {
      for (const auto& e : v->tensor_type()->sizes) t |= mentions(e);
      for (const auto& e : v->tensor_type()->strides) t |= mentions(e);
    }
    if (v->sym()) t |= mentions(*v->sym());
    if (v->producer()->kind() == NodeKind::kMakeList) {
      for (const Value* item : v->producer()->inputs()) t |= touches(item);
    }
    touches_[v] = t;
    return t;
  }

  // "" when every node of `graph` keeps rows independent; else why not. Top-level graphs
  // also check their inputs and outputs (pieces get theirs from the caller).
  std::string check_graph(const ir::Graph& graph, bool top_level) {
    for (const Node* node : graph.nodes()) {
      std::string why = check_node(*node, top_level);
      if (!why.empty()) return why;
    }
    return {};
  }

 private:
  static std::string where(const Node& n) {
    std::string w = n.op_name();
    if (!n.provenance().source.empty()) w += " (" + n.provenance().source + ")";
    return w;
  }

  bool node_touches(const Node& n) {
    for (const Value* v : n.inputs()) {
      if (touches(v)) return true;
    }
    for (const Value* v : n.outputs()) {
      if (touches(v)) return true;
    }
    return false;
  }

  std::string check_node(const Node& n, bool top_level) {
    switch (n.kind()) {
      case NodeKind::kConstant:
      case NodeKind::kSymArith:
      case NodeKind::kMakeList:
      case NodeKind::kGetItem:
        return {};  // their consumers decide what a batch-dependent value may reach
      case NodeKind::kInput:
        if (!top_level || !touches(n.output())) return {};
        return check_boundary_value(*n.output(), "input", /*tensor_dim0=*/true);
      case NodeKind::kOutput:
        if (!top_level) return {};
        for (const Value* v : n.inputs()) {
          if (!touches(v)) continue;
          std::string why = check_boundary_value(*v, "output", /*tensor_dim0=*/false);
          if (!why.empty()) return why;
        }
        return {};
      case NodeKind::kCallPiece:
      case NodeKind::kFusion:
        return node_touches(n) ? check_graph(*n.piece(), false) : std::string();
      case NodeKind::kCustomOp:
        return node_touches(n) ? where(n) +
                                     " is a custom operator on the batch rows: whether "
                                     "padding changes its results is unknown"
                               : std::string();
      case NodeKind::kAtenOp:
        return node_touches(n) ? check_aten(n) : std::string();
    }
    return {};
  }

  std::string check_boundary_value(const Value& v, const char* what, bool tensor_dim0) {
    if (v.kind() == ValueKind::kTensor) {
      BatchDim b = batch_dim(&v);
      if (b.bad || (tensor_dim0 && b.dim != 0)) {
        return std::string("an ") + what + " of type " + v.type_str() +
               " has the batch size elsewhere than as k * " + s_ +
               (tensor_dim0 ? " in dim 0" : " in one dim");
      }
      return {};
    }
    if (v.kind() == ValueKind::kInt && v.sym() && linear(*v.sym()) > 0) return {};
    return std::string("an ") + what + " (" + v.type_str() + ") depends on the batch size";
  }

  // The input bound to the schema argument `name`, or nullptr.
  static const Value* arg(const Node& n, const char* name) {
    const auto& args = n.schema().arguments();
    for (size_t i = 0; i < args.size() && i < n.inputs().size(); ++i) {
      if (args[i].name() == name) return n.input(i);
    }
    return nullptr;
  }

  static const c10::IValue* constant(const Value* v) {
    return v && v->producer()->kind() == NodeKind::kConstant ? &v->producer()->constant() : nullptr;
  }

  // Dims named by an int or int[] constant argument, normalised against `rank`; empty
  // optional when not constant (or None: all dims).
  static std::optional<std::vector<int64_t>> dims_of(const Value* v, int64_t rank) {
    const c10::IValue* c = constant(v);
    if (!c) return std::nullopt;
    std::vector<int64_t> dims;
    if (c->isInt()) {
      dims.push_back(c->toInt());
    } else if (c->isIntList()) {
      for (int64_t d : c->toIntList()) dims.push_back(d);
    } else {
      return std::nullopt;
    }
    if (dims.empty()) return std::nullopt;  // sum(x, []) reduces every dim
    for (auto& d : dims) {
      if (d < 0) d += rank;
    }
    return dims;
  }

  // Tensors an input carries: itself, or a list's items.
  static std::vector<const Value*> tensors_in(const Value* v) {
    if (v->kind() == ValueKind::kTensor) return {v};
    std::vector<const Value*> out;
    if (ir::is_list_kind(v->kind()) && v->producer()->kind() == NodeKind::kMakeList) {
      for (const Value* item : v->producer()->inputs()) {
        if (item->kind() == ValueKind::kTensor) out.push_back(item);
      }
    }
    return out;
  }

  static bool prefix_is_one(const Value* v, int64_t dim) {
    const auto& sizes = v->tensor_type()->sizes;
    for (int64_t d = 0; d < dim; ++d) {
      if (!sizes[d].is_constant() || sizes[d].constant_value() != 1) return false;
    }
    return true;
  }

  std::string check_aten(const Node& n);

  std::string s_;
  std::unordered_map<const Value*, bool> touches_;
};

// Operators whose output element at an index reads the inputs' elements at that index (after
// broadcasting) and nothing else.
const std::unordered_set<std::string>& elementwise_ops() {
  static const std::unordered_set<std::string> k = {"neg",
                                                    "exp",
                                                    "log",
                                                    "sqrt",
                                                    "rsqrt",
                                                    "reciprocal",
                                                    "abs",
                                                    "sin",
                                                    "cos",
                                                    "tanh",
                                                    "sigmoid",
                                                    "relu",
                                                    "silu",
                                                    "erf",
                                                    "log1p",
                                                    "expm1",
                                                    "gelu",
                                                    "pow",
                                                    "add",
                                                    "sub",
                                                    "mul",
                                                    "div",
                                                    "rsub",
                                                    "maximum",
                                                    "minimum",
                                                    "where",
                                                    "masked_fill",
                                                    "_to_copy",
                                                    "clone",
                                                    "alias",
                                                    "detach",
                                                    "contiguous",
                                                    "copy",
                                                    "expand",
                                                    "clamp",
                                                    "clamp_min",
                                                    "clamp_max",
                                                    "sign",
                                                    "square",
                                                    "logical_not",
                                                    "logical_and",
                                                    "logical_or",
                                                    "bitwise_not",
                                                    "bitwise_and",
                                                    "bitwise_or",
                                                    "eq",
                                                    "ne",
                                                    "lt",
                                                    "le",
                                                    "gt",
                                                    "ge",
                                                    "floor",
                                                    "ceil",
                                                    "round",
                                                    "trunc",
                                                    "exp2",
                                                    "log2",
                                                    "sinh",
                                                    "cosh",
                                                    "atan",
                                                    "mish",
                                                    "softplus",
                                                    "hardswish",
                                                    "hardsigmoid",
                                                    "leaky_relu",
                                                    "elu",
                                                    "lerp",
                                                    "addcmul",
                                                    "addcdiv",
                                                    "fmod",
                                                    "remainder",
                                                    "zeros_like",
                                                    "ones_like",
                                                    "empty_like",
                                                    "full_like",
                                                    "fill",
                                                    "lift_fresh_copy",
                                                    "type_as",
                                                    "nan_to_num",
                                                    "silu_backward",
                                                    "gelu_backward",
                                                    "sigmoid_backward",
                                                    "tanh_backward",
                                                    "threshold_backward"};
  return k;
}

// Operators over some dims (argument "dim", or the trailing `normalized_shape` dims of a layer
// norm): rows stay independent when the batch dim is not among them.
const std::unordered_set<std::string>& dim_ops() {
  static const std::unordered_set<std::string> k = {
      "sum",          "mean",      "amax",
      "amin",         "var",       "var_mean",
      "std",          "std_mean",  "prod",
      "argmax",       "argmin",    "max",
      "min",          "logsumexp", "_softmax",
      "_log_softmax", "softmax",   "log_softmax",
      "cumsum",       "cumprod",   "linalg_vector_norm",
      "norm",         "topk",      "sort",
      "any",          "all",       "_softmax_backward_data"};
  return k;
}

// Views and data movement along one dim (argument "dim"), which must not be the batch dim.
const std::unordered_set<std::string>& along_dim_ops() {
  static const std::unordered_set<std::string> k = {"select", "narrow", "split", "split_with_sizes",
                                                    "chunk",  "unbind", "cat",   "gather"};
  return k;
}

const std::unordered_set<std::string>& factory_ops() {
  static const std::unordered_set<std::string> k = {
      "zeros",    "ones",      "empty",    "full",          "new_zeros",
      "new_ones", "new_empty", "new_full", "empty_strided", "new_empty_strided",
      "arange"};
  return k;
}

std::string Analysis::check_aten(const Node& n) {
  const std::string full = n.op_name();                 // "aten::add.Tensor"
  std::string name = full.substr(full.find("::") + 2);  // "add.Tensor"
  name = name.substr(0, name.find('.'));                // "add"
  const std::string who = where(n);

  // Which inputs may carry the batch size as a number: the size arguments of views,
  // expansions and factories.
  std::set<std::string> size_args;
  if (name == "view" || name == "_unsafe_view" || name == "reshape" || name == "expand" ||
      name == "unflatten") {
    size_args = {"size", "shape", "sizes"};
  } else if (factory_ops().count(name)) {
    // arange's `end` sets only its length (element i is start + i * step), so `start` and
    // `step` may not depend on the batch.
    size_args = {"size", "stride", "end"};
  }
  const auto& schema_args = n.schema().arguments();
  std::vector<BatchDim> in_dims;
  for (size_t i = 0; i < n.inputs().size(); ++i) {
    const Value* v = n.input(i);
    const bool is_tensor = v->kind() == ValueKind::kTensor;
    const bool is_tensor_list =
        v->kind() == ValueKind::kTensorList || v->kind() == ValueKind::kOptionalTensorList;
    in_dims.push_back(is_tensor ? batch_dim(v) : BatchDim{});
    if (is_tensor && in_dims.back().bad) {
      return who + " reads " + (v->tensor_type() ? v->type_str() : "a tensor of unknown shape") +
             ", whose batch size is not k * " + s_ + " in one dim";
    }
    if (is_tensor || is_tensor_list || !touches(v)) continue;
    const std::string arg_name = i < schema_args.size() ? schema_args[i].name() : "";
    if (!size_args.count(arg_name)) {
      return who + " takes the batch size as its argument '" + arg_name +
             "': padding would change the value it sees";
    }
  }
  BatchDim out = n.outputs().empty() ? BatchDim{} : batch_dim(n.output());
  for (const Value* v : n.outputs()) {
    // An output nobody reads cannot carry rows anywhere (CUDA attention's RNG state and debug
    // mask come without a recorded shape).
    if (v->users().empty() && v->index() > 0) continue;
    if (v->kind() == ValueKind::kTensor && batch_dim(v).bad) {
      return who + " makes " + (v->tensor_type() ? v->type_str() : "a tensor of unknown shape") +
             ", whose batch size is not k * " + s_ + " in one dim";
    }
  }
  const Value* self = n.inputs().empty() ? nullptr : n.input(0);
  const BatchDim in0 = in_dims.empty() ? BatchDim{} : in_dims[0];
  auto rank_of = [](const Value* v) { return v->tensor_type() ? v->tensor_type()->rank() : 0; };

  if (elementwise_ops().count(name)) {
    // Right-aligned broadcasting: every batched input's batch dim lands on the output's.
    if (out.dim < 0) return who + " drops the batch dim";
    for (size_t i = 0; i < n.inputs().size(); ++i) {
      if (in_dims[i].dim < 0) continue;
      const int64_t aligned = rank_of(n.output()) - rank_of(n.input(i)) + in_dims[i].dim;
      if (aligned != out.dim) return who + " broadcasts the batch dim onto another dim";
    }
    return {};
  }
  if (dim_ops().count(name)) {
    const Value* dim_arg = arg(n, "dim");
    std::optional<std::vector<int64_t>> dims =
        dim_arg ? dims_of(dim_arg, rank_of(self)) : std::nullopt;
    if (!dims) return who + " reduces over every dim, the batch dim included";
    if (std::count(dims->begin(), dims->end(), in0.dim)) {
      return who + " works across the batch dim (dim " + std::to_string(in0.dim) + ")";
    }
    return {};
  }
  if (name == "native_layer_norm") {
    const c10::IValue* shape = constant(arg(n, "normalized_shape"));
    if (!shape || !shape->isIntList()) return who + " has a non-constant normalized_shape";
    const int64_t first = rank_of(self) - static_cast<int64_t>(shape->toIntList().size());
    return in0.dim >= first ? who + " normalises over the batch dim" : std::string();
  }
  if (name == "view" || name == "_unsafe_view" || name == "reshape" || name == "flatten" ||
      name == "unflatten" || name == "unsqueeze" || name == "squeeze" || name == "view_as") {
    // Sample i is one contiguous run of the row-major order when the batch dim is outermost
    // (only size-1 dims before it), in the input and in the output alike.
    if (in0.dim < 0) return {};  // a batch-sized tensor made from a constant one
    if (out.dim < 0 || !prefix_is_one(self, in0.dim) || !prefix_is_one(n.output(), out.dim)) {
      return who + " reshapes with the batch dim not outermost (" + self->type_str() + " to " +
             n.output()->type_str() + ")";
    }
    return {};
  }
  if (name == "permute" || name == "transpose" || name == "t" || name == "movedim" ||
      name == "swapaxes" || name == "swapdims") {
    return {};  // dims move; the batch dim stays one dim of the same size
  }
  if (name == "slice") {
    const auto dims = dims_of(arg(n, "dim"), rank_of(self));
    if (!dims) return who + " slices along a non-constant dim";
    if ((*dims)[0] != in0.dim) return {};
    const c10::IValue* start = constant(arg(n, "start"));
    const c10::IValue* end = constant(arg(n, "end"));
    const c10::IValue* step = constant(arg(n, "step"));
    const bool whole = start && (start->isNone() || (start->isInt() && start->toInt() == 0)) &&
                       end &&
                       (end->isNone() || (end->isInt() && end->toInt() >= (int64_t{1} << 62))) &&
                       step && step->isInt() && step->toInt() == 1;
    return whole ? std::string() : who + " slices along the batch dim";
  }
  if (name == "index_select") {
    // table.index_select(dim, rows): out row r is table's row rows[r] (a constant table); a
    // batched tensor may be selected along another dim by a constant index.
    const Value* index = arg(n, "index");
    if (!index) return who + ": unexpected schema";
    const BatchDim bi = batch_dim(index);
    if (in0.dim < 0) return {};
    const auto dims = dims_of(arg(n, "dim"), rank_of(self));
    if (bi.dim >= 0 || !dims || (*dims)[0] == in0.dim) return who + " selects along the batch dim";
    return {};
  }
  if (along_dim_ops().count(name)) {
    std::vector<const Value*> parts = tensors_in(self);
    const Value* base = parts.empty() ? nullptr : parts[0];
    const auto dims = dims_of(arg(n, "dim"), base ? rank_of(base) : 0);
    if (!dims) return who + " works along a non-constant dim";
    if (name == "gather") parts.push_back(arg(n, "index"));
    int64_t batch = -1;
    for (const Value* part : parts) {
      const BatchDim b = batch_dim(part);
      if (b.dim < 0) {
        if (name == "cat" || name == "gather") return who + " joins a tensor without the batch dim";
        continue;
      }
      if (batch >= 0 && b.dim != batch) return who + " joins tensors batched on different dims";
      batch = b.dim;
    }
    if (batch >= 0 && (*dims)[0] == batch) return who + " works along the batch dim";
    return {};
  }
  if (name == "stack") return {};  // a new dim; the batch dim keeps its rows
  if (name == "embedding") {
    return in0.dim < 0 ? std::string() : who + " looks up in a batched table";
  }
  if (name == "index") {
    // table[indices]: a constant table read at batched positions.
    if (in0.dim >= 0) return who + " indexes a batched tensor";
    for (const Value* idx : tensors_in(n.input(1))) {
      const BatchDim b = batch_dim(idx);
      if (b.dim >= 0 && !prefix_is_one(idx, b.dim)) return who + " has an index batched inside";
    }
    return out.dim >= 0 ? std::string() : who + " drops the batch dim";
  }
  if (name == "mm" || name == "addmm" || name == "linear" || name == "matmul" || name == "bmm" ||
      name == "baddbmm") {
    // The rows of the left operand, never the contracted dim, never a batched right operand
    // (bmm: both operands batched along dim 0, their batch of matrices).
    const Value* a = arg(n, name == "addmm" || name == "baddbmm" ? "mat1" : "self");
    if (name == "linear") a = arg(n, "input");
    if (name == "baddbmm") a = arg(n, "batch1");
    if (name == "bmm") a = arg(n, "self");
    if (!a) return who + ": unexpected schema";
    const BatchDim ba = batch_dim(a);
    for (size_t i = 0; i < n.inputs().size(); ++i) {
      const Value* v = n.input(i);
      if (v == a || in_dims[i].dim < 0) continue;
      if ((name == "bmm" || name == "baddbmm") && in_dims[i].dim == 0 && ba.dim == 0) continue;
      return who + " multiplies by a batched right operand or bias";
    }
    if (ba.dim < 0 || ba.dim >= rank_of(a) - 1) {
      return who + " contracts over the batch dim";
    }
    return {};
  }
  if (name == "scaled_dot_product_attention" || name.rfind("_scaled_dot_product_", 0) == 0) {
    for (const char* a : {"query", "key", "value"}) {
      const Value* v = arg(n, a);
      // Rank 2 is [sequence, embedding]: dim 0 would be the sequence, not the batch.
      if (!v || batch_dim(v).dim != 0 || rank_of(v) < 3) {
        return who + ": " + a + " is not batched along dim 0";
      }
    }
    for (const char* m : {"attn_mask", "attn_bias"}) {
      const Value* v = arg(n, m);
      if (v && v->kind() == ValueKind::kTensor && batch_dim(v).dim > 0) {
        return who + ": the mask is batched along another dim";
      }
    }
    const c10::IValue* p = constant(arg(n, "dropout_p"));
    if (!p || !(p->isDouble() || p->isInt()) || p->toScalar().toDouble() != 0.0) {
      return who + " uses dropout: random numbers per row";
    }
    return {};
  }
  if (factory_ops().count(name)) return {};  // values set by position, never by other rows
  return who + " is not known to keep batch rows independent";
}

}  // namespace

std::string PaddingPlan::str() const {
  if (!possible()) return "not padded: " + reason;
  std::ostringstream os;
  os << symbol << ": inputs";
  const char* sep = " ";
  for (size_t i = 0; i < input_rows.size(); ++i) {
    if (input_rows[i] == 0) continue;
    os << sep << i << " (x" << input_rows[i] << ")";
    sep = ", ";
  }
  os << "; outputs";
  sep = " ";
  for (size_t i = 0; i < output_rows.size(); ++i) {
    if (output_rows[i] == 0) continue;
    os << sep << i;
    if (output_dims[i] >= 0) {
      os << " (dim " << output_dims[i] << ", x" << output_rows[i] << ")";
    } else {
      os << " (x" << output_rows[i] << ")";
    }
    sep = ", ";
  }
  return os.str();
}

PaddingPlan plan_padding(const ir::Graph& graph) {
  PaddingPlan plan;
  std::string symbol;
  for (const Value* in : graph.inputs()) {
    if (in->kind() != ValueKind::kTensor || !in->tensor_type()) continue;
    const auto& sizes = in->tensor_type()->sizes;
    if (sizes.empty() || sizes[0].is_constant()) continue;
    std::set<std::string> names;
    sizes[0].collect_symbols(names);
    if (names.size() == 1) {
      symbol = *names.begin();
      break;
    }
  }
  if (symbol.empty()) {
    plan.reason = "no tensor input has a dynamic dim 0";
    return plan;
  }
  Analysis a(symbol);
  std::string why = a.check_graph(graph, /*top_level=*/true);
  if (!why.empty()) {
    plan.reason = why;
    return plan;
  }
  for (const Value* in : graph.inputs()) {
    int64_t k = 0;
    if (in->kind() == ValueKind::kTensor) {
      k = a.batch_dim(in).k;
    } else if (in->kind() == ValueKind::kInt && in->sym()) {
      k = a.linear(*in->sym());
    }
    plan.input_rows.push_back(k);
  }
  for (const Value* out : graph.outputs()) {
    if (out->kind() == ValueKind::kTensor) {
      const BatchDim b = a.batch_dim(out);
      plan.output_rows.push_back(b.dim >= 0 ? b.k : 0);
      plan.output_dims.push_back(b.dim);
    } else {
      plan.output_rows.push_back(
          out->kind() == ValueKind::kInt && out->sym() ? a.linear(*out->sym()) : 0);
      plan.output_dims.push_back(-1);
    }
  }
  plan.symbol = symbol;
  return plan;
}

int64_t bucket_for(const std::vector<int64_t>& ladder, int64_t size) {
  auto it = std::lower_bound(ladder.begin(), ladder.end(), size);
  return it == ladder.end() ? size : *it;
}

std::vector<int64_t> default_bucket_ladder() {
  std::vector<int64_t> ladder = {1, 2, 4};
  for (int64_t b = 8; b <= 256; b += 8) ladder.push_back(b);
  return ladder;
}

}  // namespace magi::runtime
