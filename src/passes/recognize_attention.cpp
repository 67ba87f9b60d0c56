// recognize_attention: attention written out as matmuls and a softmax becomes one SDPA call.
//
// Research code often writes attention by hand:
//
//   scores = q @ k.transpose(-2, -1) * scale
//   scores = scores.masked_fill(torch.tril(torch.ones(L, L)) == 0, float("-inf"))
//   out = torch.softmax(scores.float(), dim=-1).type_as(q) @ v
//
// which materialises the [b, h, L, L] scores (several times over: masked, upcast, softmax),
// quadratic in the sequence. After AOTAutograd each matmul is a bmm between views of its 4-D
// operands (view/_unsafe_view of an identity expand, with a contiguous clone where the view
// needs one). The pass starts from each softmax, walks back to the first bmm and forward to
// the second, and replaces the chain by the fused SDPA operator that F.scaled_dot_product_attention
// itself captures as on that device, which never holds the scores:
//
//   CPU   aten::_scaled_dot_product_flash_attention_for_cpu (float32, float64, bf16, f16)
//   CUDA  aten::_scaled_dot_product_flash_attention (bf16 and f16, head dim a multiple of 8 up
//         to 256), which the runtime's AttentionCall re-routes per shape and
//         group_query_attention hands grouped key/value heads.
//
// Recognised between the two matmuls, in any order: scale factors (mul or div by a positive
// constant, on the scores or on q), up to four masks, one upcast to float32 before the
// softmax with its downcast after, a clone of the weights (eval-mode dropout). A mask is causal
// when the graph builds it from a constant fill (ones, full) with tril (diagonal 0, the kept
// entries) or triu (diagonal 1, the masked entries), through comparisons with 0, logical negation,
// casts and views that keep its last two dims, and applies it as masked_fill with -inf (or the
// lowest finite value, as Hugging Face writes it) or adds a -inf bias built so; alone, it is then
// SDPA's is_causal, for L == S. Other masks that broadcast to the scores (a padding mask passed in,
// a per-head bias, Hugging Face's eager-attention mask, a causal mask with another one) become
// SDPA's attn_mask: boolean ones applied as masked_fill(-inf) combined (logical_or) and handed over
// negated (SDPA keeps the true entries), one additive mask in the scores' dtype as it is when every
// scale applies before it (with the boolean ones filled in as -inf). Such calls go through
// aten::scaled_dot_product_attention, which picks the kernel that takes the mask. Keys and
// values repeated for grouped-query attention (repeat_kv: expand then reshape) are read as the
// repeated tensors; group_query_attention removes the copies where the backend allows.
//
// Left alone, with the reason logged: a scores value, mask step or softmax with another reader
// (the rewrite would have to keep it anyway); a mask that does not broadcast to the scores, a
// masked_fill with a finite value other than of the only, causal, mask, two additive masks, an
// additive mask in another dtype or scaled after it is added; a softmax over another dim; a scale
// that is not a positive constant; shapes or dtypes the fused kernel does not take. Nothing is
// approximated: a rewritten chain computes eager's result within rounding, except for a query
// row whose keys a -inf mask hides entirely (eager's softmax gives NaN there, SDPA 0).
//
// Meant for inference graphs: the rewrite never changes what a graph returns, so a training
// forward whose softmax output or scores are saved for the backward keeps its chain (they have
// another reader). Training captures are rewritten earlier, in Dynamo's graph before
// AOTAutograd derives the backward (python/magi_compiler/_attention_fx.py). The matchers of
// nodes and masks are in attention_match.cpp.
//
// Requires: a verified graph, before group_query_attention. Guarantees: a verified graph
// computing the same outputs within rounding; no [.., L, S] intermediate left for a rewritten
// chain.
#include "magi/passes/recognize_attention.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attention_match.h"
#include "magi/common/log.h"
#include "magi/ir/node.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

