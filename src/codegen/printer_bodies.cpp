// The bodies of row and pointwise kernels, shared by the CUDA and C++ printers (the loops
// around them differ: printers.cpp).
#include <algorithm>
#include <functional>
#include <set>

#include "magi/common/error.h"
#include "printer_parts.h"

namespace magi::codegen::printer {

// Input i's stride along the last dim of the index space (a constant index with an index rank).
std::string last_stride(const KernelVariant& v, int i, const std::string& args) {
  const std::string last = v.index_rank > 0 ? "R - 1" : args + ".rank - 1";
  return args + ".strides[" + std::to_string(i) + "][" + last + "]";
}

// The element offset, in strided input i, of column `col` of the current row: the row's
// offset (ro<i>, from emit_row_offsets) plus the column times the last dim's stride.
std::string strided_offset(const KernelVariant& v, int i, const std::string& args,
                           const std::string& col) {
  if (v.strided_vectors) return "ro" + std::to_string(i) + " + (" + col + ")";  // stride 1
  const std::string stride = last_stride(v, i, args);
  return "ro" + std::to_string(i) + " + (" + col + ") * " +
         (v.narrow_index ? "static_cast<int>(" + stride + ")" : stride);
}

// The type of row indices, columns and row offsets: 32-bit where the variant's offsets fit
// (narrow_index), which halves the integer instructions of a strided or shifted kernel.
std::string index_type(const KernelVariant& v) { return v.narrow_index ? "int" : "long long"; }

// Fills `dest`[V] (default t<i>) from strided input i at element offset `off`: the V elements
// lie in one row (the vector width divides the row length), so the lanes step by the last dim's
// stride (on the GPU one vector load when that stride is 1 and the address aligned, checked at
// run time unless the variant proved it, KernelVariant::strided_vectors; `keep`: without the
// streaming hint).
std::string strided_vector_load(const KernelVariant& v, int i, bool gpu, const std::string& args,
                                const std::string& off, std::string dest, bool keep) {
  const std::string k = std::to_string(i), in = "in" + k;
  if (dest.empty()) dest = "t" + k;
  const std::string step = last_stride(v, i, args);
  if (gpu && v.strided_vectors) {
    return "magi_load<A, " + std::string(ctype(v.spec->inputs[i].dtype)) + ", V" +
           (keep ? ", true" : "") + ">(" + in + " + " + off + ", " + dest + ");";
  }
  if (gpu) {
    return "magi_load_strided<A, " + std::string(ctype(v.spec->inputs[i].dtype)) + ", V" +
           (keep ? ", true" : "") + ">(" + in + ", " + off + ", " + step + ", " + dest + ");";
  }
  return "{ const long long off = " + off + "; const long long step = " + step +
         "; for (int j = 0; j < V; ++j) " + dest + "[j] = magi_to_acc<A>(" + in +
         "[off + j * step]); }";
}

// Row and pointwise kernels decompose the row index into coordinates once (MagiRowAt, over
// the variant's index rank) and give each strided input its row's offset, ro<i>; its loads add
// column offsets to it. (A division chain per input and per load made strided kernels
// compute-bound.)
void emit_row_offsets(std::ostream& os, const KernelVariant& v, const std::vector<int>& inputs,
                      const std::string& args, const std::string& row, const std::string& ind) {
  std::vector<int> strided;
  for (int i : inputs) {
    if (v.access[i] == AccessClass::kStrided) strided.push_back(i);
  }
  if (strided.empty()) return;
  MAGI_ASSERT(v.index_rank > 0, v.symbol(), ": strided inputs without an index rank");
  os << ind << "const MagiRowAt<R, kNarrow> ri(" << args << ", " << row << ");\n";
  for (int i : strided) {
    os << ind << "const " << index_type(v) << " ro" << i << " = ri.offset(" << args << ", " << i
       << ");\n"
       << ind << "(void)ro" << i << ";\n";
  }
}

// The index rank of a variant with strided inputs, and whether its offsets fit 32 bits, as
// constants of its kernel.
void emit_index_constants(std::ostream& os, const KernelVariant& v) {
  if (v.index_rank == 0) return;
  os << "  constexpr int R = " << v.index_rank << ";\n";
  os << "  constexpr bool kNarrow = " << (v.narrow_index ? "true" : "false") << ";\n";
}

std::vector<int> all_inputs(const KernelSpec& s) {
  std::vector<int> out;
  for (size_t i = 0; i < s.inputs.size(); ++i) out.push_back(static_cast<int>(i));
  return out;
}

// Fills t<i>[V] for the chunk starting at column `col0` of row `row`.
std::string load_chunk(const KernelVariant& v, int i, bool gpu, const std::string& args) {
  const KernelSpec& s = *v.spec;
  std::string T = ctype(s.inputs[i].dtype), ti = "t" + std::to_string(i),
              in = "in" + std::to_string(i);
  std::string V = std::to_string(v.vector_width);
  std::string vec_load = gpu ? "magi_load<A, " + T + ", " + V + ">(" : "";
  const std::string tail = ");";
  switch (v.access[i]) {
    case AccessClass::kContiguous:
      if (gpu) return vec_load + in + " + row * cols + col0, " + ti + tail;
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in +
             "[row * cols + col0 + j]);";
    case AccessClass::kColumn:  // read again by every row: never streamed
      if (gpu) return "magi_load<A, " + T + ", " + V + ", true>(" + in + " + col0, " + ti + tail;
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in + "[col0 + j]);";
    case AccessClass::kRow:
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in + "[row]);";
    case AccessClass::kScalar:
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in + "[0]);";
    case AccessClass::kStrided:
      if (s.schedule == Schedule::kColumn) {  // cols spans the kept dims: a linear index
        return strided_vector_load(
            v, i, gpu, args,
            "magi_offset(" + args + ", " + std::to_string(i) + ", row * cols + col0)");
      }
      return strided_vector_load(v, i, gpu, args, strided_offset(v, i, args, "col0"));
  }
  return "";
}

// Per-row load of a per-row input.
std::string load_row_value(const KernelVariant& v, int i, const std::string& args) {
  std::string in = "in" + std::to_string(i);
  switch (v.access[i]) {
    case AccessClass::kScalar:
      return "magi_to_acc<A>(" + in + "[0])";
    case AccessClass::kStrided:
      return "magi_to_acc<A>(" + in + "[ro" + std::to_string(i) + "])";
    default:
      return "magi_to_acc<A>(" + in + "[row])";
  }
}

namespace {

// An element op worth keeping for a later pass instead of computing it again there: a
// transcendental function or a power printed as pow() (the rest, squares and square roots
// included, costs less than the store and load keeping it takes).
bool costly(const KernelSpec& s, const KOp& op) {
  if (op.kind == KOpKind::kUnary) {
    return op.fn != "neg" && op.fn != "abs" && op.fn != "relu" && op.fn != "reciprocal";
  }
  return op.kind == KOpKind::kBinary && op.fn == "pow" && closed_form_power(s, op, "x").empty();
}

constexpr int kMaxKeptValues = 8;  // rows of the kept-values buffer per thread

// The passes over a row (each reduction's, then the outputs'): the element ops each computes,
// and, on the host, the costly values a pass reads from a per-thread row buffer that the pass
// which first computed them wrote (softmax's exponentials: computed twice per element, e^v was
// half the kernel's time). The GPU computes them again: its kernels wait on memory, not on math.
struct RowPasses {
  std::vector<std::vector<int>> roots, ops, reads, writes;
  std::vector<int> slot;  // per op: its buffer, or -1
};

RowPasses plan_row_passes(const KernelSpec& s, bool keep) {
  RowPasses p;
  p.slot.assign(s.ops.size(), -1);
  for (const KOp& op : s.ops) {
    if (op.per_row && op.kind == KOpKind::kReduce) p.roots.push_back({op.args[0]});
  }
  std::vector<int> outputs = full_output_roots(s);
  if (!outputs.empty()) p.roots.push_back(outputs);
  std::vector<int> first_pass(s.ops.size(), -1);  // where each op was computed first
  int slots = 0;
  for (size_t n = 0; n < p.roots.size(); ++n) {
    std::set<int> seen, reads;
    std::function<void(int)> visit = [&](int i) {
      const KOp& op = s.ops[i];
      if (op.per_row || op.kind == KOpKind::kConst || seen.count(i) || reads.count(i)) return;
      if (keep && first_pass[i] >= 0 && costly(s, op) &&
          (p.slot[i] >= 0 || slots < kMaxKeptValues)) {
        reads.insert(i);
        if (p.slot[i] < 0) {
          p.slot[i] = slots++;
          p.writes[static_cast<size_t>(first_pass[i])].push_back(i);
        }
        return;
      }
      seen.insert(i);
      for (int a : op.args) visit(a);
    };
    p.writes.emplace_back();
    for (int r : p.roots[n]) visit(r);
    p.ops.push_back({seen.begin(), seen.end()});
    p.reads.push_back({reads.begin(), reads.end()});
    for (int i : seen) {
      if (first_pass[i] < 0) first_pass[i] = static_cast<int>(n);
    }
  }
  return p;
}

std::string kept_buffer(int i) { return "k" + std::to_string(i); }

// Rows of the kept-values buffer a thread needs: one per kept value, 0 when none is kept.
int kept_slots(const RowPasses& p) {
  int slots = 0;
  for (int slot : p.slot) slots = std::max(slots, slot + 1);
  return slots;
}

// Inside a pass's lane loop: the kept values it reads, before its ops...
void emit_kept_reads(std::ostream& os, const KernelSpec& s, const std::vector<int>& reads,
                     const std::string& ind) {
  for (int i : reads) {
    os << ind << "const A " << name(s, i) << " = " << kept_buffer(i) << "[col0 + j];"
       << comment(s.ops[i]) << "\n";
  }
}

// ... and those it computed first and a later pass reads, after them.
void emit_kept_writes(std::ostream& os, const KernelSpec& s, const std::vector<int>& writes,
                      const std::string& ind) {
  for (int i : writes) os << ind << kept_buffer(i) << "[col0 + j] = " << name(s, i) << ";\n";
}

}  // namespace

void emit_row_body(std::ostream& os, const KernelVariant& v, const RowTarget& t,
                   const std::string& ind) {
  const KernelSpec& s = *v.spec;
  const RowPasses passes = plan_row_passes(s, !t.gpu);
  const int slots = kept_slots(passes);
  for (size_t i = 0; i < s.ops.size(); ++i) {
    if (passes.slot[i] < 0) continue;
    os << ind << "A* __restrict__ " << kept_buffer(static_cast<int>(i))
       << " = kept.get() + ((long long)magi_thread_num() * " << slots << " + " << passes.slot[i]
       << ") * cols;  // " << name(s, static_cast<int>(i))
       << " of each column, kept for a later pass\n";
  }
  size_t pass = 0;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const KOp& op = s.ops[i];
    if (!op.per_row || op.kind == KOpKind::kConst) continue;
    if (op.kind == KOpKind::kLoad) {
      os << ind << "const A r" << i << " = " << load_row_value(v, op.input, t.args) << ";"
         << comment(op) << "\n";
    } else if (op.kind == KOpKind::kReduce) {
      const std::vector<int>& ops = passes.ops[pass];
      const std::vector<int>& reads = passes.reads[pass];
      const std::vector<int>& writes = passes.writes[pass];
      ++pass;
      std::string acc = "acc" + std::to_string(i);
      os << ind << "A " << acc << " = " << init(op.reduce) << ";" << comment(op) << "\n";
      const std::vector<int> inputs = element_inputs(s, ops);
      // On the host, the pass may reorder the accumulation so that the compiler vectorizes it
      // (a float sum is not associative, and magi_max's NaN test is a select); max and min
      // combine partial results with magi_max / magi_min, so a NaN anywhere still wins.
      if (!t.gpu)
        os << ind << "#pragma omp simd reduction(" << omp_reduction(op.reduce) << ":" << acc
           << ")\n";
      t.column_loop(os, ind, inputs, false, [&](std::ostream& o, const std::string& in2) {
        t.prepare_chunk(o, in2, inputs);
        o << in2 << "for (int j = 0; j < V; ++j) {\n";
        emit_kept_reads(o, s, reads, in2 + "  ");
        emit_ops(o, s, ops, unshifted(t.element_load), in2 + "  ", math_forms(t.gpu, s));
        emit_kept_writes(o, s, writes, in2 + "  ");
        o << in2 << "  " << acc << " = " << combine(op.reduce, acc, name(s, op.args[0])) << ";\n";
        o << in2 << "}\n";
      });
      t.reduce(os, ind, op.reduce, acc, "r" + std::to_string(i));
    } else {
      os << ind << "const A r" << i << " = "
         << expr(s, static_cast<int>(i), nullptr, math_forms(t.gpu, s)) << ";" << comment(op)
         << "\n";
    }
  }
  if (pass < passes.roots.size()) {
    const std::vector<int>& ops = passes.ops[pass];
    const std::vector<int>& reads = passes.reads[pass];
    const std::vector<int> inputs = element_inputs(s, ops);
    t.column_loop(os, ind, inputs, true, [&](std::ostream& o, const std::string& in2) {
      t.prepare_chunk(o, in2, inputs);
      for (size_t k = 0; k < s.outputs.size(); ++k) {
        if (!s.outputs[k].per_row) o << in2 << "A o" << k << "[V];\n";
      }
      o << in2 << "for (int j = 0; j < V; ++j) {\n";
      emit_kept_reads(o, s, reads, in2 + "  ");
      emit_ops(o, s, ops, unshifted(t.element_load), in2 + "  ", math_forms(t.gpu, s));
      for (size_t k = 0; k < s.outputs.size(); ++k) {
        if (!s.outputs[k].per_row)
          o << in2 << "  o" << k << "[j] = " << name(s, stored_op(s, s.outputs[k])) << ";\n";
      }
      o << in2 << "}\n";
      for (size_t k = 0; k < s.outputs.size(); ++k) {
        if (s.outputs[k].per_row) continue;
        std::string T = ctype(s.outputs[k].dtype);
        if (t.gpu) {
          o << in2 << t.store_guard << store_call(s, static_cast<int>(k)) << "(out" << k
            << " + row * cols + col0, o" << k << ");\n";
        } else {
          o << in2 << "for (int j = 0; j < V; ++j) out" << k
            << "[row * cols + col0 + j] = MagiStore<" << T << ">::from(o" << k << "[j]);\n";
        }
      }
    });
  }
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    if (s.outputs[k].per_row) t.store_row(os, ind, static_cast<int>(k), name(s, s.outputs[k].op));
  }
}

