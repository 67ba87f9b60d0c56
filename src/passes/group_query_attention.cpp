// group_query_attention: CUDA attention reads grouped key/value heads as they are.
//
// Grouped-query attention repeats each key/value head for the query heads that share it
// (torch.repeat_interleave along the heads, Hugging Face's repeat_kv). The capture records
//
//   view(clone(expand(unsqueeze(k, 2), [b, hkv, r, s, d])), [b, hkv * r, s, d])
//
// (full-range slices may sit around the unsqueeze): a copy r times the size of k, written once
// and read once by the attention kernel. Flash and cuDNN attention take a key and value with
// fewer heads than the query, query head h reading key/value head h / r, the mapping of the
// copy. The pass hands them k and v as they are and erases the copies that nothing else reads.
//
// Forward calls: a call whose extra outputs (logsumexp, RNG state) are used is a training
// forward; its output and logsumexp are the same with grouped heads, so it is rewritten too
// when its dropout is 0 (a backward that still reads the repeated copies then gets the values
// it was traced against; with dropout the random mask could differ).
//
// Backward calls (training): flash's and cuDNN's backwards also take grouped heads, and then
// return the key and value gradients already summed over each group. The graph sums the
// repeated heads' gradients itself, in the form _decompositions.py gives the expand's
// gradient: view(g, [b, hkv, r, s, d]), its r select(.., 2, i) views added up in order (in
// float32 for half-precision g, rounded once). A backward at dropout 0 (cuDNN: without an
// attention bias) whose key and value are repeats and whose gradients are read only through
// that sum reads k and v as they are; the sums' readers read its gradients instead, and the
// sums, the repeats and the gradients' views go. The gradients then match eager's within the
// dtype's tolerance (tests/gpu/test_runtime_choices_cuda.py).
//
// Memory-efficient attention takes no grouped heads; AttentionCall leaves it out for such
// calls. A memory-efficient forward over repeated heads without a mask, dropout or a read
// logsumexp (an inference call: SDPA picks it when the trace had a mask, which
// recognize_causal_masks may have turned into is_causal) becomes a flash call first, where
// flash takes the dtype and head dim, and then reads the grouped heads like one.
//
// Requires: a verified graph. Guarantees: a verified graph computing the same outputs.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "attention_match.h"
#include "magi/common/log.h"
#include "magi/ir/node.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

using attention_match::constant_int;
using attention_match::is_op;

// `v` with full-range slices (x[:, :], which Hugging Face's x[:, :, None] records) looked
// through.
ir::Value* skip_full_slices(ir::Value* v) {
  while (is_op(v->producer(), "aten::slice.Tensor")) {
    const ir::Node& s = *v->producer();
    const auto& in = s.input(0)->tensor_type();
    const auto dim = constant_int(s, 1), start = constant_int(s, 2), end = constant_int(s, 3),
               step = constant_int(s, 4);
    if (!in || !dim || !start || !end || !step || *start != 0 || *step != 1) break;
    const int64_t d = *dim < 0 ? *dim + in->rank() : *dim;
    if (d < 0 || d >= in->rank() || !in->sizes[d].is_constant() ||
        *end < in->sizes[d].constant_value()) {
      break;
    }
    v = s.input(0);
  }
  return v;
}

struct Repeat {
  ir::Value* source;  ///< [b, hkv, s, d]
  int64_t kv_heads;
};

// If `v` is `source` with each of its heads repeated r times in a row (dim 1), that source.
std::optional<Repeat> repeated_heads(ir::Value* v) {
  const ir::Node* view = v->producer();
  if (!is_op(view, "aten::view") && !is_op(view, "aten::_unsafe_view") &&
      !is_op(view, "aten::reshape")) {
    return std::nullopt;
  }
  const ir::Node* clone = view->input(0)->producer();
  if (!is_op(clone, "aten::clone")) return std::nullopt;
  const ir::Node* expand = skip_full_slices(clone->input(0))->producer();
  if (!is_op(expand, "aten::expand")) return std::nullopt;
  const ir::Node* unsqueeze = skip_full_slices(expand->input(0))->producer();
  if (!is_op(unsqueeze, "aten::unsqueeze")) return std::nullopt;
  const auto dim = constant_int(*unsqueeze, 1);
  if (!dim || (*dim != 2 && *dim != -3)) return std::nullopt;
  ir::Value* source = skip_full_slices(unsqueeze->input(0));

  const auto& src = source->tensor_type();
  const auto& wide = expand->output()->tensor_type();
  const auto& out = v->tensor_type();
  if (!src || !wide || !out || src->rank() != 4 || wide->rank() != 5 || out->rank() != 4) {
    return std::nullopt;
  }
  const auto& s = src->sizes;
  const auto& w = wide->sizes;
  const auto& o = out->sizes;
  if (!(w[0] == s[0] && w[1] == s[1] && w[3] == s[2] && w[4] == s[3])) return std::nullopt;
  if (!(o[0] == s[0] && o[2] == s[2] && o[3] == s[3])) return std::nullopt;
  if (!s[1].is_constant() || !w[2].is_constant() || !o[1].is_constant()) return std::nullopt;
  const int64_t kv_heads = s[1].constant_value();
  if (o[1].constant_value() != kv_heads * w[2].constant_value()) return std::nullopt;
  return Repeat{source, kv_heads};
}