using namespace attention_match;  // NOLINT(build/namespaces): the matchers this pass is made of

// The 4-D tensor `v` (a 3-D bmm operand) views: matmul's decomposition reshapes [b, h, m, n]
// to [b * h, m, n], through an identity expand and a contiguous clone where needed.
ir::Value* bmm_operand_source(ir::Value* v) {
  const ir::Node* view = v->producer();
  if (!is_reshape(view)) return nullptr;
  ir::Value* x = view->input(0);
  if (is_op(x->producer(), "aten::clone")) x = x->producer()->input(0);
  if (is_op(x->producer(), "aten::expand")) {
    const ir::TensorType* e = type_of(x);
    const ir::TensorType* s = type_of(x->producer()->input(0));
    if (e == nullptr || s == nullptr || e->sizes != s->sizes) return nullptr;  // broadcasting
    x = x->producer()->input(0);
  }
  const ir::TensorType* four = type_of(x);
  const ir::TensorType* three = type_of(v);
  if (four == nullptr || three == nullptr || four->rank() != 4 || three->rank() != 3) {
    return nullptr;
  }
  const auto& f = four->sizes;
  const auto& t = three->sizes;
  if (!(t[0] == f[0] * f[1] && t[1] == f[2] && t[2] == f[3])) return nullptr;
  return x;
}

// A multiplication or division by a positive constant: the factor it applies and the input it
// applies it to.
struct Scale {
  double factor;
  size_t operand;
};

std::optional<Scale> scale_of(const ir::Node* node) {
  const bool mul = is_op(node, "aten::mul.Tensor") || is_op(node, "aten::mul.Scalar");
  const bool div = is_op(node, "aten::div.Tensor") || is_op(node, "aten::div.Scalar");
  if (!mul && !div) return std::nullopt;
  std::optional<double> c = constant_number(*node, 1);
  size_t operand = 0;
  if (mul && !c) {
    c = constant_number(*node, 0);
    operand = 1;
  }
  if (!c || !std::isfinite(*c) || *c <= 0.0) return std::nullopt;
  const ir::TensorType* in = type_of(node->input(operand));
  const ir::TensorType* out = type_of(node->output());
  if (in == nullptr || out == nullptr || in->dtype != out->dtype || in->sizes != out->sizes) {
    return std::nullopt;
  }
  return Scale{div ? 1.0 / *c : *c, operand};
}

// One written-out attention, found from its softmax.
struct Chain {
  ir::Node* softmax = nullptr;
  ir::Value* query = nullptr;   ///< [b, h, L, d]
  ir::Value* key = nullptr;     ///< [b, h, S, d]
  ir::Value* value = nullptr;   ///< [b, h, S, d]
  ir::Value* result = nullptr;  ///< the [b, h, L, d] output of the second matmul's view
  double scale = 1.0;
  bool causal = false;
  std::vector<ir::Value*> masked;  ///< boolean masks applied with masked_fill(-inf)
  ir::Value* bias = nullptr;       ///< an additive mask
  bool has_mask() const { return !masked.empty() || bias != nullptr; }
};

// A mask step found between the matmul and the softmax.
struct MaskStep {
  ir::Value* mask = nullptr;
  const ir::Node* node = nullptr;  // masked_fill or add
  bool scaled_after = false;       // a scale applies after this step
};