void emit_kept_allocation(std::ostream& os, const KernelSpec& s, const std::string& ind) {
  const RowPasses passes = plan_row_passes(s, true);
  const int slots = kept_slots(passes);
  if (slots == 0) return;
  os << ind << "// " << slots << " row(s) of kept values per thread, for this call\n";
  os << ind << "const std::unique_ptr<A[]> kept(new A[(size_t)magi_max_threads() * " << slots
     << " * (size_t)cols]);\n";
}

// ---- pointwise body --------------------------------------------------------------------------

std::string load_pointwise(const KernelVariant& v, int i, bool gpu, const std::string& args,
                           bool rows_outside) {
  const KernelSpec& s = *v.spec;
  std::string T = ctype(s.inputs[i].dtype), ti = "t" + std::to_string(i),
              in = "in" + std::to_string(i);
  std::string V = std::to_string(v.vector_width);
  if (rows_outside) {  // the C++ row loop: the row and the column are known, no division
    if (v.access[i] == AccessClass::kColumn) {
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in +
             "[col_base + j]);";
    }
    if (v.access[i] == AccessClass::kRow) {
      return "{ const A r = magi_to_acc<A>(" + in + "[row_index]); for (int j = 0; j < V; ++j) " +
             ti + "[j] = r; }";
    }
  }
  switch (v.access[i]) {
    case AccessClass::kContiguous:
      if (gpu) return "magi_load<A, " + T + ", " + V + ", true>(" + in + " + base, " + ti + ");";
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in + "[base + j]);";
    case AccessClass::kColumn:  // read again by every row: never streamed
      if (gpu) {
        return "magi_load<A, " + T + ", " + V + ", true>(" + in + " + magi_mod_cols(" + args +
               ", base), " + ti + ");";
      }
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in +
             "[(base + j) % cols]);";
    case AccessClass::kRow:  // the vector width divides the row length: one row per vector
      if (gpu) {
        return "{ const A r = magi_to_acc<A>(" + in + "[magi_div_cols(" + args +
               ", base)]); for (int j = 0; j < V; ++j) " + ti + "[j] = r; }";
      }
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in +
             "[(base + j) / cols]);";
    case AccessClass::kScalar:
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in + "[0]);";
    case AccessClass::kStrided:
      return strided_vector_load(v, i, gpu, args, strided_offset(v, i, args, "col_base"), "", true);
  }
  return "";
}

