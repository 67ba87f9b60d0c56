// Weight offload planning: see offload_plan.h.
#include "magi/runtime/offload_plan.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>
#include <numeric>

#include "magi/common/error.h"

namespace magi::runtime {

const char* offload_policy_name(OffloadPolicy policy) {
  switch (policy) {
    case OffloadPolicy::kBase:
      return "BASE";
    case OffloadPolicy::kCostEffective:
      return "COST_EFFECTIVE";
    case OffloadPolicy::kHeuristic:
      return "HEURISTIC";
  }
  return "?";
}

OffloadPolicy parse_offload_policy(const std::string& name) {
  std::string upper = name;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (OffloadPolicy p :
       {OffloadPolicy::kBase, OffloadPolicy::kCostEffective, OffloadPolicy::kHeuristic}) {
    if (upper == offload_policy_name(p)) return p;
  }
  MAGI_CHECK(false, "unknown offload policy '", name, "'; expected BASE, COST_EFFECTIVE or ",
             "HEURISTIC");
  return OffloadPolicy::kBase;
}

namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// Compute per byte of each weight: the time of its first reader's step (the one its copy must
// finish before), per byte of all the weights first read there.
std::vector<double> compute_per_byte(const std::vector<double>& step_us,
                                     const std::vector<OffloadWeight>& weights) {
  std::vector<double> first_bytes(step_us.size(), 0.0);
  for (const auto& w : weights) first_bytes[w.first_use] += double(w.bytes);
  std::vector<double> out(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    out[i] = step_us[weights[i].first_use] / std::max(1.0, first_bytes[weights[i].first_use]);
  }
  return out;
}

std::vector<bool> choose_resident(const std::vector<double>& step_us,
                                  const std::vector<OffloadWeight>& weights, OffloadPolicy policy,
                                  double ratio) {
  std::vector<bool> resident(weights.size(), false);
  int64_t total = 0, kept = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    total += weights[i].bytes;
    if (weights[i].must_stay) {
      resident[i] = true;
      kept += weights[i].bytes;
    }
  }
  if (policy == OffloadPolicy::kBase) return resident;
  const double budget = std::clamp(ratio, 0.0, 1.0) * double(total);
  const std::vector<double> cpb = compute_per_byte(step_us, weights);
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  // Least compute per byte first: their copies are the hardest to hide. Ties: earlier first.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (cpb[a] != cpb[b]) return cpb[a] < cpb[b];
    return weights[a].first_use < weights[b].first_use;
  });
  for (size_t i : order) {
    if (resident[i]) continue;
    if (double(kept + weights[i].bytes) > budget + 0.5) continue;
    resident[i] = true;
    kept += weights[i].bytes;
  }
  return resident;
}

struct Interval {
  long a, b;  // busy steps a..b, a < 0 for a wrapped group (steps of the previous call)
};

bool overlaps(const Interval& x, const Interval& y, long steps) {
  for (long shift : {-steps, 0L, steps}) {
    if (std::max(x.a, y.a + shift) <= std::min(x.b, y.b + shift)) return true;
  }
  return false;
}

// First fit, biggest groups first, among groups busy at the same time.
int64_t assign_offsets(std::vector<OffloadGroup>& groups, std::vector<int64_t>* group_offset,
                       long steps, int64_t alignment) {
  std::vector<Interval> busy;
  for (const auto& g : groups) {
    const long a = g.gate + 1 - (g.wraps ? steps : 0);
    busy.push_back({a, long(g.release)});
  }
  std::vector<size_t> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return groups[x].bytes > groups[y].bytes; });
  group_offset->assign(groups.size(), -1);
  int64_t size = 0;
  std::vector<size_t> placed;
  for (size_t g : order) {
    std::vector<std::pair<int64_t, int64_t>> taken;  // [begin, end) of regions busy with g
    for (size_t h : placed) {
      if (overlaps(busy[g], busy[h], steps)) {
        taken.emplace_back((*group_offset)[h],
                           (*group_offset)[h] + align_up(groups[h].bytes, alignment));
      }
    }
    std::sort(taken.begin(), taken.end());
    int64_t at = 0;
    const int64_t need = align_up(groups[g].bytes, alignment);
    for (const auto& [begin, end] : taken) {
      if (at + need <= begin) break;
      at = std::max(at, end);
    }
    (*group_offset)[g] = at;
    size = std::max(size, at + need);
    placed.push_back(g);
  }
  return size;
}

