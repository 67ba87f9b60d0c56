// The recompute planner's policies (plan_recompute.h): HEURISTIC, the HANDCRAFT sequence of
// plans, AUTOSEARCH's cut-then-knapsack search, and the report.
#include "magi/passes/plan_recompute.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "magi/common/error.h"
#include "recompute_model.h"

namespace magi::passes {

using recompute::Evaluation;
using recompute::JointModel;
using recompute::NodeSet;
using recompute::OpKind;

const char* recompute_policy_name(RecomputePolicy policy) {
  switch (policy) {
    case RecomputePolicy::kHeuristic:
      return "HEURISTIC";
    case RecomputePolicy::kHandcraft:
      return "HANDCRAFT";
    case RecomputePolicy::kAutosearch:
      return "AUTOSEARCH";
  }
  return "?";
}

RecomputePolicy parse_recompute_policy(const std::string& name) {
  for (auto p :
       {RecomputePolicy::kHeuristic, RecomputePolicy::kHandcraft, RecomputePolicy::kAutosearch}) {
    if (name == recompute_policy_name(p)) return p;
  }
  MAGI_CHECK(false, "recompute_policy '", name, "' is not one of HEURISTIC, HANDCRAFT, AUTOSEARCH");
  return RecomputePolicy::kHeuristic;
}

namespace {

struct Candidate {
  NodeSet plan;
  Evaluation eval;
  int64_t peak = -1;
};

// HEURISTIC: keep compute-bound, random and impure nodes; recompute the rest. A saved
// compute-bound output that the backward reaches only through narrowing casts is replaced by
// the casts' outputs (saving the bf16 copy of an f32 matmul output, not the f32 one).
NodeSet heuristic(const JointModel& m) {
  NodeSet plan(m.size(), 0);
  for (size_t i = 0; i < m.size(); ++i) {
    plan[i] = m.recomputable(i) && m.kind(i) != OpKind::kComputeBound;
  }
  Evaluation e = m.evaluate(plan);
  for (int saved : std::vector<int>(e.saved)) {
    if (m.kind(m.producer(saved)) != OpKind::kComputeBound) continue;
    NodeSet trial = plan;
    bool any = false;
    for (size_t i = 0; i < m.size(); ++i) {
      // A recomputed cast reading (a view of) the saved value's storage: save it instead.
      if (!e.recomputed[i] || !m.is_narrowing_cast(i)) continue;
      if (m.root(m.inputs(i).front()) != m.root(saved)) continue;
      trial[i] = 0;
      any = true;
    }
    if (!any) continue;
    Evaluation t = m.evaluate(trial);
    if (t.saved_bytes < e.saved_bytes) {
      plan = std::move(trial);
      e = std::move(t);
    }
  }
  return plan;
}

// The HANDCRAFT sequence: from no recomputation, add one node at a time, the one freeing the
// most saved bytes per second of added recomputation (when none frees bytes, the cheapest that
// frees none; else the one that costs the fewest bytes), until every recomputable node is in.
std::vector<Candidate> plan_sequence(const JointModel& m) {
  std::vector<Candidate> seq;
  NodeSet plan = m.no_recompute();
  Evaluation e = m.evaluate(plan);
  seq.push_back({plan, e});
  for (;;) {
    int best = -1;
    int best_class = -1;  // 2: frees bytes, 1: frees none, 0: costs bytes
    double best_score = 0;
    Evaluation best_eval;
    for (int id : e.saved) {
      const int p = m.producer(id);
      if (plan[p] || !m.recomputable(p)) continue;
      NodeSet trial = plan;
      trial[p] = 1;
      Evaluation t = m.evaluate(trial);
      const double freed = static_cast<double>(e.saved_bytes - t.saved_bytes);
      const double cost = t.seconds - e.seconds;
      const int cls = freed > 0 ? 2 : (freed == 0 ? 1 : 0);
      const double score = cls == 2 ? freed / (cost + 1e-12) : (cls == 1 ? -cost : freed);
      if (cls > best_class || (cls == best_class && score > best_score)) {
        best = p;
        best_class = cls;
        best_score = score;
        best_eval = std::move(t);
      }
    }
    if (best < 0) break;
    plan[best] = 1;
    e = std::move(best_eval);
    seq.push_back({plan, e});
  }
  return seq;
}

// AUTOSEARCH fills kKnapsackSteps + 1 peaks, evenly from the minimum cut's to the
// no-recompute plan's, with knapsacks, each the seed of a search.
constexpr int kKnapsackSteps = 12;

// The minimum cut keeping compute-bound outputs (`base`), then saving back the recomputations
// with the most time per byte that fit in what the budget leaves.
Candidate cut_and_knapsack(const JointModel& m, const Candidate& base, int64_t budget) {
  if (base.peak > budget) return base;
  std::vector<int> items;
  for (size_t i = 0; i < m.size(); ++i) {
    if (base.eval.recomputed[i] && m.seconds(i) > 0 && m.own_bytes(i) > 0) items.push_back(int(i));
  }
  Candidate best = base;
  int64_t capacity = budget - base.peak;
  for (int attempt = 0; attempt < 8 && capacity > 0 && !items.empty(); ++attempt) {
    constexpr int kUnits = 1024;
    const double unit = std::max(1.0, static_cast<double>(capacity) / kUnits);
    std::vector<double> value(kUnits + 1, 0);
    std::vector<std::vector<char>> take(items.size(), std::vector<char>(kUnits + 1, 0));
    for (size_t k = 0; k < items.size(); ++k) {
      const int w = static_cast<int>(std::ceil(static_cast<double>(m.own_bytes(items[k])) / unit));
      for (int c = kUnits; c >= w; --c) {
        if (value[c - w] + m.seconds(items[k]) > value[c]) {
          value[c] = value[c - w] + m.seconds(items[k]);
          take[k][c] = 1;
        }
      }
    }
    Candidate trial = base;
    for (int k = static_cast<int>(items.size()) - 1, c = kUnits; k >= 0; --k) {
      if (!take[k][c]) continue;
      trial.plan[items[k]] = 0;
      c -= static_cast<int>(std::ceil(static_cast<double>(m.own_bytes(items[k])) / unit));
    }
    trial.eval = m.evaluate(trial.plan);
    trial.peak = m.simulate_peak(trial.eval);
    if (trial.peak <= budget) {
      if (trial.eval.seconds < best.eval.seconds) best = std::move(trial);
      break;
    }
    capacity -= std::max<int64_t>(trial.peak - budget, capacity / 8);
  }
  return best;
}

// From `start` (which fits), switches one node at a time between recomputed and kept while
// that lowers the predicted step cost (JointModel::step_seconds) and the simulated peak still
// fits `budget`; a few passes over the nodes that make or read what the backward needs.
Candidate improve(const JointModel& m, Candidate start, int64_t budget) {
  Candidate best = std::move(start);
  double cost = m.step_seconds(best.eval);
  for (int pass = 0; pass < 4; ++pass) {
    bool changed = false;
    std::vector<size_t> nodes;
    for (int id : best.eval.saved) {
      const int p = m.producer(id);
      if (p >= 0 && m.recomputable(p) && m.kind(p) != OpKind::kFree) nodes.push_back(p);
    }
    for (size_t i = 0; i < m.size(); ++i) {
      if (best.eval.recomputed[i] && m.kind(i) != OpKind::kFree) nodes.push_back(i);
    }
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    for (size_t i : nodes) {
      Candidate trial;
      trial.plan = best.plan;
      trial.plan[i] = !trial.plan[i];
      trial.eval = m.evaluate(trial.plan);
      const double trial_cost = m.step_seconds(trial.eval);
      if (trial_cost >= cost * (1 - 1e-9)) continue;
      trial.peak = m.simulate_peak(trial.eval);
      if (trial.peak > budget) continue;
      best = std::move(trial);
      cost = trial_cost;
      changed = true;
    }
    if (!changed) break;
  }
  return best;
}

std::string mib(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= double(1 << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1 << 30));
  } else if (b >= double(1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  }
  return buf;
}

}  // namespace

