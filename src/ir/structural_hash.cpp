// structural_key: a canonical serialisation of a graph's structure.
#include "magi/ir/structural_hash.h"

#include <ATen/core/Tensor.h>

#include <cstring>
#include <functional>
#include <sstream>
#include <unordered_map>

namespace magi::ir {
namespace {

class KeyWriter {
 public:
  std::string run(const Graph& graph) {
    for (const Node* node : graph.nodes()) write_node(*node);
    return os_.str();
  }

 private:
  void write_node(const Node& node) {
    os_ << node_kind_name(node.kind());
    switch (node.kind()) {
      case NodeKind::kAtenOp:
      case NodeKind::kCustomOp:
        os_ << ' ' << node.op_name();
        break;
      case NodeKind::kSymArith:
        os_ << ' ' << sym_op_name(node.sym_op());
        break;
      case NodeKind::kGetItem:
        os_ << ' ' << node.item_index();
        break;
      case NodeKind::kConstant:
        os_ << ' ';
        write_ivalue(node.constant(), node);
        break;
      case NodeKind::kCallPiece:
      case NodeKind::kFusion:
        os_ << " {" << structural_key(*node.piece()) << '}';
        if (node.chunk_rows() > 0) {
          os_ << " chunks " << node.chunk_rows() << ':';
          for (bool c : node.chunked_inputs()) os_ << (c ? '1' : '0');
        }
        break;
      default:
        break;
    }
    os_ << " (";
    for (const Value* in : node.inputs()) {
      auto it = ids_.find(in);
      os_ << (it == ids_.end() ? -1 : it->second) << ',';
    }
    os_ << ") ->";
    for (const Value* out : node.outputs()) {
      ids_[out] = static_cast<int64_t>(ids_.size());
      os_ << ' ' << value_kind_name(out->kind());
      if (const auto& t = out->tensor_type()) write_tensor_type(*t);
      if (const auto& s = out->sym()) {
        os_ << '=';
        write_sym(*s);
      }
    }
    os_ << '\n';
  }

  void write_tensor_type(const TensorType& t) {
    os_ << '<' << dtype_short_name(t.dtype) << '@' << t.device.str() << '[';
    for (const auto& s : t.sizes) {
      write_sym(s);
      os_ << ',';
    }
    os_ << "]{";
    for (const auto& s : t.strides) {
      write_sym(s);
      os_ << ',';
    }
    os_ << '}' << (t.requires_grad ? "g" : "") << '>';
  }

  void write_sym(const SymExpr& e) {
    switch (e.op()) {
      case SymExpr::Op::kConst:
        os_ << e.constant_value();
        return;
      case SymExpr::Op::kSymbol: {
        auto it = symbols_.try_emplace(e.symbol_name(), symbols_.size()).first;
        os_ << '$' << it->second;
        return;
      }
      default:
        break;
    }
    os_ << static_cast<int>(e.op()) << '(';
    for (const auto& operand : e.operands()) {
      write_sym(operand);
      os_ << ',';
    }
    os_ << ')';
  }

  void write_ivalue(const c10::IValue& v, const Node& node) {
    const std::string literal = literal_key(v);
    if (!literal.empty()) {
      os_ << literal;
    } else {
      // Anything else is never shared: the key names the node itself.
      os_ << v.tagKind() << '@' << static_cast<const void*>(&node);
    }
  }

  std::ostringstream os_;
  std::unordered_map<const Value*, int64_t> ids_;
  std::unordered_map<std::string, size_t> symbols_;
};

}  // namespace

std::string tensor_key(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream os;
  constexpr int64_t kMaxBytesByValue = 256;
  // By value only where the bytes are the value: not conjugated, negated, quantized or
  // Python-backed tensors.
  if (t.device().is_cpu() && t.is_contiguous() && t.layout() == c10::kStrided && !t.is_conj() &&
      !t.is_neg() && !t.is_quantized() && !t.key_set().has(c10::DispatchKey::Python) &&
      t.numel() * static_cast<int64_t>(t.element_size()) <= kMaxBytesByValue) {
    os << "tensor:" << dtype_short_name(t.scalar_type()) << t.sizes()
       << (t.unsafeGetTensorImpl()->is_wrapped_number() ? "w" : "") << ':' << std::hex;
    const auto* bytes = static_cast<const unsigned char*>(t.const_data_ptr());
    for (int64_t i = 0; i < t.numel() * static_cast<int64_t>(t.element_size()); ++i) {
      os << static_cast<int>(bytes[i]) << '.';
    }
    return os.str();
  }
  os << "tensor@" << static_cast<const void*>(t.unsafeGetTensorImpl());
  return os.str();
}

std::string literal_key(const c10::IValue& v) {
  std::ostringstream os;
  if (v.isNone()) {
    os << "None";
  } else if (v.isBool()) {
    os << (v.toBool() ? "True" : "False");
  } else if (v.isInt()) {
    os << "i" << v.toInt();
  } else if (v.isDouble()) {
    double d = v.toDouble();
    uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    os << "d" << std::hex << bits << std::dec;
  } else if (v.isString()) {
    os << "s" << v.toStringRef().size() << ':' << v.toStringRef();
  } else if (v.isDevice()) {
    os << "dev:" << v.toDevice().str();
  } else if (v.isTensor()) {
    os << tensor_key(v.toTensor());
  } else if (v.isIntList() || v.isDoubleList() || v.isBoolList()) {
    os << '[';
    for (const auto& item : v.toListRef()) os << literal_key(item) << ',';
    os << ']';
  }
  return os.str();
}

std::string structural_key(const Graph& graph) { return KeyWriter().run(graph); }

uint64_t structural_hash(const Graph& graph) {
  return std::hash<std::string>()(structural_key(graph));
}

}  // namespace magi::ir
