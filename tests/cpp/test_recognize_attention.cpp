// recognize_attention on hand-built graphs shaped as AOTAutograd captures written-out attention
// (each matmul a bmm between views of identity expands): the forms it rewrites into one fused
// SDPA call, and the ones it must leave as they are.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "magi/ir/op_info.h"
#include "magi/ir/printer.h"
#include "magi/ir/verifier.h"
#include "magi/passes/recognize_attention.h"

#include "fusion_builder.h"
#include "test_helpers.h"

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::SymExpr;
using ir::TensorType;
using ir::Value;
using test::contains;
using test::count_ops;

constexpr const char* kCpuAttention = "aten::_scaled_dot_product_flash_attention_for_cpu";
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// What the written-out attention of one test does between its two matmuls.
struct Form {
  bool scale_on_q = false;   // q * 0.25 before the matmul instead of the scores * 0.25
  bool causal_fill = false;  // masked_fill(tril(ones(8, 8)) == 0, -inf)
  bool causal_bias = false;  // + triu(full((8, 8), -inf), 1)
  bool grouped = false;      // 2 key/value heads repeated for 4 query heads (repeat_kv)
  bool mask_input = false;   // masked_fill with a boolean graph input
  double mask_fill = -std::numeric_limits<double>::infinity();  // its fill value
  bool bias_input = false;                   // + a [2, 1, 8, 8] float graph input, after the scale
  bool bias_before_scale = false;            // the same bias added before the scale
  bool scores_returned = false;              // the scores are also a graph output
  const char* normalise = "aten::_softmax";  // or another row reduction
};

// b = 2, h = 4, L = S = 8, d = 16.
struct AttentionGraph {
  Graph g;
  Value* q = nullptr;
  Value* key = nullptr;    // the [2, 4, 8, 16] key the first matmul transposes
  Value* value = nullptr;  // the [2, 4, 8, 16] value the second matmul reads
  Value* bias = nullptr;   // the additive mask input, if any

  explicit AttentionGraph(const Form& f) {
    test::Builder b(g);
    q = input(b, "q", 4);
    Value* k = input(b, "k", f.grouped ? 2 : 4);
    Value* v = input(b, "v", f.grouped ? 2 : 4);
    Value* mask_in = f.mask_input ? b.input("mask", {8, 8}, c10::kBool) : nullptr;
    bias = f.bias_input || f.bias_before_scale ? b.input("bias", {2, 1, 8, 8}) : nullptr;
    key = f.grouped ? repeat(b, k, "k") : k;
    value = f.grouped ? repeat(b, v, "v") : v;

    Value* qs = f.scale_on_q ? b.op("aten::mul", "Tensor", {q, b.number(0.25)}, *q->tensor_type(),
                                    "q_scaled", 10)
                             : q;
    TensorType kt_type = test::tensor_type({2, 4, 16, 8});
    kt_type.strides = {512, 128, 1, 16};
    Value* kt =
        b.op("aten::transpose", "int", {key, b.integer(-2), b.integer(-1)}, kt_type, "key_t", 10);
    Value* scores = matmul(b, qs, kt, 16, 8, "scores", 10);
    if (f.bias_before_scale) scores = b.add(scores, bias, "biased_first", 10);
    if (!f.scale_on_q) {
      scores = b.op("aten::mul", "Tensor", {scores, b.number(0.25)}, *scores->tensor_type(),
                    "scaled", 10);
    }
    if (f.scores_returned) extra_output_ = scores;
    if (f.causal_fill) {
      Value* ones = b.op("aten::ones", "", {b.dims({8, 8}), b.none(), b.none(), b.none(), b.none()},
                         test::tensor_type({8, 8}), "ones", 11);
      Value* tril =
          b.op("aten::tril", "", {ones, b.integer(0)}, test::tensor_type({8, 8}), "tril", 11);
      Value* upper = b.op("aten::eq", "Scalar", {tril, b.scalar(0)},
                          test::tensor_type({8, 8}, c10::kBool), "eq", 12);
      scores = b.op("aten::masked_fill", "Scalar", {scores, upper, b.scalar(kNegInf)},
                    *scores->tensor_type(), "masked", 12);
    }
    if (f.mask_input) {
      scores = b.op("aten::masked_fill", "Scalar", {scores, mask_in, b.scalar(f.mask_fill)},
                    *scores->tensor_type(), "masked_input", 12);
    }
    if (f.bias_input) scores = b.add(scores, bias, "biased_input", 12);
    if (f.causal_bias) {
      Value* full =
          b.op("aten::full", "",
               {b.dims({8, 8}), b.scalar(kNegInf), b.none(), b.none(), b.none(), b.none()},
               test::tensor_type({8, 8}), "full", 11);
      Value* triu =
          b.op("aten::triu", "", {full, b.integer(1)}, test::tensor_type({8, 8}), "triu", 11);
      scores = b.add(scores, triu, "biased", 12);
    }
    Value* weights = b.op(f.normalise, "", {scores, b.integer(-1), b.flag(false)},
                          *scores->tensor_type(), "weights", 13);
    Value* out = matmul(b, weights, value, 8, 16, "attended", 14);
    TensorType t_type = test::tensor_type({2, 8, 4, 16});
    t_type.strides = {512, 16, 128, 1};
    Value* transposed =
        b.op("aten::transpose", "int", {out, b.integer(1), b.integer(2)}, t_type, "result_t", 15);
    TensorType r_type = t_type;
    r_type.strides = TensorType::contiguous_strides(r_type.sizes);
    Value* result = b.op("aten::clone", "", {transposed, b.none()}, r_type, "result", 15);
    if (extra_output_ != nullptr) {
      g.set_outputs({result, extra_output_});
    } else {
      g.set_outputs({result});
    }
  }