// The masks applied to the scores: is_causal when the only one is the causal mask, SDPA's
// attn_mask otherwise. Returns the reason they can be neither, or "".
std::string match_masks(const std::vector<MaskStep>& steps, const ir::TensorType& scores,
                        Chain& chain) {
  const auto is_fill = [](const ir::Node* n) {
    return is_op(n, "aten::masked_fill.Scalar") || is_op(n, "aten::masked_fill.Tensor");
  };
  if (steps.size() == 1) {
    std::string ignored;
    const Mask m = classify_mask(steps[0].mask, &ignored);
    if (is_fill(steps[0].node) ? m == Mask::kMaskUpper : m == Mask::kNegInfUpper) {
      const ir::TensorType* mt = type_of(steps[0].mask);
      if (mt == nullptr || mt->rank() > 4 || last_two(*mt) != last_two(scores)) {
        return "the mask's last two dims are not the scores'";
      }
      if (!(scores.sizes[2] == scores.sizes[3])) {
        return "a causal mask with query length != key length";
      }
      chain.causal = true;
      return "";
    }
  }
  // Otherwise every mask goes into SDPA's attn_mask, which it broadcasts to [b, h, L, S].
  for (const MaskStep& step : steps) {
    const ir::TensorType* mt = type_of(step.mask);
    if (mt == nullptr || !broadcasts_to(*mt, scores)) {
      return "a mask that does not broadcast to the scores";
    }
    if (is_fill(step.node)) {
      const auto value = constant_number(*step.node, 2);
      if (mt->dtype != c10::kBool) return "a masked_fill whose mask is not boolean";
      if (!value || !std::isinf(*value)) {
        return "a masked_fill of a mask that is not the only causal one with a finite value "
               "(SDPA masks with -inf)";
      }
      chain.masked.push_back(step.mask);
    } else {
      if (chain.bias != nullptr) return "two additive masks";
      if (mt->dtype != scores.dtype) return "an additive mask in another dtype than the scores";
      if (step.scaled_after) return "a scale applied after the additive mask";
      chain.bias = step.mask;
    }
  }
  return "";
}

