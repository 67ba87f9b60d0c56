// Column kernels (reductions over leading dims): the pass over the index space that
// accumulates per-column partials, and on the GPU the combination of the row splits.
#include <functional>

#include "magi/common/error.h"
#include "printer_parts.h"

namespace magi::codegen::printer {
namespace {

// The parts of a column kernel: its reductions, the ops of the pass over the index space
// (`element`), and which per-column ops do not depend on a reduction (`invariant`: computable
// in that pass, such as a per-column operand and its cast).
struct ColumnPlan {
  std::vector<int> reductions;
  std::vector<int> element;
  std::vector<bool> invariant;
  std::vector<int> column_inputs;  ///< per-column inputs, loaded once
};

ColumnPlan plan_columns(const KernelSpec& s) {
  ColumnPlan p;
  p.invariant.assign(s.ops.size(), false);
  std::vector<int> roots = full_output_roots(s);
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const KOp& op = s.ops[i];
    if (op.kind == KOpKind::kReduce) {
      p.reductions.push_back(static_cast<int>(i));
      roots.push_back(op.args[0]);
    } else if (op.per_row && op.kind != KOpKind::kConst) {
      bool inv = true;
      for (int a : op.args) inv &= s.ops[a].kind == KOpKind::kConst || p.invariant[a];
      p.invariant[i] = inv;
      if (op.kind == KOpKind::kLoad) p.column_inputs.push_back(op.input);
    }
  }
  p.element = element_closure(s, roots);
  return p;
}

// Statements defining the per-column values of lane j: the invariant ones (in the pass over the
// index space), or all of them with the reductions read from `acc(i)` (after it).
void emit_column_values(std::ostream& os, const KernelSpec& s, const ColumnPlan& p,
                        const std::function<std::string(int)>& acc, const std::string& ind,
                        MathForms forms) {
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const KOp& op = s.ops[i];
    if (!op.per_row || op.kind == KOpKind::kConst || (!acc && !p.invariant[i])) continue;
    os << ind << "const A r" << i << " = ";
    if (op.kind == KOpKind::kLoad) {
      os << "t" << op.input << "[j]";
    } else if (op.kind == KOpKind::kReduce) {
      os << acc(static_cast<int>(i));
    } else {
      os << expr(s, static_cast<int>(i), nullptr, forms);
    }
    os << ";" << comment(op) << "\n";
  }
}

// One step of the pass over the index space, for the V columns from col0 of `row`: loads,
// per-element ops, accumulation into `acc(i)`, stores of the full-size outputs.
void emit_column_step(std::ostream& os, const KernelVariant& v, const ColumnPlan& p, bool gpu,
                      const std::string& args, const std::function<std::string(int)>& acc,
                      const std::string& ind) {
  const KernelSpec& s = *v.spec;
  for (int i : element_inputs(s, p.element)) {
    os << ind << "A t" << i << "[V];\n" << ind << load_chunk(v, i, gpu, args) << "\n";
  }
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    if (!s.outputs[k].per_row) os << ind << "A o" << k << "[V];\n";
  }
  os << ind << "for (int j = 0; j < V; ++j) {\n";
  emit_column_values(os, s, p, nullptr, ind + "  ", math_forms(gpu, s));
  emit_ops(os, s, p.element, unshifted([](int i) { return "t" + std::to_string(i) + "[j]"; }),
           ind + "  ", math_forms(gpu, s));
  for (int r : p.reductions) {
    os << ind << "  " << acc(r) << " = "
       << combine(s.ops[r].reduce, acc(r), name(s, s.ops[r].args[0])) << ";\n";
  }
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    if (!s.outputs[k].per_row) {
      os << ind << "  o" << k << "[j] = " << name(s, stored_op(s, s.outputs[k])) << ";\n";
    }
  }
  os << ind << "}\n";
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    if (s.outputs[k].per_row) continue;
    std::string T = ctype(s.outputs[k].dtype);
    if (gpu) {
      os << ind << store_call(s, static_cast<int>(k)) << "(out" << k << " + row * cols + col0, o"
         << k << ");\n";
    } else {
      os << ind << "for (int j = 0; j < V; ++j) out" << k << "[row * cols + col0 + j] = MagiStore<"
         << T << ">::from(o" << k << "[j]);\n";
    }
  }
}

