// The two printers of the kernel IR: CUDA C++ for NVRTC and C++ with OpenMP for the host
// compiler. Both print readable code: each statement carries the ATen op and user source
// line it came from.
#pragma once

#include <cstdint>
#include <string>

#include "magi/codegen/kernel_ir.h"

namespace magi::codegen {

// The schedule of generated CUDA kernels (kernel_schedule.cpp). The defaults are the fastest
// settings measured on bf16 rows of 2048 to 8192 values; they are fixed behaviour. Developers
// tuning for another GPU may override the counts below with MAGI_KERNEL_SCHEDULE
// (docs/architecture.md); the printed source, hence the kernel cache key, follows them.

/// Threads and 16-byte chunks per thread of the generated CUDA kernels.
struct KernelSchedule {
  /// Threads per block at most (so the compiler may give each thread up to 255 registers: a row
  /// kernel holds its row chunks in registers). Row kernels over rows longer than this many
  /// threads hold take held_row_threads (wide rows) or stream_threads (streamed rows).
  int block_threads = 256;
  /// Chunks of vector_width columns each thread of a row kernel holds in registers.
  int row_chunks = 4;
  /// The most threads a row kernel takes to hold its rows in registers: rows that block_threads
  /// threads do not hold but this many do are held by a wider block (KernelVariant::wide_rows)
  /// instead of streamed; at most block_threads turns wide rows off. Rows of 16384 bf16 values
  /// held by 512 threads beat streamed rows; rows of 32768 held by 1024 threads lost to them.
  int held_row_threads = 512;
  /// Threads per block of a row kernel whose rows do not fit in registers (streamed rows).
  int stream_threads = 512;
  /// Vectors of each input a thread of a streamed-row kernel loads ahead of each step.
  int stream_chunks = 2;
};
/// The schedule of this process: the defaults with MAGI_KERNEL_SCHEDULE's overrides, read once.
/// A malformed value is a UserError naming the variable, raised by the first compile.
const KernelSchedule& kernel_schedule();
/// The defaults with the overrides in `text` ("row_chunks=8,block_threads=512"; keys are the
/// fields of KernelSchedule; thread counts are powers of two in [32, 1024], chunks in [1, 16]).
KernelSchedule parse_kernel_schedule(const std::string& text);

/// Whether GPU row kernels of `v`'s layout (its rows_in_warps, streamed_rows and wide_rows) loop
/// over rows by the grid's stride or take their block's row(s) with no loop (the launch's grid
/// covers every row). `row_bytes`: a row of the kernel's widest row-wide input. Wide rows and
/// streamed rows of at most kStreamedRowsWithoutLoop bytes are printed without the loop, every
/// other layout with it. Each variant records its choice (KernelVariant::row_loop).
bool row_grid_loop(const KernelVariant& v, int64_t row_bytes);
/// The longest streamed row (bytes of the widest row-wide input) printed without the loop over
/// rows. Without it the kernels take fewer registers, so more blocks per SM, each keeping its row
/// in L2 between the passes over it. That gains on rows of up to 64 KiB and loses on longer
/// ones, whose blocks' rows no longer fit in L2 together.
constexpr int64_t kStreamedRowsWithoutLoop = int64_t{64} << 10;

/// How a generated CUDA kernel moves 16-byte vectors.
enum class VectorIo : uint8_t {
  /// Streaming (evict-first) loads and stores, except loads of per-column inputs every row reads
  /// again, all loads of pointwise kernels (__ldg) and stores of outputs a library operator
  /// reads (KOutput::keep), which are plain.
  kStreaming,
  /// Row loads under an L2 evict_last policy without L1 allocation, plain stores.
  kL2Last,
};
/// The vector I/O `variant` is printed with: kL2Last for row kernels that hold their rows in
/// registers, reduce them once and write an output per element (RMSNorm, add+RMSNorm, RMSNorm's
/// backward), kStreaming for every other. Plain stores are whole 16-byte st.global.v4.b32
/// (magi_store16_plain).
VectorIo vector_io_for(const KernelVariant& variant);
/// The preamble `variant`'s translation unit starts with: kCudaPreamble, preceded by the
/// define of its vector I/O.
std::string cuda_preamble(const KernelVariant& variant);

/// Whether variant `v` (its vector width and access classes set) qualifies for packed_bf16.
bool packed_bf16_possible(const KernelVariant& v);

std::string print_cuda(const KernelVariant& variant);
std::string print_cpp(const KernelVariant& variant);

/// The embedded helper sources (kernels/*.cuh, *.h).
extern const char* const kCudaPreamble;
extern const char* const kCpuPreamble;

}  // namespace magi::codegen