// Walks back from the softmax's input to the first bmm. Returns the reason it is not an
// attention chain, or "" with `chain` filled; `candidate` says whether a bmm feeds the softmax.
std::string match_scores(ir::Value* x, Chain& chain, bool& candidate, bool& upcast,
                         c10::ScalarType& scores_dtype) {
  std::string why;
  std::vector<MaskStep> masks;
  bool scaled = false;  // a scale seen so far, i.e. applied after the steps found later
  for (int steps = 0; steps < 16; ++steps) {
    ir::Node* node = x->producer();
    if (node == nullptr || !node->is_operator()) break;
    if (is_reshape(node) && is_op(node->input(0)->producer(), "aten::bmm")) {
      candidate = true;
      if (!why.empty()) return why;
      ir::Node* bmm = node->input(0)->producer();
      if (bmm->output()->users().size() != 1) return "the matmul's result has another reader";
      if (x->users().size() != 1) return "the scores have another reader";
      const ir::TensorType* scores = type_of(x);
      ir::Value* q = bmm_operand_source(bmm->input(0));
      ir::Value* kt = bmm_operand_source(bmm->input(1));
      if (scores == nullptr || scores->rank() != 4 || q == nullptr || kt == nullptr) {
        return "the matmul is not one of 4-D operands";
      }
      const ir::Node* t = kt->producer();
      const bool transposed =
          (is_op(t, "aten::transpose.int") && constant_int(*t, 1) && constant_int(*t, 2) &&
           in_last_two(*constant_int(*t, 1), 4) && in_last_two(*constant_int(*t, 2), 4) &&
           *constant_int(*t, 1) % 4 != *constant_int(*t, 2) % 4);
      bool permuted = false;
      if (is_op(t, "aten::permute")) {
        const c10::IValue* p = ir::constant_input(*t, 1);
        permuted =
            p != nullptr && p->isIntList() && p->toIntVector() == std::vector<int64_t>{0, 1, 3, 2};
      }
      if (!transposed && !permuted) return "the key side of the matmul is not a transposed key";
      chain.key = t->input(0);
      // A constant scale on q (q * d**-0.5 before the matmul) moves into the call.
      if (q->users().size() == 1) {
        const ir::Node* qs = q->producer();
        if (const auto f = scale_of(qs)) {
          chain.scale *= f->factor;
          q = qs->input(f->operand);
        }
      }
      chain.query = q;
      scores_dtype = scores->dtype;
      return masks.empty() ? "" : match_masks(masks, *scores, chain);
    }
    if (node->inputs().empty()) break;
    if (x->users().size() != 1 && why.empty()) {
      why = "a value between the matmul and the softmax has another reader";
    }
    const ir::TensorType* out = type_of(node->output());
    const ir::TensorType* in = type_of(node->input(0));
    if (out == nullptr || in == nullptr) break;
    ir::Value* next = node->input(0);
    if (const auto f = scale_of(node)) {
      chain.scale *= f->factor;
      next = node->input(f->operand);
      scaled = true;
    } else if (is_op(node, "aten::masked_fill.Scalar") || is_op(node, "aten::masked_fill.Tensor")) {
      const auto value = constant_number(*node, 2);
      if (why.empty() &&
          (masks.size() >= 4 || !value || !is_masking_value(*value) || out->sizes != in->sizes)) {
        why = masks.size() >= 4 ? "more than four masks"
                                : "masked_fill with a value other than -inf, or "
                                  "a mask that broadcasts the scores";
      }
      masks.push_back({node->input(1), node, scaled});
    } else if (is_op(node, "aten::add.Tensor")) {
      // The bias is the operand built as a mask, or the one the other broadcasts over; the
      // scores are the other.
      std::string ignored;
      const ir::TensorType* first = type_of(node->input(0));
      const bool bias_first = (classify_mask(node->input(1), &ignored) == Mask::kUnknown &&
                               classify_mask(node->input(0), &ignored) != Mask::kUnknown) ||
                              (first != nullptr && first->sizes != out->sizes);
      next = node->input(bias_first ? 1 : 0);
      const auto alpha = constant_number(*node, 2);
      const ir::TensorType* scores = type_of(next);
      if (why.empty() && (masks.size() >= 4 || !alpha || *alpha != 1.0 || scores == nullptr ||
                          out->dtype != scores->dtype || out->sizes != scores->sizes)) {
        why = masks.size() >= 4 ? "more than four masks" : "an addition that is not a mask bias";
      }
      masks.push_back({node->input(bias_first ? 0 : 1), node, scaled});
    } else if (is_op(node, "aten::_to_copy")) {
      if (why.empty() && (upcast || out->dtype != c10::kFloat || out->sizes != in->sizes ||
                          out->device != in->device ||
                          !(in->dtype == c10::kBFloat16 || in->dtype == c10::kHalf))) {
        why = "a cast other than one upcast to float32";
      }
      upcast = true;
    } else {
      if (why.empty()) why = "the softmax reads " + node->op_name() + " of the scores";
    }
    x = next;
  }
  return why.empty() ? "no matmul feeds the softmax" : why;
}

