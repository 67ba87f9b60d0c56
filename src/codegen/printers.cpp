// CUDA and C++ printers of the kernel IR. Shared: naming, scalar expressions, which ops each
// pass needs. Different: how the index space is walked (threads and blocks vs OpenMP loops).
//
// Row kernels run, per row: the per-row ops in SSA order, and for each reduction a pass over
// the row that evaluates the per-element ops it needs and combines them; then a final pass
// that stores the full-size outputs. On the GPU a row belongs to one thread block; when the
// row fits (cols <= threads * vector_width * row_chunks) it is read from memory once
// into registers and every pass reads the registers, else each pass streams the row again.
#include <functional>
#include <sstream>

#include "magi/codegen/printers.h"
#include "magi/common/error.h"
#include "printer_parts.h"

namespace magi::codegen {

using namespace printer;  // NOLINT: the printer pieces are this file's vocabulary

namespace {
// The loop over the rows of a GPU row kernel: one row per block, or (rows_in_warps) blockDim.y
// rows per block, each row's lanes along x. Without `loop` (KernelVariant::row_loop), the
// launch's grid covers every row, a block takes its own row(s) and no loop is printed: with a
// loop the compiler keeps registers for another row (on sm_90, RMSNorm's held kernel takes 58
// instead of 48, its streamed one 52 instead of 38). The caller closes the block opened here.
void emit_gpu_row_loop(std::ostream& os, bool rows_in_warps, bool loop, const std::string& ind) {
  if (!rows_in_warps) {
    if (loop) {
      os << ind << "for (long long row = blockIdx.x; row < a.rows; row += gridDim.x) {\n";
    } else {
      os << ind << "if ((long long)blockIdx.x < a.rows) {  // the grid covers every row\n"
         << ind << "  const long long row = blockIdx.x;\n";
    }
    return;
  }
  if (loop) {
    os << ind << "for (long long row0 = (long long)blockIdx.x * blockDim.y; row0 < a.rows;\n"
       << ind << "     row0 += (long long)gridDim.x * blockDim.y) {\n";
  } else {
    os << ind << "{  // the grid covers every row\n"
       << ind << "  const long long row0 = (long long)blockIdx.x * blockDim.y;\n";
  }
  os << ind << "  // Every lane runs every iteration (its row's shuffles need it): lanes past the\n"
     << ind << "  // last row redo that row and store nothing.\n"
     << ind << "  const bool live = row0 + threadIdx.y < a.rows;\n"
     << ind << "  const long long row = live ? row0 + threadIdx.y : a.rows - 1;\n";
}
}  // namespace

std::string print_cuda(const KernelVariant& v) {
  check_variant(v);
  const KernelSpec& s = *v.spec;
  std::ostringstream os;
  emit_header_comment(os, v);
  const KernelSchedule& schedule = kernel_schedule();
  const int block_threads = v.streamed_rows ? schedule.stream_threads
                            : v.wide_rows   ? schedule.held_row_threads
                                            : schedule.block_threads;
  os << "extern \"C\" __global__ void __launch_bounds__(" << block_threads << ") " << v.symbol()
     << "(const MagiArgs a) {\n";
  os << "  magi_wait_for_prior_grids();\n";
  os << "  typedef " << (s.use_double ? "double" : "float") << " A;\n";
  os << "  constexpr int V = " << v.vector_width << ";\n";
  emit_index_constants(os, v);
  emit_pointers(os, s, "a.");
  if (s.schedule == Schedule::kColumn) {
    emit_column_cuda(os, v);
    os << "}\n";
    return unroll_lane_loops(os.str());
  }
  if (s.schedule == Schedule::kPointwise) {
    os << "  const long long vectors = a.numel / V;\n";
    const int unroll = v.unroll;
    if (unroll == 1) {  // the grid covers every vector
      os << "  const long long vi = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n";
      os << "  if (vi < vectors) {\n";
      os << "    const long long base = vi * V;\n";
      emit_pointwise_body(os, v, true, "a", "    ");
      os << "  }\n}\n";
      return unroll_lane_loops(os.str());
    }
    // U vectors per thread per step, a block's threads striding over them together.
    os << "  constexpr int U = " << unroll << ";\n";
    os << "  for (long long v0 = blockIdx.x * (long long)blockDim.x * U + threadIdx.x; v0 < "
          "vectors;\n       v0 += (long long)gridDim.x * blockDim.x * U) {\n";
    os << "    #pragma unroll\n    for (int u = 0; u < U; ++u) {\n";
    os << "      const long long vi = v0 + (long long)u * blockDim.x;\n";
    os << "      if (vi < vectors) {\n        const long long base = vi * V;\n";
    emit_pointwise_body(os, v, true, "a", "        ");
    os << "      }\n    }\n  }\n}\n";
    return unroll_lane_loops(os.str());
  }
  os << "  constexpr int K = " << (v.streamed_rows ? schedule.stream_chunks : schedule.row_chunks)
     << ";\n";
  os << "  __shared__ A scratch[32];\n";
  // When a row fits (cols <= threads * V * K), each thread owns the same K chunks of V columns
  // in every row: inputs with one value per element are read once per row into registers, in
  // their storage type (c<i>). Inputs with one value per column (a norm's weight) are read
  // into registers w<i> with each row's loads when the kernel has one such input (RMSNorm: one
  // trip to memory before the reduction instead of two), and where used when it has more
  // (LayerNorm's weight and bias held across its two reductions cost registers its row needs).
  auto cached_input = [&v](int i) {
    return v.access[i] == AccessClass::kContiguous || v.access[i] == AccessClass::kStrided;
  };
  int column_count = 0;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    column_count += !s.inputs[i].per_row && v.access[i] == AccessClass::kColumn;
  }
  const bool columns_with_row = column_count <= 1;
  std::vector<int> row_inputs, column_inputs;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    if (s.inputs[i].per_row) continue;
    if (cached_input(static_cast<int>(i))) row_inputs.push_back(static_cast<int>(i));
    if (v.access[i] == AccessClass::kColumn && columns_with_row) {
      column_inputs.push_back(static_cast<int>(i));
    }
  }
  auto raw_type = [&](int i) {
    return "MagiVec<" + std::string(ctype(s.inputs[i].dtype)) + ", V>";
  };
  auto raw_load = [&](int i, const std::string& slot) {
    std::string in = "in" + std::to_string(i);
    switch (v.access[i]) {
      case AccessClass::kContiguous:
        return "magi_load_raw(" + in + " + row * cols + col0, " + slot + ");";
      case AccessClass::kColumn:  // read again by every row: never streamed
        return "magi_load_raw<true>(" + in + " + col0, " + slot + ");";
      default:  // strided: as strided_vector_load
        if (v.strided_vectors) {
          return "magi_load_raw(" + in + " + " + strided_offset(v, i, "a", "col0") + ", " + slot +
                 ");";
        }
        return "{ const long long off = " + strided_offset(v, i, "a", "col0") +
               "; const long long step = " + last_stride(v, i, "a") +
               "; for (int j = 0; j < V; ++j) " + slot + ".v[j] = " + in + "[off + j * step]; }";
    }
  };
  auto chunk_loop = [](std::ostream& o, const std::string& ind, const std::string& body) {
    o << ind << "#pragma unroll\n" << ind << "for (int k = 0; k < K; ++k) {\n";
    o << ind << "  const long long col0 = ((long long)k * blockDim.x + threadIdx.x) * V;\n";
    o << ind << "  if (col0 < cols) {\n" << body << ind << "  }\n" << ind << "}\n";
  };
  // Inputs a streamed row pass loads as whole vectors ahead of its computation.
  auto streamed = [&v, &s](int i) {
    return !s.inputs[i].per_row &&
           (v.access[i] == AccessClass::kContiguous || v.access[i] == AccessClass::kColumn);
  };
  const bool warps = v.rows_in_warps;
  auto make_target = [&](bool cached) {
    RowTarget t;
    t.gpu = true;
    t.store_guard = warps ? "if (live) " : "";
    t.args = "a";
    // Streamed rows (not cached): each step of the column loop first loads K vectors of every
    // whole-vector input (s<i>[K], in storage type), then computes, so that K loads per input
    // are in flight (with each chunk's loads beside its computation, under its bounds check,
    // the compiler issued one at a time). L2 keeps a row (evict_last) until the output pass,
    // which reads it for the last time (evict_first); per-column inputs are kept throughout.
    t.column_loop = [cached, streamed, raw_type, &v](
                        std::ostream& o, const std::string& ind, const std::vector<int>& inputs,
                        bool output_pass,
                        const std::function<void(std::ostream&, const std::string&)>& body) {
      if (cached) {
        o << ind << "#pragma unroll\n" << ind << "for (int k = 0; k < K; ++k) {\n";
        o << ind << "  const long long col0 = ((long long)k * blockDim.x + threadIdx.x) * V;\n";
        o << ind << "  if (col0 < cols) {\n";
        body(o, ind + "    ");
        o << ind << "  }\n" << ind << "}\n";
        return;
      }
      o << ind
        << "for (long long step = (long long)threadIdx.x * V; step < cols; step += (long "
           "long)blockDim.x * V * K) {\n";
      std::ostringstream loads;
      for (int i : inputs) {
        if (!streamed(i)) continue;
        const std::string in = "in" + std::to_string(i), slot = "s" + std::to_string(i) + "[k]";
        const std::string at =
            v.access[i] == AccessClass::kColumn ? " + col0" : " + row * cols + col0";
        o << ind << "  " << raw_type(i) << " s" << i << "[K];\n";
        const bool last = v.access[i] == AccessClass::kContiguous && output_pass;
        loads << ind << "      magi_load_raw_hint" << (last ? "<true>(" : "(") << in << at << ", "
              << slot << ", " << (last ? "drop" : "keep") << ");\n";
      }
      if (!loads.str().empty()) {
        o << ind << "  #pragma unroll\n" << ind << "  for (int k = 0; k < K; ++k) {\n";
        o << ind << "    const long long col0 = step + (long long)k * blockDim.x * V;\n";
        o << ind << "    if (col0 < cols) {\n" << loads.str() << ind << "    }\n";
        o << ind << "  }\n";
      }
      o << ind << "  #pragma unroll\n" << ind << "  for (int k = 0; k < K; ++k) {\n";
      o << ind << "    const long long col0 = step + (long long)k * blockDim.x * V;\n";
      o << ind << "    if (col0 < cols) {\n";
      body(o, ind + "      ");
      o << ind << "    }\n" << ind << "  }\n" << ind << "}\n";
    };
    t.reduce = [warps](std::ostream& o, const std::string& ind, ReduceKind r,
                       const std::string& acc, const std::string& result) {
      std::string fn = r == ReduceKind::kSum   ? "[](A x, A y) { return x + y; }"
                       : r == ReduceKind::kMax ? "[](A x, A y) { return magi_max(x, y); }"
                                               : "[](A x, A y) { return magi_min(x, y); }";
      o << ind << "const A " << result << " = "
        << (warps ? "magi_warp_row_reduce<A>(" : "magi_block_reduce<A>(") << acc << ", " << fn
        << (warps ? ");\n" : ", scratch);\n");
    };
    t.store_row = [&s, warps](std::ostream& o, const std::string& ind, int k,
                              const std::string& value) {
      o << ind << (warps ? "if (threadIdx.x == 0 && live) out" : "if (threadIdx.x == 0) out") << k
        << "[row] = MagiStore<" << ctype(s.outputs[k].dtype) << ">::from(" << value << ");\n";
    };
    t.element_load = [&v, cached, cached_input, columns_with_row, streamed](int i) {
      if (cached && cached_input(i)) return "magi_vec_get<A>(c" + std::to_string(i) + "[k], j)";
      if (cached && v.access[i] == AccessClass::kColumn && columns_with_row)
        return "magi_vec_get<A>(w" + std::to_string(i) + "[k], j)";
      if (!cached && streamed(i)) return "magi_vec_get<A>(s" + std::to_string(i) + "[k], j)";
      return "t" + std::to_string(i) + "[j]";
    };
    t.prepare_chunk = [&v, cached, cached_input, columns_with_row, streamed](
                          std::ostream& o, const std::string& ind, const std::vector<int>& inputs) {
      for (int i : inputs) {
        if (cached && cached_input(i)) continue;
        if (cached && v.access[i] == AccessClass::kColumn && columns_with_row) continue;
        if (!cached && streamed(i)) continue;
        o << ind << "A t" << i << "[V];\n" << ind << load_chunk(v, i, true, "a") << "\n";
      }
    };
    return t;
  };
  if (v.streamed_rows) {
    // The launch picks this layout when cols > blockDim.x * V * K.
    os << "  // Rows longer than the block holds in registers: streamed once per pass.\n";
    os << "  const unsigned long long keep = magi_l2_evict_last(), drop = "
          "magi_l2_evict_first();\n  (void)keep;\n  (void)drop;\n";
    emit_gpu_row_loop(os, v.rows_in_warps, v.row_loop, "  ");
    emit_row_offsets(os, v, all_inputs(s), "a", "row", "    ");
    emit_row_body(os, v, make_target(false), "    ");
    os << "  }\n}\n";
    return unroll_lane_loops(os.str());
  }
  // The launch picks this layout when cols <= blockDim.x * V * K.
  os << "  // Rows held in registers: each row read once.\n";
  emit_gpu_row_loop(os, v.rows_in_warps, v.row_loop, "  ");
  emit_row_offsets(os, v, all_inputs(s), "a", "row", "    ");
  std::ostringstream row_loads;
  for (int i : column_inputs) {
    os << "    " << raw_type(i) << " w" << i << "[K];\n";
    row_loads << "        " << raw_load(i, "w" + std::to_string(i) + "[k]") << "\n";
  }
  for (int i : row_inputs) {
    os << "    " << raw_type(i) << " c" << i << "[K];\n";
    row_loads << "        " << raw_load(i, "c" + std::to_string(i) + "[k]") << "\n";
  }
  if (!row_loads.str().empty()) chunk_loop(os, "    ", row_loads.str());
  emit_row_body(os, v, make_target(true), "    ");
  os << "  }\n}\n";
  return unroll_lane_loops(os.str());
}