// Input i read at column `col + shift` of the lane's row (clamped to the row: a cat's
// select discards the loads of its other pieces, whose columns may fall outside).
std::string shifted_load(const KernelVariant& v, int i, int64_t shift, const std::string& args) {
  const std::string c = "magi_col(col + " + std::to_string(shift) + "LL, cols)";
  const std::string in = "in" + std::to_string(i);
  std::string offset;
  switch (v.access[i]) {
    case AccessClass::kContiguous:
      offset = "row_start + " + c;
      break;
    case AccessClass::kColumn:
      offset = c;
      break;
    case AccessClass::kRow:
      offset = "row_start / cols";
      break;
    case AccessClass::kScalar:
      offset = "0";
      break;
    case AccessClass::kStrided:
      offset = strided_offset(v, i, args, c);
      break;
  }
  return "magi_to_acc<A>(" + in + "[" + offset + "])";
}

// Loads at a column shift that is a multiple of V read whole vectors: with V dividing the row
// length, a vector's shifted columns are all inside the row or all outside it (then clamped:
// a cat's select discards them). They fill s<op>[V] before the lane loop.
bool vector_shift(const KernelVariant& v, const KOp& op) {
  return op.kind == KOpKind::kLoad && op.shift != 0 && op.shift % v.vector_width == 0 &&
         (v.access[op.input] == AccessClass::kContiguous ||
          v.access[op.input] == AccessClass::kStrided);
}

