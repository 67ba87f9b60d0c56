// CUDA and C++ printers of the kernel IR. Shared: naming, scalar expressions, which ops each
// pass needs. Different: how the index space is walked (threads and blocks vs OpenMP loops).
//
// Row kernels run, per row: the per-row ops in SSA order, and for each reduction a pass over
// the row that evaluates the per-element ops it needs and combines them; then a final pass
// that stores the full-size outputs. On the GPU a row belongs to one thread block; when the
// row fits (cols <= threads * vector_width * row_chunks_per_thread()) it is read from memory once
// into registers and every pass reads the registers, else each pass streams the row again.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <sstream>

#include "magi/codegen/printers.h"
#include "magi/common/error.h"

namespace magi::codegen {
namespace {

const char* ctype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return "float";
    case c10::ScalarType::Double:
      return "double";
    case c10::ScalarType::BFloat16:
      return "magi_bf16";
    case c10::ScalarType::Half:
      return "magi_f16";
    case c10::ScalarType::Bool:
      return "bool";
    default:
      break;
  }
  MAGI_ASSERT(false, "no kernel type for dtype ", c10::toString(t));
  return "";
}

std::string literal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  std::string s(buf);
  if (s == "inf") return "magi_inf<A>()";
  if (s == "-inf") return "-magi_inf<A>()";
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return "A(" + s + ")";
}

// Names: per-row values r<i>, per-element values e<i>.
// Constants are printed inline wherever they are used.
std::string name(const KernelSpec& s, int i) {
  const KOp& op = s.ops[i];
  if (op.kind == KOpKind::kConst) return op.fn.empty() ? literal(op.value) : "A(" + op.fn + ")";
  return (op.per_row ? "r" : "e") + std::to_string(i);
}

// `fast`: print the GPU's fast forms of exp, log, division, sigmoid and silu
// (KernelSpec::fast_math).
// How a printer reads a Load op (its input at its column shift) inside a lane loop.
using LoadFn = std::function<std::string(const KOp&)>;

// The load of a schedule without column shifts (slices and cats only join pointwise kernels).
LoadFn unshifted(std::function<std::string(int)> load) {
  return [load = std::move(load)](const KOp& op) {
    MAGI_ASSERT(op.shift == 0, "a load at a column offset in a reduction kernel");
    return load(op.input);
  };
}

std::string expr(const KernelSpec& s, int i, const LoadFn& load, bool fast) {
  const KOp& op = s.ops[i];
  auto a = [&](int k) { return name(s, op.args[k]); };
  switch (op.kind) {
    case KOpKind::kLoad:
      return load(op);
    case KOpKind::kConst:
      return name(s, i);
    case KOpKind::kRound:
      if (op.round_to == c10::ScalarType::Float) return "A(static_cast<float>(" + a(0) + "))";
      return std::string(op.round_to == c10::ScalarType::BFloat16 ? "magi_round_bf16("
                                                                  : "magi_round_f16(") +
             a(0) + ")";
    case KOpKind::kWhere:
      return "(" + a(0) + " != A(0) ? " + a(1) + " : " + a(2) + ")";
    case KOpKind::kSelect: {
      // (col + shift < b0 ? a0 : (col + shift < b1 ? a1 : a2))
      const std::string c = op.shift == 0 ? "col" : "(col + " + std::to_string(op.shift) + "LL)";
      std::string e = a(static_cast<int>(op.bounds.size()));
      for (size_t k = op.bounds.size(); k-- > 0;) {
        e = "(" + c + " < " + std::to_string(op.bounds[k]) + "LL ? " + a(static_cast<int>(k)) +
            " : " + e + ")";
      }
      return e;
    }
    case KOpKind::kUnary: {
      const std::string& f = op.fn;
      if (f == "neg") return "(-" + a(0) + ")";
      if (f == "reciprocal") return "(A(1) / " + a(0) + ")";
      if (f == "abs") return "fabs(" + a(0) + ")";
      if (fast && (f == "exp" || f == "log" || f == "sigmoid" || f == "silu")) {
        return "magi_f" + f + "(" + a(0) + ")";
      }
      if (f == "rsqrt" || f == "sigmoid" || f == "relu" || f == "silu" || f == "gelu" ||
          f == "gelu_tanh") {
        return "magi_" + f + "(" + a(0) + ")";
      }
      return f + "(" + a(0) + ")";  // exp, log, sqrt, sin, cos, tanh, erf, log1p, expm1
    }
    case KOpKind::kBinary: {
      const std::string& f = op.fn;
      if (f == "add") return "(" + a(0) + " + " + a(1) + ")";
      if (f == "sub") return "(" + a(0) + " - " + a(1) + ")";
      if (f == "mul") return "(" + a(0) + " * " + a(1) + ")";
      if (f == "div" && fast) return "magi_fdiv(" + a(0) + ", " + a(1) + ")";
      if (f == "div") return "(" + a(0) + " / " + a(1) + ")";
      if (f == "max" || f == "min") return "magi_" + f + "(" + a(0) + ", " + a(1) + ")";
      if (f == "pow") {
        const KOp& e = s.ops[op.args[1]];
        if (e.kind == KOpKind::kConst && e.fn.empty()) {
          if (e.value == 2.0) return "(" + a(0) + " * " + a(0) + ")";
          if (e.value == 1.0) return a(0);
          if (e.value == 0.5) return "sqrt(" + a(0) + ")";
          if (e.value == -1.0) return "(A(1) / " + a(0) + ")";
          if (e.value == -0.5) return "magi_rsqrt(" + a(0) + ")";
          if (e.value == 3.0) return "(" + a(0) + " * " + a(0) + " * " + a(0) + ")";
        }
        return "pow(" + a(0) + ", " + a(1) + ")";
      }
      break;
    }
    case KOpKind::kReduce:
      break;
  }
  MAGI_ASSERT(false, "cannot print op ", i, " (", op.fn, ")");
  return "";
}

