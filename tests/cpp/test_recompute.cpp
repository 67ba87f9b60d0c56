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

TEST(Recompute, AutosearchPeaksGrowWithTheBudget) {
  DiamondJoint j;
  RecomputeOptions o = options(RecomputePolicy::kAutosearch);
  o.peak_budget_bytes = int64_t{1} << 40;
  const int64_t top = plan_recompute(j.g, o).predicted_peak_bytes;
  int64_t last = -1;
  for (double f : {0.5, 0.7, 0.85, 1.0}) {
    o.peak_budget_bytes = static_cast<int64_t>(f * double(top));
    RecomputePlan plan = plan_recompute(j.g, o);
    if (plan.budget_met) EXPECT_LE(plan.predicted_peak_bytes, o.peak_budget_bytes);
    EXPECT_GE(plan.predicted_peak_bytes, last);
    last = plan.predicted_peak_bytes;
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
