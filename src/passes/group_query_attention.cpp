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
// Only calls whose extra outputs (logsumexp, RNG state) are unused: in a training forward they
// are saved for a backward traced against the repeated tensors. Memory-efficient attention
// takes no grouped heads; AttentionCall leaves it out for such calls.
//
// Requires: a verified graph. Guarantees: a verified graph computing the same outputs.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "magi/common/log.h"
#include "magi/ir/node.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

bool is_op(const ir::Node* node, const char* name) {
  return node->is_operator() && node->op_name() == name;
}

std::optional<int64_t> constant_int(const ir::Node& node, size_t i) {
  const c10::IValue* v = ir::constant_input(node, i);
  if (v == nullptr || !v->isInt()) return std::nullopt;
  return v->toInt();
}

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

// Flash and cuDNN attention read grouped heads, cuDNN also with a mask: on the H100 (torch
// 2.11) a [1, 1, 1, 256] mask with 32 query and 8 key heads matched a float32 reference to
// 2e-3 (scripts/gpu/cudnn_gqa_mask_probe.py).
bool takes_grouped_heads(const ir::Node& node) {
  return is_op(&node, "aten::_scaled_dot_product_flash_attention") ||
         is_op(&node, "aten::_scaled_dot_product_cudnn_attention");
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

}  // namespace

bool group_query_attention(ir::Graph& graph) {
  bool changed = false;
  for (ir::Node* node : graph.nodes()) {
    if (!takes_grouped_heads(*node)) continue;
    bool extras_unused = true;
    for (size_t k = 1; k < node->outputs().size(); ++k) {
      extras_unused &= node->output(k)->users().empty();
    }
    if (!extras_unused) continue;
    // Schema order: query, key, value, ...
    const auto key = repeated_heads(node->input(1));
    const auto value = repeated_heads(node->input(2));
    if (!key || !value || key->kv_heads != value->kv_heads) continue;
    MAGI_LOG_DEBUG("group_query_attention: ", node->provenance().fx_name, " reads ",
                   key->source->name(), " and ", value->source->name(), " (", key->kv_heads,
                   " heads) instead of their repeated copies");
    ir::Value* old_key = node->input(1);
    ir::Value* old_value = node->input(2);
    node->set_input(1, key->source);
    node->set_input(2, value->source);
    erase_unread(graph, old_key);
    if (old_value != old_key) erase_unread(graph, old_value);
    changed = true;
  }
  return changed;
}

}  // namespace magi::passes