void emit_shifted_vector_loads(std::ostream& os, const KernelVariant& v,
                               const std::vector<int>& ops, bool gpu, const std::string& args,
                               const std::string& ind) {
  const KernelSpec& s = *v.spec;
  for (int n : ops) {
    const KOp& op = s.ops[n];
    if (!vector_shift(v, op)) continue;
    const std::string k = std::to_string(op.input), T = ctype(s.inputs[op.input].dtype);
    // The guard adds in 64 bits (a shift of up to a row, on rows of up to 2^31 values); the
    // offset it lets through fits the variant's index type.
    const std::string shifted = "col_base + " + std::to_string(op.shift) + "LL";
    const std::string offset_shift =
        "col_base + " + std::to_string(op.shift) + (v.narrow_index ? "" : "LL");
    const std::string first = "row_start + " + offset_shift;
    const std::string dest = "s" + std::to_string(n);
    // A vector whose shifted columns leave the row belongs to another piece of a cat or pad,
    // whose select discards it: it is not read at all (rotate_half reads one of its two
    // shifted vectors per lane, not both).
    os << ind << "A " << dest << "[V];\n";
    os << ind << "if (" << shifted << " >= 0 && " << shifted << " <= cols - V) {\n";
    if (v.access[op.input] == AccessClass::kStrided) {
      os << ind << "  "
         << strided_vector_load(v, op.input, gpu, args,
                                strided_offset(v, op.input, args, offset_shift), dest, true)
         << "\n";
    } else if (gpu) {
      // Kept in cache like the unshifted load: the same bytes are read at other shifts.
      os << ind << "  magi_load<A, " << T << ", V, true>(in" << k << " + " << first << ", " << dest
         << ");\n";
    } else {
      os << ind << "  const " << index_type(v) << " off = " << first << ";\n"
         << ind << "  for (int j = 0; j < V; ++j) " << dest << "[j] = magi_to_acc<A>(in" << k
         << "[off + j]);\n";
    }
    os << ind << "} else {\n"
       << ind << "  for (int j = 0; j < V; ++j) " << dest << "[j] = A(0);\n"
       << ind << "}\n";
  }
}