bool in_repeat_chain(const ir::Node* node) {
  switch (node->kind()) {
    case ir::NodeKind::kConstant:
    case ir::NodeKind::kMakeList:
    case ir::NodeKind::kSymArith:
      return true;
    default:
      return is_op(node, "aten::view") || is_op(node, "aten::_unsafe_view") ||
             is_op(node, "aten::reshape") || is_op(node, "aten::clone") ||
             is_op(node, "aten::expand") || is_op(node, "aten::unsqueeze") ||
             is_op(node, "aten::slice.Tensor");
  }
}

// Erases the repeat chain that produced `v` and the size lists and constants it read, as far
// as nothing else reads them (every node of the chain is free of side effects).
void erase_unread(ir::Graph& graph, ir::Value* v) {
  std::vector<ir::Node*> work{v->producer()};
  std::set<const ir::Node*> erased;  // a node read twice is on the list twice
  while (!work.empty()) {
    ir::Node* node = work.back();
    work.pop_back();
    if (erased.count(node)) continue;
    bool unread = true;
    for (const ir::Value* out : node->outputs()) unread &= out->users().empty();
    if (!unread || !in_repeat_chain(node)) continue;
    std::vector<ir::Node*> producers;
    for (const ir::Value* in : node->inputs()) producers.push_back(in->producer());
    erased.insert(node);
    graph.erase(node);
    work.insert(work.end(), producers.begin(), producers.end());
  }
}

// The attention calls that read grouped heads: flash and cuDNN, forward and backward (cuDNN's
// forward also with a mask, which broadcasts over the heads either way).
struct AttentionOp {
  const char* name;
  bool backward;
  size_t key;                  ///< the key's input; the value's is the next
  size_t dropout;              ///< dropout_p's input (the forwards' default is 0)
  std::optional<size_t> bias;  ///< an attention bias the call must not have (backward)
};

const AttentionOp* attention_op(const ir::Node& node) {
  static const AttentionOp kOps[] = {
      {"aten::_scaled_dot_product_flash_attention", false, 1, 3, std::nullopt},
      {"aten::_scaled_dot_product_cudnn_attention", false, 1, 5, std::nullopt},
      {"aten::_scaled_dot_product_flash_attention_backward", true, 2, 10, std::nullopt},
      {"aten::_scaled_dot_product_cudnn_attention_backward", true, 2, 13, 8},
  };
  for (const AttentionOp& op : kOps) {
    if (is_op(&node, op.name)) return &op;
  }
  return nullptr;
}

// Is input `i` of `node` the constant number `n` (int or float)? Absent inputs take `absent`.
bool is_number(const ir::Node& node, size_t i, double n, bool absent) {
  if (i >= node.inputs().size()) return absent;
  const c10::IValue* v = ir::constant_input(node, i);
  return v != nullptr && ((v->isDouble() && v->toDouble() == n) ||
                          (v->isInt() && static_cast<double>(v->toInt()) == n));
}

bool no_dropout(const ir::Node& node, size_t i) {
  return is_number(node, i, 0.0, /*absent=*/true);  // the forwards' default is 0
}

// No attention bias: None, or the undefined tensor the importer makes of None for a Tensor
// parameter (ops without a bias input have none).
bool no_bias(const ir::Node& node, const AttentionOp& op) {
  if (!op.bias) return true;
  const c10::IValue* bias = ir::constant_input(node, *op.bias);
  return bias != nullptr && (bias->isNone() || (bias->isTensor() && !bias->toTensor().defined()));
}

ir::Node* only_user(const ir::Value* v) {
  return v->users().size() == 1 ? v->users().front() : nullptr;
}