  Node* attention(const char* name = kCpuAttention) const {
    for (Node* n : g.nodes()) {
      if (n->is_operator() && n->op_name() == name) return n;
    }
    return nullptr;
  }

 private:
  Value* extra_output_ = nullptr;

  static Value* input(test::Builder& b, const std::string& name, int64_t heads) {
    Value* x = b.input(name, {2, heads, 8, 16});
    TensorType t = *x->tensor_type();
    t.strides = TensorType::contiguous_strides(t.sizes);
    x->set_tensor_type(t);
    return x;
  }

  // x.matmul(y) of [2, 4, 8, n] and [2, 4, n, m] as the capture decomposes it.
  static Value* matmul(test::Builder& b, Value* x, Value* y, int64_t n, int64_t m,
                       const std::string& name, int line) {
    Value* xe = b.op("aten::expand", "", {x, b.dims({2, 4, 8, n}), b.flag(false)},
                     *x->tensor_type(), name + "_lhs_expand", line);
    Value* xv = b.view(xe, {8, 8, n}, name + "_lhs");
    Value* ye = b.op("aten::expand", "", {y, b.dims({2, 4, n, m}), b.flag(false)},
                     *y->tensor_type(), name + "_rhs_expand", line);
    TensorType contiguous = *ye->tensor_type();
    contiguous.strides = TensorType::contiguous_strides(contiguous.sizes);
    Value* yc = b.op("aten::clone", "", {ye, b.none()}, contiguous, name + "_rhs_contiguous", line);
    Value* yv = b.view(yc, {8, n, m}, name + "_rhs");
    Value* mm = b.op("aten::bmm", "", {xv, yv}, test::tensor_type({8, 8, m}), name + "_bmm", line);
    return b.view(mm, {2, 4, 8, m}, name);
  }

  // repeat_kv: view(clone(expand(unsqueeze(x, 2), [2, 2, 2, 8, 16])), [2, 4, 8, 16]).
  static Value* repeat(test::Builder& b, Value* x, const std::string& name) {
    Value* u = b.op("aten::unsqueeze", "", {x, b.integer(2)}, test::tensor_type({2, 2, 1, 8, 16}),
                    name + "_unsqueeze");
    Value* e = b.op("aten::expand", "", {u, b.dims({2, 2, 2, 8, 16}), b.flag(false)},
                    test::tensor_type({2, 2, 2, 8, 16}), name + "_expand");
    Value* c = b.op("aten::clone", "", {e, b.none()}, test::tensor_type({2, 2, 2, 8, 16}),
                    name + "_clone");
    Value* r = b.view(c, {2, 4, 8, 16}, name + "_rep");
    TensorType t = *r->tensor_type();
    t.strides = TensorType::contiguous_strides(t.sizes);
    r->set_tensor_type(t);
    return r;
  }
};