// Walks forward from the softmax to the second bmm and the view of its result.
std::string match_output(Chain& chain, bool upcast, c10::ScalarType scores_dtype) {
  ir::Value* p = chain.softmax->output();
  if (upcast) {
    ir::Node* cast = only_user(p);
    if (!is_op(cast, "aten::_to_copy") || type_of(cast->output()) == nullptr ||
        type_of(cast->output())->dtype != scores_dtype) {
      return "the float32 softmax is not cast back to the scores' dtype";
    }
    p = cast->output();
  } else if (type_of(p) == nullptr || type_of(p)->dtype != scores_dtype) {
    return "the softmax changes the dtype";
  }
  if (p->users().size() != 1) return "the attention weights have another reader";
  // Dropout in eval mode (or at p = 0) is captured as a clone of the weights.
  for (ir::Node* copy = only_user(p); is_op(copy, "aten::clone") || is_op(copy, "aten::alias");
       copy = only_user(p)) {
    if (type_of(copy->output()) == nullptr || type_of(copy->output())->sizes != type_of(p)->sizes ||
        copy->output()->users().size() != 1) {
      return "the attention weights are copied and read twice";
    }
    p = copy->output();
  }
  ir::Node* wrap = only_user(p);
  if (is_op(wrap, "aten::expand")) {
    if (type_of(wrap->output()) == nullptr || type_of(wrap->output())->sizes != type_of(p)->sizes ||
        wrap->output()->users().size() != 1) {
      return "the attention weights are broadcast or read twice";
    }
    wrap = only_user(wrap->output());
  }
  if (!is_reshape(wrap) || wrap->output()->users().size() != 1) {
    return "the attention weights are not read by a matmul alone";
  }
  ir::Node* bmm = only_user(wrap->output());
  if (!is_op(bmm, "aten::bmm") || bmm->input(0) != wrap->output() ||
      bmm_operand_source(wrap->output()) != p) {
    return "the attention weights are not the left operand of a matmul";
  }
  chain.value = bmm_operand_source(bmm->input(1));
  ir::Node* view = only_user(bmm->output());
  if (chain.value == nullptr || !is_reshape(view) || type_of(view->output()) == nullptr ||
      type_of(view->output())->rank() != 4) {
    return "the matmul with the value is not one of 4-D operands";
  }
  chain.result = view->output();
  return "";
}

// Shapes, dtypes and layouts the fused kernel takes; the operator's name or "" with `why`.
std::string choose_operator(const Chain& c, std::string* why) {
  const ir::TensorType* q = type_of(c.query);
  const ir::TensorType* k = type_of(c.key);
  const ir::TensorType* v = type_of(c.value);
  const ir::TensorType* r = type_of(c.result);
  if (!q || !k || !v || !r || q->rank() != 4 || k->rank() != 4 || v->rank() != 4) {
    *why = "query, key and value are not 4-D tensors";
    return "";
  }
  const auto& qs = q->sizes;
  const auto& ks = k->sizes;
  const auto& vs = v->sizes;
  if (!(ks[0] == qs[0] && ks[1] == qs[1] && ks[3] == qs[3] && vs[0] == qs[0] && vs[1] == qs[1] &&
        vs[2] == ks[2] && vs[3] == qs[3] &&
        r->sizes == std::vector<ir::SymExpr>{qs[0], qs[1], qs[2], vs[3]})) {
    *why = "query, key and value shapes do not line up ([b, h, L, d], [b, h, S, d], [b, h, S, d])";
    return "";
  }
  if (k->dtype != q->dtype || v->dtype != q->dtype || r->dtype != q->dtype ||
      k->device != q->device || v->device != q->device) {
    *why = "query, key and value differ in dtype or device";
    return "";
  }
  // The fused kernels assume a dense last dim and would read a strided one wrongly.
  for (const ir::TensorType* t : {q, k, v}) {
    if (t->strides.size() != 4 || !(t->strides.back() == ir::SymExpr(1))) {
      *why = "an operand's last dim is not known to be contiguous";
      return "";
    }
  }
  const c10::ScalarType dtype = q->dtype;
  if (c.has_mask()) {
    std::vector<ir::Value*> masks = c.masked;
    if (c.bias != nullptr) masks.push_back(c.bias);
    for (const ir::Value* mask : masks) {
      const ir::TensorType* m = type_of(mask);
      if (m == nullptr || m->device != q->device) {
        *why = "a mask on another device than the query";
        return "";
      }
    }
    if (c.bias != nullptr && type_of(c.bias)->dtype != dtype) {
      *why = "an additive mask in another dtype than the query";
      return "";
    }
    if (c10::isFloatingType(dtype) && (q->device.is_cpu() || q->device.is_cuda())) {
      return "aten::scaled_dot_product_attention";
    }
    *why = std::string("no attention with a mask for ") + c10::toString(dtype) + " on " +
           q->device.str();
    return "";
  }
  if (q->device.is_cpu()) {
    if (dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kBFloat16 ||
        dtype == c10::kHalf) {
      return "aten::_scaled_dot_product_flash_attention_for_cpu";
    }
    *why = std::string("no fused CPU attention for ") + c10::toString(dtype);
    return "";
  }
  if (q->device.is_cuda()) {
    if (attention_match::flash_takes(*q)) return "aten::_scaled_dot_product_flash_attention";
    *why = std::string("no flash attention for ") + c10::toString(dtype) + " with head dim " +
           qs[3].str() + " (bf16 or f16, a multiple of 8 up to 256)";
    return "";
  }
  *why = "no fused attention on " + q->device.str();
  return "";
}