// _to_copy(x) that changes the dtype to `to` and nothing else.
bool is_cast_to(const ir::Node* node, c10::ScalarType to) {
  if (node == nullptr || !is_op(node, "aten::_to_copy")) return false;
  const auto& in = node->input(0)->tensor_type();
  const auto& out = node->output()->tensor_type();
  return in && out && out->dtype == to && out->device == in->device && out->sizes == in->sizes;
}

// The value that sums `grad` ([b, hkv * r, s, d], the gradient of the repeated heads) over each
// group of r heads, as _decompositions.py gives the expand's gradient: view(grad, [b, hkv, r,
// s, d]), whose select(.., 2, i) for i < r are added in order, in float32 for a half-precision
// grad and rounded back once. nullptr when grad is read in any other way.
ir::Value* group_sum(ir::Value* grad, int64_t kv_heads) {
  const auto& g = grad->tensor_type();
  if (!g || g->rank() != 4 || !g->sizes[1].is_constant() || kv_heads <= 0) return nullptr;
  const int64_t heads = g->sizes[1].constant_value();
  if (heads % kv_heads != 0 || heads == kv_heads) return nullptr;
  const int64_t r = heads / kv_heads;
  ir::Node* view = only_user(grad);
  if (view == nullptr || !(is_op(view, "aten::view") || is_op(view, "aten::_unsafe_view") ||
                           is_op(view, "aten::reshape"))) {
    return nullptr;
  }
  const auto& w = view->output()->tensor_type();
  if (!w || w->rank() != 5) return nullptr;
  const auto& s = g->sizes;
  const auto& ws = w->sizes;
  const auto is = [](const ir::SymExpr& e, int64_t n) {
    return e.is_constant() && e.constant_value() == n;
  };
  if (!(ws[0] == s[0] && is(ws[1], kv_heads) && is(ws[2], r) && ws[3] == s[2] && ws[4] == s[3])) {
    return nullptr;
  }
  const bool widened = g->dtype == c10::ScalarType::BFloat16 || g->dtype == c10::ScalarType::Half;
  std::vector<ir::Value*> terms(r, nullptr);
  if (static_cast<int64_t>(view->output()->users().size()) != r) return nullptr;
  for (ir::Node* select : view->output()->users()) {
    if (!is_op(select, "aten::select.int")) return nullptr;
    const auto dim = constant_int(*select, 1), index = constant_int(*select, 2);
    if (!dim || (*dim != 2 && *dim != -3) || !index || *index < 0 || *index >= r ||
        terms[*index] != nullptr) {
      return nullptr;
    }
    ir::Value* term = select->output();
    if (widened) {
      ir::Node* cast = only_user(term);
      if (!is_cast_to(cast, c10::ScalarType::Float)) return nullptr;
      term = cast->output();
    }
    terms[*index] = term;
  }
  ir::Value* total = terms[0];
  for (int64_t i = 1; i < r; ++i) {
    ir::Node* add = only_user(total);
    if (add == nullptr || !is_op(add, "aten::add.Tensor") || add->input(0) != total ||
        add->input(1) != terms[i] || terms[i]->users().size() != 1 ||
        !is_number(*add, 2, 1.0, /*absent=*/true)) {  // alpha 1
      return nullptr;
    }
    total = add->output();
  }
  if (widened) {
    ir::Node* cast = only_user(total);
    if (!is_cast_to(cast, g->dtype)) return nullptr;
    total = cast->output();
  }
  const auto& t = total->tensor_type();
  if (!t || t->rank() != 4 ||
      !(t->sizes[0] == s[0] && is(t->sizes[1], kv_heads) && t->sizes[2] == s[2] &&
        t->sizes[3] == s[3])) {
    return nullptr;
  }
  return total;
}

// Does every reader of `v` take it in any layout? The group sum is a new contiguous tensor;
// the backward's gradient has the key's layout instead. Views that only restride (transpose,
// unsqueeze, ...) are followed; a view that needs compatible strides (view, _unsafe_view,
// as_strided), a custom op or a graph output could tell the layouts apart.
bool read_in_any_layout(const ir::Value* v) {
  for (const ir::Node* user : v->users()) {
    if (user->kind() == ir::NodeKind::kOutput || user->kind() == ir::NodeKind::kCustomOp) {
      return false;
    }
    if (!user->is_operator()) return false;
    const std::string name = user->op_name();
    if (name == "aten::view" || name == "aten::_unsafe_view" || name == "aten::as_strided") {
      return false;
    }
    const bool restrides =
        name == "aten::transpose.int" || name == "aten::permute" || name == "aten::unsqueeze" ||
        name == "aten::squeeze.dim" || name == "aten::squeeze.dims" || name == "aten::squeeze" ||
        name == "aten::expand" || name == "aten::select.int" || name == "aten::slice.Tensor" ||
        name == "aten::t" || name == "aten::alias" || name == "aten::detach";
    if (restrides && !read_in_any_layout(user->output())) return false;
  }
  return true;
}