RecomputePlan plan_recompute(const ir::Graph& joint, const RecomputeOptions& options) {
  RecomputePlan out;
  out.policy = options.policy;
  JointModel m(joint, options);
  const NodeSet none = m.no_recompute();
  const Evaluation none_eval = m.evaluate(none);
  out.no_recompute_bytes = none_eval.saved_bytes;
  out.no_recompute_peak_bytes = m.simulate_peak(none_eval);

  NodeSet plan;
  int64_t lowest_peak = 0;  // AUTOSEARCH's candidates' lowest, when it ran
  switch (options.policy) {
    case RecomputePolicy::kHeuristic:
      plan = heuristic(m);
      break;
    case RecomputePolicy::kHandcraft: {
      MAGI_CHECK(options.memory_budget >= 0 && options.memory_budget <= 1,
                 "recompute_config.memory_budget=", options.memory_budget,
                 " is outside [0, 1]; it is the fraction of the no-recompute plan's saved bytes");
      std::vector<Candidate> seq = plan_sequence(m);
      int64_t fewest = seq.front().eval.saved_bytes;
      for (const auto& c : seq) fewest = std::min(fewest, c.eval.saved_bytes);
      const double limit =
          std::max(options.memory_budget * static_cast<double>(out.no_recompute_bytes),
                   static_cast<double>(fewest));
      for (const auto& c : seq) {
        if (static_cast<double>(c.eval.saved_bytes) <= limit) {
          plan = c.plan;
          break;
        }
      }
      if (options.memory_budget * static_cast<double>(out.no_recompute_bytes) <
          static_cast<double>(fewest)) {
        out.budget_met = false;
        out.note = "no plan saves fewer than " + mib(fewest) +
                   " (the outputs of random ops, attention ops among them, and of ops with side "
                   "effects are always "
                   "saved)";
      }
      break;
    }
    case RecomputePolicy::kAutosearch: {
      MAGI_CHECK(options.peak_budget_bytes > 0,
                 "recompute_policy=AUTOSEARCH needs recompute_config.memory_budget_bytes > 0 (the "
                 "activation peak to fit, in bytes); got ",
                 options.peak_budget_bytes);
      const int64_t budget = options.peak_budget_bytes;
      // Every candidate is improved within its own simulated peak, so the pool does not depend
      // on the budget, which only says which candidates fit: a larger budget never gets a
      // plan predicted to cost more.
      std::vector<Candidate> pool = plan_sequence(m);
      Candidate cut;
      cut.plan = m.min_cut(/*allow_compute_bound=*/false);
      cut.eval = m.evaluate(cut.plan);
      cut.peak = m.simulate_peak(cut.eval);
      const int64_t top = std::max(cut.peak, out.no_recompute_peak_bytes);
      std::vector<Candidate> seeds;
      int64_t last = -1;
      for (int k = 0; k <= kKnapsackSteps; ++k) {
        const int64_t peak = cut.peak + (top - cut.peak) * k / kKnapsackSteps;
        if (peak != last) seeds.push_back(cut_and_knapsack(m, cut, peak));
        last = peak;
      }
      // Also the heuristic plan and the fewest saved bytes of all, in case no plan fits.
      for (NodeSet extra : {heuristic(m), m.min_cut(/*allow_compute_bound=*/true)}) {
        Evaluation ev = m.evaluate(extra);
        seeds.push_back({std::move(extra), std::move(ev)});
      }
      for (Candidate& c : seeds) {
        if (c.peak < 0) c.peak = m.simulate_peak(c.eval);
        pool.push_back(improve(m, c, c.peak));
        pool.push_back(std::move(c));
      }
      const Candidate* best = nullptr;
      const Candidate* smallest = nullptr;
      double best_cost = 0;
      for (auto& c : pool) {
        if (c.peak < 0) c.peak = m.simulate_peak(c.eval);
        if (smallest == nullptr || c.peak < smallest->peak) smallest = &c;
        const double cost = m.step_seconds(c.eval);
        if (c.peak <= budget && (best == nullptr || cost < best_cost)) {
          best = &c;
          best_cost = cost;
        }
      }
      lowest_peak = smallest->peak;
      if (best == nullptr) {
        best = smallest;
        out.budget_met = false;
        out.note = "no plan's simulated activation peak fits " + mib(budget) +
                   "; the smallest is " + mib(smallest->peak);
      }
      plan = best->plan;
      break;
    }
  }

  const Evaluation e = m.evaluate(plan);
  out.lowest_peak_bytes = lowest_peak;
  for (NodeSet other : {heuristic(m), m.min_cut(false), m.min_cut(true), plan}) {
    const Evaluation oe = m.evaluate(other);
    const int64_t peak = m.simulate_peak(oe);
    if (out.lowest_peak_bytes == 0 || peak < out.lowest_peak_bytes) out.lowest_peak_bytes = peak;
  }
  out.saved_bytes = e.saved_bytes;
  out.recompute_seconds = e.seconds;
  out.step_seconds = m.step_seconds(e);
  out.predicted_peak_bytes = m.simulate_peak(e, &out.predicted_forward_peak_bytes);
  for (int id : e.saved) out.saved.push_back(m.value(id));
  for (size_t i = 0; i < m.size(); ++i) {
    if (!plan[i]) out.kept.push_back(m.node(i));
    if (!e.recomputed[i]) continue;
    out.recomputed.push_back(m.node(i));
    if (m.kind(i) != OpKind::kFree) {
      out.recomputed_ops.push_back(m.node(i));
      out.recomputed_bytes += m.own_bytes(i);
    }
  }
  return out;
}

