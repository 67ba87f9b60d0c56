// Kernel IR: one generated kernel, independent of the graph IR and of any printer.
//
// A kernel walks an index space: either every element of a tensor (pointwise schedule) or
// the rows of a tensor whose last dim is reduced (row schedule: one row per thread block on
// the GPU, per OpenMP iteration on the CPU). Its body is a DAG of scalar operations (KOps) in
// SSA order. Every KOp is either per-element or per-row; per-row values come from reductions
// over the row (sum, max, min) or from per-row inputs, and broadcast back over the row for free.
//
// A column kernel (Schedule::kColumn) reduces over leading dims instead: its
// "per-row" values (KOp::per_row, KInput::per_row, KOutput::per_row) are per column, one per
// index of the kept dims (flattened: `cols` is their product). One pass over the index space
// evaluates the per-element ops and accumulates the reductions; the per-column ops run after it. On
// the GPU a block of 32 x 8 threads owns 32 column vectors, its 8 thread rows and the grid's y dim
// splitting the rows; the splits' partial results go to a workspace that a second launch sums in a
// fixed order.
//
// Inputs are described by dtype only here; how each is addressed (contiguous, broadcast along
// rows or columns, scalar, or general strides) is decided at launch from the actual tensors,
// and is part of the *variant* a printer is asked for (`AccessClass`), so one kernel serves
// every shape whose inputs are laid out alike.
//
// Arithmetic runs in float (double for float64 groups). After every op whose eager result
// dtype is bfloat16 or float16 (or float32, in a double kernel) the value is rounded to that
// dtype, so a fused chain rounds exactly where eager PyTorch's op-by-op execution does.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace magi::codegen {

enum class Schedule : uint8_t { kPointwise, kRow, kColumn };

/// "pointwise", "row" or "column".
const char* schedule_name(Schedule s);

// _(Name, printed name) of every scalar op a kernel may contain.
#define MAGI_KOP_KINDS(_) \
  _(Load, "load")         \
  _(Const, "const")       \
  _(Unary, "unary")       \
  _(Binary, "binary")     \
  _(Where, "where")       \
  _(Select, "select")     \
  _(Round, "round")       \
  _(Reduce, "reduce")

enum class KOpKind : uint8_t {
#define MAGI_DECLARE_KOP(name, text) k##name,
  MAGI_KOP_KINDS(MAGI_DECLARE_KOP)
#undef MAGI_DECLARE_KOP
};

enum class ReduceKind : uint8_t { kSum, kMax, kMin };

struct KOp {
  KOpKind kind = KOpKind::kConst;
  std::string fn;         ///< Unary/Binary: function name ("exp", "add", "gelu_tanh", ...)
  std::vector<int> args;  ///< earlier KOps
  int input = -1;         ///< Load: input index
  /// Load: read the input at column c + shift of the kernel's column c (clamped to the row);
  /// Select: compare c + shift with the bounds. From slices and cats of the last dim.
  int64_t shift = 0;
  /// Select: args[k] where c + shift < bounds[k] (the first such k), else the last arg.
  std::vector<int64_t> bounds;
  double value = 0.0;  ///< Const (fn "cols": the row length; "rows": the row count)
  c10::ScalarType round_to = c10::ScalarType::Undefined;  ///< Round: bf16/f16 (f32 in double)
  ReduceKind reduce = ReduceKind::kSum;                   ///< Reduce
  bool per_row = false;  ///< one value per row (per column in a column kernel)
  std::string comment;   ///< the ATen op and user source it comes from
};

struct KInput {
  c10::ScalarType dtype;
  bool per_row = false;  ///< [..., 1]-shaped in a row kernel, [cols]-shaped in a column one
};

struct KOutput {
  int op;
  c10::ScalarType dtype;
  bool per_row = false;
  /// Read by an operator that is not one of our kernels (a matmul, attention, a custom op):
  /// stored without the streaming hint (VectorIo::kStreaming), so that the reader finds it in L2.
  bool keep = false;
};