// The call's constant arguments: dropout, is_causal, attn_mask, scale.
void expect_call(const AttentionGraph& a, bool causal, double scale) {
  const Node* call = a.attention();
  ASSERT_NE(call, nullptr) << ir::to_string(a.g);
  EXPECT_EQ(call->input(0), a.q);
  EXPECT_EQ(call->input(1), a.key);
  EXPECT_EQ(call->input(2), a.value);
  EXPECT_EQ(ir::constant_input(*call, 4)->toBool(), causal);
  EXPECT_DOUBLE_EQ(ir::constant_input(*call, 6)->toDouble(), scale);
  // No [.., 8, 8] intermediate is left: no matmul, softmax or mask.
  for (const char* gone : {"aten::bmm", "aten::_softmax", "aten::masked_fill", "aten::tril",
                           "aten::triu", "aten::ones", "aten::full", "aten::add"}) {
    EXPECT_EQ(count_ops(a.g, gone), 0u) << gone << " left in\n" << ir::to_string(a.g);
  }
  // The transpose after the call reads it in its own layout (the query's here), its strides
  // updated; no copy is added.
  const Node* transpose = call->output(0)->users().at(0);
  EXPECT_EQ(transpose->op_name(), "aten::transpose.int");
  EXPECT_EQ(transpose->output()->tensor_type()->strides, (std::vector<SymExpr>{512, 16, 128, 1}));
}

TEST(RecognizeAttention, ScaledScores) {
  AttentionGraph a({});
  EXPECT_TRUE(recognize_attention(a.g));
  ir::verify(a.g);
  expect_call(a, /*causal=*/false, 0.25);
  EXPECT_TRUE(contains(ir::to_string(a.g),
                       "= aten::_scaled_dot_product_flash_attention_for_cpu(%q, %k, %v, 0.0, "
                       "False, None, 0.25)"));
  EXPECT_FALSE(recognize_attention(a.g)) << "a second run changes nothing";
}

TEST(RecognizeAttention, ScaleOnTheQueryMovesIntoTheCall) {
  Form f;
  f.scale_on_q = true;
  AttentionGraph a(f);
  EXPECT_TRUE(recognize_attention(a.g));
  ir::verify(a.g);
  expect_call(a, false, 0.25);
  EXPECT_EQ(count_ops(a.g, "aten::mul"), 0u) << ir::to_string(a.g);
}

TEST(RecognizeAttention, CausalMaskedFillBecomesIsCausal) {
  Form f;
  f.causal_fill = true;
  AttentionGraph a(f);
  EXPECT_TRUE(recognize_attention(a.g));
  ir::verify(a.g);
  expect_call(a, /*causal=*/true, 0.25);
  EXPECT_EQ(count_ops(a.g, "aten::eq"), 0u);
}

TEST(RecognizeAttention, CausalMinusInfinityBiasBecomesIsCausal) {
  Form f;
  f.causal_bias = true;
  f.scale_on_q = true;
  AttentionGraph a(f);
  EXPECT_TRUE(recognize_attention(a.g));
  ir::verify(a.g);
  expect_call(a, /*causal=*/true, 0.25);
}

TEST(RecognizeAttention, GroupedQueryAttentionReadsTheRepeatedHeads) {
  Form f;
  f.grouped = true;
  f.causal_fill = true;
  AttentionGraph a(f);
  EXPECT_TRUE(recognize_attention(a.g));
  ir::verify(a.g);
  expect_call(a, true, 0.25);
  // The repeats stay for group_query_attention (CUDA flash and cuDNN read grouped heads).
  EXPECT_EQ(a.key->producer()->op_name(), "aten::view");
}

/// Builds `f` and checks the pass reports no change and leaves the graph's text as it was.
void expect_untouched(const Form& f) {
  AttentionGraph a(f);
  const std::string before = ir::to_string(a.g);
  EXPECT_FALSE(recognize_attention(a.g));
  EXPECT_EQ(ir::to_string(a.g), before);
}

TEST(RecognizeAttention, LeavesANonSoftmaxReductionAlone) {
  Form f;
  f.normalise = "aten::_log_softmax";
  expect_untouched(f);
}