// Does every reader of `v` take it in any layout? The fused call's output is laid out as the
// backend lays it out, not as the matmul's contiguous result was; views that need a layout
// (view, _unsafe_view, as_strided), custom ops and the graph's outputs could tell them apart.
bool read_in_any_layout(const ir::Value* v) {
  for (const ir::Node* user : v->users()) {
    if (!user->is_operator() || user->kind() == ir::NodeKind::kCustomOp) return false;
    const std::string name = user->op_name();
    if (is_reshape(user) || name == "aten::as_strided") return false;
    if (ir::op_info(*user).op_class == ir::OpClass::kView && !read_in_any_layout(user->output())) {
      return false;
    }
  }
  return true;
}

std::vector<ir::SymExpr> strides_in_order(const std::vector<ir::SymExpr>& sizes,
                                          const std::vector<int>& order) {
  // order: dims from outermost to innermost.
  std::vector<ir::SymExpr> strides(sizes.size());
  ir::SymExpr s(1);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    strides[*it] = s;
    s = s * sizes[*it];
  }
  return strides;
}

// SDPA's attn_mask from the chain's masks: the boolean ones (masked where true) combined and
// negated (SDPA keeps the true entries), or the additive one with them filled in as -inf.
ir::Value* attention_mask(ir::Graph& graph, const Chain& c) {
  const auto op = [&](const char* name, const char* overload, std::vector<ir::Value*> inputs,
                      ir::TensorType type, const char* out) {
    ir::Node* n = graph.add_op(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload),
                               std::move(inputs));
    n->provenance() = c.softmax->provenance();
    n->output()->set_tensor_type(std::move(type));
    n->output()->set_name(graph.unique_name(out));
    return n->output();
  };
  ir::Value* masked = c.masked.empty() ? nullptr : c.masked[0];
  for (size_t i = 1; i < c.masked.size(); ++i) {
    masked =
        op("aten::logical_or", "", {masked, c.masked[i]},
           broadcast_type(*type_of(masked), *type_of(c.masked[i]), c10::kBool), "attention_masked");
  }
  if (c.bias == nullptr) {
    const ir::TensorType* m = type_of(masked);  // a new, dense tensor of the mask's shape
    return op("aten::logical_not", "", {masked}, broadcast_type(*m, *m, c10::kBool),
              "attention_keep");
  }
  if (masked == nullptr) return c.bias;
  const ir::TensorType* bias = type_of(c.bias);
  ir::Value* neg_inf =
      graph.add_constant(-std::numeric_limits<double>::infinity(), ir::ValueKind::kScalar);
  return op("aten::where", "ScalarSelf", {masked, neg_inf, c.bias},
            broadcast_type(*type_of(masked), *bias, bias->dtype), "attention_bias");
}