std::vector<std::string> RecomputePlan::recomputed_names() const {
  std::vector<std::string> names;
  for (const ir::Node* n : recomputed) names.push_back(n->provenance().fx_name);
  return names;
}

std::vector<std::string> RecomputePlan::saved_names() const {
  std::vector<std::string> names;
  for (const ir::Value* v : saved) names.push_back(v->name());
  return names;
}

std::string RecomputePlan::report() const {
  std::ostringstream s;
  auto pct = [](int64_t a, int64_t b) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.0f%%", b > 0 ? 100.0 * double(a) / double(b) : 100.0);
    return std::string(buf);
  };
  s << "recompute plan (" << recompute_policy_name(policy) << ")\n";
  s << "  saved:      " << mib(saved_bytes) << " in " << saved.size() << " values ("
    << pct(saved_bytes, no_recompute_bytes) << " of the no-recompute plan's "
    << mib(no_recompute_bytes) << ")\n";
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.3f ms", recompute_seconds * 1e3);
  s << "  recomputed: " << recomputed_ops.size() << " ops writing " << mib(recomputed_bytes)
    << ", about " << ms << " per step (roofline)\n";
  std::snprintf(ms, sizeof ms, "%.3f ms", step_seconds * 1e3);
  s << "  predicted step cost: " << ms
    << " (saved values written and read, recomputation fused into the backward)\n";
  s << "  predicted activation peak: " << mib(predicted_peak_bytes) << " (in the forward "
    << mib(predicted_forward_peak_bytes) << "; no-recompute plan: " << mib(no_recompute_peak_bytes)
    << ")\n";
  if (!budget_met) s << "  budget not met: " << note << "\n";
  s << "saved values:\n";
  for (const ir::Value* v : saved) {
    s << "  " << v->name() << "  " << v->type_str() << "  = " << v->producer()->op_name() << "\n";
  }
  s << "recomputed ops:\n";
  for (const ir::Node* n : recomputed_ops) {
    s << "  " << n->provenance().fx_name << "  " << n->op_name();
    if (!n->outputs().empty()) s << "  " << n->output()->type_str();
    s << "\n";
  }
  return s.str();
}

}  // namespace magi::passes