std::string combine(ReduceKind r, const std::string& x, const std::string& y) {
  switch (r) {
    case ReduceKind::kSum:
      return x + " + " + y;
    case ReduceKind::kMax:
      return "magi_max(" + x + ", " + y + ")";
    case ReduceKind::kMin:
      return "magi_min(" + x + ", " + y + ")";
  }
  return "";
}

std::string init(ReduceKind r) {
  switch (r) {
    case ReduceKind::kSum:
      return "A(0)";
    case ReduceKind::kMax:
      return "-magi_inf<A>()";
    case ReduceKind::kMin:
      return "magi_inf<A>()";
  }
  return "";
}

// The per-element ops (in SSA order) that `roots` need.
std::vector<int> element_closure(const KernelSpec& s, const std::vector<int>& roots) {
  std::set<int> seen;
  std::function<void(int)> visit = [&](int i) {
    if (s.ops[i].per_row || s.ops[i].kind == KOpKind::kConst || seen.count(i)) return;
    seen.insert(i);
    for (int a : s.ops[i].args) visit(a);
  };
  for (int r : roots) visit(r);
  return {seen.begin(), seen.end()};
}

// The inputs `ops` load at the lane's own column (loads at a column offset are read inline).
std::vector<int> element_inputs(const KernelSpec& s, const std::vector<int>& ops) {
  std::set<int> inputs;
  for (int i : ops) {
    if (s.ops[i].kind == KOpKind::kLoad && s.ops[i].shift == 0) inputs.insert(s.ops[i].input);
  }
  return {inputs.begin(), inputs.end()};
}

bool uses_columns(const KernelSpec& s) {
  for (const KOp& op : s.ops) {
    if (op.kind == KOpKind::kSelect || (op.kind == KOpKind::kLoad && op.shift != 0)) return true;
  }
  return false;
}

std::string comment(const KOp& op) { return op.comment.empty() ? "" : "  // " + op.comment; }

// Statements computing `ops` for lane j, loads reading `load(input)`.
void emit_ops(std::ostream& os, const KernelSpec& s, const std::vector<int>& ops,
              const LoadFn& load, const std::string& indent, bool fast) {
  for (int i : ops) {
    os << indent << "const A " << name(s, i) << " = " << expr(s, i, load, fast) << ";"
       << comment(s.ops[i]) << "\n";
  }
}

std::vector<int> full_output_roots(const KernelSpec& s) {
  std::vector<int> roots;
  for (const auto& o : s.outputs) {
    if (!o.per_row) roots.push_back(o.op);
  }
  return roots;
}

