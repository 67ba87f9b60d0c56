// Pointwise bodies on packed bf16 pairs (KernelVariant::packed_bf16): two elements per 32-bit
// word, loaded and stored as they are in memory, with one bf16x2 instruction per product or
// sum of a pair instead of unpacking each element to float, computing, rounding and packing.
//
// The result is bit for bit what the float body computes, for the ops allowed here, except for
// the encoding of NaNs (the float body's stores make every NaN 0x7fff; here a NaN loaded,
// negated or selected keeps its bits). The float product of two bf16 values is exact (8 + 8
// significant bits), so rounding it to bf16 rounds once, as fma.rn.bf16x2 does. Their float
// sum is rounded twice, to float and then to bf16, which gives the once-rounded sum because
// float has at least 2 x 8 + 2 significant bits. Negation flips the sign bits, a
// select picks whole words (lane-uniform columns), a constant that is a bf16 value (a pad's
// zero, a scale of 0.5) is that value twice, and a rounding of a bf16 value changes nothing.
// Anything else (other constants, other functions, a product read before its rounding) keeps
// the float body.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "magi/common/error.h"
#include "printer_parts.h"

namespace magi::codegen::printer {

namespace {

bool is_bf16_round(const KOp& op) {
  return op.kind == KOpKind::kRound && op.round_to == c10::ScalarType::BFloat16;
}

bool is_pair_arithmetic(const KOp& op) {
  return op.kind == KOpKind::kBinary && (op.fn == "mul" || op.fn == "add" || op.fn == "sub");
}

// The word of constant `c` as a bf16 pair ("0x3f003f00u" for 0.5), or "" when its value is no
// bf16 value (then the float body's product with it is not a bf16 product).
std::string const_words(const KOp& c) {
  if (c.kind != KOpKind::kConst || !c.fn.empty() || std::isnan(c.value)) return "";
  const float f = static_cast<float>(c.value);
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof(bits));
  if (static_cast<double>(f) != c.value || (bits & 0xffffu) != 0) return "";
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08xu", (bits & 0xffff0000u) | (bits >> 16));
  return text;
}

// Whether input load `op` can be read as whole bf16 vectors.
bool whole_vector_load(const KernelVariant& v, const KOp& op) {
  const int i = op.input;
  if (v.spec->inputs[i].dtype != c10::ScalarType::BFloat16 || v.spec->inputs[i].per_row) {
    return false;
  }
  const AccessClass a = v.access[i];
  const bool whole = a == AccessClass::kContiguous || a == AccessClass::kColumn ||
                     (a == AccessClass::kStrided && v.strided_vectors);
  if (!whole) return false;
  return op.shift == 0 || (a != AccessClass::kColumn && vector_shift(v, op));
}

}  // namespace

bool packed_bf16_body_possible(const KernelVariant& v) {
  const KernelSpec& s = *v.spec;
  if (s.schedule != Schedule::kPointwise || s.use_double || v.vector_width != 8) return false;
  for (const KOutput& o : s.outputs) {
    if (o.per_row || o.dtype != c10::ScalarType::BFloat16) return false;
  }
  const std::vector<int> ops = element_closure(s, full_output_roots(s));
  if (uses_columns(s) && !lane_uniform_columns(v, ops)) return false;
  const std::set<int> in_body(ops.begin(), ops.end());
  std::set<int> stored;
  for (const KOutput& o : s.outputs) stored.insert(stored_op(s, o));
  // exact: the op's value is a bf16 value (a word pair); pending: a product or sum of two
  // such values, rounded by the op that reads it (a bf16 rounding, or the store).
  std::set<int> exact, pending;
  for (int n : ops) {
    const KOp& op = s.ops[n];
    auto exact_args = [&] {
      for (int a : op.args) {
        if (!exact.count(a) && const_words(s.ops[a]).empty()) return false;
      }
      return true;
    };
    if (op.kind == KOpKind::kLoad) {
      if (!whole_vector_load(v, op)) return false;
      exact.insert(n);
    } else if (op.kind == KOpKind::kUnary && op.fn == "neg" && exact_args()) {
      exact.insert(n);
    } else if (op.kind == KOpKind::kSelect && exact_args()) {
      exact.insert(n);
    } else if (is_bf16_round(op) && (exact.count(op.args[0]) || pending.count(op.args[0]))) {
      exact.insert(n);
    } else if (is_pair_arithmetic(op) && exact_args()) {
      pending.insert(n);
    } else {
      return false;
    }
  }
  // A pending value may only be rounded: read by a bf16 rounding, or stored as bf16.
  for (int n : ops) {
    for (int a : s.ops[n].args) {
      if (pending.count(a) && !is_bf16_round(s.ops[n])) return false;
    }
  }
  for (int n : stored) {
    if (!exact.count(n) && !pending.count(n)) return false;
  }
  return true;
}