namespace {

// Every input the pointwise body's ops load, shifted or not.
std::vector<int> pointwise_reads(const KernelVariant& v) {
  const KernelSpec& s = *v.spec;
  std::vector<int> read;
  for (int n : element_closure(s, full_output_roots(s))) {
    if (s.ops[n].kind == KOpKind::kLoad) read.push_back(s.ops[n].input);
  }
  std::sort(read.begin(), read.end());
  read.erase(std::unique(read.begin(), read.end()), read.end());
  return read;
}

}  // namespace

// Whether every lane of a vector takes the same piece of each select in `ops`: each select's
// bounds and column shift are multiples of V (col_base is one, V dividing the row length) and
// every shifted load reads whole vectors. Then `col_base + j + shift < bound` is the same for
// all j in [0, V).
bool lane_uniform_columns(const KernelVariant& v, const std::vector<int>& ops) {
  const int64_t V = v.vector_width;
  for (int n : ops) {
    const KOp& op = v.spec->ops[n];
    if (op.kind == KOpKind::kLoad && op.shift != 0 && !vector_shift(v, op)) return false;
    if (op.kind != KOpKind::kSelect) continue;
    if (op.shift % V != 0) return false;
    for (int64_t b : op.bounds) {
      if (b % V != 0) return false;
    }
  }
  return true;
}

