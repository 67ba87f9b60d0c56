// recognize_causal_masks: an attention call handed a mask that the graph computes from token
// positions, and that is the causal mask, gets is_causal instead of the mask.
//
// Hugging Face models build their attention mask in the forward (transformers' masking_utils):
// outside a trace they pass no mask and is_causal to SDPA, but under any Dynamo capture they
// materialise it, a [1, 1, S, S] boolean compared from position ranges and turned into an
// additive float mask. At 100,000 tokens that is 10 GB of booleans and 20 GB of bf16, and a
// masked call cannot use flash attention, which skips the blocks above the diagonal.
//
// The pass follows the mask back to its sources with a small abstract interpretation over the
// index of each entry: a value is known when every entry is an affine function of at most two
// dims' indices (arange, its sums and differences, slices, concatenations that continue the
// sequence, cumulative sums of constants), a constant, or a comparison of such functions
// (a band: i[col] - i[row] <= c; its negation is the band i[row] - i[col] <= -c - 1). Broadcasting,
// unsqueeze, expand and reshapes that only add or drop size-1 dims move the dims along. A mask is
// causal when it is the band with c = 0 over its last two dims and the query and key lengths are
// equal (SDPA's is_causal keeps the upper-left triangle); a mask that keeps everything is dropped
// without is_causal. Anything else (a padding mask from the inputs, a sliding window, a cached
// prefix) is left as it is. Calls whose only used output is the attention output are rewritten
// (inference graphs; a training forward saves its logsumexp for a backward that takes the mask),
// and each call with a mask is recorded beside recognize_attention's decisions.
#include <ATen/core/Tensor.h>

#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "attention_match.h"
#include "magi/common/log.h"
#include "magi/ir/graph.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"
#include "magi/passes/recognize_attention.h"

namespace magi::passes {
namespace {

using attention_match::constant_int;
using attention_match::constant_number;
using attention_match::is_masking_value;
using attention_match::type_of;

// What each entry of a tensor holds as a function of its index i.
struct Entries {
  enum class Kind { kUnknown, kAffine, kBand } kind = Kind::kUnknown;
  // kAffine: coef * i[dim] + coef2 * i[dim2] + offset (a constant when both coefs are 0; the
  // second term is used only between a sum or difference and a comparison).
  int64_t dim = -1;
  double coef = 0.0;
  int64_t dim2 = -1;
  double coef2 = 0.0;
  double offset = 0.0;
  // kBand: i[col] - i[row] <= band, as a boolean; or, when additive, 0 where that holds and
  // `masked` (a masking value) elsewhere.
  int64_t row = -1, col = -1;
  int64_t band = 0;
  bool additive = false;
  double masked = 0.0;

  static Entries constant(double v) {
    Entries e;
    e.kind = Kind::kAffine;
    e.offset = v;
    return e;
  }
  bool is_constant() const { return kind == Kind::kAffine && coef == 0.0 && coef2 == 0.0; }
  /// Affine in one dim's index (or constant).
  bool is_simple() const { return kind == Kind::kAffine && coef2 == 0.0; }
  bool known() const { return kind != Kind::kUnknown; }
};

Entries unknown() { return {}; }

class Interpreter {
 public:
  Entries of(const ir::Value* v) {
    auto it = memo_.find(v);
    if (it != memo_.end()) return it->second;
    memo_[v] = unknown();  // cycles cannot occur, but a deep walk must not repeat itself
    Entries e = normalise(v, evaluate(v));
    memo_[v] = e;
    return e;
  }

 private:
  static int64_t rank_of(const ir::Value* v) {
    const ir::TensorType* t = type_of(v);
    return t == nullptr ? 0 : t->rank();
  }