// Loads of the per-column inputs for the V columns from col0 (any row reads the same values).
// On the GPU only for threads whose columns exist (`active`).
void emit_column_input_loads(std::ostream& os, const KernelVariant& v, const ColumnPlan& p,
                             bool gpu, const std::string& args, const std::string& ind) {
  for (int i : p.column_inputs) os << ind << "A t" << i << "[V];\n";
  if (p.column_inputs.empty()) return;
  os << ind << (gpu ? "if (active) {\n" : "{\n") << ind << "  const long long row = 0;\n"
     << ind << "  (void)row;\n";
  for (int i : p.column_inputs) os << ind << "  " << load_chunk(v, i, gpu, args) << "\n";
  os << ind << "}\n";
}

// The per-column ops and stores, once the reductions are complete in `acc(i)`.
void emit_column_outputs(std::ostream& os, const KernelVariant& v, const ColumnPlan& p, bool gpu,
                         const std::function<std::string(int)>& acc, const std::string& ind) {
  const KernelSpec& s = *v.spec;
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    if (s.outputs[k].per_row) os << ind << "A o" << k << "[V];\n";
  }
  os << ind << "for (int j = 0; j < V; ++j) {\n";
  emit_column_values(os, s, p, acc, ind + "  ", math_forms(gpu, s));
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    if (s.outputs[k].per_row) {
      os << ind << "  o" << k << "[j] = " << name(s, s.outputs[k].op) << ";\n";
    }
  }
  os << ind << "}\n";
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    if (!s.outputs[k].per_row) continue;
    std::string T = ctype(s.outputs[k].dtype);
    if (gpu) {
      os << ind << store_call(s, static_cast<int>(k)) << "(out" << k << " + col0, o" << k << ");\n";
    } else {
      os << ind << "for (int j = 0; j < V; ++j) out" << k << "[col0 + j] = MagiStore<" << T
         << ">::from(o" << k << "[j]);\n";
    }
  }
}

// CUDA: blocks of 32 x 8 threads; each thread owns V columns and walks every 8th row of its
// block's share of the rows (the grid's y dim splits them). The 8 thread rows combine through
// shared memory in a fixed order; with one split the block finishes the columns, else it
// writes its partials to the workspace [reduction][split][cols] and a second launch
// (a.phase == 1, one split) combines them in split order: results never depend on timing.

}  // namespace