void emit_header_comment(std::ostream& os, const KernelVariant& v) {
  const KernelSpec& s = *v.spec;
  os << "// " << v.symbol() << ": " << schedule_name(s.schedule) << " kernel fusing";
  for (const auto& op : s.fused_ops) os << " " << op;
  os << "\n";
  std::set<std::string> sources(s.sources.begin(), s.sources.end());
  for (const auto& src : sources) os << "//   from " << src << "\n";
  os << "// input access:";
  for (size_t i = 0; i < v.access.size(); ++i)
    os << " in" << i << "=" << static_cast<char>(v.access[i]);
  os << ", vector width " << v.vector_width << "\n";
}

void emit_pointers(std::ostream& os, const KernelSpec& s, const std::string& args) {
  size_t n = s.inputs.size();
  for (size_t i = 0; i < n; ++i) {
    os << "  const " << ctype(s.inputs[i].dtype) << "* __restrict__ in" << i
       << " = static_cast<const " << ctype(s.inputs[i].dtype) << "*>(" << args << "ptr[" << i
       << "]);\n";
  }
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    os << "  " << ctype(s.outputs[k].dtype) << "* __restrict__ out" << k << " = static_cast<"
       << ctype(s.outputs[k].dtype) << "*>(" << args << "ptr[" << n + k << "]);\n";
  }
  os << "  const long long cols = " << args << "cols;\n";
  os << "  const long long rows = " << args << "rows;\n";
  os << "  (void)cols;\n  (void)rows;\n";
}

// ---- shared structure of a row kernel ------------------------------------------------------

// Fills `dest`[V] (default t<i>) from input i through its strides, for the V elements from
// linear index `first`: they lie in one row (the vector width divides the row length), so the
// offset is computed once and the lanes step by the last dim's stride (on the GPU one vector
// load when that stride is 1 and the address aligned).
std::string strided_vector_load(const KernelVariant& v, int i, bool gpu, const std::string& args,
                                const std::string& first, std::string dest = "") {
  const std::string k = std::to_string(i), in = "in" + k;
  if (dest.empty()) dest = "t" + k;
  const std::string off = "magi_offset(" + args + ", " + k + ", " + first + ")";
  const std::string step = args + ".strides[" + k + "][" + args + ".rank - 1]";
  if (gpu) {
    return "magi_load_strided<A, " + std::string(ctype(v.spec->inputs[i].dtype)) + ", V>(" + in +
           ", " + off + ", " + step + ", " + dest + ");";
  }
  return "{ const long long off = " + off + "; const long long step = " + step +
         "; for (int j = 0; j < V; ++j) " + dest + "[j] = magi_to_acc<A>(" + in +
         "[off + j * step]); }";
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
    case AccessClass::kColumn:
      if (gpu) return vec_load + in + " + col0, " + ti + tail;
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in + "[col0 + j]);";
    case AccessClass::kRow:
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in + "[row]);";
    case AccessClass::kScalar:
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in + "[0]);";
    case AccessClass::kStrided:
      return strided_vector_load(v, i, gpu, args, "row * cols + col0");
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
      return "magi_to_acc<A>(" + in + "[magi_offset(" + args + ", " + std::to_string(i) +
             ", row * cols)])";
    default:
      return "magi_to_acc<A>(" + in + "[row])";
  }
}

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