  // A dim of size 1 has index 0 only: the entries do not depend on it.
  static Entries normalise(const ir::Value* v, Entries e) {
    const ir::TensorType* t = type_of(v);
    if (!e.known()) return e;
    if (t == nullptr) return e.is_constant() ? e : unknown();
    // Positions are exact only in integer dtypes (and float64): a float32, bf16 or f16 tensor
    // rounds large positions, so an affine value there is not followed.
    const bool exact =
        c10::isIntegralType(t->dtype, /*includeBool=*/false) || t->dtype == c10::kDouble;
    if (e.kind == Entries::Kind::kAffine && !e.is_constant() && !exact) return unknown();
    const auto size_one = [&](int64_t d) {
      return d >= 0 && d < t->rank() && t->sizes[d] == ir::SymExpr(1);
    };
    if (e.kind == Entries::Kind::kAffine) {
      if (e.coef2 != 0.0 && (e.dim2 < 0 || e.dim2 >= t->rank())) return unknown();
      if (e.coef2 != 0.0 && size_one(e.dim2)) e.coef2 = 0.0;
      if (e.coef != 0.0 && (e.dim < 0 || e.dim >= t->rank())) return unknown();
      if (e.coef != 0.0 && size_one(e.dim)) e.coef = 0.0;
      if (e.coef == 0.0 && e.coef2 != 0.0) {
        std::swap(e.dim, e.dim2);
        std::swap(e.coef, e.coef2);
      }
      if (e.coef == 0.0) e.dim = -1;
      if (e.coef2 == 0.0) e.dim2 = -1;
    }
    if (e.kind == Entries::Kind::kBand) {
      if (e.row < 0 || e.col < 0 || e.row >= t->rank() || e.col >= t->rank()) return unknown();
      if (size_one(e.row) || size_one(e.col)) return unknown();
    }
    return e;
  }

  // Moves the dims of `e` (entries of a tensor of rank `from`) by `shift(d)`.
  template <typename F>
  static Entries remap(Entries e, F shift) {
    if (e.kind == Entries::Kind::kAffine && e.coef != 0.0) e.dim = shift(e.dim);
    if (e.kind == Entries::Kind::kAffine && e.coef2 != 0.0) e.dim2 = shift(e.dim2);
    if (e.kind == Entries::Kind::kBand) {
      e.row = shift(e.row);
      e.col = shift(e.col);
    }
    return e;
  }

  // An operand of an elementwise op, its dims right-aligned with the output's.
  Entries operand(const ir::Node& node, size_t i) {
    const ir::Value* in = node.input(i);
    if (in->kind() != ir::ValueKind::kTensor) {
      const auto n = constant_number(node, i);
      return n ? Entries::constant(*n) : unknown();
    }
    const int64_t shift = rank_of(node.output()) - rank_of(in);
    if (shift < 0) return unknown();
    return remap(of(in), [&](int64_t d) { return d + shift; });
  }

  static std::optional<bool> compare_constants(const std::string& op, double a, double b) {
    if (op == "le") return a <= b;
    if (op == "lt") return a < b;
    if (op == "ge") return a >= b;
    if (op == "gt") return a > b;
    if (op == "eq") return a == b;
    if (op == "ne") return a != b;
    return std::nullopt;
  }

  // a + sign * b, when it stays within two dims.
  static Entries combine(const Entries& a, const Entries& b, double sign) {
    if (a.kind != Entries::Kind::kAffine || b.kind != Entries::Kind::kAffine) return unknown();
    std::vector<std::pair<int64_t, double>> terms;
    const auto add = [&](int64_t dim, double coef) {
      if (coef == 0.0) return;
      for (auto& t : terms) {
        if (t.first == dim) {
          t.second += coef;
          return;
        }
      }
      terms.push_back({dim, coef});
    };
    add(a.dim, a.coef);
    add(a.dim2, a.coef2);
    add(b.dim, sign * b.coef);
    add(b.dim2, sign * b.coef2);
    std::vector<std::pair<int64_t, double>> kept;
    for (const auto& t : terms) {
      if (t.second != 0.0) kept.push_back(t);
    }
    if (kept.size() > 2) return unknown();
    Entries e = Entries::constant(a.offset + sign * b.offset);
    if (!kept.empty()) std::tie(e.dim, e.coef) = kept[0];
    if (kept.size() == 2) std::tie(e.dim2, e.coef2) = kept[1];
    return e;
  }

