// The recompute planner (passes/plan_recompute.h) on hand-built joint graphs: what each policy
// saves and recomputes for chains, diamonds, views, narrowing casts and random ops, budgets,
// and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "fusion_builder.h"
#include "magi/common/error.h"
#include "magi/passes/plan_recompute.h"

namespace magi::test {
namespace {

using passes::plan_recompute;
using passes::RecomputeOptions;
using passes::RecomputePlan;
using passes::RecomputePolicy;

constexpr int64_t kN = 64, kK = 32, kH = 128;  // rows, model width, hidden width

std::set<std::string> saved_of(const RecomputePlan& plan) {
  std::set<std::string> out;
  for (const Value* v : plan.saved) out.insert(v->name());
  return out;
}

std::set<std::string> recomputed_of(const RecomputePlan& plan) {
  std::set<std::string> out;
  for (const Node* n : plan.recomputed_ops) out.insert(n->output()->name());
  return out;
}

RecomputeOptions options(RecomputePolicy policy) {
  RecomputeOptions o;
  o.policy = policy;
  o.num_forward_outputs = 1;
  return o;
}

struct Joint {
  Graph g;
  Builder b{g};
  Value* mm(Value* a, Value* w, const std::string& out) {
    TensorType t = *a->tensor_type();
    t.sizes = {a->tensor_type()->sizes[0], w->tensor_type()->sizes[1]};
    return b.op("aten::mm", "", {a, w}, t, out);
  }
  Value* t(Value* w, const std::string& out) {
    TensorType tt = *w->tensor_type();
    std::swap(tt.sizes[0], tt.sizes[1]);
    return b.op("aten::t", "", {w}, tt, out);
  }
};

// x * 2 -> mm(w1) -> relu -> mm(w2), and its backward: the weight gradients read the scaled
// input and the relu output; the relu backward reads the relu output too.
struct MlpJoint : Joint {
  MlpJoint() {
    Value* x = b.input("primals_1", {kN, kK});
    Value* w1 = b.input("primals_2", {kK, kH});
    Value* w2 = b.input("primals_3", {kH, kK});
    Value* dy = b.input("tangents_1", {kN, kK});
    Value* h = b.op("aten::mul", "Tensor", {x, b.number(2.0)}, *x->tensor_type(), "scaled");
    Value* a = mm(h, w1, "a");
    Value* r = b.unary("aten::relu", a, "r");
    Value* y = mm(r, w2, "y");
    Value* dw2 = mm(t(r, "t_r"), dy, "dw2");
    Value* dr = mm(dy, t(w2, "t_w2"), "dr");
    Value* da =
        b.op("aten::threshold_backward", "", {dr, r, b.scalar(0)}, *dr->tensor_type(), "da");
    Value* dw1 = mm(t(h, "t_h"), da, "dw1");
    g.set_outputs({y, dw1, dw2});
  }
};

TEST(Recompute, HeuristicSavesMatmulOutputsAndRecomputesTheCheapOps) {
  MlpJoint j;
  RecomputePlan plan = plan_recompute(j.g, options(RecomputePolicy::kHeuristic));
  // relu's output is recomputed from the saved matmul output; the scaled input from x.
  EXPECT_EQ(saved_of(plan), (std::set<std::string>{"a"}));
  EXPECT_EQ(recomputed_of(plan), (std::set<std::string>{"scaled", "r"}));
  EXPECT_EQ(plan.saved_bytes, kN * kH * 4);
  // Without recomputation the backward keeps the scaled input and the relu output.
  EXPECT_EQ(plan.no_recompute_bytes, kN * kK * 4 + kN * kH * 4);
  EXPECT_GT(plan.recompute_seconds, 0);
  EXPECT_TRUE(contains(plan.report(), "recompute plan (HEURISTIC)"));
  EXPECT_TRUE(contains(plan.report(), "a  f32[64, 128]  = aten::mm"));
}

TEST(Recompute, HandcraftBudgetOneSavesWhatTheBackwardReadsAndZeroTheLeast) {
  MlpJoint j;
  RecomputeOptions o = options(RecomputePolicy::kHandcraft);
  o.memory_budget = 1.0;
  RecomputePlan all = plan_recompute(j.g, o);
  EXPECT_EQ(saved_of(all), (std::set<std::string>{"scaled", "r"}));
  EXPECT_TRUE(all.recomputed_ops.empty());
  EXPECT_EQ(all.recompute_seconds, 0);
  o.memory_budget = 0.0;
  RecomputePlan least = plan_recompute(j.g, o);
  // Everything recomputes from the graph inputs, the matmul included.
  EXPECT_TRUE(saved_of(least).empty());
  EXPECT_EQ(least.saved_bytes, 0);
  EXPECT_EQ(recomputed_of(least), (std::set<std::string>{"scaled", "a", "r"}));
  EXPECT_TRUE(least.budget_met);
}

// exp(x) feeds sin and cos, whose outputs the backward reads (a diamond).
struct DiamondJoint : Joint {
  DiamondJoint() {
    Value* x = b.input("primals_1", {kN, kH});
    Value* dy = b.input("tangents_1", {kN, kH});
    Value* u = b.unary("aten::exp", x, "u");
    Value* s = b.unary("aten::sin", u, "s");
    Value* c = b.unary("aten::cos", u, "c");
    Value* y = b.add(s, c, "y");
    Value* gs = b.mul(dy, c, "gs");
    Value* gc = b.mul(dy, s, "gc");
    Value* gu = b.add(gs, gc, "gu");
    Value* gx = b.mul(gu, u, "gx");
    g.set_outputs({y, gx});
  }
};

TEST(Recompute, HandcraftBudgetsAreMonotonic) {
  DiamondJoint j;
  RecomputeOptions o = options(RecomputePolicy::kHandcraft);
  int64_t last_bytes = -1;
  double last_seconds = 1e30;
  for (double budget : {0.0, 0.2, 0.34, 0.5, 0.67, 0.8, 1.0}) {
    o.memory_budget = budget;
    RecomputePlan plan = plan_recompute(j.g, o);
    SCOPED_TRACE("budget " + std::to_string(budget));
    EXPECT_GE(plan.saved_bytes, last_bytes);
    EXPECT_LE(plan.recompute_seconds, last_seconds);
    EXPECT_LE(double(plan.saved_bytes), budget * double(plan.no_recompute_bytes) + 1e-9);
    last_bytes = plan.saved_bytes;
    last_seconds = plan.recompute_seconds;
  }
  // Without recomputation: u, s and c (three rows of kH floats each).
  EXPECT_EQ(last_bytes, 3 * kN * kH * 4);
}

TEST(Recompute, AViewIsRecomputedAndItsBaseSavedOnce) {
  Joint j;
  Builder& b = j.b;
  Value* x = b.input("primals_1", {kN, kK});
  Value* w = b.input("primals_2", {kK, kH});
  Value* dy = b.input("tangents_1", {kN * kH});
  Value* a = j.mm(x, w, "a");
  Value* flat = b.view(a, {kN * kH}, "flat");
  Value* y = b.mul(flat, flat, "y");
  Value* gy = b.mul(dy, flat, "gy");  // the backward reads the view
  Value* wt = j.t(w, "t_w");          // a view of a parameter: free
  Value* ga = b.view(gy, {kN, kH}, "ga");
  Value* gx = j.mm(ga, j.t(wt, "t_t_w"), "gx");
  j.g.set_outputs({y, gx});
  for (auto policy : {RecomputePolicy::kHeuristic, RecomputePolicy::kHandcraft}) {
    RecomputeOptions o = options(policy);
    o.memory_budget = 1.0;
    RecomputePlan plan = plan_recompute(j.g, o);
    EXPECT_EQ(saved_of(plan), (std::set<std::string>{"a"})) << recompute_policy_name(policy);
    EXPECT_EQ(plan.saved_bytes, kN * kH * 4);
  }
}

TEST(Recompute, HeuristicSavesTheNarrowCastOfAMatmulOutput) {
  Joint j;
  Builder& b = j.b;
  Value* x = b.input("primals_1", {kN, kK});
  Value* w = b.input("primals_2", {kK, kH});
  Value* dy = b.input("tangents_1", {kN, kH}, kBF16);
  Value* a = j.mm(x, w, "a");
  Value* a16 = b.cast(a, kBF16, "a16");
  Value* y = b.mul(a16, a16, "y");
  Value* g1 = b.mul(dy, a16, "g1");
  Value* g2 = b.add(g1, g1, "g2");
  j.g.set_outputs({y, g2});
  RecomputePlan plan = plan_recompute(j.g, options(RecomputePolicy::kHeuristic));
  EXPECT_EQ(saved_of(plan), (std::set<std::string>{"a16"}));
  EXPECT_EQ(plan.saved_bytes, kN * kH * 2);
}

// native_dropout, then a matmul: the backward reads the dropped-out values and the mask.
struct DropoutJoint : Joint {
  DropoutJoint() {
    Value* x = b.input("primals_1", {kN, kK});
    Value* w = b.input("primals_2", {kK, kH});
    Value* dy = b.input("tangents_1", {kN, kH});
    Value* e = b.unary("aten::exp", x, "e");
    Node* drop = g.add_op(op("aten::native_dropout"),
                          {e, g.add_constant(0.5, ValueKind::kFloat), b.flag(true)});
    named(drop, "dropped");
    drop->output(0)->set_tensor_type(*e->tensor_type());
    TensorType mask = *e->tensor_type();
    mask.dtype = c10::ScalarType::Bool;
    drop->output(1)->set_tensor_type(mask);
    drop->output(1)->set_name("mask");
    Value* y = mm(drop->output(0), w, "y");
    Value* gw = mm(t(drop->output(0), "t_d"), dy, "gw");
    Value* gd = mm(dy, t(w, "t_w"), "gd");
    Value* gm = b.op("aten::native_dropout_backward", "", {gd, drop->output(1), b.scalar(2.0)},
                     *gd->tensor_type(), "gm");
    Value* gx = b.mul(gm, e, "gx");
    g.set_outputs({y, gw, gx});
  }
};

TEST(Recompute, RandomOpsAreNeverRecomputed) {
  DropoutJoint j;
  for (auto policy :
       {RecomputePolicy::kHeuristic, RecomputePolicy::kHandcraft, RecomputePolicy::kAutosearch}) {
    RecomputeOptions o = options(policy);
    o.memory_budget = 0.0;
    o.peak_budget_bytes = 1;
    RecomputePlan plan = plan_recompute(j.g, o);
    SCOPED_TRACE(recompute_policy_name(policy));
    const auto saved = saved_of(plan);
    EXPECT_TRUE(saved.count("dropped") && saved.count("mask"));
    for (const Node* n : plan.recomputed) EXPECT_NE(n->op_name(), "aten::native_dropout");
    // exp is cheap and recomputed from x by every policy at these budgets.
    EXPECT_TRUE(recomputed_of(plan).count("e"));
  }
  RecomputeOptions o = options(RecomputePolicy::kHandcraft);
  o.memory_budget = 0.0;
  RecomputePlan plan = plan_recompute(j.g, o);
  EXPECT_FALSE(plan.budget_met);
  EXPECT_TRUE(contains(plan.note, "the outputs of random ops"));
}

TEST(Recompute, AutosearchFitsThePeakBudgetWithTheFastestPlan) {
  MlpJoint j;
  RecomputeOptions o = options(RecomputePolicy::kAutosearch);
  RecomputePlan none = plan_recompute(j.g, options(RecomputePolicy::kHeuristic));
  const int64_t roomy = none.no_recompute_peak_bytes;
  o.peak_budget_bytes = roomy;
  RecomputePlan plan = plan_recompute(j.g, o);
  EXPECT_TRUE(plan.budget_met);
  EXPECT_EQ(plan.recompute_seconds, 0);  // no recomputation fits
  EXPECT_LE(plan.predicted_peak_bytes, roomy);

  o.peak_budget_bytes = roomy - 1;  // now something must be recomputed
  plan = plan_recompute(j.g, o);
  EXPECT_TRUE(plan.budget_met) << plan.report();
  EXPECT_LT(plan.predicted_peak_bytes, roomy);
  EXPECT_GT(plan.recompute_seconds, 0);

  o.peak_budget_bytes = 1;
  plan = plan_recompute(j.g, o);
  EXPECT_FALSE(plan.budget_met);
  EXPECT_TRUE(contains(plan.note, "fits 1.0 KiB") || contains(plan.note, "fits 0.0 KiB"))
      << plan.note;
}

// bf16 in and out, float32 between: h = x @ w1, v = float(h)^2, z = bf16(v), y = z @ w2. The
// backward reads v (the square's gradient) and z (w2's gradient).
struct WideningJoint : Joint {
  WideningJoint() {
    Value* x = b.input("primals_1", {kN, kK}, kBF16);
    Value* w1 = b.input("primals_2", {kK, kH}, kBF16);
    Value* w2 = b.input("primals_3", {kH, kK}, kBF16);
    Value* dy = b.input("tangents_1", {kN, kK}, kBF16);
    Value* h = mm(x, w1, "h");
    Value* hf = b.cast(h, c10::ScalarType::Float, "hf");
    Value* v = b.mul(hf, hf, "v");
    Value* z = b.cast(v, c10::ScalarType::BFloat16, "z");
    Value* y = mm(z, w2, "y");
    Value* dw2 = mm(t(z, "t_z"), dy, "dw2");
    Value* dz = b.cast(mm(dy, t(w2, "t_w2"), "dz"), c10::ScalarType::Float, "dzf");
    Value* dh =
        b.cast(b.mul(b.mul(dz, v, "dv"), b.number(2.0), "dv2"), c10::ScalarType::BFloat16, "dh");
    Value* dw1 = mm(t(x, "t_x"), dh, "dw1");
    g.set_outputs({y, dw1, dw2});
  }
};

TEST(Recompute, AutosearchRecomputesWhatFusionKeepsInRegistersRatherThanSaveIt) {
  WideningJoint j;
  RecomputeOptions o = options(RecomputePolicy::kHandcraft);
  o.memory_budget = 1.0;
  const RecomputePlan none = plan_recompute(j.g, o);
  ASSERT_EQ(saved_of(none), (std::set<std::string>{"v", "z"}));
  // With room for everything, saving the float32 v costs its write in the forward and its read
  // in the backward (6 bytes a value more than reading the bf16 h); recomputed from h inside the
  // backward's fused kernel it costs nothing. z stays saved: the forward's matmul writes it anyway
  // and the backward's matmul reads it.
  o.policy = RecomputePolicy::kAutosearch;
  o.peak_budget_bytes = none.no_recompute_peak_bytes;
  const RecomputePlan plan = plan_recompute(j.g, o);
  EXPECT_EQ(saved_of(plan), (std::set<std::string>{"h", "z"})) << plan.report();
  EXPECT_EQ(recomputed_of(plan), (std::set<std::string>{"hf", "v"})) << plan.report();
  EXPECT_LT(plan.step_seconds, none.step_seconds);
  EXPECT_LE(plan.predicted_peak_bytes, o.peak_budget_bytes);
  EXPECT_LT(plan.saved_bytes, none.saved_bytes);
  // What each plan moves: v twice (f32) and z once, against h and z once each (bf16).
  const double bandwidth = o.roofline.bytes_per_second;
  EXPECT_DOUBLE_EQ(none.step_seconds, (2.0 * kN * kH * 4 + kN * kH * 2) / bandwidth);
  EXPECT_DOUBLE_EQ(plan.step_seconds, (2.0 * kN * kH * 2) / bandwidth);
  EXPECT_TRUE(contains(plan.report(), "predicted step cost: ")) << plan.report();
}

TEST(Recompute, AutosearchCostsNeverGrowWithTheBudget) {
  for (bool widening : {false, true}) {
    DiamondJoint diamond;
    WideningJoint wide;
    const Graph& g = widening ? wide.g : diamond.g;
    RecomputeOptions o = options(RecomputePolicy::kAutosearch);
    o.peak_budget_bytes = int64_t{1} << 40;
    const RecomputePlan roomy = plan_recompute(g, o);
    double last = -1;
    for (double f : {1.0, 0.85, 0.7, 0.5, 0.3}) {
      o.peak_budget_bytes = static_cast<int64_t>(f * double(roomy.no_recompute_peak_bytes));
      RecomputePlan plan = plan_recompute(g, o);
      if (plan.budget_met) EXPECT_LE(plan.predicted_peak_bytes, o.peak_budget_bytes);
      EXPECT_GE(plan.step_seconds, last) << "budget " << f;  // smaller budget, no cheaper plan
      last = plan.step_seconds;
    }
    EXPECT_GE(last, roomy.step_seconds);
  }
}

TEST(Recompute, CustomComputeSensitiveOpsAreSaved) {
  MlpJoint j;
  RecomputeOptions o = options(RecomputePolicy::kHeuristic);
  o.compute_sensitive_ops = {"aten::relu"};
  RecomputePlan plan = plan_recompute(j.g, o);
  EXPECT_EQ(saved_of(plan), (std::set<std::string>{"r"}));
  EXPECT_EQ(recomputed_of(plan), (std::set<std::string>{"scaled"}));
}

// Grouped-query attention: k and v (2 heads for 4 query heads) are scalings of the inputs,
// repeated per head (repeat_kv: unsqueeze, expand, clone, view) for flash attention; the
// backward's attention gradient reads the same repeats, and the key/value gradients are summed
// over each group.
struct GroupedAttentionJoint : Joint {
  // `summed`: the key/value gradients are summed over each group (as the capture writes the
  // expand's gradient); else the key's gradient is also returned as it is.
  explicit GroupedAttentionJoint(double dropout, bool summed = true) {
    const TensorType grouped = tensor_type({2, 2, 8, 16}, kBF16);
    const TensorType heads = tensor_type({2, 4, 8, 16}, kBF16);
    Value* q = b.input("primals_1", {2, 4, 8, 16}, kBF16);
    Value* k_in = b.input("primals_2", {2, 2, 8, 16}, kBF16);
    Value* v_in = b.input("primals_3", {2, 2, 8, 16}, kBF16);
    Value* dy = b.input("tangents_1", {2, 4, 8, 16}, kBF16);
    Value* k = b.op("aten::mul", "Tensor", {k_in, b.number(2.0)}, grouped, "k");
    Value* v = b.op("aten::mul", "Tensor", {v_in, b.number(2.0)}, grouped, "v");
    Value* k_rep = repeat_heads(b, k, 2, "k");
    Value* v_rep = repeat_heads(b, v, 2, "v");
    Value* out = b.op("aten::_scaled_dot_product_flash_attention", "",
                      {q, k_rep, v_rep, b.floating(dropout), b.flag(true), b.flag(false), b.none()},
                      heads, "attention");
    Node* forward = out->producer();
    forward->output(1)->set_tensor_type(tensor_type({2, 4, 8}));
    const auto unset = [&] {
      return g.add_constant(c10::IValue(at::Tensor()), ValueKind::kTensor);
    };
    Value* dq = b.op(
        "aten::_scaled_dot_product_flash_attention_backward", "",
        {dy, q, k_rep, v_rep, out, forward->output(1), unset(), unset(), b.integer(8), b.integer(8),
         b.floating(dropout), b.flag(true), forward->output(6), forward->output(7), b.none()},
        heads, "dq");
    Node* backward = dq->producer();
    std::vector<Value*> outputs = {out, dq};
    for (size_t j = 1; j < 3; ++j) {
      backward->output(j)->set_tensor_type(heads);
      Value* sum = sum_head_groups(b, backward->output(j), 2, j == 1 ? "dk" : "dv");
      outputs.push_back(
          b.op("aten::mul", "Tensor", {sum, b.number(2.0)}, grouped, j == 1 ? "dk_in" : "dv_in"));
    }
    if (!summed) outputs.push_back(backward->output(1));
    g.set_outputs(outputs);
  }
};

TEST(Recompute, GroupedHeadCopiesForAttentionAreFreeAndNeverSaved) {
  constexpr int64_t kGroupedBytes = 2 * 2 * 8 * 16 * 2, kCopyBytes = 2 * kGroupedBytes;
  RecomputeOptions o = options(RecomputePolicy::kHandcraft);
  o.num_forward_outputs = 1;
  o.memory_budget = 1.0;  // no recomputation but what costs nothing
  GroupedAttentionJoint j(/*dropout=*/0.0);
  RecomputePlan plan = plan_recompute(j.g, o);
  // group_query_attention removes the copies from both graphs: the backward repeats k and v
  // from the saved scalings for free.
  std::set<std::string> saved = saved_of(plan);
  EXPECT_TRUE(saved.count("k") && saved.count("v")) << plan.report();
  EXPECT_FALSE(saved.count("k_clone") || saved.count("v_clone")) << plan.report();
  EXPECT_TRUE(plan.recomputed_ops.empty()) << plan.report();
  const int64_t grouped_peak = plan.predicted_peak_bytes, grouped_saved = plan.saved_bytes;

  // The attention calls read k and v themselves: saving them costs a read, recomputing them a
  // write and a read (the backward's attention is compute-bound).
  o.policy = RecomputePolicy::kAutosearch;
  o.peak_budget_bytes = plan.no_recompute_peak_bytes;
  RecomputePlan autosearch = plan_recompute(j.g, o);
  saved = saved_of(autosearch);
  EXPECT_TRUE(saved.count("k") && saved.count("v")) << autosearch.report();
  o.policy = RecomputePolicy::kHandcraft;

  // With the pass off, the copies are ordinary values: saved, and counted in the peak.
  o.grouped_attention = false;
  plan = plan_recompute(j.g, o);
  saved = saved_of(plan);
  EXPECT_TRUE(saved.count("k_clone") && saved.count("v_clone")) << plan.report();
  EXPECT_FALSE(saved.count("k")) << plan.report();
  EXPECT_EQ(plan.saved_bytes - grouped_saved, 2 * (kCopyBytes - kGroupedBytes)) << plan.report();
  EXPECT_GT(plan.predicted_peak_bytes, grouped_peak) << plan.report();

  // With dropout the pass leaves the call alone, so the copies stay.
  o.grouped_attention = true;
  GroupedAttentionJoint with_dropout(/*dropout=*/0.1);
  plan = plan_recompute(with_dropout.g, o);
  EXPECT_TRUE(saved_of(plan).count("k_clone")) << plan.report();
  // Nor when the key's gradient is read other than through the group sum.
  GroupedAttentionJoint unsummed(/*dropout=*/0.0, /*summed=*/false);
  plan = plan_recompute(unsummed.g, o);
  EXPECT_TRUE(saved_of(plan).count("k_clone")) << plan.report();
}

TEST(Recompute, BadBudgetsAreUserErrors) {
  MlpJoint j;
  RecomputeOptions o = options(RecomputePolicy::kHandcraft);
  o.memory_budget = 1.5;
  EXPECT_TRUE(contains(message_of<UserError>([&] { plan_recompute(j.g, o); }),
                       "recompute_config.memory_budget=1.5 is outside [0, 1]"));
  o = options(RecomputePolicy::kAutosearch);
  EXPECT_TRUE(contains(message_of<UserError>([&] { plan_recompute(j.g, o); }),
                       "needs recompute_config.memory_budget_bytes > 0"));
  EXPECT_TRUE(contains(message_of<UserError>([] { passes::parse_recompute_policy("FAST"); }),
                       "'FAST' is not one of HEURISTIC, HANDCRAFT, AUTOSEARCH"));
}

}  // namespace
}  // namespace magi::test