void emit_row_body(std::ostream& os, const KernelVariant& v, const RowTarget& t,
                   const std::string& ind) {
  const KernelSpec& s = *v.spec;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const KOp& op = s.ops[i];
    if (!op.per_row || op.kind == KOpKind::kConst) continue;
    if (op.kind == KOpKind::kLoad) {
      os << ind << "const A r" << i << " = " << load_row_value(v, op.input, t.args) << ";"
         << comment(op) << "\n";
    } else if (op.kind == KOpKind::kReduce) {
      std::vector<int> ops = element_closure(s, {op.args[0]});
      std::string acc = "acc" + std::to_string(i);
      os << ind << "A " << acc << " = " << init(op.reduce) << ";" << comment(op) << "\n";
      const std::vector<int> inputs = element_inputs(s, ops);
      t.column_loop(os, ind, inputs, false, [&](std::ostream& o, const std::string& in2) {
        t.prepare_chunk(o, in2, inputs);
        o << in2 << "for (int j = 0; j < V; ++j) {\n";
        emit_ops(o, s, ops, unshifted(t.element_load), in2 + "  ", t.gpu && s.fast_math);
        o << in2 << "  " << acc << " = " << combine(op.reduce, acc, name(s, op.args[0])) << ";\n";
        o << in2 << "}\n";
      });
      t.reduce(os, ind, op.reduce, acc, "r" + std::to_string(i));
    } else {
      os << ind << "const A r" << i << " = "
         << expr(s, static_cast<int>(i), nullptr, t.gpu && s.fast_math) << ";" << comment(op)
         << "\n";
    }
  }
  std::vector<int> roots = full_output_roots(s);
  if (!roots.empty()) {
    std::vector<int> ops = element_closure(s, roots);
    const std::vector<int> inputs = element_inputs(s, ops);
    t.column_loop(os, ind, inputs, true, [&](std::ostream& o, const std::string& in2) {
      t.prepare_chunk(o, in2, inputs);
      for (size_t k = 0; k < s.outputs.size(); ++k) {
        if (!s.outputs[k].per_row) o << in2 << "A o" << k << "[V];\n";
      }
      o << in2 << "for (int j = 0; j < V; ++j) {\n";
      emit_ops(o, s, ops, unshifted(t.element_load), in2 + "  ", t.gpu && s.fast_math);
      for (size_t k = 0; k < s.outputs.size(); ++k) {
        if (!s.outputs[k].per_row)
          o << in2 << "  o" << k << "[j] = " << name(s, s.outputs[k].op) << ";\n";
      }
      o << in2 << "}\n";
      for (size_t k = 0; k < s.outputs.size(); ++k) {
        if (s.outputs[k].per_row) continue;
        std::string T = ctype(s.outputs[k].dtype);
        if (t.gpu) {
          o << in2 << t.store_guard << "magi_store<A, " << T << ", V>(out" << k
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

// ---- pointwise body --------------------------------------------------------------------------

std::string load_pointwise(const KernelVariant& v, int i, bool gpu, const std::string& args) {
  const KernelSpec& s = *v.spec;
  std::string T = ctype(s.inputs[i].dtype), ti = "t" + std::to_string(i),
              in = "in" + std::to_string(i);
  std::string V = std::to_string(v.vector_width);
  switch (v.access[i]) {
    case AccessClass::kContiguous:
      if (gpu) return "magi_load<A, " + T + ", " + V + ">(" + in + " + base, " + ti + ");";
      return "for (int j = 0; j < V; ++j) " + ti + "[j] = magi_to_acc<A>(" + in + "[base + j]);";
    case AccessClass::kColumn:
      if (gpu) {
        return "magi_load<A, " + T + ", " + V + ">(" + in + " + magi_mod_cols(" + args +
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
      return strided_vector_load(v, i, gpu, args, "base");
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
      offset = "magi_offset(" + args + ", " + std::to_string(i) + ", row_start) + " + c + " * " +
               args + ".strides[" + std::to_string(i) + "][" + args + ".rank - 1]";
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
    const std::string first =
        "row_start + magi_col(col_base + " + std::to_string(op.shift) + "LL, cols - V + 1)";
    const std::string dest = "s" + std::to_string(n);
    os << ind << "A " << dest << "[V];\n";
    if (v.access[op.input] == AccessClass::kStrided) {
      os << ind << strided_vector_load(v, op.input, gpu, args, first, dest) << "\n";
    } else if (gpu) {
      os << ind << "magi_load<A, " << T << ", V>(in" << k << " + " << first << ", " << dest
         << ");\n";
    } else {
      os << ind << "{ const long long off = " << first << "; for (int j = 0; j < V; ++j) " << dest
         << "[j] = magi_to_acc<A>(in" << k << "[off + j]); }\n";
    }
  }
}

void emit_pointwise_body(std::ostream& os, const KernelVariant& v, bool gpu,
                         const std::string& args, const std::string& ind) {
  const KernelSpec& s = *v.spec;
  std::vector<int> ops = element_closure(s, full_output_roots(s));
  for (int i : element_inputs(s, ops)) {
    os << ind << "A t" << i << "[V];\n" << ind << load_pointwise(v, i, gpu, args) << "\n";
  }
  for (size_t k = 0; k < s.outputs.size(); ++k) os << ind << "A o" << k << "[V];\n";
  const bool columns = uses_columns(s);
  if (columns) {  // the V lanes lie in one row (the vector width divides the row length)
    os << ind << "const long long col_base = "
       << (gpu ? "magi_mod_cols(" + args + ", base)" : std::string("base % cols")) << ";\n";
    os << ind << "const long long row_start = base - col_base;\n";
    os << ind << "(void)row_start;\n";
    emit_shifted_vector_loads(os, v, ops, gpu, args, ind);
  }
  os << ind << "for (int j = 0; j < V; ++j) {\n";
  if (columns) os << ind << "  const long long col = col_base + j;\n";
  emit_ops(
      os, s, ops,
      [&](const KOp& op) {
        if (op.shift == 0) return "t" + std::to_string(op.input) + "[j]";
        if (vector_shift(v, op)) return "s" + std::to_string(&op - s.ops.data()) + "[j]";
        return shifted_load(v, op.input, op.shift, args);
      },
      ind + "  ", gpu && s.fast_math);
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    os << ind << "  o" << k << "[j] = " << name(s, s.outputs[k].op) << ";\n";
  }
  os << ind << "}\n";
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    std::string T = ctype(s.outputs[k].dtype);
    if (gpu) {
      os << ind << "magi_store<A, " << T << ", V>(out" << k << " + base, o" << k << ");\n";
    } else {
      os << ind << "for (int j = 0; j < V; ++j) out" << k << "[base + j] = MagiStore<" << T
         << ">::from(o" << k << "[j]);\n";
    }
  }
}

// ---- column kernels ---------------------------------------------------------------------------

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
                        bool fast) {
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const KOp& op = s.ops[i];
    if (!op.per_row || op.kind == KOpKind::kConst || (!acc && !p.invariant[i])) continue;
    os << ind << "const A r" << i << " = ";
    if (op.kind == KOpKind::kLoad) {
      os << "t" << op.input << "[j]";
    } else if (op.kind == KOpKind::kReduce) {
      os << acc(static_cast<int>(i));
    } else {
      os << expr(s, static_cast<int>(i), nullptr, fast);
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
  emit_column_values(os, s, p, nullptr, ind + "  ", gpu && s.fast_math);
  emit_ops(os, s, p.element, unshifted([](int i) { return "t" + std::to_string(i) + "[j]"; }),
           ind + "  ", gpu && s.fast_math);
  for (int r : p.reductions) {
    os << ind << "  " << acc(r) << " = "
       << combine(s.ops[r].reduce, acc(r), name(s, s.ops[r].args[0])) << ";\n";
  }
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    if (!s.outputs[k].per_row) {
      os << ind << "  o" << k << "[j] = " << name(s, s.outputs[k].op) << ";\n";
    }
  }
  os << ind << "}\n";
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    if (s.outputs[k].per_row) continue;
    std::string T = ctype(s.outputs[k].dtype);
    if (gpu) {
      os << ind << "magi_store<A, " << T << ", V>(out" << k << " + row * cols + col0, o" << k
         << ");\n";
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
  emit_column_values(os, s, p, acc, ind + "  ", gpu && s.fast_math);
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
      os << ind << "magi_store<A, " << T << ", V>(out" << k << " + col0, o" << k << ");\n";
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

void check_variant(const KernelVariant& v) {
  MAGI_ASSERT(v.spec != nullptr, "variant without a spec");
  MAGI_ASSERT(v.access.size() == v.spec->inputs.size(), "variant has ", v.access.size(),
              " access classes for ", v.spec->inputs.size(), " inputs");
  MAGI_ASSERT(v.spec->inputs.size() + v.spec->outputs.size() <= 16,
              "kernel with more than 16 inputs and outputs");
}

}  // namespace

// Lane loops index the per-thread register arrays (c<i>[k][j], t<i>[j], o<k>[j]); unless they
// are fully unrolled those arrays live in local memory, which costs most of the bandwidth.
static std::string unroll_lane_loops(std::string code) {
  const std::string loop = "for (int j = 0; j < V; ++j)";
  const std::string pragma = "_Pragma(\"unroll\") ";
  for (size_t p = code.find(loop); p != std::string::npos;
       p = code.find(loop, p + pragma.size() + loop.size())) {
    code.insert(p, pragma);
  }
  return code;
}

namespace {
int env_int(const char* name, int fallback, int lo, int hi) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  MAGI_CHECK(*end == '\0' && v >= lo && v <= hi, name, "=", text, " is not an integer in [", lo,
             ", ", hi, "]");
  return static_cast<int>(v);
}
}  // namespace

int row_chunks_per_thread() {
  static const int chunks = env_int("MAGI_ROW_CHUNKS", 4, 1, 16);
  return chunks;
}

int pointwise_unroll() {
  static const int unroll = env_int("MAGI_POINTWISE_UNROLL", 1, 1, 8);
  return unroll;
}

char row_column_loads() {
  static const char mode = [] {
    const char* text = std::getenv("MAGI_ROW_COLUMN_LOADS");
    std::string m = text == nullptr || *text == '\0' ? "late" : text;
    MAGI_CHECK(m == "block" || m == "row" || m == "late", "MAGI_ROW_COLUMN_LOADS=", m,
               " is not one of block, row, late");
    return m[0];
  }();
  return mode;
}

int max_threads_per_block() {
  static const int threads = [] {
    int t = env_int("MAGI_MAX_BLOCK_THREADS", 256, 32, 1024);
    MAGI_CHECK((t & (t - 1)) == 0, "MAGI_MAX_BLOCK_THREADS=", t, " is not a power of two");
    return t;
  }();
  return threads;
}

int stream_threads_per_block() {
  static const int threads = [] {
    int t = env_int("MAGI_ROW_STREAM_THREADS", 512, 32, 1024);
    MAGI_CHECK((t & (t - 1)) == 0, "MAGI_ROW_STREAM_THREADS=", t, " is not a power of two");
    return t;
  }();
  return threads;
}

int stream_chunks_per_thread() {
  static const int chunks = env_int("MAGI_ROW_STREAM_CHUNKS", 2, 1, 16);
  return chunks;
}

bool row_stream_hints() {
  static const bool on = env_int("MAGI_ROW_STREAM_HINTS", 1, 0, 1) == 1;
  return on;
}

namespace {
// The loop over the rows of a GPU row kernel: one row per block, or (rows_in_warps) blockDim.y
// rows per block, each row's lanes along x.
void emit_gpu_row_loop(std::ostream& os, bool rows_in_warps, const std::string& ind) {
  if (!rows_in_warps) {
    os << ind << "for (long long row = blockIdx.x; row < a.rows; row += gridDim.x) {\n";
    return;
  }
  os << ind << "for (long long row0 = (long long)blockIdx.x * blockDim.y; row0 < a.rows;\n"
     << ind << "     row0 += (long long)gridDim.x * blockDim.y) {\n"
     << ind << "  // Every lane runs every iteration (its row's shuffles need it): lanes past the\n"
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
  const int block_threads = v.streamed_rows ? stream_threads_per_block() : max_threads_per_block();
  os << "extern \"C\" __global__ void __launch_bounds__(" << block_threads << ") " << v.symbol()
     << "(const MagiArgs a) {\n";
  os << "  typedef " << (s.use_double ? "double" : "float") << " A;\n";
  os << "  constexpr int V = " << v.vector_width << ";\n";
  emit_pointers(os, s, "a.");
  if (s.schedule == Schedule::kColumn) {
    emit_column_cuda(os, v);
    os << "}\n";
    return unroll_lane_loops(os.str());
  }
  if (s.schedule == Schedule::kPointwise) {
    os << "  const long long vectors = a.numel / V;\n";
    const int unroll = pointwise_unroll();
    if (unroll == 1) {
      os << "  for (long long vi = blockIdx.x * (long long)blockDim.x + threadIdx.x; vi < "
            "vectors;\n       vi += (long long)gridDim.x * blockDim.x) {\n";
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
  os << "  constexpr int K = "
     << (v.streamed_rows ? stream_chunks_per_thread() : row_chunks_per_thread()) << ";\n";
  os << "  __shared__ A scratch[32];\n";
  // When a row fits (cols <= threads * V * K), each thread owns the same K chunks of V columns
  // in every row: inputs with one value per element are read once per row into registers, in
  // their storage type (c<i>). Inputs with one value per column (a norm's weight) are read
  // where used (row_column_loads() 'l', the default: no registers held across reductions), or
  // into registers w<i> with each row ('r') or once per block ('b').
  auto cached_input = [&v](int i) {
    return v.access[i] == AccessClass::kContiguous || v.access[i] == AccessClass::kStrided;
  };
  const char column_mode = row_column_loads();
  std::vector<int> row_inputs, column_inputs;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    if (s.inputs[i].per_row) continue;
    if (cached_input(static_cast<int>(i))) row_inputs.push_back(static_cast<int>(i));
    if (v.access[i] == AccessClass::kColumn && column_mode != 'l') {
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
      case AccessClass::kColumn:
        return "magi_load_raw(" + in + " + col0, " + slot + ");";
      default:  // strided: as strided_vector_load
        return "{ const long long off = magi_offset(a, " + std::to_string(i) +
               ", row * cols + col0); const long long step = a.strides[" + std::to_string(i) +
               "][a.rank - 1]; for (int j = 0; j < V; ++j) " + slot + ".v[j] = " + in +
               "[off + j * step]; }";
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
        if (row_stream_hints()) {
          const char* policy =
              v.access[i] == AccessClass::kContiguous && output_pass ? "drop" : "keep";
          loads << ind << "      magi_load_raw_hint(" << in << at << ", " << slot << ", " << policy
                << ");\n";
        } else {
          loads << ind << "      magi_load_raw(" << in << at << ", " << slot << ");\n";
        }
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
    t.element_load = [&v, cached, cached_input, column_mode, streamed](int i) {
      if (cached && cached_input(i)) return "magi_to_acc<A>(c" + std::to_string(i) + "[k].v[j])";
      if (cached && v.access[i] == AccessClass::kColumn && column_mode != 'l')
        return "magi_to_acc<A>(w" + std::to_string(i) + "[k].v[j])";
      if (!cached && streamed(i)) return "magi_to_acc<A>(s" + std::to_string(i) + "[k].v[j])";
      return "t" + std::to_string(i) + "[j]";
    };
    t.prepare_chunk = [&v, cached, cached_input, column_mode, streamed](
                          std::ostream& o, const std::string& ind, const std::vector<int>& inputs) {
      for (int i : inputs) {
        if (cached && cached_input(i)) continue;
        if (cached && v.access[i] == AccessClass::kColumn && column_mode != 'l') continue;
        if (!cached && streamed(i)) continue;
        o << ind << "A t" << i << "[V];\n" << ind << load_chunk(v, i, true, "a") << "\n";
      }
    };
    return t;
  };
  if (v.streamed_rows) {
    // The launch picks this layout when cols > blockDim.x * V * K.
    os << "  // Rows longer than the block holds in registers: streamed once per pass.\n";
    if (row_stream_hints()) {
      os << "  const unsigned long long keep = magi_l2_evict_last(), drop = "
            "magi_l2_evict_first();\n  (void)keep;\n  (void)drop;\n";
    }
    emit_gpu_row_loop(os, v.rows_in_warps, "  ");
    emit_row_body(os, v, make_target(false), "    ");
    os << "  }\n}\n";
    return unroll_lane_loops(os.str());
  }
  // The launch picks this layout when cols <= blockDim.x * V * K.
  os << "  // Rows held in registers: each row read once.\n";
  std::ostringstream column_loads;
  if (column_mode == 'b') {
    for (int i : column_inputs) {
      os << "  " << raw_type(i) << " w" << i << "[K];\n";
      column_loads << "      " << raw_load(i, "w" + std::to_string(i) + "[k]") << "\n";
    }
    if (!column_inputs.empty()) chunk_loop(os, "  ", column_loads.str());
  }
  emit_gpu_row_loop(os, v.rows_in_warps, "  ");
  std::ostringstream row_loads;
  if (column_mode == 'r') {
    for (int i : column_inputs) {
      os << "    " << raw_type(i) << " w" << i << "[K];\n";
      row_loads << "        " << raw_load(i, "w" + std::to_string(i) + "[k]") << "\n";
    }
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
  emit_pointers(os, s, "a->");
  if (s.schedule == Schedule::kColumn) {
    emit_column_cpp(os, v);
    os << "}\n";
    return os.str();
  }
  if (s.schedule == Schedule::kPointwise) {
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
  os << "#pragma omp parallel for schedule(static) if (a->rows * cols > 32768)\n";
  os << "  for (long long row = 0; row < a->rows; ++row) {\n";
  emit_row_body(os, v, t, "    ");
  os << "  }\n}\n";
  return os.str();
}

}  // namespace magi::codegen