// Gates of BASE and COST_EFFECTIVE: `lookahead` buffers reused round robin. Group g is copied
// into the buffer of group g - lookahead once that group's last reader has finished.
void fixed_lookahead_gates(std::vector<OffloadGroup>& groups, const OffloadOptions& o) {
  const long n = long(groups.size());
  const long ahead = long(std::max<size_t>(1, o.lookahead));
  for (long g = 0; g < n; ++g) {
    OffloadGroup& group = groups[g];
    if (g >= ahead) {
      group.gate = long(groups[g - ahead].release);
      group.wraps = false;
    } else if (o.prefetch_across_calls) {
      const long h = g - ahead + n;  // the group of the previous call whose buffer it takes
      group.wraps = true;
      group.gate = h >= 0 ? long(groups[h].release) : -1;
    } else {
      group.gate = -1;
      group.wraps = false;
    }
  }
}

// HEURISTIC: every copy as late as the time model allows, the copies one after another on
// one stream (the latest schedule, built backwards from the last group).
void just_in_time_gates(std::vector<OffloadGroup>& groups, const std::vector<double>& step_us,
                        const OffloadOptions& o) {
  const size_t steps = step_us.size();
  std::vector<double> end(steps);  // time at which step i ends
  double t = 0;
  for (size_t i = 0; i < steps; ++i) end[i] = (t += step_us[i]);
  const double total = t;
  const double rate = o.link_bytes_per_us * std::clamp(o.safety_factor, 0.05, 1.0);
  auto start_of = [&](size_t step) { return step == 0 ? 0.0 : end[step - 1]; };
  // The last step ending at or before `time` (-1: none).
  auto gate_at = [&](double time) {
    auto it = std::upper_bound(end.begin(), end.end(), time + 1e-9);
    return long(it - end.begin()) - 1;
  };
  double next_start = std::numeric_limits<double>::infinity();
  for (size_t k = groups.size(); k-- > 0;) {
    OffloadGroup& g = groups[k];
    const double finish = std::min(start_of(g.first_use), next_start);
    const double begin = finish - double(g.bytes) / rate;
    next_start = begin;
    if (begin >= 0 || !o.prefetch_across_calls) {
      g.wraps = false;
      g.gate = begin >= 0 ? gate_at(begin) : -1;
    } else {
      g.wraps = true;
      g.gate = begin + total >= 0 ? gate_at(begin + total) : -1;
    }
  }
}

// The order constraints the runtime relies on: copies are issued in group order (wrapped
// groups, issued during the previous call, first), and a wrapped group's copy starts after
// its own previous instance was last read.
void legalise_gates(std::vector<OffloadGroup>& groups) {
  bool seen_plain = false;
  long last_wrapped = -1, last_plain = -1;
  for (OffloadGroup& g : groups) {
    if (g.wraps && seen_plain) g.wraps = false, g.gate = -1;  // cannot precede an earlier group
    if (g.wraps) {
      g.gate = std::max({g.gate, long(g.release), last_wrapped});
      last_wrapped = g.gate;
    } else {
      seen_plain = true;
      g.gate = std::max(g.gate, last_plain);
      g.gate = std::min(g.gate, long(g.first_use) - 1);  // never after its own first reader
      last_plain = g.gate;
    }
  }
}

OffloadPlan make_plan(const std::vector<double>& step_us, const std::vector<OffloadWeight>& weights,
                      const OffloadOptions& o, bool search_ratio);

}  // namespace

