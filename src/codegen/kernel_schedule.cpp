// The schedule of the generated CUDA kernels: threads and chunks per block (the defaults, or
// the developer override MAGI_KERNEL_SCHEDULE, docs/architecture.md), the loop over rows and
// the vector I/O each variant takes, and the preamble defines that follow from them. Part of
// the printed source, hence of the kernel cache key.
#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "magi/codegen/printers.h"
#include "magi/common/error.h"

namespace magi::codegen {

namespace {
constexpr const char* kScheduleVariable = "MAGI_KERNEL_SCHEDULE";

// The field of `s` named `key`, or nullptr; `power_of_two`: whether it counts threads.
int* schedule_field(KernelSchedule& s, const std::string& key, bool* power_of_two) {
  struct Field {
    const char* name;
    int KernelSchedule::*member;
    bool threads;
  };
  static constexpr Field kFields[] = {
      {"block_threads", &KernelSchedule::block_threads, true},
      {"row_chunks", &KernelSchedule::row_chunks, false},
      {"held_row_threads", &KernelSchedule::held_row_threads, true},
      {"stream_threads", &KernelSchedule::stream_threads, true},
      {"stream_chunks", &KernelSchedule::stream_chunks, false},
  };
  for (const Field& f : kFields) {
    if (key == f.name) {
      *power_of_two = f.threads;
      return &(s.*f.member);
    }
  }
  return nullptr;
}
}  // namespace

KernelSchedule parse_kernel_schedule(const std::string& text) {
  KernelSchedule s;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    bool threads = false;
    int* field = eq == std::string::npos ? nullptr : schedule_field(s, key, &threads);
    MAGI_CHECK(field != nullptr, kScheduleVariable, ": '", item,
               "' is not one of block_threads=, row_chunks=, held_row_threads=, "
               "stream_threads=, stream_chunks= followed by a number");
    const std::string value = item.substr(eq + 1);
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    const long lo = threads ? 32 : 1, hi = threads ? 1024 : 16;
    MAGI_CHECK(!value.empty() && *end == '\0' && v >= lo && v <= hi, kScheduleVariable, ": ", key,
               "=", value, " is not an integer in [", lo, ", ", hi, "]");
    MAGI_CHECK(!threads || (v & (v - 1)) == 0, kScheduleVariable, ": ", key, "=", value,
               " is not a power of two");
    *field = static_cast<int>(v);
  }
  return s;
}

const KernelSchedule& kernel_schedule() {
  static const KernelSchedule schedule = [] {
    const char* text = std::getenv(kScheduleVariable);
    return parse_kernel_schedule(text == nullptr ? "" : text);
  }();
  return schedule;
}

bool row_grid_loop(const KernelVariant& v, int64_t row_bytes) {
  return !(v.wide_rows || (v.streamed_rows && row_bytes <= kStreamedRowsWithoutLoop));
}

VectorIo vector_io_for(const KernelVariant& variant) {
  // Rows held in registers, reduced once and written out whole (RMSNorm, add+RMSNorm):
  // torch.compile's policy, rows read under L2 evict_last and written with plain stores, which
  // measured at or above streaming for RMSNorm and add+RMSNorm. Kernels that reduce a row twice
  // (LayerNorm lost with it), row kernels whose outputs are one value per row (a sum, a mean),
  // streamed rows, rows in warps, pointwise and column kernels stay with streaming loads and
  // stores. RMSNorm's backward takes the forward's choice. The CPU test runs compile every CUDA
  // form of a kernel with the held form's choice.
  MAGI_ASSERT(variant.spec != nullptr, "vector_io_for: a kernel variant without its spec");
  const KernelSpec& spec = *variant.spec;
  if (spec.schedule != Schedule::kRow || variant.streamed_rows || variant.rows_in_warps) {
    return VectorIo::kStreaming;
  }
  int reductions = 0;
  for (const KOp& op : spec.ops) reductions += op.kind == KOpKind::kReduce;
  const bool element_output = std::any_of(spec.outputs.begin(), spec.outputs.end(),
                                          [](const KOutput& o) { return !o.per_row; });
  return reductions == 1 && element_output ? VectorIo::kL2Last : VectorIo::kStreaming;
}

std::string cuda_preamble(const KernelVariant& variant) {
  const char* define = vector_io_for(variant) == VectorIo::kL2Last
                           ? "#define MAGI_VECTOR_IO_L2LAST 1\n"
                           : "#define MAGI_VECTOR_IO_CS 1\n";
  return define + std::string(kCudaPreamble) + "\n";
}

}  // namespace magi::codegen
