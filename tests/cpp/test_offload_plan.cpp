// Weight offload planning (runtime/offload_plan.h) on synthetic programs.
#include <gtest/gtest.h>

#include <random>

#include "magi/common/error.h"
#include "magi/runtime/offload_plan.h"

namespace magi::runtime {
namespace {

constexpr int64_t kMB = 1 << 20;

// A "transformer": per layer one step reading a weight of `bytes`, then `gap` steps without.
struct Program {
  std::vector<double> step_us;
  std::vector<OffloadWeight> weights;
};

Program layers(int n, int64_t bytes, double layer_us, int gap = 1, double gap_us = 1) {
  Program p;
  for (int i = 0; i < n; ++i) {
    OffloadWeight w;
    w.bytes = bytes;
    w.first_use = w.last_use = p.step_us.size();
    p.weights.push_back(w);
    p.step_us.push_back(layer_us);
    for (int k = 0; k < gap; ++k) p.step_us.push_back(gap_us);
  }
  return p;
}

OffloadOptions options(OffloadPolicy policy, double ratio = 0.3) {
  OffloadOptions o;
  o.policy = policy;
  o.resident_ratio = ratio;
  o.link_bytes_per_us = 5e4;  // 50 GB/s
  return o;
}

// The invariants the engine relies on.
void expect_legal(const OffloadPlan& plan, const Program& p) {
  const long steps = long(p.step_us.size());
  long last_wrapped = -1, last_plain = -1;
  bool seen_plain = false;
  for (const OffloadGroup& g : plan.groups) {
    EXPECT_LE(g.first_use, g.release);
    if (g.wraps) {
      EXPECT_FALSE(seen_plain) << "a prefetched group after one copied in its own call";
      EXPECT_GE(g.gate, long(g.release)) << "prefetch before its previous instance was read";
      EXPECT_GE(g.gate, last_wrapped);
      last_wrapped = g.gate;
    } else {
      seen_plain = true;
      EXPECT_LT(g.gate, long(g.first_use)) << "copy starts after its reader";
      EXPECT_GE(g.gate, last_plain);
      last_plain = g.gate;
    }
  }
  // Regions of groups busy at the same time (on the circle of calls) are disjoint.
  for (size_t a = 0; a < plan.groups.size(); ++a) {
    for (size_t b = a + 1; b < plan.groups.size(); ++b) {
      const auto& x = plan.groups[a];
      const auto& y = plan.groups[b];
      const long xa = x.gate + 1 - (x.wraps ? steps : 0), xb = long(x.release);
      const long ya = y.gate + 1 - (y.wraps ? steps : 0), yb = long(y.release);
      bool busy_together = false;
      for (long shift : {-steps, 0L, steps}) {
        busy_together |= std::max(xa, ya + shift) <= std::min(xb, yb + shift);
      }
      if (!busy_together) continue;
      const int64_t xo = plan.offset[x.weights[0]], yo = plan.offset[y.weights[0]];
      EXPECT_TRUE(xo + x.bytes <= yo || yo + y.bytes <= xo)
          << "groups " << a << " and " << b << " share buffer bytes while both busy";
    }
  }
  for (size_t k = 0; k < p.weights.size(); ++k) {
    if (plan.resident[k]) {
      EXPECT_EQ(plan.offset[k], -1);
    } else {
      EXPECT_GE(plan.offset[k], 0);
      EXPECT_LE(plan.offset[k] + p.weights[k].bytes, plan.buffer_bytes);
    }
  }
}

TEST(OffloadPlan, BaseStreamsEveryWeightWithAFixedLookahead) {
  Program p = layers(8, 10 * kMB, 1000);
  OffloadOptions o = options(OffloadPolicy::kBase, 0.9);  // the ratio is not BASE's business
  OffloadPlan plan = plan_offload(p.step_us, p.weights, o);
  EXPECT_EQ(plan.resident_bytes, 0);
  EXPECT_EQ(plan.streamed_bytes, 80 * kMB);
  ASSERT_EQ(plan.groups.size(), 8u);
  // Two buffers round robin: group g is copied once group g-2 was last read.
  for (size_t g = 2; g < 8; ++g) {
    EXPECT_FALSE(plan.groups[g].wraps);
    EXPECT_EQ(plan.groups[g].gate, long(plan.groups[g - 2].release)) << "group " << g;
  }
  // The first two are prefetched by the previous call, into the buffers of its last two.
  EXPECT_TRUE(plan.groups[0].wraps);
  EXPECT_EQ(plan.groups[0].gate, long(plan.groups[6].release));
  EXPECT_TRUE(plan.groups[1].wraps);
  EXPECT_EQ(plan.groups[1].gate, long(plan.groups[7].release));
  // Two groups' worth of buffer for 80 MB streamed.
  EXPECT_EQ(plan.buffer_bytes, 2 * 10 * kMB);
  expect_legal(plan, p);
}

TEST(OffloadPlan, NoPrefetchAcrossCallsStartsTheFirstGroupsAtTheCallStart) {
  Program p = layers(6, 4 * kMB, 500);
  OffloadOptions o = options(OffloadPolicy::kBase);
  o.prefetch_across_calls = false;
  OffloadPlan plan = plan_offload(p.step_us, p.weights, o);
  for (const auto& g : plan.groups) EXPECT_FALSE(g.wraps);
  EXPECT_EQ(plan.groups[0].gate, -1);
  EXPECT_EQ(plan.groups[1].gate, -1);
  // The first copy cannot hide behind anything: the call stalls for it.
  EXPECT_GT(plan.stall_us, 4.0 * kMB / 5e4 * 0.99);
  expect_legal(plan, p);
}

TEST(OffloadPlan, CostEffectiveKeepsTheLeastComputePerByteUpToTheRatio) {
  // Four weights of 10 MB; their readers compute 100, 4000, 50, 2000 us.
  Program p;
  for (double us : {100.0, 4000.0, 50.0, 2000.0}) {
    OffloadWeight w;
    w.bytes = 10 * kMB;
    w.first_use = w.last_use = p.step_us.size();
    p.weights.push_back(w);
    p.step_us.push_back(us);
  }
  OffloadPlan plan =
      plan_offload(p.step_us, p.weights, options(OffloadPolicy::kCostEffective, 0.5));
  EXPECT_EQ(plan.resident, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(plan.resident_bytes, 20 * kMB);
  EXPECT_EQ(plan.streamed_bytes, 20 * kMB);
  // A quarter fits one weight only: the cheapest reader's.
  plan = plan_offload(p.step_us, p.weights, options(OffloadPolicy::kCostEffective, 0.25));
  EXPECT_EQ(plan.resident, (std::vector<bool>{false, false, true, false}));
  // The ratio is data of the plan: all-resident and none-resident from the same program.
  EXPECT_EQ(plan_offload(p.step_us, p.weights, options(OffloadPolicy::kCostEffective, 1.0))
                .streamed_bytes,
            0);
  EXPECT_EQ(plan_offload(p.step_us, p.weights, options(OffloadPolicy::kCostEffective, 0.0))
                .resident_bytes,
            0);
  expect_legal(plan, p);
}

TEST(OffloadPlan, WeightsWhoseViewsAreOutputsStayResident) {
  Program p = layers(4, 8 * kMB, 1000);
  p.weights[2].must_stay = true;
  for (OffloadPolicy policy :
       {OffloadPolicy::kBase, OffloadPolicy::kCostEffective, OffloadPolicy::kHeuristic}) {
    OffloadPlan plan = plan_offload(p.step_us, p.weights, options(policy, 0.0));
    EXPECT_TRUE(plan.resident[2]) << offload_policy_name(policy);
    EXPECT_EQ(plan.resident_bytes, 8 * kMB);
    expect_legal(plan, p);
  }
}

TEST(OffloadPlan, HeuristicStartsEachCopyAsLateAsTheComputeBeforeItAllows) {
  // Ten steps of 100 us, then one reading a 5 MB weight (about 100 us at 50 GB/s, 111 us at 0.9
  // of it): the copy must start two steps before the reader's step, not earlier.
  Program p;
  for (int i = 0; i < 10; ++i) p.step_us.push_back(100);
  OffloadWeight w;
  w.bytes = 512 * 9765;  // 4.99968 MB, a multiple of the alignment: 99.99 us
  w.first_use = w.last_use = 10;
  p.weights.push_back(w);
  p.step_us.push_back(100);
  OffloadOptions o = options(OffloadPolicy::kHeuristic, 0.0);
  o.safety_factor = 0.9;
  OffloadPlan plan = plan_offload(p.step_us, p.weights, o);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_FALSE(plan.groups[0].wraps);
  EXPECT_EQ(plan.groups[0].gate, 7);  // ends at 800 us; the copy needs 111 us before 1000 us
  EXPECT_NEAR(plan.stall_us, 0.0, 1e-6);
  EXPECT_TRUE(plan.hidden());
  // A safety factor of 1 lets it start one step later.
  o.safety_factor = 1.0;
  EXPECT_EQ(plan_offload(p.step_us, p.weights, o).groups[0].gate, 8);
}

TEST(OffloadPlan, HeuristicNeedsLessBufferThanALongLookahead) {
  Program p = layers(24, 20 * kMB, 2000, 2, 500);
  OffloadOptions base = options(OffloadPolicy::kBase);
  base.lookahead = 6;
  OffloadPlan wide = plan_offload(p.step_us, p.weights, base);
  OffloadPlan late = plan_offload(p.step_us, p.weights, options(OffloadPolicy::kHeuristic, 0.0));
  EXPECT_TRUE(wide.hidden());
  EXPECT_TRUE(late.hidden());
  EXPECT_LT(late.buffer_bytes, wide.buffer_bytes);
  expect_legal(wide, p);
  expect_legal(late, p);
}

TEST(OffloadPlan, HeuristicDoesNotFillTheBufferWhenCopiesCannotHide) {
  // Copy-bound: every copy would have to start a whole call early. Starting them sooner than
  // four groups ahead gains nothing on a saturated link, so the buffer stays that small.
  Program p = layers(12, 30 * kMB, 50);
  OffloadPlan plan = plan_offload(p.step_us, p.weights, options(OffloadPolicy::kHeuristic, 0.0));
  EXPECT_FALSE(plan.hidden());
  EXPECT_LE(plan.buffer_bytes, 5 * 30 * kMB);
  EXPECT_EQ(plan.streamed_bytes, 12 * 30 * kMB);
  expect_legal(plan, p);
}

TEST(OffloadPlan, PredictsWhetherCopiesCanHide) {
  // Compute-bound: 30 MB per layer (600 us of copy) behind 5 ms of compute.
  Program big = layers(12, 30 * kMB, 5000);
  OffloadPlan plan = plan_offload(big.step_us, big.weights, options(OffloadPolicy::kHeuristic));
  EXPECT_TRUE(plan.hidden());
  EXPECT_NEAR(plan.overlap, 1.0, 1e-9);
  EXPECT_NEAR(plan.call_us, plan.compute_us, 1e-6);
  EXPECT_EQ(plan.ratio_to_hide, 0.0);
  // Copy-bound: the same weights behind 50 us per layer.
  Program small = layers(12, 30 * kMB, 50);
  plan = plan_offload(small.step_us, small.weights, options(OffloadPolicy::kCostEffective));
  EXPECT_FALSE(plan.hidden());
  EXPECT_LT(plan.overlap, 0.2);
  EXPECT_GT(plan.ratio_to_hide, 0.9);  // nearly everything would have to stay
  // The prediction: copies run back to back, so a call takes about the copy time.
  const double copy_us = double(plan.streamed_bytes) / 5e4;
  EXPECT_NEAR(plan.copy_us, copy_us, 1e-6);
  EXPECT_GE(plan.call_us, copy_us * 0.95);
  EXPECT_NE(plan.summary().find("COST_EFFECTIVE"), std::string::npos);
}

TEST(OffloadPlan, SimulationOfAnAllResidentPlanIsTheComputeTime) {
  Program p = layers(5, 4 * kMB, 300);
  OffloadPlan plan = plan_offload(p.step_us, p.weights, options(OffloadPolicy::kCostEffective, 1));
  EXPECT_EQ(plan.groups.size(), 0u);
  double stall = -1;
  EXPECT_DOUBLE_EQ(simulate_offload_call_us(plan, p.step_us, 5e4, &stall), plan.compute_us);
  EXPECT_EQ(stall, 0.0);
}

TEST(OffloadPlan, RandomProgramsGiveLegalPlans) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 60; ++trial) {
    Program p;
    const int steps = 5 + int(rng() % 60);
    for (int i = 0; i < steps; ++i) p.step_us.push_back(double(rng() % 3000));
    const int n = 1 + int(rng() % 40);
    for (int k = 0; k < n; ++k) {
      OffloadWeight w;
      w.bytes = int64_t(1 + rng() % 64) * kMB / 4;
      w.first_use = rng() % steps;
      w.last_use =
          w.first_use + rng() % std::max<size_t>(1, std::min<size_t>(5, steps - w.first_use));
      w.must_stay = rng() % 17 == 0;
      p.weights.push_back(w);
    }
    for (OffloadPolicy policy :
         {OffloadPolicy::kBase, OffloadPolicy::kCostEffective, OffloadPolicy::kHeuristic}) {
      OffloadOptions o = options(policy, double(rng() % 100) / 100);
      o.lookahead = 1 + rng() % 4;
      o.prefetch_across_calls = rng() % 4 != 0;
      SCOPED_TRACE("trial " + std::to_string(trial) + " " + offload_policy_name(policy));
      OffloadPlan plan = plan_offload(p.step_us, p.weights, o);
      expect_legal(plan, p);
      EXPECT_EQ(plan.resident_bytes + plan.streamed_bytes, plan.total_bytes);
      EXPECT_GE(plan.call_us + 1e-6, plan.compute_us);
    }
  }
}

TEST(OffloadPlan, RejectsUsesOutsideTheProgram) {
  std::vector<double> steps = {10, 10};
  OffloadWeight w;
  w.bytes = 100;
  w.first_use = 1;
  w.last_use = 2;
  try {
    plan_offload(steps, {w}, options(OffloadPolicy::kBase));
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("weight 0 is read by steps 1..2 of a program of 2 steps"),
              std::string::npos)
        << e.what();
  }
  OffloadOptions bad = options(OffloadPolicy::kBase);
  bad.link_bytes_per_us = 0;
  EXPECT_THROW(plan_offload(steps, {}, bad), UserError);
  EXPECT_THROW(parse_offload_policy("cheap"), UserError);
  EXPECT_EQ(parse_offload_policy("heuristic"), OffloadPolicy::kHeuristic);
}

}  // namespace
}  // namespace magi::runtime