double simulate_offload_call_us(const OffloadPlan& plan, const std::vector<double>& step_us,
                                double link_bytes_per_us, double* stall_us) {
  const size_t steps = step_us.size();
  const size_t n = plan.groups.size();
  std::vector<std::vector<size_t>> first_read(steps), gated(steps + 1);  // gated[gate + 1]
  for (size_t g = 0; g < n; ++g) {
    first_read[plan.groups[g].first_use].push_back(g);
    gated[size_t(plan.groups[g].gate + 1)].push_back(g);
  }
  std::vector<double> ready(n, 0.0), ready_next(n, 0.0);
  std::vector<bool> prefetched(n, false);
  double t = 0, copy_free = 0, call_us = 0, compute = 0;
  for (double us : step_us) compute += us;
  auto copy = [&](size_t g, double not_before) {
    const double begin = std::max(copy_free, not_before);
    copy_free = begin + double(plan.groups[g].bytes) / link_bytes_per_us;
    return copy_free;
  };
  for (int call = 0; call < 3; ++call) {
    const double call_start = t;
    ready.swap(ready_next);
    // Groups the previous call did not prefetch start now.
    for (size_t g = 0; g < n; ++g) {
      if (plan.groups[g].wraps && !prefetched[g]) ready[g] = copy(g, t);
    }
    std::fill(prefetched.begin(), prefetched.end(), false);
    for (size_t g : gated[0]) {
      if (plan.groups[g].wraps) {
        ready_next[g] = copy(g, t), prefetched[g] = true;
      } else {
        ready[g] = copy(g, t);
      }
    }
    for (size_t i = 0; i < steps; ++i) {
      for (size_t g : first_read[i]) t = std::max(t, ready[g]);
      t += step_us[i];
      for (size_t g : gated[i + 1]) {
        if (plan.groups[g].wraps) {
          ready_next[g] = copy(g, t), prefetched[g] = true;
        } else {
          ready[g] = copy(g, t);
        }
      }
    }
    call_us = t - call_start;
  }
  if (stall_us != nullptr) *stall_us = std::max(0.0, call_us - compute);
  return call_us;
}

namespace {

OffloadPlan make_plan(const std::vector<double>& step_us, const std::vector<OffloadWeight>& weights,
                      const OffloadOptions& o, bool search_ratio) {
  OffloadPlan plan;
  plan.policy = o.policy;
  const size_t steps = step_us.size();
  plan.resident = choose_resident(step_us, weights, o.policy, o.resident_ratio);
  plan.offset.assign(weights.size(), -1);
  plan.group_of.assign(weights.size(), kNone);
  std::vector<size_t> group_at(steps, kNone);
  for (size_t i = 0; i < weights.size(); ++i) {
    plan.total_bytes += weights[i].bytes;
    if (plan.resident[i]) {
      plan.resident_bytes += weights[i].bytes;
      continue;
    }
    plan.streamed_bytes += weights[i].bytes;
    group_at[weights[i].first_use] = 0;  // marked; numbered below in step order
  }
  for (size_t s = 0; s < steps; ++s) {
    if (group_at[s] == kNone) continue;
    group_at[s] = plan.groups.size();
    OffloadGroup g;
    g.first_use = g.release = s;
    plan.groups.push_back(g);
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    if (plan.resident[i]) continue;
    OffloadGroup& g = plan.groups[group_at[weights[i].first_use]];
    plan.group_of[i] = group_at[weights[i].first_use];
    g.weights.push_back(i);
    g.release = std::max(g.release, weights[i].last_use);
  }
  // Offsets of weights inside their group, each aligned.
  std::vector<int64_t> inside(weights.size(), 0);
  for (OffloadGroup& g : plan.groups) {
    for (size_t i : g.weights) {
      inside[i] = g.bytes;
      g.bytes += align_up(weights[i].bytes, o.alignment);
    }
  }
  if (o.policy == OffloadPolicy::kHeuristic) {
    // As late as the time model allows, but never more than twice the look-ahead in groups
    // early: when copies cannot hide, starting them sooner only fills the buffer.
    std::vector<OffloadGroup> capped = plan.groups;
    OffloadOptions wide = o;
    wide.lookahead = 2 * std::max<size_t>(1, o.lookahead);
    fixed_lookahead_gates(capped, wide);
    just_in_time_gates(plan.groups, step_us, o);
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      auto at = [&](const OffloadGroup& x) { return x.gate + 1 - (x.wraps ? long(steps) : 0); };
      if (at(capped[g]) > at(plan.groups[g])) {
        plan.groups[g].gate = capped[g].gate;
        plan.groups[g].wraps = capped[g].wraps;
      }
    }
  } else {
    fixed_lookahead_gates(plan.groups, o);
  }
  legalise_gates(plan.groups);
  std::vector<int64_t> group_offset;
  plan.buffer_bytes = assign_offsets(plan.groups, &group_offset, long(steps), o.alignment);
  for (size_t i = 0; i < weights.size(); ++i) {
    if (plan.group_of[i] != kNone) plan.offset[i] = group_offset[plan.group_of[i]] + inside[i];
  }