/// One fused group, ready for a printer.
struct KernelSpec {
  std::string name;  ///< e.g. "fused_pow_mean_add_rsqrt_mul_3"
  Schedule schedule = Schedule::kPointwise;
  bool use_double = false;  ///< compute in double (float64 groups)
  /// Column kernels: the leading dims 0..column_dims-1 of the index space are reduced; the
  /// kernel sees it as [rows, cols] with cols the product of the other dims.
  int column_dims = 0;
  /// Every output is bf16/fp16: exp, log, division, sigmoid and silu use the GPU's fast forms,
  /// whose error (a few float ulps) is far below the outputs' rounding step.
  bool fast_math = false;
  std::vector<KInput> inputs;
  std::vector<KOp> ops;
  std::vector<KOutput> outputs;
  std::vector<std::string> fused_ops;  ///< ATen ops this kernel replaces, in order
  std::vector<std::string> sources;    ///< user source lines they came from

  /// Textual form for dumps and golden tests.
  std::string str() const;
};

/// How a kernel variant addresses one input (decided per call from strides, see
/// classify_access in the runtime).
enum class AccessClass : char {
  kContiguous = 'c',  ///< same shape as the index space, row-major
  kRow = 'r',         ///< one value per row (broadcast along the last dim), rows contiguous
  kColumn = 'l',      ///< one value per column (broadcast along all leading dims)
  kScalar = 's',      ///< one value
  kStrided = 'g',     ///< general strides over up to MAGI_MAX_RANK dims (magi_kernel_abi.h)
};

/// A printable variant: the spec plus how each input is addressed and the vector width.
struct KernelVariant {
  const KernelSpec* spec = nullptr;
  std::vector<AccessClass> access;  ///< one per input
  int vector_width = 1;             ///< elements per thread access for contiguous inputs
  /// GPU row kernels: rows of at most 32 threads, several per block (blockDim.y of them),
  /// reduced by shuffles among each row's lanes; else one row per block.
  bool rows_in_warps = false;
  /// GPU row kernels: rows longer than a block holds in registers, read once per pass over
  /// them (each step of a pass loads K vectors ahead); else held in registers, read once.
  bool streamed_rows = false;
  /// GPU row kernels whose rows are held in registers: by a block of more threads than
  /// KernelSchedule::block_threads (at most held_row_threads), printed with that bound instead
  /// (rows of 8192 < cols <= 16384 bf16 values; symbol suffix _h).
  bool wide_rows = false;
  /// GPU row kernels: loop over rows by the grid's stride (a block may take several rows);
  /// false, the launch's grid covers every row and a block takes its own (row_grid_loop: wide
  /// rows and streamed rows of at most 64 KiB; symbol suffix _g).
  bool row_loop = true;
  /// Row and pointwise kernels with strided inputs: the rank of the index space, which the
  /// printed kernel takes as a constant (its row-coordinate loops unroll to it); 0 otherwise.
  int index_rank = 0;
  /// With index_rank: every row index and every strided input's offsets fit in 31 bits, so
  /// the coordinate arithmetic is 32-bit.
  bool narrow_index = false;
  /// GPU pointwise kernels: 16-byte vectors each thread handles per step of its grid-stride
  /// loop (1: one vector per thread, no loop).
  int unroll = 1;
  /// GPU row and pointwise kernels with strided inputs and a vector width above 1: every
  /// strided input steps by 1 along the last dim and its rows start at vector-aligned
  /// addresses, so its vectors load as one access each, with no check at run time (the
  /// broadcast cos and sin of a rotary embedding).
  bool strided_vectors = false;
  /// GPU pointwise kernels over bf16 whose ops are products, sums, differences, negations and
  /// selects of bf16 values, each rounded to bf16: computed on packed pairs (bf16x2), bit for
  /// bit as the float body but for NaN encodings (see printer_packed.cpp).
  bool packed_bf16 = false;
  /// The C symbol / CUDA kernel name of this variant.
  std::string symbol() const;
};

}  // namespace magi::codegen