// Replaces the chain by the call; returns the value its readers now read.
ir::Value* rewrite(ir::Graph& graph, const Chain& c, const std::string& op_name) {
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(op_name.c_str(), "");
  ir::Node* anchor = c.result->producer();
  graph.set_insert_point(anchor);
  const auto constant = [&](c10::IValue v, ir::ValueKind kind) {
    return graph.add_constant(std::move(v), kind);
  };
  ir::Value* dropout = constant(0.0, ir::ValueKind::kFloat);
  ir::Value* causal = constant(c.causal, ir::ValueKind::kBool);
  ir::Value* scale = constant(c.scale, ir::ValueKind::kFloat);
  std::vector<ir::Value*> inputs = {c.query, c.key, c.value};
  const bool cpu = op_name == "aten::_scaled_dot_product_flash_attention_for_cpu";
  const bool masked = c.has_mask();
  if (masked) {
    // scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, *, scale, enable_gqa)
    ir::Value* attn_mask = attention_mask(graph, c);
    inputs.insert(inputs.end(), {attn_mask, dropout, causal, scale});
    inputs.push_back(constant(false, ir::ValueKind::kBool));  // enable_gqa
  } else {
    inputs.insert(inputs.end(), {dropout, causal});
    if (cpu) {
      inputs.push_back(constant(c10::IValue(), ir::ValueKind::kNone));  // attn_mask
    } else {
      inputs.push_back(constant(false, ir::ValueKind::kBool));  // return_debug_mask
    }
    inputs.push_back(scale);
  }
  ir::Node* call = graph.add_op(op, std::move(inputs));
  call->provenance() = c.softmax->provenance();
  call->output(0)->set_name(graph.unique_name("attention"));
  // The output's layout: the CPU kernel allocates it like the query; flash on CUDA (and the
  // kernels scaled_dot_product_attention picks for a mask) as [b, L, h, d] seen through a
  // transpose. Kernels read it with its actual strides either way, and a reader that needs a
  // layout gets a contiguous copy below.
  ir::TensorType out = *type_of(c.result);
  const ir::TensorType* q = type_of(c.query);
  out.strides = cpu ? q->strides : strides_in_order(out.sizes, {0, 2, 1, 3});
  call->output(0)->set_tensor_type(out);
  if (!masked) {
    ir::TensorType lse = out;
    lse.dtype = c10::kFloat;
    lse.sizes = {q->sizes[0], q->sizes[1], q->sizes[2]};
    lse.strides = ir::TensorType::contiguous_strides(lse.sizes);
    call->output(1)->set_tensor_type(lse);
  }
  ir::Value* result = call->output(0);
  if (!read_in_any_layout(c.result)) {
    ir::Node* copy = graph.add_op(c10::Dispatcher::singleton().findSchemaOrThrow("aten::clone", ""),
                                  {result, constant(c10::IValue(c10::MemoryFormat::Contiguous),
                                                    ir::ValueKind::kMemoryFormat)});
    copy->provenance() = c.softmax->provenance();
    ir::TensorType contiguous = *type_of(c.result);
    contiguous.strides = ir::TensorType::contiguous_strides(contiguous.sizes);
    copy->output()->set_tensor_type(contiguous);
    copy->output()->set_name(graph.unique_name("attention_contiguous"));
    result = copy->output();
  }
  graph.set_insert_point(nullptr);
  const std::vector<ir::Node*> readers = c.result->users();
  for (ir::Node* reader : readers) {
    reader->replace_input(c.result, result);
    // A transpose or permute of the result now sees the call's strides.
    if (result == call->output(0) && ir::op_info(*reader).op_class == ir::OpClass::kView &&
        ir::op_info(*reader).fn == "permute" && reader->output()->tensor_type()) {
      ir::TensorType t = *reader->output()->tensor_type();
      const std::vector<int64_t> dims = ir::view_permutation(*reader);
      if (dims.size() != out.strides.size()) continue;
      t.strides.clear();
      for (int64_t d : dims) t.strides.push_back(out.strides[d]);
      reader->output()->set_tensor_type(std::move(t));
    }
  }
  return result;
}

std::mutex patterns_mutex;
std::vector<AttentionPattern>& patterns() {
  static std::vector<AttentionPattern> all;
  return all;
}

void record(const ir::Node& softmax, bool rewritten, const std::string& detail);

