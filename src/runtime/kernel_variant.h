// How FusedKernel chooses the kernel variant of a call (each input's access class, the vector
// width, the row layout, vectors per thread, the index rank) from MagiArgs, the one argument of
// every generated kernel (kernels/magi_kernel_abi.h). Private to the runtime layer: FusedKernel is
// its only user (and tests/cpp/test_printers.cpp checks threads_per_row).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "magi/codegen/kernel_ir.h"
#include "magi/codegen/printers.h"
#include "magi_kernel_abi.h"

namespace magi::runtime::detail {

using MagiArgs = ::MagiArgs;

/// How an input of `sizes` and `strides` is addressed in the index space `space`; `expanded`
/// receives its strides in the space (0 where broadcast).
codegen::AccessClass classify(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              const std::vector<int64_t>& space, std::vector<int64_t>& expanded);
/// The index rank (and 32-bit index arithmetic) of a row or pointwise variant with strided
/// inputs, whose strides over `space` are in `args`.
void set_index_rank(codegen::KernelVariant& kv, const std::vector<int64_t>& space,
                    const MagiArgs& args);
/// The row length a kernel sees: the last dim, or the product of a column kernel's kept dims.
int64_t kernel_cols(const codegen::KernelSpec& spec, const std::vector<int64_t>& space);
/// Per-column and per-row inputs of a column kernel that keeps more than the last dim are
/// read through their strides.
void adapt_column_access(const codegen::KernelSpec& spec, size_t rank,
                         std::vector<codegen::AccessClass>& access);
/// MAGI_VERIFY_CUDA_CODEGEN=1: CPU runs also NVRTC-compile the CUDA forms of their variants.
bool verify_cuda_codegen();
/// The CUDA forms a GPU may print for CPU variant `cpu`, one source: the width the CPU chose
/// (1) and the widest vectors, each row layout, 4 vectors per thread for pointwise kernels,
/// strided inputs checked and whole, and packed bf16 pairs where the body qualifies.
std::string cuda_forms(const codegen::KernelVariant& cpu);
/// Vectors per thread of a GPU pointwise variant (KernelVariant::unroll).
int pointwise_unroll_for(const codegen::KernelVariant& kv, int64_t numel, int sm_count);
/// The SM count of CUDA device `index`, or an H100's (132) where no driver answers.
int sm_count_of(int index);
/// Threads per row of a GPU row kernel over rows of `cols` elements of vectors of `width`.
int64_t threads_per_row(int64_t cols, int width);
/// The layout of a GPU row kernel over rows of `cols` elements (no-op for other schedules) and
/// whether it loops over rows (KernelVariant::row_loop).
void choose_row_layout(codegen::KernelVariant& kv, int64_t cols);
/// KernelVariant::strided_vectors for a GPU row or pointwise variant whose vector width is
/// set, with its strided inputs' strides over `space` in `args`; `aligned(i)`: input i's data
/// pointer is aligned to a vector.
template <typename Aligned>
bool strided_vectors_for(const codegen::KernelVariant& kv, const std::vector<int64_t>& space,
                         const MagiArgs& args, Aligned aligned) {
  if (kv.vector_width <= 1 || kv.spec->schedule == codegen::Schedule::kColumn) return false;
  const size_t rank = space.size();
  bool any = false;
  for (size_t i = 0; i < kv.access.size(); ++i) {
    if (kv.access[i] != codegen::AccessClass::kStrided) continue;
    any = true;
    if (args.strides[i][rank - 1] != 1 || !aligned(static_cast<int>(i))) return false;
    for (size_t d = 0; d + 1 < rank; ++d) {
      if (space[d] > 1 && args.strides[i][d] % kv.vector_width != 0) return false;
    }
  }
  return any;
}

/// The vector width of a GPU variant: elements per 16 bytes of the narrowest input or output
/// that is read or written whole (contiguous or per column), halved until the row length, the
/// element count and `aligned(width)` (the pointers) allow it. A template: it runs per call.
template <typename Aligned>
inline int vector_width_for(const codegen::KernelSpec& spec,
                            const std::vector<codegen::AccessClass>& access, int64_t cols,
                            int64_t numel, const Aligned& aligned) {
  size_t narrowest = 16;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if ((access[i] == codegen::AccessClass::kContiguous ||
         access[i] == codegen::AccessClass::kColumn) &&
        !spec.inputs[i].per_row) {
      narrowest = std::min(narrowest, c10::elementSize(spec.inputs[i].dtype));
    }
  }
  for (const auto& out : spec.outputs) {
    if (!out.per_row) narrowest = std::min(narrowest, c10::elementSize(out.dtype));
  }
  int width = static_cast<int>(16 / narrowest);
  while (width > 1 && !(cols % width == 0 && numel % width == 0 && aligned(width))) width /= 2;
  return width;
}

}  // namespace magi::runtime::detail