std::string print_cpp(const KernelVariant& v) {
  check_variant(v);
  const KernelSpec& s = *v.spec;
  std::ostringstream os;
  emit_header_comment(os, v);
  os << "extern \"C\" void " << v.symbol() << "(const MagiArgs* a) {\n";
  os << "  typedef " << (s.use_double ? "double" : "float") << " A;\n";
  os << "  constexpr int V = " << v.vector_width << ";\n";
  emit_index_constants(os, v);
  emit_pointers(os, s, "a->");
  if (s.schedule == Schedule::kColumn) {
    emit_column_cpp(os, v);
    os << "}\n";
    return os.str();
  }
  if (s.schedule == Schedule::kPointwise) {
    const bool per_row_or_column = std::any_of(v.access.begin(), v.access.end(), [](AccessClass c) {
      return c == AccessClass::kRow || c == AccessClass::kColumn;
    });
    if (pointwise_needs_rows(v) || per_row_or_column) {
      // Rows outside, columns inside: each row's coordinates and strided offsets are computed
      // once (lanes are single elements here, so per vector would be per element), and per-row
      // and per-column inputs are indexed by the row and the column (not a division or modulo
      // per element). Parallel over rows: a tensor of few long rows runs on few threads.
      os << "#pragma omp parallel for schedule(static) if (a->numel > 32768)\n";
      os << "  for (long long row_index = 0; row_index < rows; ++row_index) {\n";
      os << "    const long long row_start = row_index * cols;\n";
      emit_pointwise_rows(os, v, false, "(*a)", "    ", true);
      os << "    for (long long col_base = 0; col_base < cols; col_base += V) {\n";
      os << "      const long long base = row_start + col_base;\n";
      emit_pointwise_body(os, v, false, "(*a)", "      ", true);
      os << "    }\n  }\n}\n";
      return os.str();
    }
    os << "  const long long vectors = a->numel / V;\n";
    os << "#pragma omp parallel for schedule(static) if (a->numel > 32768)\n";
    os << "  for (long long vi = 0; vi < vectors; ++vi) {\n";
    os << "    const long long base = vi * V;\n";
    emit_pointwise_body(os, v, false, "(*a)", "    ");
    os << "  }\n}\n";
    return os.str();
  }
  RowTarget t;
  t.gpu = false;
  t.args = "(*a)";
  t.column_loop = [](std::ostream& o, const std::string& ind, const std::vector<int>&, bool,
                     const std::function<void(std::ostream&, const std::string&)>& body) {
    o << ind << "for (long long col0 = 0; col0 < cols; col0 += V) {\n";
    body(o, ind + "  ");
    o << ind << "}\n";
  };
  t.reduce = [](std::ostream& o, const std::string& ind, ReduceKind, const std::string& acc,
                const std::string& result) {
    o << ind << "const A " << result << " = " << acc << ";\n";
  };
  t.store_row = [&s](std::ostream& o, const std::string& ind, int k, const std::string& value) {
    o << ind << "out" << k << "[row] = MagiStore<" << ctype(s.outputs[k].dtype) << ">::from("
      << value << ");\n";
  };
  t.element_load = [](int i) { return "t" + std::to_string(i) + "[j]"; };
  t.prepare_chunk = [&v](std::ostream& o, const std::string& ind, const std::vector<int>& inputs) {
    for (int i : inputs)
      o << ind << "A t" << i << "[V];\n" << ind << load_chunk(v, i, false, "(*a)") << "\n";
  };
  emit_kept_allocation(os, s, "  ");
  os << "#pragma omp parallel for schedule(static) if (a->rows * cols > 32768)\n";
  os << "  for (long long row = 0; row < a->rows; ++row) {\n";
  emit_row_offsets(os, v, all_inputs(s), "(*a)", "row", "    ");
  emit_row_body(os, v, t, "    ");
  os << "  }\n}\n";
  return os.str();
}

bool packed_bf16_possible(const KernelVariant& v) { return packed_bf16_body_possible(v); }

}  // namespace magi::codegen