// Rewrites a forward call (see the file comment); false when it is not one to rewrite.
bool rewrite_forward(ir::Graph& graph, ir::Node* node, const AttentionOp& op) {
  bool extras_unused = true;
  for (size_t k = 1; k < node->outputs().size(); ++k) {
    extras_unused &= node->output(k)->users().empty();
  }
  if (!extras_unused && !no_dropout(*node, op.dropout)) return false;
  const auto key = repeated_heads(node->input(op.key));
  const auto value = repeated_heads(node->input(op.key + 1));
  if (!key || !value || key->kv_heads != value->kv_heads) return false;
  MAGI_LOG_DEBUG("group_query_attention: ", node->provenance().fx_name, " reads ",
                 key->source->name(), " and ", value->source->name(), " (", key->kv_heads,
                 " heads) instead of their repeated copies");
  ir::Value* old_key = node->input(op.key);
  ir::Value* old_value = node->input(op.key + 1);
  node->set_input(op.key, key->source);
  node->set_input(op.key + 1, value->source);
  erase_unread(graph, old_key);
  if (old_value != old_key) erase_unread(graph, old_value);
  return true;
}

// Rewrites a backward call (see the file comment); false when it is not one to rewrite. Leaves
// the sums it bypasses for the caller's dead-code sweep (they come after `node`).
bool rewrite_backward(ir::Graph& graph, ir::Node* node, const AttentionOp& op) {
  if (!no_dropout(*node, op.dropout)) return false;
  if (!no_bias(*node, op)) return false;
  const auto key = repeated_heads(node->input(op.key));
  const auto value = repeated_heads(node->input(op.key + 1));
  if (!key || !value || key->kv_heads != value->kv_heads || node->outputs().size() != 3) {
    return false;
  }
  // Outputs: the query's, the key's and the value's gradients.
  ir::Value* sums[2] = {nullptr, nullptr};
  for (size_t j = 0; j < 2; ++j) {
    ir::Value* grad = node->output(1 + j);
    if (grad->users().empty()) continue;
    sums[j] = group_sum(grad, key->kv_heads);
    if (sums[j] == nullptr || !read_in_any_layout(sums[j])) return false;
  }
  MAGI_LOG_DEBUG("group_query_attention: ", node->provenance().fx_name, " reads ",
                 key->source->name(), " and ", value->source->name(), " (", key->kv_heads,
                 " heads) and returns their gradients summed over each group");
  ir::Value* old_key = node->input(op.key);
  ir::Value* old_value = node->input(op.key + 1);
  const Repeat* sources[2] = {&*key, &*value};
  node->set_input(op.key, key->source);
  node->set_input(op.key + 1, value->source);
  for (size_t j = 0; j < 2; ++j) {
    ir::Value* grad = node->output(1 + j);
    ir::TensorType type = *grad->tensor_type();
    type.sizes = sources[j]->source->tensor_type()->sizes;
    type.strides = sources[j]->source->tensor_type()->strides;  // both backwards' layout
    grad->set_tensor_type(std::move(type));
    if (sums[j] == nullptr) continue;
    const std::vector<ir::Node*> readers = sums[j]->users();
    for (ir::Node* reader : readers) reader->replace_input(sums[j], grad);
  }
  erase_unread(graph, old_key);
  if (old_value != old_key) erase_unread(graph, old_value);
  return true;
}

// Are the key and value gradients of a backward call (grouped heads) read only through group
// sums whose readers take any layout, as rewrite_backward needs?
bool returns_group_sums(const ir::Node& node, const AttentionOp& op) {
  const auto key = repeated_heads(node.input(op.key));
  if (!key || node.outputs().size() != 3) return false;
  for (size_t j = 0; j < 2; ++j) {
    ir::Value* grad = node.output(1 + j);
    if (grad->users().empty()) continue;
    const ir::Value* sum = group_sum(grad, key->kv_heads);
    if (sum == nullptr || !read_in_any_layout(sum)) return false;
  }
  return true;
}

