// Printer pieces both targets share: C types, names, scalar expressions, the op lists each pass
// needs, the header comment and the pointer declarations of a kernel.
#include <cstdio>
#include <functional>
#include <set>

#include "magi/common/error.h"
#include "magi_kernel_abi.h"
#include "printer_parts.h"

namespace magi::codegen::printer {

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

LoadFn unshifted(std::function<std::string(int)> load) {
  return [load = std::move(load)](const KOp& op) {
    MAGI_ASSERT(op.shift == 0, "a load at a column offset in a reduction kernel");
    return load(op.input);
  };
}

std::string closed_form_power(const KernelSpec& s, const KOp& op, const std::string& x) {
  const KOp& e = s.ops[op.args[1]];
  if (e.kind != KOpKind::kConst || !e.fn.empty()) return "";
  if (e.value == 2.0) return "(" + x + " * " + x + ")";
  if (e.value == 1.0) return x;
  if (e.value == 0.5) return "sqrt(" + x + ")";
  if (e.value == -1.0) return "(A(1) / " + x + ")";
  if (e.value == -0.5) return "magi_rsqrt(" + x + ")";
  if (e.value == 3.0) return "(" + x + " * " + x + " * " + x + ")";
  return "";
}

std::string expr(const KernelSpec& s, int i, const LoadFn& load, MathForms forms) {
  const KOp& op = s.ops[i];
  const bool fast = forms == MathForms::kDeviceFast;
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
        // A bound that fits 32 bits is an int literal: a 32-bit column compares in 32 bits.
        const bool wide = op.bounds[k] > 0x7fffffffLL;
        e = "(" + c + " < " + std::to_string(op.bounds[k]) + (wide ? "LL ? " : " ? ") +
            a(static_cast<int>(k)) + " : " + e + ")";
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
      if (forms == MathForms::kHost && f == "exp") return "magi_exp(" + a(0) + ")";
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
        const std::string closed = closed_form_power(s, op, a(0));
        return closed.empty() ? "pow(" + a(0) + ", " + a(1) + ")" : closed;
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

std::string omp_reduction(ReduceKind r) {
  switch (r) {
    case ReduceKind::kSum:
      return "+";
    case ReduceKind::kMax:
      return "magi_max";
    case ReduceKind::kMin:
      return "magi_min";
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

std::string store_call(const KernelSpec& s, int k) {
  const KOutput& o = s.outputs[static_cast<size_t>(k)];
  return std::string("magi_store<A, ") + ctype(o.dtype) + ", V" + (o.keep ? ", true" : "") + ">";
}

std::string comment(const KOp& op) { return op.comment.empty() ? "" : "  // " + op.comment; }

// Statements computing `ops` for lane j, loads reading `load(input)`.
void emit_ops(std::ostream& os, const KernelSpec& s, const std::vector<int>& ops,
              const LoadFn& load, const std::string& indent, MathForms forms) {
  for (int i : ops) {
    os << indent << "const A " << name(s, i) << " = " << expr(s, i, load, forms) << ";"
       << comment(s.ops[i]) << "\n";
  }
}

int stored_op(const KernelSpec& s, const KOutput& o) {
  const KOp& op = s.ops[o.op];
  const bool half = o.dtype == c10::ScalarType::BFloat16 || o.dtype == c10::ScalarType::Half;
  return half && op.kind == KOpKind::kRound && op.round_to == o.dtype ? op.args[0] : o.op;
}

std::vector<int> full_output_roots(const KernelSpec& s) {
  std::vector<int> roots;
  for (const auto& o : s.outputs) {
    if (!o.per_row) roots.push_back(stored_op(s, o));
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

void check_variant(const KernelVariant& v) {
  MAGI_ASSERT(v.spec != nullptr, "variant without a spec");
  MAGI_ASSERT(v.access.size() == v.spec->inputs.size(), "variant has ", v.access.size(),
              " access classes for ", v.spec->inputs.size(), " inputs");
  MAGI_ASSERT(v.spec->inputs.size() + v.spec->outputs.size() <= MAGI_MAX_KERNEL_ARGS,
              "kernel with more than ", MAGI_MAX_KERNEL_ARGS, " inputs and outputs");
  MAGI_ASSERT(!v.strided_vectors || (v.vector_width > 1 && v.spec->schedule != Schedule::kColumn),
              v.symbol(), ": whole strided vectors in a column kernel or at width 1");
  MAGI_ASSERT(
      !v.wide_rows || (v.spec->schedule == Schedule::kRow && !v.streamed_rows && !v.rows_in_warps),
      v.symbol(), ": wide rows are a layout of row kernels holding one row per block");
}

// Lane loops index the per-thread register arrays (c<i>[k][j], t<i>[j], o<k>[j]); unless they
// are fully unrolled those arrays live in local memory, which costs most of the bandwidth.
std::string unroll_lane_loops(std::string code) {
  const std::string loop = "for (int j = 0; j < V; ++j)";
  const std::string pragma = "_Pragma(\"unroll\") ";
  for (size_t p = code.find(loop); p != std::string::npos;
       p = code.find(loop, p + pragma.size() + loop.size())) {
    code.insert(p, pragma);
  }
  return code;
}

}  // namespace magi::codegen::printer