void emit_column_cuda(std::ostream& os, const KernelVariant& v) {
  const KernelSpec& s = *v.spec;
  const ColumnPlan p = plan_columns(s);
  os << "  const long long col0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * V;\n";
  os << "  const bool active = col0 < cols;\n";
  os << "  __shared__ A red[256 * V];\n";
  os << "  A* const ws = static_cast<A*>(a.workspace);\n";
  emit_column_input_loads(os, v, p, true, "a", "  ");
  auto acc = [](int r) { return "acc" + std::to_string(r) + "[j]"; };
  for (int r : p.reductions) os << "  A acc" << r << "[V];\n";
  os << "  if (a.phase == 0) {\n";
  for (int r : p.reductions) {
    os << "    for (int j = 0; j < V; ++j) acc" << r << "[j] = " << init(s.ops[r].reduce) << ";\n";
  }
  os << "    if (active) {\n";
  // Unrolled so that several rows' loads are in flight at once: a split is short (64 rows
  // over 8 thread rows for a 4096-row weight gradient), and one 16-byte load per input per
  // iteration leaves the memory system idle between them. The sums still run row by row.
  os << "#pragma unroll 4\n";
  os << "      for (long long row = blockIdx.y * (long long)blockDim.y + threadIdx.y; row < rows;\n"
        "           row += (long long)gridDim.y * blockDim.y) {\n";
  emit_column_step(os, v, p, true, "a", acc, "        ");
  os << "      }\n    }\n";
  os << "    const int slot = (threadIdx.y * blockDim.x + threadIdx.x) * V;\n";
  for (int r : p.reductions) {
    const ReduceKind k = s.ops[r].reduce;
    os << "    for (int j = 0; j < V; ++j) red[slot + j] = acc" << r << "[j];\n";
    os << "    __syncthreads();\n";
    os << "    if (threadIdx.y == 0) {\n";
    os << "      for (int j = 0; j < V; ++j) {\n";
    os << "        A t = red[threadIdx.x * V + j];\n";
    os << "        for (int y = 1; y < blockDim.y; ++y) t = "
       << combine(k, "t", "red[(y * blockDim.x + threadIdx.x) * V + j]") << ";\n";
    os << "        acc" << r << "[j] = t;\n      }\n    }\n";
    os << "    __syncthreads();\n";
  }
  os << "    if (threadIdx.y != 0 || !active) return;\n";
  os << "    if (a.splits > 1) {\n";
  for (size_t n = 0; n < p.reductions.size(); ++n) {
    os << "      for (int j = 0; j < V; ++j) ws[(" << n
       << "LL * a.splits + blockIdx.y) * cols + col0 + j] = acc" << p.reductions[n] << "[j];\n";
  }
  os << "      return;\n    }\n";
  os << "  } else {\n";
  os << "    if (threadIdx.y != 0 || !active) return;\n";
  for (size_t n = 0; n < p.reductions.size(); ++n) {
    const int r = p.reductions[n];
    os << "    for (int j = 0; j < V; ++j) {\n";
    os << "      const A* part = ws + " << n << "LL * a.splits * cols + col0 + j;\n";
    os << "      A t = part[0];\n";
    os << "      for (long long split = 1; split < a.splits; ++split) t = "
       << combine(s.ops[r].reduce, "t", "part[split * cols]") << ";\n";
    os << "      acc" << r << "[j] = t;\n    }\n";
  }
  os << "  }\n";
  emit_column_outputs(os, v, p, true, acc, "  ");
}

// C++: OpenMP over tiles of 64 columns; each tile walks all rows in order.
void emit_column_cpp(std::ostream& os, const KernelVariant& v) {
  const KernelSpec& s = *v.spec;
  const ColumnPlan p = plan_columns(s);
  auto acc = [](int r) { return "acc" + std::to_string(r) + "[col0 - c_begin + j]"; };
  os << "  constexpr long long TILE = 64;\n";
  os << "  const long long tiles = (cols + TILE - 1) / TILE;\n";
  os << "#pragma omp parallel for schedule(static) if (a->numel > 32768)\n";
  os << "  for (long long tile = 0; tile < tiles; ++tile) {\n";
  os << "    const long long c_begin = tile * TILE;\n";
  os << "    const long long c_end = c_begin + TILE < cols ? c_begin + TILE : cols;\n";
  for (int r : p.reductions) {
    os << "    A acc" << r << "[TILE];\n";
    os << "    for (long long c = 0; c < TILE; ++c) acc" << r << "[c] = " << init(s.ops[r].reduce)
       << ";\n";
  }
  os << "    for (long long row = 0; row < rows; ++row) {\n";
  os << "      for (long long col0 = c_begin; col0 < c_end; col0 += V) {\n";
  emit_column_input_loads(os, v, p, false, "(*a)", "        ");
  emit_column_step(os, v, p, false, "(*a)", acc, "        ");
  os << "      }\n    }\n";
  os << "    for (long long col0 = c_begin; col0 < c_end; col0 += V) {\n";
  emit_column_input_loads(os, v, p, false, "(*a)", "      ");
  emit_column_outputs(os, v, p, false, acc, "      ");
  os << "    }\n  }\n";
}

}  // namespace magi::codegen::printer