// A mask that is not causal: scaled_dot_product_attention(q, k, v, attn_mask, 0, false, scale).
const Node* expect_masked_call(const AttentionGraph& a) {
  const Node* call = a.attention("aten::scaled_dot_product_attention");
  EXPECT_NE(call, nullptr) << ir::to_string(a.g);
  if (call == nullptr) return nullptr;
  EXPECT_EQ(call->input(0), a.q);
  EXPECT_EQ(call->input(1), a.key);
  EXPECT_EQ(call->input(2), a.value);
  EXPECT_DOUBLE_EQ(ir::constant_input(*call, 4)->toDouble(), 0.0);
  EXPECT_FALSE(ir::constant_input(*call, 5)->toBool());
  EXPECT_DOUBLE_EQ(ir::constant_input(*call, 6)->toDouble(), 0.25);
  for (const char* gone : {"aten::bmm", "aten::_softmax", "aten::masked_fill", "aten::add"}) {
    EXPECT_EQ(count_ops(a.g, gone), 0u) << gone << " left in\n" << ir::to_string(a.g);
  }
  EXPECT_TRUE(ir::verify_errors(a.g).empty()) << ir::to_string(a.g);
  return call;
}

TEST(RecognizeAttention, ABooleanMaskInputIsHandedOverNegated) {
  Form f;
  f.mask_input = true;
  AttentionGraph a(f);
  ASSERT_TRUE(recognize_attention(a.g));
  const Node* call = expect_masked_call(a);
  ASSERT_NE(call, nullptr);
  // SDPA keeps the true entries; masked_fill masked them.
  const Node* keep = call->input(3)->producer();
  ASSERT_TRUE(keep->is_operator());
  EXPECT_EQ(keep->op_name(), "aten::logical_not");
  EXPECT_EQ(keep->input(0)->name(), "mask");
}

TEST(RecognizeAttention, ACausalAndAPaddingMaskAreCombined) {
  Form f;
  f.causal_fill = true;
  f.mask_input = true;
  AttentionGraph a(f);
  ASSERT_TRUE(recognize_attention(a.g));
  const Node* call = expect_masked_call(a);
  ASSERT_NE(call, nullptr);
  // keep = !(upper | mask): the causal mask stays a tensor, since SDPA takes is_causal or a mask.
  const Node* keep = call->input(3)->producer();
  ASSERT_EQ(keep->op_name(), "aten::logical_not");
  const Node* any = keep->input(0)->producer();
  ASSERT_EQ(any->op_name(), "aten::logical_or");
  EXPECT_EQ(any->input(0)->name(), "mask");
  EXPECT_EQ(any->input(1)->name(), "eq");
}

TEST(RecognizeAttention, ABooleanMaskIsFilledIntoTheAdditiveOne) {
  Form f;
  f.mask_input = true;
  f.bias_input = true;
  AttentionGraph a(f);
  ASSERT_TRUE(recognize_attention(a.g));
  const Node* call = expect_masked_call(a);
  ASSERT_NE(call, nullptr);
  const Node* where = call->input(3)->producer();
  ASSERT_EQ(where->op_name(), "aten::where.ScalarSelf");
  EXPECT_EQ(where->input(0)->name(), "mask");
  EXPECT_EQ(where->input(2), a.bias);
  EXPECT_EQ(where->output()->tensor_type()->sizes, (std::vector<SymExpr>{2, 1, 8, 8}));
}

TEST(RecognizeAttention, AnAdditiveMaskInputIsTheAttnMask) {
  Form f;
  f.bias_input = true;
  AttentionGraph a(f);
  ASSERT_TRUE(recognize_attention(a.g));
  const Node* call = expect_masked_call(a);
  ASSERT_NE(call, nullptr);
  EXPECT_EQ(call->input(3), a.bias);
}

TEST(RecognizeAttention, LeavesAMaskInputFilledWithAFiniteValueAlone) {
  Form f;
  f.mask_input = true;
  f.mask_fill = -1e4;  // SDPA would mask with -inf: a fully masked row would differ
  expect_untouched(f);
}

TEST(RecognizeAttention, LeavesABiasScaledAfterItIsAddedAlone) {
  Form f;
  f.bias_before_scale = true;  // (scores + bias) * 0.25: SDPA would not scale the bias
  expect_untouched(f);
}

TEST(RecognizeAttention, LeavesScoresWithASecondReaderAlone) {
  Form f;
  f.scores_returned = true;
  f.causal_fill = true;
  AttentionGraph a(f);
  const std::string before = ir::to_string(a.g);
  EXPECT_FALSE(recognize_attention(a.g));
  EXPECT_EQ(ir::to_string(a.g), before);
  EXPECT_EQ(count_ops(a.g, "aten::bmm"), 2u);
}

}  // namespace
}  // namespace magi::passes
