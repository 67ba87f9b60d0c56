// MAGI_MEMORY_TRACE (memory_trace.h): what an executor run holds, step by step, and where the
// CUDA allocator's peak rose.
#include "memory_trace.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string_view>

#include "magi/common/log.h"

namespace magi::runtime {

bool memory_trace_on() {
  static const bool on = [] {
    const char* v = std::getenv("MAGI_MEMORY_TRACE");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return on;
}

MemoryTrace::MemoryTrace(const std::vector<c10::IValue>& regs) {
  for (const c10::IValue& v : regs) {
    const c10::StorageImpl* s = storage_of(v);
    if (s != nullptr && input_index_.emplace(s, inputs_.size()).second) {
      inputs_.push_back({c10::weak_intrusive_ptr<c10::StorageImpl>(
                             c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(
                                 const_cast<c10::StorageImpl*>(s))),
                         static_cast<int64_t>(s->nbytes())});
    }
    if (device_ < 0 && v.isTensor() && v.toTensor().is_cuda()) device_ = v.toTensor().get_device();
  }
  if (device_ >= 0) {
    const auto stats = allocator_stats();
    start_allocated_ = stats.current;
    allocator_peak_ = stats.peak;
  }
  record(regs, -1);
}

void MemoryTrace::record(const std::vector<c10::IValue>& regs, int64_t step) {
  if (device_ >= 0) {
    // The allocator's peak only rises during the instruction that set it: this is the one
    // (inside it: its outputs beside its inputs, and whatever it allocates for itself).
    const int64_t peak = allocator_stats().peak;
    if (peak > allocator_peak_) allocator_peak_ = peak, allocator_peak_step_ = step;
  }
  std::unordered_map<const c10::StorageImpl*, size_t> seen;  // storage -> first register
  Step rec{step, 0, {}, {}};
  for (size_t r = 0; r < regs.size(); ++r) {
    const c10::StorageImpl* s = storage_of(regs[r]);
    if (s == nullptr || !seen.emplace(s, r).second) continue;
    rec.bytes += static_cast<int64_t>(s->nbytes());
    auto in = input_index_.find(s);
    const bool is_input = in != input_index_.end();
    if (is_input) rec.inputs.push_back(in->second);
    rec.storages.push_back({static_cast<int64_t>(s->nbytes()), r, is_input ? in->second : kNone});
  }
  steps_.push_back(std::move(rec));
}

void MemoryTrace::report(const std::vector<Instr>& instrs, size_t num_registers) const {
  std::vector<char> resident(inputs_.size());
  int64_t resident_bytes = 0;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    resident[i] = !inputs_[i].storage.expired();
    if (resident[i]) resident_bytes += inputs_[i].bytes;
  }
  const Step* peak = nullptr;
  int64_t peak_bytes = -1;
  for (const Step& st : steps_) {
    int64_t own = st.bytes;
    for (size_t i : st.inputs) own -= resident[i] ? inputs_[i].bytes : 0;
    if (own > peak_bytes) peak_bytes = own, peak = &st;
  }
  std::vector<std::string> made_by(num_registers, "an input");
  for (const Instr& instr : instrs) {
    for (Ref r : instr.out) {
      if (r != kUnused) made_by[r] = instr.where;
    }
  }
  std::vector<std::pair<int64_t, size_t>> largest;
  for (const Held& h : peak->storages) {
    if (h.input == kNone || !resident[h.input]) largest.emplace_back(h.bytes, h.reg);
  }
  std::sort(largest.begin(), largest.end(), std::greater<>());
  std::string lines;
  for (size_t i = 0; i < largest.size() && i < 12; ++i) {
    lines += detail::str_cat("\n  ", mib(largest[i].first), " from ", made_by[largest[i].second]);
  }
  const std::string where =
      peak->step < 0 ? std::string("with the inputs alone") : "after " + instrs[peak->step].where;
  log::write(log::Level::kInfo,
             detail::str_cat("memory trace: ", instrs.size(), " instructions, peak ",
                             mib(peak_bytes), " of tensors ", where, " (step ", peak->step,
                             "), not counting the ", mib(resident_bytes),
                             " of inputs the caller keeps (parameters...); largest there:", lines));
  if (device_ >= 0) {
    log::write(log::Level::kInfo,
               allocator_peak_step_ < 0
                   ? detail::str_cat("memory trace: the CUDA allocator's peak (",
                                     mib(allocator_peak_), ") was not raised by this run")
                   : detail::str_cat(
                         "memory trace: the CUDA allocator's peak rose to ", mib(allocator_peak_),
                         ", ", mib(allocator_peak_ - start_allocated_),
                         " above what was allocated when the run began, during ",
                         instrs[allocator_peak_step_].where, " (step ", allocator_peak_step_, ")"));
  }
}

const c10::StorageImpl* MemoryTrace::storage_of(const c10::IValue& v) {
  if (!v.isTensor()) return nullptr;
  const at::Tensor& t = v.toTensor();
  return t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
}

std::string MemoryTrace::mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

MemoryTrace::AllocatorStats MemoryTrace::allocator_stats() const {
  const auto s = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(device_);
  const auto& all =
      s.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return {all.current, all.peak};
}

}  // namespace magi::runtime
