// Internal to the printers (src/codegen/printer_*.cpp, printers.cpp): the pieces both targets
// share. Naming and scalar expressions (printer_parts.cpp), the bodies of row and pointwise
// kernels (printer_bodies.cpp), pointwise bodies on packed bf16 pairs (printer_packed.cpp),
// column kernels (printer_columns.cpp).
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "magi/codegen/kernel_ir.h"

namespace magi::codegen::printer {

// How a printer reads a Load op (its input at its column shift) inside a lane loop.
using LoadFn = std::function<std::string(const KOp&)>;

// The load of a schedule without column shifts (slices and cats only join pointwise kernels).
LoadFn unshifted(std::function<std::string(int)> load);

// Emits the body of one row (shared by both targets). `column_loop(os, body)` wraps a body in
// the target's loop over this thread's chunks; `reduce(os, kind, acc, result)` finishes a
// reduction; `store_row(os, k, value)` stores a per-row output.
struct RowTarget {
  bool gpu;
  std::string store_guard;  // GPU, rows in warps: "if (live) " (lanes past the last row)
  std::string args;         // "a." or "a->"
  // `inputs`: the element inputs the body reads; `output_pass`: the row's last pass over its
  // columns (the one writing the outputs)
  std::function<void(std::ostream&, const std::string& indent, const std::vector<int>& inputs,
                     bool output_pass,
                     const std::function<void(std::ostream&, const std::string&)>& body)>
      column_loop;
  std::function<void(std::ostream&, const std::string& indent, ReduceKind, const std::string& acc,
                     const std::string& result)>
      reduce;
  std::function<void(std::ostream&, const std::string& indent, int k, const std::string& value)>
      store_row;
  // load of element input i inside a chunk, lane j
  std::function<std::string(int)> element_load;
  // statements making the element inputs available inside a chunk (streaming: load them)
  std::function<void(std::ostream&, const std::string& indent, const std::vector<int>& inputs)>
      prepare_chunk;
};

const char* ctype(c10::ScalarType t);
std::string literal(double v);
std::string name(const KernelSpec& s, int i);
// Which forms of the math functions an expression prints: the host's (exp of a float as
// magi_exp, which GCC vectorizes where a call to expf keeps the loop scalar), the GPU's precise
// ones, or the GPU's fast forms of exp, log, division, sigmoid and silu (KernelSpec::fast_math).
enum class MathForms { kHost, kDevice, kDeviceFast };
inline MathForms math_forms(bool gpu, const KernelSpec& s) {
  if (!gpu) return MathForms::kHost;
  return s.fast_math ? MathForms::kDeviceFast : MathForms::kDevice;
}
// A pow op (`op`, of `x`) whose constant exponent has a form without pow(): x * x, sqrt(x),
// magi_rsqrt(x) and the like; "" for any other exponent.
std::string closed_form_power(const KernelSpec& s, const KOp& op, const std::string& x);
std::string expr(const KernelSpec& s, int i, const LoadFn& load, MathForms forms);
std::string combine(ReduceKind r, const std::string& x, const std::string& y);
/// The OpenMP reduction identifier of `r` in host kernels (magi_max / magi_min: declared in the
/// host preamble, propagating NaN as the GPU's combine does).
std::string omp_reduction(ReduceKind r);
std::string init(ReduceKind r);
std::vector<int> element_closure(const KernelSpec& s, const std::vector<int>& roots);
std::vector<int> element_inputs(const KernelSpec& s, const std::vector<int>& ops);
bool uses_columns(const KernelSpec& s);
std::string comment(const KOp& op);
/// "magi_store<A, T, V>" for GPU output k: with kKeep (no streaming hint) where the output is
/// read next by a library kernel (KOutput::keep).
std::string store_call(const KernelSpec& s, int k);
// Statements computing `ops` for lane j, loads reading `load(input)`.
void emit_ops(std::ostream& os, const KernelSpec& s, const std::vector<int>& ops,
              const LoadFn& load, const std::string& indent, MathForms forms);
/// The op whose value output `o` stores: a rounding to the output's own 16-bit dtype is left to
/// the store, whose conversion rounds the same way (the stored bits are the same).
int stored_op(const KernelSpec& s, const KOutput& o);
std::vector<int> full_output_roots(const KernelSpec& s);
void emit_header_comment(std::ostream& os, const KernelVariant& v);
void emit_pointers(std::ostream& os, const KernelSpec& s, const std::string& args);

std::string last_stride(const KernelVariant& v, int i, const std::string& args);
std::string strided_offset(const KernelVariant& v, int i, const std::string& args,
                           const std::string& col);
std::string strided_vector_load(const KernelVariant& v, int i, bool gpu, const std::string& args,
                                const std::string& off, std::string dest = "", bool keep = false);
// Statements giving each strided input among `inputs` the offset of row `row`: ro<i>.
void emit_row_offsets(std::ostream& os, const KernelVariant& v, const std::vector<int>& inputs,
                      const std::string& args, const std::string& row, const std::string& ind);
std::vector<int> all_inputs(const KernelSpec& s);
// `constexpr int R` and `constexpr bool kNarrow` of a variant with an index rank.
void emit_index_constants(std::ostream& os, const KernelVariant& v);
std::string load_chunk(const KernelVariant& v, int i, bool gpu, const std::string& args);
std::string load_row_value(const KernelVariant& v, int i, const std::string& args);
void emit_row_body(std::ostream& os, const KernelVariant& v, const RowTarget& t,
                   const std::string& ind);
// Host row kernels: before the parallel loop over rows, the buffer the passes keep costly
// values in for later passes over the row (`kept`: a row of each kept value per thread),
// allocated for this call, so that a failed allocation raises std::bad_alloc to the caller
// instead of terminating inside the parallel region. Prints nothing when nothing is kept.
void emit_kept_allocation(std::ostream& os, const KernelSpec& s, const std::string& ind);
/// `rows_outside`: inside the C++ printer's row loop (row_index and col_base defined).
std::string load_pointwise(const KernelVariant& v, int i, bool gpu, const std::string& args,
                           bool rows_outside = false);
std::string shifted_load(const KernelVariant& v, int i, int64_t shift, const std::string& args);
bool vector_shift(const KernelVariant& v, const KOp& op);
/// Whether every lane of a vector takes the same piece of each select in `ops` (and every
/// shifted load among them reads whole vectors).
bool lane_uniform_columns(const KernelVariant& v, const std::vector<int>& ops);
/// "int" where the variant's offsets fit 32 bits (narrow_index), else "long long".
std::string index_type(const KernelVariant& v);
void emit_shifted_vector_loads(std::ostream& os, const KernelVariant& v,
                               const std::vector<int>& ops, bool gpu, const std::string& args,
                               const std::string& ind);
/// Whether a pointwise variant addresses its inputs per row (columns of a slice/cat/pad, or
/// strided inputs): its body then needs row_index, col_base and row_start.
bool pointwise_needs_rows(const KernelVariant& v);
/// The row decomposition of a pointwise body (row_index, col_base, row_start from `base`,
/// and the strided inputs' row offsets); `row_given`: row_index and row_start are already
/// defined (the C++ printer loops over rows), so only the offsets are emitted.
void emit_pointwise_rows(std::ostream& os, const KernelVariant& v, bool gpu,
                         const std::string& args, const std::string& ind, bool row_given);
/// `rows_outside`: emit_pointwise_rows was called outside the body (no decomposition in it).
void emit_pointwise_body(std::ostream& os, const KernelVariant& v, bool gpu,
                         const std::string& args, const std::string& ind,
                         bool rows_outside = false);

/// Whether a GPU pointwise variant's body can run on packed bf16 pairs (printer_packed.cpp),
/// and that body.
bool packed_bf16_body_possible(const KernelVariant& v);
void emit_packed_bf16_body(std::ostream& os, const KernelVariant& v, const std::string& args,
                           const std::string& ind);

void check_variant(const KernelVariant& v);
std::string unroll_lane_loops(std::string code);

/// Column kernels: the body after the pointers, for each target.
void emit_column_cuda(std::ostream& os, const KernelVariant& v);
void emit_column_cpp(std::ostream& os, const KernelVariant& v);

}  // namespace magi::codegen::printer