  // op(a, b) over two affine operands: a constant, or a band when a - b is the difference of
  // two dims' indices plus a constant.
  static Entries compare(std::string op, const Entries& a, const Entries& b) {
    Entries d = combine(a, b, -1.0);
    if (d.kind != Entries::Kind::kAffine) return unknown();
    if (d.is_constant()) {
      const auto r = compare_constants(op, d.offset, 0.0);
      return r ? Entries::constant(*r ? 1.0 : 0.0) : unknown();
    }
    if (op != "le" && op != "lt" && op != "ge" && op != "gt") return unknown();
    if (op == "ge" || op == "gt") {  // -d <= 0 (or < 0)
      d.coef = -d.coef;
      d.coef2 = -d.coef2;
      d.offset = -d.offset;
      op = op == "ge" ? "le" : "lt";
    }
    // d = i[x] - i[y] + c, with d <= 0 (or < 0): i[x] - i[y] <= -c (or -c - 1).
    if (d.coef2 == 0.0 || d.coef + d.coef2 != 0.0 || std::abs(d.coef) != 1.0) return unknown();
    if (d.offset != static_cast<double>(static_cast<int64_t>(d.offset))) return unknown();
    Entries e;
    e.kind = Entries::Kind::kBand;
    e.col = d.coef == 1.0 ? d.dim : d.dim2;
    e.row = d.coef == 1.0 ? d.dim2 : d.dim;
    e.band = -static_cast<int64_t>(d.offset) - (op == "lt" ? 1 : 0);
    return e;
  }

  static bool is_true(const Entries& e) { return e.is_constant() && e.offset != 0.0; }
  static bool is_false(const Entries& e) { return e.is_constant() && e.offset == 0.0; }
  static bool same_band(const Entries& a, const Entries& b) {
    return a.kind == Entries::Kind::kBand && b.kind == Entries::Kind::kBand && a.row == b.row &&
           a.col == b.col && a.band == b.band && !a.additive && !b.additive;
  }

  static Entries logical_and(const Entries& a, const Entries& b) {
    if (a.additive || b.additive) return unknown();
    if (is_true(a)) return b;
    if (is_true(b)) return a;
    if (is_false(a) || is_false(b)) return Entries::constant(0.0);
    return same_band(a, b) ? a : unknown();
  }

  static Entries logical_or(const Entries& a, const Entries& b) {
    if (a.additive || b.additive) return unknown();
    if (is_false(a)) return b;
    if (is_false(b)) return a;
    if (is_true(a) || is_true(b)) return Entries::constant(1.0);
    return same_band(a, b) ? a : unknown();
  }

  static Entries logical_not(Entries e) {
    if (e.is_constant()) return Entries::constant(e.offset == 0.0 ? 1.0 : 0.0);
    if (e.kind != Entries::Kind::kBand || e.additive) return unknown();
    // not (i[col] - i[row] <= b)  <=>  i[row] - i[col] <= -b - 1
    std::swap(e.row, e.col);
    e.band = -e.band - 1;
    return e;
  }

  // where(cond, x, y) with a band condition and constant branches: an additive band mask.
  static Entries where(Entries cond, const Entries& x, const Entries& y) {
    if (is_true(cond)) return x;
    if (is_false(cond)) return y;
    if (cond.kind != Entries::Kind::kBand || cond.additive || !x.is_constant() ||
        !y.is_constant()) {
      return unknown();
    }
    double keep = x.offset, masked = y.offset;
    if (keep != 0.0) {  // the masking value where the condition holds: keep where it does not
      std::swap(keep, masked);
      cond = logical_not(cond);
    }
    if (keep != 0.0 || !is_masking_value(masked)) return unknown();
    cond.additive = true;
    cond.masked = masked;
    return cond;
  }

  static std::optional<int64_t> normalised_dim(std::optional<int64_t> d, int64_t rank) {
    if (!d) return std::nullopt;
    const int64_t n = *d < 0 ? *d + rank : *d;
    if (n < 0 || n >= rank) return std::nullopt;
    return n;
  }

