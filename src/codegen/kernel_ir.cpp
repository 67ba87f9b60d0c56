// KernelSpec printing, fingerprints and variant keys.
#include "magi/codegen/kernel_ir.h"

#include <sstream>

namespace magi::codegen {
namespace {

const char* kop_name(KOpKind k) {
  switch (k) {
#define MAGI_KOP_NAME(name, text) \
  case KOpKind::k##name:          \
    return text;
    MAGI_KOP_KINDS(MAGI_KOP_NAME)
#undef MAGI_KOP_NAME
  }
  return "?";
}

const char* reduce_name(ReduceKind r) {
  switch (r) {
    case ReduceKind::kSum:
      return "sum";
    case ReduceKind::kMax:
      return "max";
    case ReduceKind::kMin:
      return "min";
  }
  return "?";
}

void print_body(std::ostream& os, const KernelSpec& s) {
  os << schedule_name(s.schedule) << (s.use_double ? " f64" : " f32") << "\n";
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    os << "in" << i << ": " << c10::toString(s.inputs[i].dtype)
       << (s.inputs[i].per_row ? " row" : "") << "\n";
  }
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const KOp& op = s.ops[i];
    os << "v" << i << (op.per_row ? "r" : "") << " = " << kop_name(op.kind);
    switch (op.kind) {
      case KOpKind::kLoad:
        os << " in" << op.input;
        if (op.shift != 0) os << " col" << (op.shift > 0 ? "+" : "") << op.shift;
        break;
      case KOpKind::kSelect:
        os << " col" << (op.shift >= 0 ? "+" : "") << op.shift << " <";
        for (int64_t b : op.bounds) os << " " << b;
        break;
      case KOpKind::kConst: {
        std::ostringstream v;
        v.precision(17);
        v << op.value;
        os << " " << (op.fn.empty() ? v.str() : op.fn);
        break;
      }
      case KOpKind::kRound:
        os << " " << c10::toString(op.round_to);
        break;
      case KOpKind::kReduce:
        os << " " << reduce_name(op.reduce);
        break;
      default:
        os << " " << op.fn;
        break;
    }
    for (int a : op.args) os << " v" << a;
    if (!op.comment.empty()) os << "  # " << op.comment;
    os << "\n";
  }
  for (size_t i = 0; i < s.outputs.size(); ++i) {
    os << "out" << i << ": " << c10::toString(s.outputs[i].dtype)
       << (s.outputs[i].per_row ? " row" : "") << (s.outputs[i].keep ? " keep" : "") << " = v"
       << s.outputs[i].op << "\n";
  }
}

}  // namespace

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kPointwise:
      return "pointwise";
    case Schedule::kRow:
      return "row";
    case Schedule::kColumn:
      return "column";
  }
  return "?";
}

std::string KernelSpec::str() const {
  std::ostringstream os;
  os << "kernel " << name << "\n";
  print_body(os, *this);
  return os.str();
}

std::string KernelVariant::symbol() const {
  std::string s = spec->name + "_";
  for (AccessClass a : access) s += static_cast<char>(a);
  s += "_v" + std::to_string(vector_width) + (rows_in_warps ? "_w" : "") +
       (streamed_rows ? "_s" : "") + (wide_rows ? "_h" : "") + (row_loop ? "" : "_g");
  if (index_rank > 0) s += "_r" + std::to_string(index_rank) + (narrow_index ? "n" : "");
  if (unroll > 1) s += "_u" + std::to_string(unroll);
  if (strided_vectors) s += "_sv";
  if (packed_bf16) s += "_p2";
  return s;
}

}  // namespace magi::codegen
