// Weight offload at run time: pinned host memory for weights, and the engine that streams
// them to the GPU on a copy stream while the executor runs (plans: offload_plan.h).
//
// Offloaded weights are CUDA tensors whose memory is pinned host memory (mapped into the
// GPU's address space), so the model keeps working everywhere: Dynamo traces CUDA
// parameters, eager code reads them over the host link (slowly), `.cuda()` finds them on the
// device already. Compiled inference graphs do not read them in place: the engine copies
// each one into a GPU buffer just before its first reader, or keeps a GPU copy of it
// (resident weights, shared by every graph of the process).
//
// The engine of an Executable calibrates itself over its first calls:
//   call 1: every weight streamed through two buffers (BASE); each step's compute time
//           estimated from its operators (FLOPs, bytes) and timed with CUDA events;
//   call 2: the configured policy, planned on the estimates; timed;
//   call 3: the same plan, timed again (call 2 may include piece CUDA-graph captures);
//   call 4: planned on the faster of the two times of each step; timed for the report;
//   later:  no timing. The plan changes nothing that was captured or compiled.
// Consecutive calls are ordered on the GPU even when they run on different streams.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "magi/runtime/offload_plan.h"

namespace magi::runtime {

/// A copy of `src` in pinned host memory, as a tensor on `device` (CUDA: the GPU reads the
/// host memory directly; CPU: an ordinary CPU tensor). Tensors of 64 MiB or more get a pinned
/// allocation of their exact size; smaller ones share 256 MiB chunks (no power-of-two
/// rounding). A chunk is freed when its last tensor is.
at::Tensor offload_to_host(const at::Tensor& src, c10::Device device);
/// The same pinned memory as `offloaded`, seen from `device` (no copy).
at::Tensor offloaded_view(const at::Tensor& offloaded, c10::Device device);
/// Whether `t`'s memory is pinned host memory from offload_to_host.
bool is_offloaded(const at::Tensor& t);
/// Pinned bytes currently held for offloaded weights (chunks, including their free tails).
int64_t offload_host_bytes();
/// Host-to-device copy rate from pinned memory, in GB/s, measured once per device (64 MiB,
/// median of 3). 0 without CUDA.
double host_link_gbps(int device);
/// Bytes of GPU copies of resident weights held for the engines of this process.
int64_t resident_cache_bytes();

/// What an Executable knows of each of its inputs, for the engine.
struct OffloadInputUse {
  size_t input = 0;
  size_t first_use = 0, last_use = 0;  // steps reading it or a view of it
  bool escapes = false;                // a view of it is a graph output
  bool mutated = false;                // written in place by the graph: never offloaded
};

struct OffloadReport {
  std::string policy;
  std::string source;  // what the current plan's step times came from
  int plan_version = 0;
  size_t weights = 0, groups = 0;
  int64_t total_bytes = 0, resident_bytes = 0, streamed_bytes = 0, buffer_bytes = 0;
  double link_gbps = 0;
  double predicted_compute_ms = 0, predicted_copy_ms = 0, predicted_call_ms = 0;
  double predicted_overlap = 1;
  double ratio_to_hide = 0;
  bool hidden = true;
  // From the last timed call (-1 before one ran with the current plan).
  double measured_call_ms = -1, measured_compute_ms = -1, measured_overlap = -1;
  size_t calls = 0;
};

class OffloadEngine {
 public:
  OffloadEngine(const OffloadOptions& options, std::vector<OffloadInputUse> uses, size_t num_steps);
  ~OffloadEngine();

  // The run protocol, one call at a time (Executable::run holds lock() while it runs):
  /// Swaps offloaded weights in `inputs` for their GPU buffers or resident copies and starts
  /// the first copies. False when no input is offloaded (the engine stays out of the call).
  bool begin(std::vector<c10::IValue>& inputs);
  void before_step(size_t step);
  void after_step(size_t step);
  void finish();  // after the last step of a call that succeeded
  void abort();   // the call failed part way

  /// The executor adds the estimated compute time of each operator it runs here (call 1).
  static void add_estimate(double us);
  static bool estimating();

  std::optional<OffloadReport> report() const;
  std::mutex& lock();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Estimated GPU time of one operator call from its operands (FLOPs of matmuls and attention
/// at the device's matrix rate, bytes of everything at its memory rate, plus a launch).
/// `name`: the operator's qualified name ("aten::mm"), or any other name for bytes only.
double estimate_operator_us(const std::string& name, const std::vector<c10::IValue>& in,
                            const std::vector<c10::IValue>& out);

}  // namespace magi::runtime