  // Reshapes that add or drop size-1 dims only: the dims of size other than 1 keep their order.
  Entries reshape(const ir::Node& node) {
    const ir::TensorType* in = type_of(node.input(0));
    const ir::TensorType* out = type_of(node.output());
    if (in == nullptr || out == nullptr) return unknown();
    std::vector<int64_t> in_dims, out_dims;
    for (int64_t d = 0; d < in->rank(); ++d) {
      if (!(in->sizes[d] == ir::SymExpr(1))) in_dims.push_back(d);
    }
    for (int64_t d = 0; d < out->rank(); ++d) {
      if (!(out->sizes[d] == ir::SymExpr(1))) out_dims.push_back(d);
    }
    if (in_dims.size() != out_dims.size()) return unknown();
    std::unordered_map<int64_t, int64_t> to;
    for (size_t k = 0; k < in_dims.size(); ++k) {
      if (!(in->sizes[in_dims[k]] == out->sizes[out_dims[k]])) return unknown();
      to[in_dims[k]] = out_dims[k];
    }
    bool ok = true;
    Entries e = remap(of(node.input(0)), [&](int64_t d) {
      auto it = to.find(d);
      if (it == to.end()) ok = false;
      return it == to.end() ? -1 : it->second;
    });
    return ok ? e : unknown();
  }

  Entries slice(const ir::Node& node) {
    const ir::TensorType* in = type_of(node.input(0));
    if (in == nullptr) return unknown();
    const auto dim = normalised_dim(constant_int(node, 1), in->rank());
    const auto step = constant_int(node, 4);
    const c10::IValue* start_value = ir::constant_input(node, 2);
    if (!dim || !step || start_value == nullptr) return unknown();
    int64_t start = 0;
    if (start_value->isInt()) {
      start = start_value->toInt();
    } else if (!start_value->isNone()) {
      return unknown();
    }
    if (start < 0) {
      if (!in->sizes[*dim].is_constant()) return unknown();
      start = std::max<int64_t>(0, start + in->sizes[*dim].constant_value());
    }
    Entries e = of(node.input(0));
    if (e.kind == Entries::Kind::kAffine) {
      // The output's index j is the input's start + j * step along `dim`.
      if (e.coef != 0.0 && e.dim == *dim) {
        e.offset += e.coef * static_cast<double>(start);
        e.coef *= static_cast<double>(*step);
      }
      if (e.coef2 != 0.0 && e.dim2 == *dim) {
        e.offset += e.coef2 * static_cast<double>(start);
        e.coef2 *= static_cast<double>(*step);
      }
      return e;
    }
    if (e.kind == Entries::Kind::kBand && (e.row == *dim || e.col == *dim)) {
      if (*step != 1) return unknown();
      // The output's index j is the input's j + start along `dim`.
      e.band += e.col == *dim ? -start : start;
      return e;
    }
    return e;
  }

  // cat of pieces that continue one affine sequence along the cat dim.
  Entries cat(const ir::Node& node) {
    const ir::Node* list = node.input(0)->producer();
    if (list == nullptr || list->kind() != ir::NodeKind::kMakeList) return unknown();
    const int64_t rank = rank_of(node.output());
    const auto dim = normalised_dim(constant_int(node, 1), rank);
    if (!dim) return unknown();
    // Entries and length along dim; the last piece's length places nothing after it, so it may
    // be symbolic (-1): a sequence of any length continued, as a dynamic capture records it.
    std::vector<std::pair<Entries, int64_t>> pieces;
    const auto& inputs = list->inputs();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ir::TensorType* t = type_of(inputs[i]);
      if (t == nullptr || t->rank() != rank) return unknown();
      const ir::SymExpr& length = t->sizes[*dim];
      if (!length.is_constant() && i + 1 < inputs.size()) return unknown();
      pieces.push_back({of(inputs[i]), length.is_constant() ? length.constant_value() : -1});
    }
    if (pieces.empty()) return unknown();
    // coef * (position along the cat) + base; found from the first non-constant piece.
    std::optional<double> coef, base;
    int64_t position = 0;
    for (const auto& [e, length] : pieces) {
      if (!e.is_simple()) return unknown();
      if (!e.is_constant()) {
        if (e.dim != *dim) return unknown();
        const double b = e.offset - e.coef * static_cast<double>(position);
        if (coef && (*coef != e.coef || *base != b)) return unknown();
        coef = e.coef;
        base = b;
      }
      position += length;
    }
    if (!coef) {
      // All constant: one value only.
      for (const auto& piece : pieces) {
        if (piece.first.offset != pieces.front().first.offset) return unknown();
      }
      return pieces.front().first;
    }
    position = 0;
    for (const auto& [e, length] : pieces) {
      // A constant piece fits only where it is one entry long and holds the sequence's value.
      if (e.is_constant() &&
          (length != 1 || e.offset != *coef * static_cast<double>(position) + *base)) {
        return unknown();
      }
      position += length;
    }
    Entries e;
    e.kind = Entries::Kind::kAffine;
    e.dim = *dim;
    e.coef = *coef;
    e.offset = *base;
    return e;
  }