void emit_packed_bf16_body(std::ostream& os, const KernelVariant& v, const std::string& args,
                           const std::string& ind) {
  MAGI_ASSERT(packed_bf16_body_possible(v), v.symbol(), ": not a packed bf16 body");
  const KernelSpec& s = *v.spec;
  const std::vector<int> ops = element_closure(s, full_output_roots(s));
  if (pointwise_needs_rows(v)) emit_pointwise_rows(os, v, true, args, ind, false);
  // Whole-vector loads: one per input read unshifted, one per shifted load (zero outside the
  // row: a cat's select discards it).
  std::map<int, std::string> words;  // load op -> its word array
  std::set<int> loaded;
  for (int n : ops) {
    const KOp& op = s.ops[n];
    if (op.kind != KOpKind::kLoad) continue;
    const std::string k = std::to_string(op.input), in = "in" + k;
    if (op.shift == 0) {
      words[n] = "u" + k;
      if (!loaded.insert(op.input).second) continue;
      std::string at;
      switch (v.access[op.input]) {
        case AccessClass::kColumn:
          at = in + " + magi_mod_cols(" + args + ", base)";
          break;
        case AccessClass::kStrided:
          at = in + " + " + strided_offset(v, op.input, args, "col_base");
          break;
        default:
          at = in + " + base";
      }
      os << ind << "unsigned u" << k << "[V / 2];\n"
         << ind << "magi_load_words<true>(" << at << ", u" << k << ");\n";
      continue;
    }
    const std::string dest = "s" + std::to_string(n);
    words[n] = dest;
    const std::string shifted = "col_base + " + std::to_string(op.shift) + "LL";
    const std::string offset_shift =
        "col_base + " + std::to_string(op.shift) + (v.narrow_index ? "" : "LL");
    const std::string at = v.access[op.input] == AccessClass::kStrided
                               ? in + " + " + strided_offset(v, op.input, args, offset_shift)
                               : in + " + row_start + " + offset_shift;
    os << ind << "unsigned " << dest << "[V / 2] = {};\n"
       << ind << "if (" << shifted << " >= 0 && " << shifted << " <= cols - V) {\n"
       << ind << "  magi_load_words<true>(" << at << ", " << dest << ");\n"
       << ind << "}\n";
  }
  for (size_t k = 0; k < s.outputs.size(); ++k) os << ind << "unsigned o" << k << "[V / 2];\n";
  if (uses_columns(s)) os << ind << "const " << index_type(v) << " col = col_base;\n";
  os << ind << "_Pragma(\"unroll\") for (int q = 0; q < V / 2; ++q) {\n";
  const std::string in2 = ind + "  ";
  for (int n : ops) {
    const KOp& op = s.ops[n];
    auto a = [&](size_t k) {
      const std::string c = const_words(s.ops[op.args[k]]);
      return c.empty() ? name(s, op.args[k]) : c;
    };
    std::string e;
    switch (op.kind) {
      case KOpKind::kLoad:
        e = words[n] + "[q]";
        break;
      case KOpKind::kUnary:  // neg
        e = "(" + a(0) + " ^ 0x80008000u)";
        break;
      case KOpKind::kSelect: {  // whole words: every lane of the vector takes the same piece
        const std::string c = op.shift == 0 ? "col" : "(col + " + std::to_string(op.shift) + "LL)";
        e = a(op.bounds.size());
        for (size_t k = op.bounds.size(); k-- > 0;) {  // 32-bit compares where bounds fit
          const bool wide = op.bounds[k] > 0x7fffffffLL;
          e = "(" + c + " < " + std::to_string(op.bounds[k]) + (wide ? "LL ? " : " ? ") + a(k) +
              " : " + e + ")";
        }
        break;
      }
      case KOpKind::kRound:  // of a bf16 value, or of a pair op that rounded already
        e = a(0);
        break;
      default:  // mul, add, sub
        e = "magi_bf16x2_" + op.fn + "(" + a(0) + ", " + a(1) + ")";
    }
    os << in2 << "const unsigned " << name(s, n) << " = " << e << ";" << comment(op) << "\n";
  }
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    os << in2 << "o" << k << "[q] = " << name(s, stored_op(s, s.outputs[k])) << ";\n";
  }
  os << ind << "}\n";
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    os << ind << "magi_store16" << (s.outputs[k].keep ? "<true>" : "") << "(out" << k
       << " + base, o" << k << "[0], o" << k << "[1], o" << k << "[2], o" << k << "[3]);\n";
  }
}

}  // namespace magi::codegen::printer