void record(const ir::Node& softmax, bool rewritten, const std::string& detail) {
  const std::string at = node_location(softmax);
  if (rewritten) {
    MAGI_LOG_INFO("recognize_attention: ", at, ": rewritten as ", detail);
  } else {
    MAGI_LOG_INFO("recognize_attention: ", at, ": left as written: ", detail);
  }
  std::lock_guard<std::mutex> lock(patterns_mutex);
  patterns().push_back({at, rewritten, detail});
}

}  // namespace

std::vector<AttentionPattern> attention_patterns() {
  std::lock_guard<std::mutex> lock(patterns_mutex);
  return patterns();
}

void record_attention_pattern(AttentionPattern pattern) {
  std::lock_guard<std::mutex> lock(patterns_mutex);
  patterns().push_back(std::move(pattern));
}

void clear_attention_patterns() {
  std::lock_guard<std::mutex> lock(patterns_mutex);
  patterns().clear();
}

bool recognize_attention(ir::Graph& graph) {
  std::vector<std::pair<Chain, std::string>> found;
  for (ir::Node* node : graph.nodes()) {
    const bool softmax = is_op(node, "aten::_softmax") || is_op(node, "aten::softmax.int");
    if (!softmax) continue;
    Chain chain;
    chain.softmax = node;
    bool candidate = false, upcast = false;
    c10::ScalarType scores_dtype = c10::kFloat;
    std::string why;
    const ir::TensorType* in = type_of(node->input(0));
    const auto dim = constant_int(*node, 1);
    if (in == nullptr || !dim || (*dim != -1 && *dim != in->rank() - 1)) {
      why = "the softmax is not over the last dim";
    } else if (is_op(node, "aten::_softmax") &&
               !(ir::constant_input(*node, 2) && ir::constant_input(*node, 2)->isBool() &&
                 !ir::constant_input(*node, 2)->toBool())) {
      why = "the softmax computes half-precision input in float32 itself";
    } else if (is_op(node, "aten::softmax.int") &&
               !(ir::constant_input(*node, 2) && ir::constant_input(*node, 2)->isNone())) {
      why = "the softmax casts its input itself";
    }
    std::string scores_why = match_scores(node->input(0), chain, candidate, upcast, scores_dtype);
    if (!candidate) {
      MAGI_LOG_DEBUG("recognize_attention: ", node_location(*node), ": not attention (", scores_why,
                     ")");
      continue;
    }
    if (why.empty()) why = scores_why;
    if (why.empty()) why = match_output(chain, upcast, scores_dtype);
    std::string op_name;
    if (why.empty()) op_name = choose_operator(chain, &why);
    if (!why.empty()) {
      record(*node, false, why);
      continue;
    }
    found.emplace_back(chain, op_name);
  }
  // A chain may read an earlier chain's result as its query, key, value or mask: it reads the
  // call that replaced it, so the earlier chain's matmuls and scores go.
  std::map<ir::Value*, ir::Value*> replaced;
  const auto now = [&](ir::Value* v) {
    const auto it = replaced.find(v);
    return it == replaced.end() ? v : it->second;
  };
  for (auto& [chain, op_name] : found) {
    chain.query = now(chain.query);
    chain.key = now(chain.key);
    chain.value = now(chain.value);
    chain.bias = chain.bias == nullptr ? nullptr : now(chain.bias);
    for (ir::Value*& m : chain.masked) m = now(m);
    replaced[chain.result] = rewrite(graph, chain, op_name);
    std::ostringstream detail;
    detail << op_name << " (" << (chain.causal ? "causal, " : "")
           << (chain.masked.empty() ? "" : "boolean mask, ")
           << (chain.bias == nullptr ? "" : "additive mask, ") << "scale " << chain.scale << ")";
    record(*chain.softmax, true, detail.str());
  }
  if (found.empty()) return false;
  eliminate_dead_code(graph);  // the scores chains and the masks no one reads now
  return true;
}

}  // namespace magi::passes