  Entries evaluate(const ir::Value* v) {
    const ir::Node* node = v->producer();
    if (node == nullptr) return unknown();
    if (node->kind() == ir::NodeKind::kConstant) {
      const auto n = attention_match::number_of(node->constant());
      return n ? Entries::constant(*n) : unknown();
    }
    if (!node->is_operator() || node->kind() == ir::NodeKind::kCustomOp) return unknown();
    if (node->outputs().size() != 1 || v->kind() != ir::ValueKind::kTensor) return unknown();
    const std::string name = node->op_name();
    const auto base = name.substr(0, name.find('.'));

    // Factories.
    if (name == "aten::arange" || name == "aten::arange.start" ||
        name == "aten::arange.start_step") {
      double start = 0.0, step = 1.0;
      if (name != "aten::arange") {
        const auto s = constant_number(*node, 0);
        if (!s) return unknown();
        start = *s;
      }
      if (name == "aten::arange.start_step") {
        const auto s = constant_number(*node, 2);
        if (!s) return unknown();
        step = *s;
      }
      Entries e;
      e.kind = Entries::Kind::kAffine;
      e.dim = 0;
      e.coef = step;
      e.offset = start;
      return e;
    }
    if (name == "aten::scalar_tensor") {
      const auto s = constant_number(*node, 0);
      return s ? Entries::constant(*s) : unknown();
    }
    if (name == "aten::new_ones" || name == "aten::ones" || name == "aten::ones_like") {
      return Entries::constant(1.0);
    }
    if (name == "aten::new_zeros" || name == "aten::zeros" || name == "aten::zeros_like") {
      return Entries::constant(0.0);
    }
    if (name == "aten::full" || name == "aten::full_like" || name == "aten::new_full") {
      const auto s = constant_number(*node, name == "aten::new_full" ? 2 : 1);
      return s ? Entries::constant(*s) : unknown();
    }

    // Same entries, another layout or dtype.
    if (name == "aten::alias" || name == "aten::detach" || name == "aten::clone" ||
        name == "aten::lift_fresh_copy" || name == "aten::contiguous" || name == "aten::_to_copy") {
      const ir::TensorType* in = type_of(node->input(0));
      const ir::TensorType* out = type_of(v);
      if (in == nullptr || out == nullptr) return unknown();
      const bool in_bool = in->dtype == c10::kBool, out_bool = out->dtype == c10::kBool;
      Entries e = of(node->input(0));
      if (in_bool != out_bool) {
        // Booleans to numbers: 1 and 0; numbers to booleans: nonzero. Constants only.
        if (!e.is_constant()) return unknown();
        return Entries::constant(e.offset != 0.0 ? 1.0 : 0.0);
      }
      if (e.additive && !c10::isFloatingType(out->dtype)) return unknown();
      return e;
    }
    if (name == "aten::unsqueeze") {
      const auto dim = normalised_dim(constant_int(*node, 1), rank_of(v));
      if (!dim) return unknown();
      return remap(of(node->input(0)), [&](int64_t d) { return d < *dim ? d : d + 1; });
    }
    if (name == "aten::expand") {
      const int64_t shift = rank_of(v) - rank_of(node->input(0));
      if (shift < 0) return unknown();
      return remap(of(node->input(0)), [&](int64_t d) { return d + shift; });
    }
    if (attention_match::is_reshape(node) || name == "aten::squeeze.dim" ||
        name == "aten::squeeze") {
      return reshape(*node);
    }
    if (name == "aten::slice.Tensor") return slice(*node);
    if (name == "aten::cat") return cat(*node);
    if (name == "aten::cumsum") {
      const auto dim = normalised_dim(constant_int(*node, 1), rank_of(v));
      const Entries e = of(node->input(0));
      if (!dim || !e.is_constant()) return unknown();
      if (e.offset == 0.0) return Entries::constant(0.0);
      Entries out;
      out.kind = Entries::Kind::kAffine;
      out.dim = *dim;
      out.coef = e.offset;
      out.offset = e.offset;
      return out;
    }
    // Gathering from a constant tensor gives that constant.
    if (name == "aten::index.Tensor") {
      const Entries e = of(node->input(0));
      return e.is_constant() ? e : unknown();
    }

    // Elementwise arithmetic.
    if (name == "aten::add.Tensor" || name == "aten::sub.Tensor" || name == "aten::add.Scalar" ||
        name == "aten::sub.Scalar") {
      const auto alpha = constant_number(*node, 2);
      if (!alpha) return unknown();
      const double sign = (base == "aten::sub" ? -1.0 : 1.0) * *alpha;
      return combine(operand(*node, 0), operand(*node, 1), sign);
    }
    for (const char* cmp : {"le", "lt", "ge", "gt", "eq", "ne"}) {
      const std::string op = cmp;
      if (name == "aten::" + op + ".Tensor" || name == "aten::" + op + ".Scalar") {
        return compare(op, operand(*node, 0), operand(*node, 1));
      }
    }
    // Bitwise ops are logical ones on booleans only (2 & 1 is 0).
    const auto booleans = [&] {
      for (const ir::Value* in : node->inputs()) {
        const ir::TensorType* t = type_of(in);
        if (t != nullptr && t->dtype != c10::kBool) return false;
      }
      return true;
    };
    if (name == "aten::logical_and" ||
        ((name == "aten::bitwise_and.Tensor" || name == "aten::__and__.Tensor") && booleans())) {
      return logical_and(operand(*node, 0), operand(*node, 1));
    }
    if (name == "aten::logical_or" ||
        ((name == "aten::bitwise_or.Tensor" || name == "aten::__or__.Tensor") && booleans())) {
      return logical_or(operand(*node, 0), operand(*node, 1));
    }
    if (name == "aten::logical_not" || name == "aten::bitwise_not") {
      const ir::TensorType* in = type_of(node->input(0));
      if (in == nullptr || in->dtype != c10::kBool) return unknown();
      return logical_not(of(node->input(0)));
    }
    if (name == "aten::where.self" || name == "aten::where.ScalarSelf" ||
        name == "aten::where.ScalarOther" || name == "aten::where.Scalar") {
      return where(operand(*node, 0), operand(*node, 1), operand(*node, 2));
    }
    if (name == "aten::masked_fill.Scalar" || name == "aten::masked_fill.Tensor") {
      return where(operand(*node, 1), operand(*node, 2), operand(*node, 0));
    }
    return unknown();
  }