bool pointwise_needs_rows(const KernelVariant& v) {
  const std::vector<int> read = pointwise_reads(v);
  return uses_columns(*v.spec) || std::any_of(read.begin(), read.end(), [&](int i) {
           return v.access[i] == AccessClass::kStrided;
         });
}

void emit_pointwise_rows(std::ostream& os, const KernelVariant& v, bool gpu,
                         const std::string& args, const std::string& ind, bool row_given) {
  if (!row_given) {        // the V lanes lie in one row (the vector width divides the row length)
    if (v.narrow_index) {  // the whole index space is under 2^31 elements
      os << ind << "const int row_index = "
         << (gpu ? "magi_udiv(static_cast<unsigned>(base), " + args + ".cols_magic, " + args +
                       ".cols_shift)"
                 : std::string("static_cast<int>(base / cols)"))
         << ";\n";
      os << ind
         << "const int col_base = static_cast<int>(base) - row_index * static_cast<int>(cols);\n";
      os << ind << "const int row_start = static_cast<int>(base) - col_base;\n";
    } else {
      os << ind << "const long long row_index = "
         << (gpu ? "magi_div_cols(" + args + ", base)" : std::string("base / cols")) << ";\n";
      os << ind << "const long long col_base = base - row_index * cols;\n";
      os << ind << "const long long row_start = base - col_base;\n";
    }
    os << ind << "(void)row_start;\n";
  }
  emit_row_offsets(os, v, pointwise_reads(v), args, "row_index", ind);
}

void emit_pointwise_body(std::ostream& os, const KernelVariant& v, bool gpu,
                         const std::string& args, const std::string& ind, bool rows_outside) {
  if (v.packed_bf16) {
    MAGI_ASSERT(gpu && !rows_outside, v.symbol(), ": packed bf16 pairs outside a GPU kernel");
    emit_packed_bf16_body(os, v, args, ind);
    return;
  }
  const KernelSpec& s = *v.spec;
  std::vector<int> ops = element_closure(s, full_output_roots(s));
  const std::vector<int> inputs = element_inputs(s, ops);
  const bool columns = uses_columns(s);
  if (!rows_outside && pointwise_needs_rows(v)) emit_pointwise_rows(os, v, gpu, args, ind, false);
  for (int i : inputs) {
    os << ind << "A t" << i << "[V];\n"
       << ind << load_pointwise(v, i, gpu, args, rows_outside) << "\n";
  }
  for (size_t k = 0; k < s.outputs.size(); ++k) os << ind << "A o" << k << "[V];\n";
  if (columns) emit_shifted_vector_loads(os, v, ops, gpu, args, ind);
  os << ind << "for (int j = 0; j < V; ++j) {\n";
  // Where every select's bounds and column shift are multiples of V and every shifted load
  // reads whole vectors, all V lanes take the same piece: the select tests the vector's first
  // column, once per vector instead of once per lane.
  if (columns) {
    os << ind << "  const " << index_type(v) << " col = col_base"
       << (lane_uniform_columns(v, ops) ? "" : " + j") << ";\n";
  }
  emit_ops(
      os, s, ops,
      [&](const KOp& op) {
        if (op.shift == 0) return "t" + std::to_string(op.input) + "[j]";
        if (vector_shift(v, op)) return "s" + std::to_string(&op - s.ops.data()) + "[j]";
        return shifted_load(v, op.input, op.shift, args);
      },
      ind + "  ", math_forms(gpu, s));
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    os << ind << "  o" << k << "[j] = " << name(s, stored_op(s, s.outputs[k])) << ";\n";
  }
  os << ind << "}\n";
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    std::string T = ctype(s.outputs[k].dtype);
    if (gpu) {
      os << ind << store_call(s, static_cast<int>(k)) << "(out" << k << " + base, o" << k << ");\n";
    } else {
      os << ind << "for (int j = 0; j < V; ++j) out" << k << "[base + j] = MagiStore<" << T
         << ">::from(o" << k << "[j]);\n";
    }
  }
}

}  // namespace magi::codegen::printer
