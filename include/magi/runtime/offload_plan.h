// Weight offload planning: which weights stay on the GPU, when each streamed weight is copied
// in, and where in the streaming buffer it lands. Pure data in, data out (no CUDA), so the
// policies are tested on synthetic programs (tests/cpp/test_offload_plan.cpp).
//
// The program is a sequence of steps (the top-level instructions of an Executable: operator
// calls, fused kernels, piece calls) with a compute time each. A weight is read by the steps
// from `first_use` to `last_use` (views of it included). Streamed weights first read by the
// same step form one transfer group: one copy batch, one "ready" event.
//
// A group's copy may start on the copy stream once its gate step has finished on the compute
// stream (gate -1: the start of the call). A group whose copy starts during the previous call
// (prefetch across calls) has `wraps` set and its gate is a step of that call. Its buffer
// region is busy from the end of the gate step to the end of its last reader; regions of
// groups busy at the same time never overlap, so the gate alone orders a copy after the last
// reader of whatever occupied its region before.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace magi::runtime {

enum class OffloadPolicy { kBase, kCostEffective, kHeuristic };

const char* offload_policy_name(OffloadPolicy policy);
OffloadPolicy parse_offload_policy(const std::string& name);  // "BASE", ... (any case)

struct OffloadWeight {
  int64_t bytes = 0;
  size_t first_use = 0;
  size_t last_use = 0;
  bool must_stay = false;  // a view of it is a graph output: never streamed
};

struct OffloadOptions {
  OffloadPolicy policy = OffloadPolicy::kCostEffective;
  double resident_ratio = 0.3;     // COST_EFFECTIVE, HEURISTIC: share of weight bytes kept
  double safety_factor = 0.9;      // HEURISTIC: usable share of the measured link bandwidth
  double link_bytes_per_us = 5e4;  // host-to-device copy rate (50 GB/s = 5e4 bytes per us)
  size_t lookahead = 2;            // BASE, COST_EFFECTIVE: buffers reused round robin
  int64_t alignment = 512;         // buffer offsets
  bool prefetch_across_calls = true;
};

struct OffloadGroup {
  std::vector<size_t> weights;  // indices into the weights given to plan_offload
  int64_t bytes = 0;
  size_t first_use = 0;
  size_t release = 0;  // last step reading any of its weights
  long gate = -1;      // the copy starts after this step (-1: at the start of the call)
  bool wraps = false;  // gate is a step of the previous call (prefetch)
};

struct OffloadPlan {
  OffloadPolicy policy = OffloadPolicy::kCostEffective;
  std::vector<bool> resident;        // per weight
  std::vector<int64_t> offset;       // per weight: offset in the streaming buffer (-1: resident)
  std::vector<size_t> group_of;      // per weight: its group (SIZE_MAX: resident)
  std::vector<OffloadGroup> groups;  // in copy order
  int64_t total_bytes = 0, resident_bytes = 0, streamed_bytes = 0, buffer_bytes = 0;
  // Predicted steady state (a call following a call), from a simulation of both streams.
  double compute_us = 0;  // sum of the step times
  double copy_us = 0;     // streamed bytes at the link rate
  double call_us = 0;     // compute plus stalls waiting for copies
  double stall_us = 0;
  double overlap = 1;  // share of the copy time hidden behind compute
  // Smallest resident ratio (COST_EFFECTIVE selection) at which stalls stay under 5% of the
  // compute time; > 1 when even all-resident would not do (never: all-resident has no copies).
  double ratio_to_hide = 0;
  bool hidden() const { return stall_us <= 0.05 * compute_us; }
  std::string summary() const;  // one line for the log
};

/// Plans a program of `step_us.size()` steps. Throws magi::Error on inconsistent input (a use
/// outside the program, first_use > last_use, a non-positive link rate).
OffloadPlan plan_offload(const std::vector<double>& step_us,
                         const std::vector<OffloadWeight>& weights, const OffloadOptions& options);

/// The simulated steady-state call time of `plan` with these step times (used for plans made
/// from one set of times and judged on another, e.g. measured ones).
double simulate_offload_call_us(const OffloadPlan& plan, const std::vector<double>& step_us,
                                double link_bytes_per_us, double* stall_us = nullptr);

}  // namespace magi::runtime