  for (double us : step_us) plan.compute_us += us;
  plan.copy_us = double(plan.streamed_bytes) / o.link_bytes_per_us;
  plan.call_us = simulate_offload_call_us(plan, step_us, o.link_bytes_per_us, &plan.stall_us);
  plan.overlap = plan.copy_us > 0 ? std::clamp(1.0 - plan.stall_us / plan.copy_us, 0.0, 1.0) : 1;
  if (search_ratio) {
    plan.ratio_to_hide = 1.0;
    OffloadOptions trial = o;
    if (trial.policy == OffloadPolicy::kBase) trial.policy = OffloadPolicy::kCostEffective;
    for (int k = 0; k <= 20; ++k) {
      trial.resident_ratio = k / 20.0;
      if (make_plan(step_us, weights, trial, false).hidden()) {
        plan.ratio_to_hide = trial.resident_ratio;
        break;
      }
    }
  }
  return plan;
}

}  // namespace

OffloadPlan plan_offload(const std::vector<double>& step_us,
                         const std::vector<OffloadWeight>& weights, const OffloadOptions& options) {
  MAGI_CHECK(options.link_bytes_per_us > 0, "offload plan: the link rate must be positive, got ",
             options.link_bytes_per_us, " bytes/us");
  MAGI_CHECK(options.alignment > 0, "offload plan: alignment must be positive");
  for (size_t i = 0; i < weights.size(); ++i) {
    const OffloadWeight& w = weights[i];
    MAGI_CHECK(w.first_use <= w.last_use && w.last_use < step_us.size(), "offload plan: weight ", i,
               " is read by steps ", w.first_use, "..", w.last_use, " of a program of ",
               step_us.size(), " steps");
    MAGI_CHECK(w.bytes >= 0, "offload plan: weight ", i, " has ", w.bytes, " bytes");
  }
  for (double us : step_us) {
    MAGI_CHECK(us >= 0, "offload plan: a step takes ", us, " us");
  }
  return make_plan(step_us, weights, options, true);
}

std::string OffloadPlan::summary() const {
  auto gb = [](int64_t b) { return double(b) / 1e9; };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s: %.3f GB of weights, %.3f GB resident, %.3f GB streamed per call in %zu "
                "groups through a %.3f GB buffer; predicted per call: %.2f ms of copies, "
                "%.2f ms of compute, %.2f ms stalled (%.0f%% of the copy time hidden)",
                offload_policy_name(policy), gb(total_bytes), gb(resident_bytes),
                gb(streamed_bytes), groups.size(), gb(buffer_bytes), copy_us / 1e3,
                compute_us / 1e3, stall_us / 1e3, overlap * 100);
  return buf;
}

}  // namespace magi::runtime