  std::unordered_map<const ir::Value*, Entries> memo_;
};

// Where an attention operator takes its mask and causal flag, by argument name.
struct AttentionArgs {
  size_t mask = 0, causal = 0;
};

std::optional<AttentionArgs> attention_args(const ir::Node& node) {
  if (node.kind() != ir::NodeKind::kAtenOp) return std::nullopt;
  const std::string name = node.op_name();
  if (name != "aten::scaled_dot_product_attention" &&
      name != "aten::_scaled_dot_product_efficient_attention" &&
      name != "aten::_scaled_dot_product_cudnn_attention" &&
      name != "aten::_scaled_dot_product_flash_attention_for_cpu") {
    return std::nullopt;
  }
  AttentionArgs a;
  std::optional<size_t> mask, causal;
  const auto& args = node.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == "attn_mask" || args[i].name() == "attn_bias") mask = i;
    if (args[i].name() == "is_causal") causal = i;
  }
  if (!mask || !causal) return std::nullopt;
  a.mask = *mask;
  a.causal = *causal;
  return a;
}

// Why the mask of `node` cannot become is_causal, or "" when it is the causal mask (or keeps
// everything: `*keeps_all`).
std::string judge(Interpreter& interpreter, const ir::Node& node, const AttentionArgs& args,
                  bool* keeps_all) {
  const ir::Value* mask = node.input(args.mask);
  const ir::TensorType* m = type_of(mask);
  const ir::TensorType* q = type_of(node.input(0));
  const ir::TensorType* k = type_of(node.input(1));
  if (m == nullptr || q == nullptr || k == nullptr || m->rank() < 2 || q->rank() < 2 ||
      k->rank() < 2) {
    return "the mask, query or key has no known shape";
  }
  for (size_t i = 1; i < node.outputs().size(); ++i) {
    if (!node.output(i)->users().empty()) {
      return "the call's logsumexp or random state is read (a training forward)";
    }
  }
  const c10::IValue* causal_value = ir::constant_input(node, args.causal);
  if (causal_value == nullptr || !causal_value->isBool()) return "is_causal is not a constant";
  const Entries e = interpreter.of(mask);
  const bool bool_mask = m->dtype == c10::kBool;
  if (e.is_constant()) {
    if ((bool_mask && e.offset != 0.0) || (!bool_mask && e.offset == 0.0)) {
      *keeps_all = true;
      return "";
    }
    return "the mask is a constant that hides entries";
  }
  if (e.kind != Entries::Kind::kBand) {
    return "the mask is built by operators the pass does not follow";
  }
  if (causal_value->toBool()) return "is_causal is set as well as a mask";
  if (e.additive == bool_mask) return "the mask's dtype does not match its contents";
  if (e.row == m->rank() - 1 && e.col == m->rank() - 2) {
    return "the mask keeps the upper triangle (keys at or after the query), not the lower";
  }
  if (e.row != m->rank() - 2 || e.col != m->rank() - 1) {
    return "the mask compares positions along other dims than its last two";
  }
  if (e.band != 0) {
    return "the mask's diagonal is offset by " + std::to_string(e.band) +
           " (a cached prefix or another alignment)";
  }
  if (!(q->sizes[q->rank() - 2] == k->sizes[k->rank() - 2])) {
    return "the query and key lengths may differ (" + q->sizes[q->rank() - 2].str() + " and " +
           k->sizes[k->rank() - 2].str() + ")";
  }
  return "";
}

