// MAGI_MEMORY_TRACE=1: each executor run logs the most tensor memory its registers held at
// once (distinct storages), the step where that happened and the largest values alive there,
// and on CUDA the instruction during which the allocator's peak rose. For comparing a graph's
// real liveness with the recompute planner's prediction; it scans the registers after every
// instruction, so it is off by default. Internal to src/runtime (executor.cpp uses it).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "program.h"

namespace magi::runtime {

/// Whether MAGI_MEMORY_TRACE is set (read once per process).
bool memory_trace_on();

class MemoryTrace {
 public:
  /// Starts a trace of one run from its registers holding the inputs.
  explicit MemoryTrace(const std::vector<c10::IValue>& regs);
  /// Records the distinct storages the registers hold after instruction `step` (-1: the inputs
  /// alone): their bytes, and which of them are inputs.
  void record(const std::vector<c10::IValue>& regs, int64_t step);
  /// Logs the trace. Call once the registers are gone: an input whose storage is still alive
  /// then is the caller's (a parameter, a tensor it keeps) and is not counted as the run's.
  void report(const std::vector<Instr>& instrs, size_t num_registers) const;

 private:
  struct Input {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t bytes;
  };
  static constexpr size_t kNone = static_cast<size_t>(-1);
  struct Held {
    int64_t bytes;
    size_t reg;    // the first register holding the storage
    size_t input;  // index into inputs_, or kNone
  };
  struct Step {
    int64_t step;
    int64_t bytes;
    std::vector<size_t> inputs;  // indices into inputs_
    std::vector<Held> storages;
  };
  struct AllocatorStats {
    int64_t current, peak;
  };
  static const c10::StorageImpl* storage_of(const c10::IValue& v);
  static std::string mib(int64_t bytes);
  AllocatorStats allocator_stats() const;

  int device_ = -1;  // a CUDA run's device: the allocator's peak is traced too
  int64_t start_allocated_ = 0;
  int64_t allocator_peak_ = 0;
  int64_t allocator_peak_step_ = -1;
  std::vector<Input> inputs_;
  std::unordered_map<const c10::StorageImpl*, size_t> input_index_;
  std::vector<Step> steps_;
};

}  // namespace magi::runtime