// Do `node`'s key and value inputs both repeat the same number of grouped heads?
bool reads_repeated_heads(const ir::Node& node, const AttentionOp& op) {
  const auto key = repeated_heads(node.input(op.key));
  const auto value = repeated_heads(node.input(op.key + 1));
  return key && value && key->kv_heads == value->kv_heads;
}

}  // namespace

bool is_grouped_attention_copy(const ir::Node& clone) {
  if (!is_op(&clone, "aten::clone") || clone.output()->users().empty()) return false;
  for (const ir::Node* view : clone.output()->users()) {
    if (view->outputs().size() != 1 || !repeated_heads(view->output())) return false;
    if (view->output()->users().empty()) return false;
    for (const ir::Node* reader : view->output()->users()) {
      const AttentionOp* op = attention_op(*reader);
      if (op == nullptr || !reads_repeated_heads(*reader, *op) ||
          !no_dropout(*reader, op->dropout)) {
        return false;
      }
      const ir::Value* v = view->output();
      if (reader->input(op->key) != v && reader->input(op->key + 1) != v) return false;
      if (op->backward && !returns_group_sums(*reader, *op)) return false;
      for (size_t i = 0; i < reader->inputs().size(); ++i) {
        if (reader->input(i) == v && i != op->key && i != op->key + 1) return false;
      }
      if (!no_bias(*reader, *op)) return false;
    }
  }
  return true;
}

// `node` as a flash call when it is an unmasked inference call of memory-efficient attention
// over repeated heads that flash can run (bf16 or f16, a head dim that is a multiple of 8 up to
// 256, on CUDA); otherwise `node`. The output keeps its type: both kernels return [b, L, h, d]
// seen through a transpose.
ir::Node* efficient_as_flash(ir::Graph& graph, ir::Node* node) {
  // (query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, *, scale)
  if (!is_op(node, "aten::_scaled_dot_product_efficient_attention") || node->inputs().size() != 8) {
    return node;
  }
  for (size_t k = 1; k < node->outputs().size(); ++k) {
    if (!node->output(k)->users().empty()) return node;
  }
  const c10::IValue* bias = ir::constant_input(*node, 3);
  const c10::IValue* causal = ir::constant_input(*node, 6);
  if (bias == nullptr || !(bias->isNone() || (bias->isTensor() && !bias->toTensor().defined())) ||
      !no_dropout(*node, 5) || causal == nullptr || !causal->isBool()) {
    return node;
  }
  const auto& q = node->input(0)->tensor_type();
  const auto& out = node->output(0)->tensor_type();
  if (!q || !out || !q->device.is_cuda() || !attention_match::flash_takes(*q)) return node;
  // key 1, value 2, dropout_p 5
  const AttentionOp efficient = {"aten::_scaled_dot_product_efficient_attention", false, 1, 5, {}};
  if (!reads_repeated_heads(*node, efficient)) return node;

  graph.set_insert_point(node);
  // _scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
  //                                     return_debug_mask, *, scale)
  ir::Node* flash =
      graph.add_op(c10::Dispatcher::singleton().findSchemaOrThrow(
                       "aten::_scaled_dot_product_flash_attention", ""),
                   {node->input(0), node->input(1), node->input(2), node->input(5), node->input(6),
                    graph.add_constant(false, ir::ValueKind::kBool), node->input(7)});
  graph.set_insert_point(nullptr);
  flash->provenance() = node->provenance();
  flash->output(0)->set_tensor_type(*out);
  flash->output(0)->set_name(graph.unique_name("attention"));
  const std::vector<ir::Node*> readers = node->output(0)->users();
  for (ir::Node* reader : readers) reader->replace_input(node->output(0), flash->output(0));
  MAGI_LOG_DEBUG("group_query_attention: ", node->provenance().fx_name,
                 " runs as flash attention, which reads grouped heads");
  graph.erase(node);
  return flash;
}

bool group_query_attention(ir::Graph& graph) {
  bool changed = false;
  bool bypassed_sums = false;
  for (ir::Node* node : graph.nodes()) {
    node = efficient_as_flash(graph, node);
    const AttentionOp* op = attention_op(*node);
    if (op == nullptr) continue;
    if (op->backward) {
      const bool rewritten = rewrite_backward(graph, node, *op);
      bypassed_sums |= rewritten;
      changed |= rewritten;
    } else {
      changed |= rewrite_forward(graph, node, *op);
    }
  }
  if (bypassed_sums) eliminate_dead_code(graph);  // the group sums no one reads now
  return changed;
}

}  // namespace magi::passes