// Does `v` depend on a graph input? Such a mask (padding from the caller) is no candidate, and
// its decision is not recorded.
bool reads_graph_input(const ir::Value* v, std::unordered_map<const ir::Value*, bool>& memo) {
  auto it = memo.find(v);
  if (it != memo.end()) return it->second;
  memo[v] = false;
  const ir::Node* node = v->producer();
  bool reads = node == nullptr || node->kind() == ir::NodeKind::kInput;
  for (size_t i = 0; !reads && node != nullptr && i < node->inputs().size(); ++i) {
    reads = reads_graph_input(node->input(i), memo);
  }
  memo[v] = reads;
  return reads;
}

}  // namespace

bool recognize_causal_masks(ir::Graph& graph) {
  bool changed = false;
  Interpreter interpreter;
  std::unordered_map<const ir::Value*, bool> reads_input;
  for (ir::Node* node : graph.nodes()) {
    const auto args = attention_args(*node);
    if (!args || node->input(args->mask)->kind() != ir::ValueKind::kTensor) continue;
    bool keeps_all = false;
    const std::string why = judge(interpreter, *node, *args, &keeps_all);
    const std::string at = attention_match::node_location(*node);
    if (!why.empty() && reads_graph_input(node->input(args->mask), reads_input)) {
      MAGI_LOG_DEBUG("recognize_causal_masks: ", at, ": mask kept: it depends on the inputs (", why,
                     ")");
      continue;
    }
    if (!why.empty()) {
      MAGI_LOG_INFO("recognize_causal_masks: ", at, ": mask kept: ", why);
      record_attention_pattern(
          {at, false, node->op_name() + " keeps its mask: " + why, "recognize_causal_masks"});
      continue;
    }
    graph.set_insert_point(node);
    node->set_input(args->mask, graph.add_constant(c10::IValue(), ir::ValueKind::kNone));
    if (!keeps_all) node->set_input(args->causal, graph.add_constant(true, ir::ValueKind::kBool));
    graph.set_insert_point(nullptr);
    const std::string detail =
        node->op_name() + (keeps_all ? " without its mask (it keeps every entry)"
                                     : " with is_causal instead of a causal mask built from "
                                       "token positions");
    MAGI_LOG_INFO("recognize_causal_masks: ", at, ": ", detail);
    record_attention_pattern({at, true, detail, "recognize_causal_masks"});
    changed = true;
  }
  if (changed) eliminate_dead_code(graph);
  return changed;
}

}  // namespace magi::passes
