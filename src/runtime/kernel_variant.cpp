// FusedKernel's choice of kernel variant per call (src/runtime/kernel_variant.h).
#include "kernel_variant.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "magi/codegen/compiler.h"
#include "magi/codegen/printers.h"

namespace magi::runtime::detail {

using codegen::AccessClass;

namespace {

int64_t pow2_ceil(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

}  // namespace

// How an input of `sizes` and `strides` is addressed in the index space `space`; `expanded`
// receives its strides in the space (0 where broadcast).
AccessClass classify(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                     const std::vector<int64_t>& space, std::vector<int64_t>& expanded) {
  const int64_t rank = static_cast<int64_t>(space.size());
  const int64_t dim = static_cast<int64_t>(sizes.size());
  expanded.assign(rank, 0);
  const int64_t offset = rank - dim;
  for (int64_t d = 0; d < dim; ++d) {
    expanded[offset + d] = (sizes[d] == 1 && space[offset + d] != 1) ? 0 : strides[d];
  }
  // Contiguous strides of the space (size-1 dims may carry any stride).
  std::vector<int64_t> contiguous(rank);
  int64_t running = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    contiguous[d] = running;
    running *= space[d];
  }
  auto matches = [&](int64_t from, int64_t to) {
    for (int64_t d = from; d < to; ++d) {
      if (space[d] != 1 && expanded[d] != contiguous[d]) return false;
    }
    return true;
  };
  auto all_zero = [&](int64_t from, int64_t to) {
    for (int64_t d = from; d < to; ++d) {
      if (space[d] != 1 && expanded[d] != 0) return false;
    }
    return true;
  };
  if (matches(0, rank)) return AccessClass::kContiguous;
  if (all_zero(0, rank)) return AccessClass::kScalar;
  if (rank >= 1 && all_zero(0, rank - 1) && (space[rank - 1] == 1 || expanded[rank - 1] == 1)) {
    return AccessClass::kColumn;
  }
  if (rank >= 1 && all_zero(rank - 1, rank)) {
    // Per-row: leading dims contiguous with the row index (stride of dim d = product of the
    // leading sizes after it, i.e. contiguous[d] / cols).
    const int64_t cols = space[rank - 1];
    bool ok = cols > 0;
    for (int64_t d = 0; d + 1 < rank && ok; ++d) {
      if (space[d] != 1 && expanded[d] * cols != contiguous[d]) ok = false;
    }
    if (ok) return AccessClass::kRow;
  }
  return AccessClass::kStrided;
}

// A column kernel sees its index space as [rows, cols], cols the product of the kept dims.
// Row and pointwise variants with strided inputs take the index space's rank as a constant,
// and 32-bit coordinate arithmetic when every row index and every strided input's offsets
// (args.strides, over `space`) stay under 2^31.
void set_index_rank(codegen::KernelVariant& kv, const std::vector<int64_t>& space,
                    const MagiArgs& args) {
  const bool strided = std::count(kv.access.begin(), kv.access.end(), AccessClass::kStrided) > 0;
  if (!strided || kv.spec->schedule == codegen::Schedule::kColumn) return;
  kv.index_rank = static_cast<int>(space.size());
  constexpr int64_t kLimit = 0x7fffffff;
  int64_t numel = 1;
  for (int64_t n : space) numel *= n;
  bool narrow = numel <= kLimit;
  for (size_t i = 0; i < kv.access.size() && narrow; ++i) {
    if (kv.access[i] != AccessClass::kStrided) continue;
    int64_t span = 0;
    for (size_t d = 0; d < space.size(); ++d) span += (space[d] - 1) * args.strides[i][d];
    narrow = span <= kLimit;
  }
  kv.narrow_index = narrow;
}

int64_t kernel_cols(const codegen::KernelSpec& spec, const std::vector<int64_t>& space) {
  if (spec.schedule != codegen::Schedule::kColumn) return space.back();
  int64_t cols = 1;
  for (size_t d = spec.column_dims; d < space.size(); ++d) cols *= space[d];
  return cols;
}

// Per-column and per-row access mean one value per column or row of the last dim. In a column
// kernel that keeps more than the last dim, its columns and rows are other ones: such inputs
// are read through their strides.
void adapt_column_access(const codegen::KernelSpec& spec, size_t rank,
                         std::vector<AccessClass>& access) {
  if (spec.schedule != codegen::Schedule::kColumn || rank - spec.column_dims == 1) return;
  for (AccessClass& a : access) {
    if (a == AccessClass::kColumn || a == AccessClass::kRow) a = AccessClass::kStrided;
  }
}

bool verify_cuda_codegen() {
  const char* env = std::getenv("MAGI_VERIFY_CUDA_CODEGEN");
  return env != nullptr && std::string(env) == "1";
}

std::string cuda_forms(const codegen::KernelVariant& cpu) {
  const codegen::KernelSpec& spec = *cpu.spec;
  codegen::KernelVariant gpu = cpu;
  // A row length and element count of 0 let every width through.
  const int widest = vector_width_for(spec, gpu.access, 0, 0, [](int) { return true; });
  const bool strided = std::count(gpu.access.begin(), gpu.access.end(), AccessClass::kStrided) > 0;
  const bool whole = strided && widest > 1 && spec.schedule != codegen::Schedule::kColumn;
  std::string cuda;
  for (bool vectors : {false, true}) {
    if (vectors && !whole) break;
    gpu.strided_vectors = vectors;
    gpu.unroll = 1;
    // Row kernels in each layout: rows in registers one per block, rows in warps, wide rows in
    // registers, streamed; streamed once more for the longest rows, which codegen::row_grid_loop
    // prints otherwise.
    struct Layout {
      bool in_warps, streamed, wide;
      int64_t row_bytes;  // of the widest input read along the row
    };
    constexpr int64_t kLongest = std::numeric_limits<int64_t>::max();
    for (const Layout& l : {Layout{false, false, false, 0}, Layout{true, false, false, 0},
                            Layout{false, false, true, 0}, Layout{false, true, false, 0},
                            Layout{false, true, false, kLongest}}) {
      if ((l.in_warps || l.streamed || l.wide) && spec.schedule != codegen::Schedule::kRow) break;
      const codegen::KernelSchedule& schedule = codegen::kernel_schedule();
      if (l.wide && schedule.held_row_threads <= schedule.block_threads) continue;
      gpu.rows_in_warps = l.in_warps;
      gpu.streamed_rows = l.streamed;
      gpu.wide_rows = l.wide;
      if (l.row_bytes == kLongest &&
          codegen::row_grid_loop(gpu, kLongest) == codegen::row_grid_loop(gpu, 0)) {
        break;
      }
      gpu.row_loop =
          spec.schedule != codegen::Schedule::kRow || codegen::row_grid_loop(gpu, l.row_bytes);
      for (int width : {1, widest}) {
        if (vectors && width == 1) continue;
        gpu.vector_width = width;
        cuda += codegen::print_cuda(gpu) + "\n";
        if (widest == 1) break;
      }
    }
    if (spec.schedule == codegen::Schedule::kPointwise) {  // and with 4 vectors per thread
      gpu.unroll = 4;
      cuda += codegen::print_cuda(gpu) + "\n";
    }
  }
  gpu.rows_in_warps = gpu.streamed_rows = gpu.wide_rows = false;
  gpu.row_loop = true;
  gpu.unroll = 1;
  gpu.vector_width = widest;
  gpu.strided_vectors = whole;
  if (codegen::packed_bf16_possible(gpu)) {
    gpu.packed_bf16 = true;
    cuda += codegen::print_cuda(gpu) + "\n";
    gpu.unroll = 4;
    cuda += codegen::print_cuda(gpu) + "\n";
  }
  return cuda;
}

// Vectors per thread of a GPU pointwise variant over `numel` elements on a device of
// `sm_count` SMs: 4 for a kernel that reads an input
// shifted along the row or through general strides and whose one-vector grid is at least 16
// waves of the device's threads, 1 for the rest. A shifted or strided kernel issues more
// instructions per byte, and several vectors per thread keep enough loads in flight on a large
// grid; on a grid of a few waves the extra vectors only leave threads idle. Contiguous
// pointwise kernels reach copy bandwidth with one vector per thread.
int pointwise_unroll_for(const codegen::KernelVariant& kv, int64_t numel, int sm_count) {
  if (kv.spec->schedule != codegen::Schedule::kPointwise) return 1;
  const bool strided = std::count(kv.access.begin(), kv.access.end(), AccessClass::kStrided) > 0;
  const bool shifted = std::any_of(kv.spec->ops.begin(), kv.spec->ops.end(), [](const auto& op) {
    return op.kind == codegen::KOpKind::kLoad && op.shift != 0;
  });
  constexpr int64_t kThreadsPerSm = 2048, kWaves = 16;
  const int64_t vectors = numel / std::max(kv.vector_width, 1);
  return (strided || shifted) && vectors >= kWaves * kThreadsPerSm * sm_count ? 4 : 1;
}

// The SM count of CUDA device `index`, or an H100's (132) where no driver answers (a CPU-only
// process predicting the variants a GPU run will need).
int sm_count_of(int index) {
  return codegen::cuda_driver_available() ? codegen::device_info(index).sm_count : 132;
}

// Threads per row of a GPU row kernel: the fewest for the row to fit in registers, K chunks of
// V elements each (a power of two up to a warp; beyond it whole warps: a power of two would
// leave chunks idle), at most a block, or at most a wide block (KernelSchedule's
// held_row_threads) where that holds the row; for a row neither holds, the most a block holds,
// block_threads, which marks it streamed (its launch then takes stream_threads threads). Rows of at
// most 32 threads run several to a block (KernelVariant::rows_in_warps): a norm over a head of 128
// bf16 values takes 4 lanes with 4 loads in flight each (a block of 32 threads per such row would
// leave three quarters of its threads idle).
int64_t threads_per_row(int64_t cols, int width) {
  const codegen::KernelSchedule& schedule = codegen::kernel_schedule();
  const int64_t per_thread = int64_t(width) * schedule.row_chunks;
  const int64_t need = (cols + per_thread - 1) / per_thread;
  int64_t fit = pow2_ceil(need);
  if (fit > 32) fit = (need + 31) / 32 * 32;
  if (fit <= std::max(schedule.block_threads, schedule.held_row_threads)) return fit;
  return schedule.block_threads;
}

// The layout of a GPU row kernel over rows of `cols` elements (no-op for other schedules), and
// whether it loops over rows (codegen::row_grid_loop, from the bytes of a row of its widest
// input read along the row; none such, as in a kernel of per-column inputs only, counts 0):
// rows of at most 32 threads run several to a block; rows longer than a block holds in
// registers are held by a wider one (wide rows, up to KernelSchedule's held_row_threads) or
// else streamed, once per pass over them.
void choose_row_layout(codegen::KernelVariant& kv, int64_t cols) {
  if (kv.spec->schedule != codegen::Schedule::kRow) return;
  const int64_t threads = threads_per_row(cols, kv.vector_width);
  kv.rows_in_warps = threads <= 32;
  const codegen::KernelSchedule& schedule = codegen::kernel_schedule();
  kv.streamed_rows = cols > threads * kv.vector_width * schedule.row_chunks;
  kv.wide_rows = !kv.streamed_rows && threads > schedule.block_threads;
  int64_t widest = 0;  // bytes of an element of the widest input read along the row
  for (size_t i = 0; i < kv.access.size(); ++i) {
    if (kv.access[i] == AccessClass::kContiguous || kv.access[i] == AccessClass::kStrided) {
      widest = std::max<int64_t>(widest, c10::elementSize(kv.spec->inputs[i].dtype));
    }
  }
  kv.row_loop = codegen::row_grid_loop(kv, cols * widest);
}

}  // namespace magi::runtime::detail
