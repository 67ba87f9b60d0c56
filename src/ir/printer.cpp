// Graph printer. Constant and list nodes are not printed on their own lines: they appear
// inline where they are used, as literals do in an FX graph.
#include "magi/ir/printer.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <utility>
#include <vector>

#include "magi/common/error.h"

namespace magi::ir {
namespace {

std::string python_dtype_name(c10::ScalarType t) {
  using c10::ScalarType;
  switch (t) {
    case ScalarType::Float:
      return "torch.float32";
    case ScalarType::Double:
      return "torch.float64";
    case ScalarType::Half:
      return "torch.float16";
    case ScalarType::BFloat16:
      return "torch.bfloat16";
    case ScalarType::Long:
      return "torch.int64";
    case ScalarType::Int:
      return "torch.int32";
    case ScalarType::Short:
      return "torch.int16";
    case ScalarType::Char:
      return "torch.int8";
    case ScalarType::Byte:
      return "torch.uint8";
    case ScalarType::Bool:
      return "torch.bool";
    default:
      return std::string("torch.") + c10::toString(t);
  }
}

std::string format_double(double x) {
  // Shortest text that reads back to the same double, like Python's repr.
  for (int precision = 6; precision <= 17; ++precision) {
    std::ostringstream os;
    os << std::setprecision(precision) << x;
    if (std::stod(os.str()) == x) {
      std::string s = os.str();
      if (s.find_first_of(".eE") == std::string::npos && s != "inf" && s != "-inf" && s != "nan") {
        s += ".0";
      }
      return s;
    }
  }
  return std::to_string(x);
}

std::string format_ivalue(const c10::IValue& v, ValueKind kind) {
  if (v.isNone()) return "None";
  switch (kind) {
    case ValueKind::kDtype:
      return python_dtype_name(static_cast<c10::ScalarType>(v.toInt()));
    case ValueKind::kLayout:
      return v.toInt() == 0 ? "torch.strided" : "torch.layout(" + std::to_string(v.toInt()) + ")";
    case ValueKind::kMemoryFormat: {
      static const char* kNames[] = {"torch.contiguous_format", "torch.preserve_format",
                                     "torch.channels_last", "torch.channels_last_3d"};
      int64_t i = v.toInt();
      return (i >= 0 && i < 4) ? kNames[i] : "memory_format(" + std::to_string(i) + ")";
    }
    default:
      break;
  }
  if (v.isBool()) return v.toBool() ? "True" : "False";
  if (v.isInt()) return std::to_string(v.toInt());
  if (v.isDouble()) return format_double(v.toDouble());
  if (v.isString()) return "'" + v.toStringRef() + "'";
  if (v.isDevice()) return "device('" + v.toDevice().str() + "')";
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    std::string s = "tensor(" + dtype_short_name(t.scalar_type()) + "[";
    for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
    const bool elsewhere = t.defined() && !t.device().is_cpu();  // undefined: no device
    return s + "]" + (elsewhere ? "@" + t.device().str() : "") + ")";
  }
  if (v.isList()) {
    std::string s = "[";
    auto items = v.toListRef();
    ValueKind elem = kind == ValueKind::kIntList ? ValueKind::kInt : ValueKind::kOther;
    for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + format_ivalue(items[i], elem);
    return s + "]";
  }
  if (v.isScalar()) {
    auto s = v.toScalar();
    return s.isIntegral(false) ? std::to_string(s.toLong()) : format_double(s.toDouble());
  }
  return "<" + v.tagKind() + ">";
}

std::string type_annotation(const Value* v) {
  if (v->kind() == ValueKind::kInt && v->sym() && !v->sym()->is_constant()) {
    return "int(" + v->sym()->str() + ")";
  }
  return v->type_str();
}

std::string join_operands(const std::vector<Value*>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + format_operand(values[i]);
  return s;
}

}  // namespace

std::string format_operand(const Value* value) {
  const Node* p = value->producer();
  if (p->kind() == NodeKind::kConstant) return format_ivalue(p->constant(), value->kind());
  if (p->kind() == NodeKind::kMakeList) return "[" + join_operands(p->inputs()) + "]";
  return "%" + value->name();
}

void print(std::ostream& os, const Graph& graph, const PrintOptions& options) {
  os << "graph(";
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    const Value* v = graph.inputs()[i];
    os << (i ? ", " : "") << "%" << v->name();
    if (options.show_types) os << ": " << type_annotation(v);
  }
  os << "):\n";
  // Lines are collected first so that all source comments start in one column, the one after
  // the longest commented line.
  std::vector<std::pair<std::string, std::string>> lines;  // (text, source comment)
  size_t comment_column = 0;
  for (const Node* node : graph.nodes()) {
    std::ostringstream line;
    switch (node->kind()) {
      case NodeKind::kInput:
      case NodeKind::kConstant:
      case NodeKind::kMakeList:
        continue;
      case NodeKind::kOutput:
        line << "return (" << join_operands(node->inputs()) << ")";
        break;
      default: {
        for (size_t i = 0; i < node->outputs().size(); ++i) {
          const Value* out = node->outputs()[i];
          line << (i ? ", " : "") << "%" << out->name();
          if (options.show_types) line << ": " << type_annotation(out);
        }
        if (!node->outputs().empty()) line << " = ";
        if (node->kind() == NodeKind::kGetItem) {
          line << format_operand(node->input(0)) << "[" << node->item_index() << "]";
        } else {
          line << node->op_name() << "(" << join_operands(node->inputs()) << ")";
          if (node->chunk_rows() > 0) {
            line << " in chunks of " << node->chunk_rows() << " rows of";
            for (size_t i = 0; i < node->chunked_inputs().size(); ++i) {
              if (node->chunked_inputs()[i]) line << " %" << node->input(i)->name();
            }
          }
        }
      }
    }
    std::string source = options.show_source ? node->provenance().source : "";
    if (!source.empty()) comment_column = std::max(comment_column, line.str().size());
    lines.emplace_back(line.str(), std::move(source));
  }
  for (auto& [text, source] : lines) {
    if (!source.empty()) text += std::string(comment_column - text.size(), ' ') + "  # " + source;
    os << "  " << text << "\n";
  }
  std::vector<Graph*> pieces = graph.pieces();
  for (size_t i = 0; i < pieces.size(); ++i) {
    os << "\npiece_" << i << " = ";
    print(os, *pieces[i], options);
  }
}

std::string to_string(const Graph& graph, const PrintOptions& options) {
  std::ostringstream os;
  print(os, graph, options);
  return os.str();
}

}  // namespace magi::ir
