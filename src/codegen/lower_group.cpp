// Lowering a fusion group to a KernelSpec: each ATen op becomes a few scalar KOps, composite
// ops (softmax, layer norm, mean) are expanded into reductions and pointwise math here.
#include "magi/codegen/lower_group.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "magi/common/error.h"
#include "magi/ir/op_info.h"

namespace magi::codegen {
namespace {

bool is_reduced_precision(c10::ScalarType t) {
  return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half;
}

class Lowering {
 public:
  Lowering(const ir::Graph& group, const std::string& name) : group_(group) { spec_.name = name; }

  KernelSpec run() {
    for (const ir::Node* node : group_.nodes()) {
      if (node->kind() == ir::NodeKind::kAtenOp) {
        ir::OpClass c = ir::op_info(*node).op_class;
        if (c == ir::OpClass::kReduction || c == ir::OpClass::kSoftmax ||
            c == ir::OpClass::kLayerNorm) {
          spec_.schedule = Schedule::kRow;
          if (const auto& t = node->input(0)->tensor_type()) row_length_ = t->sizes.back();
        } else if (c == ir::OpClass::kColumnReduction) {
          spec_.schedule = Schedule::kColumn;
          spec_.column_dims = static_cast<int>(ir::column_reduced_dims(*node));
          if (const auto& t = node->input(0)->tensor_type()) space_ = t->sizes;
        }
      }
      for (const ir::Value* v : node->outputs()) {
        if (v->tensor_type() && v->tensor_type()->dtype == c10::ScalarType::Double) {
          spec_.use_double = true;
        }
      }
    }
    const auto chains = input_view_chains(group_);
    for (size_t k = 0; k < group_.inputs().size(); ++k) {
      const ir::Value* in = group_.inputs()[k];
      KInput input{in->tensor_type() ? in->tensor_type()->dtype : c10::ScalarType::Float};
      if (in->tensor_type() && in->tensor_type()->dtype == c10::ScalarType::Double) {
        spec_.use_double = true;
      }
      // An input read before a view is read per element: its shape is not the index space's.
      input.per_row =
          chains[k].empty() && ((spec_.schedule == Schedule::kRow && is_row_shaped(*in)) ||
                                (spec_.schedule == Schedule::kColumn && is_column_shaped(*in)));
      spec_.inputs.push_back(input);
      KOp load;
      load.kind = KOpKind::kLoad;
      load.input = static_cast<int>(spec_.inputs.size() - 1);
      load.per_row = input.per_row;
      input_index_[in] = static_cast<int>(spec_.inputs.size() - 1);
      set(in, add(std::move(load)));
    }
    // Narrow values (slices and ops on them) are lowered where a cat reads them, at the
    // column offset of its piece.
    std::unordered_set<const ir::Node*> narrow;
    for (const ir::Node* node : group_.nodes()) {
      if (node->kind() != ir::NodeKind::kAtenOp) continue;
      ir::OpClass c = ir::op_info(*node).op_class;
      bool reads_narrow = false;
      for (const ir::Value* in : node->inputs()) reads_narrow |= narrow.count(in->producer()) > 0;
      const bool widens = c == ir::OpClass::kCat || c == ir::OpClass::kPad;
      if (c == ir::OpClass::kSlice || (!widens && reads_narrow)) narrow.insert(node);
      spec_.fused_ops.push_back(node->op_name());
      if (!node->provenance().source.empty()) spec_.sources.push_back(node->provenance().source);
    }
    for (const ir::Node* node : group_.nodes()) {
      switch (node->kind()) {
        case ir::NodeKind::kInput:
        case ir::NodeKind::kOutput:
        case ir::NodeKind::kMakeList:  // a cat's pieces: read by the cat
          break;
        case ir::NodeKind::kConstant:
          lower_constant(*node);
          break;
        case ir::NodeKind::kAtenOp:
          if (!narrow.count(node)) lower_op(*node, 0);
          break;
        default:
          MAGI_ASSERT(false, "fusion group contains a ", node->op_name(), " node");
      }
    }
    for (const ir::Value* out : group_.outputs()) {
      const int op = eval(out, 0);
      spec_.outputs.push_back({op, out->tensor_type()->dtype, spec_.ops[op].per_row});
    }
    spec_.fast_math =
        !spec_.use_double && !spec_.outputs.empty() &&
        std::all_of(spec_.outputs.begin(), spec_.outputs.end(), [](const KOutput& o) {
          return o.dtype == c10::ScalarType::BFloat16 || o.dtype == c10::ScalarType::Half;
        });
    return std::move(spec_);
  }

 private:
  bool is_row_shaped(const ir::Value& v) const {
    const auto& t = v.tensor_type();
    if (!t) return false;
    if (t->sizes.empty()) return true;  // a 0-dim tensor is one value for every row
    const ir::SymExpr& last = t->sizes.back();
    bool last_is_one = last.is_constant() && last.constant_value() == 1;
    bool row_is_one = row_length_.is_constant() && row_length_.constant_value() == 1;
    return last_is_one && !row_is_one;
  }

  // In a column kernel: the same for every row, i.e. of size 1 (or absent) in each reduced
  // dim (right-aligned to the index space; a 0-dim tensor is one value for every column).
  bool is_column_shaped(const ir::Value& v) const {
    const auto& t = v.tensor_type();
    if (!t || t->sizes.size() > space_.size()) return false;
    const size_t offset = space_.size() - t->sizes.size();
    for (size_t d = 0; d < t->sizes.size(); ++d) {
      const ir::SymExpr& s = t->sizes[d];
      if (offset + d < static_cast<size_t>(spec_.column_dims) &&
          !(s.is_constant() && s.constant_value() == 1)) {
        return false;
      }
    }
    return true;
  }

  int add(KOp op) {
    if (op.kind != KOpKind::kLoad && op.kind != KOpKind::kConst && op.kind != KOpKind::kReduce) {
      bool per_row = true;
      for (int a : op.args) per_row &= spec_.ops[a].per_row || spec_.ops[a].kind == KOpKind::kConst;
      op.per_row = per_row && spec_.schedule != Schedule::kPointwise;
    }
    if (op.kind == KOpKind::kReduce) op.per_row = true;
    op.comment = comment_;
    spec_.ops.push_back(std::move(op));
    return static_cast<int>(spec_.ops.size() - 1);
  }

  int constant(double value, const std::string& fn = "") {
    KOp op;
    op.kind = KOpKind::kConst;
    op.value = value;
    op.fn = fn;
    return add(std::move(op));
  }
  int unary(const std::string& fn, int a) {
    KOp op;
    op.kind = KOpKind::kUnary;
    op.fn = fn;
    op.args = {a};
    return add(std::move(op));
  }
  int binary(const std::string& fn, int a, int b) {
    KOp op;
    op.kind = KOpKind::kBinary;
    op.fn = fn;
    op.args = {a, b};
    return add(std::move(op));
  }
  // The gradient of an activation from the gradient of its output `g` and `x` (the input; for
  // sigmoid and tanh, the output), as ATen's *_backward ops compute it, in the accumulation
  // type with one rounding at the end (the caller's).
  int activation_grad(const std::string& fn, int g, int x) {
    const int one = constant(1.0);
    if (fn == "silu_backward") {  // g * s * (1 + x * (1 - s)), s = sigmoid(x)
      const int sig = unary("sigmoid", x);
      const int inner = binary("add", one, binary("mul", x, binary("sub", one, sig)));
      return binary("mul", g, binary("mul", sig, inner));
    }
    if (fn == "sigmoid_backward") return binary("mul", binary("mul", g, binary("sub", one, x)), x);
    if (fn == "tanh_backward") return binary("mul", g, binary("sub", one, binary("mul", x, x)));
    const double sqrt1_2 = 0.70710678118654752440, two_over_sqrt_pi = 1.12837916709551257390;
    if (fn == "gelu_backward") {  // g * (cdf + x * pdf)
      const int cdf = binary("mul", constant(0.5),
                             binary("add", one, unary("erf", binary("mul", x, constant(sqrt1_2)))));
      const int pdf =
          binary("mul", unary("exp", binary("mul", constant(-0.5), binary("mul", x, x))),
                 constant(two_over_sqrt_pi * sqrt1_2 * 0.5));
      return binary("mul", g, binary("add", cdf, binary("mul", x, pdf)));
    }
    MAGI_ASSERT(fn == "gelu_tanh_backward", "no gradient form for ", fn);
    // t = tanh(beta * (x + kappa x^3)); d/dx [x/2 (1 + t)] = (1 + t)/2 + x/2 (1 - t^2) beta
    // (1 + 3 kappa x^2)
    const double beta = 1.41421356237309504880 * two_over_sqrt_pi * 0.5, kappa = 0.044715;
    const int x_sq = binary("mul", x, x);
    const int inner =
        binary("mul", constant(beta),
               binary("add", x, binary("mul", constant(kappa), binary("mul", x_sq, x))));
    const int t = unary("tanh", inner);
    const int left = binary("mul", constant(0.5), binary("add", one, t));
    const int slope =
        binary("mul", binary("sub", one, binary("mul", t, t)),
               binary("mul", constant(beta),
                      binary("add", one, binary("mul", constant(3.0 * kappa), x_sq))));
    const int right = binary("mul", binary("mul", constant(0.5), x), slope);
    return binary("mul", g, binary("add", left, right));
  }
  int reduce(ReduceKind kind, int a) {
    KOp op;
    op.kind = KOpKind::kReduce;
    op.reduce = kind;
    op.args = {a};
    return add(std::move(op));
  }
  // Rounds to the eager result dtype of `v` when that is bf16/f16, or float32 in a kernel
  // computing in double.
  int round_as(int x, const ir::Value& v) {
    c10::ScalarType t = v.tensor_type()->dtype;
    if (!is_reduced_precision(t) && !(spec_.use_double && t == c10::ScalarType::Float)) return x;
    if (exact_in(x, t)) return x;  // rounding would give the same value: no instructions
    KOp op;
    op.kind = KOpKind::kRound;
    op.round_to = t;
    op.args = {x};
    return add(std::move(op));
  }

  // Whether op `x` already holds a value of dtype `t` exactly: a load of an input stored in
  // `t`, a rounding to `t`, a constant `t` represents, and negation, absolute value, ReLU and
  // selections (cat, where) of such values. Eager's result of such an op in `t` is that value,
  // so it needs no rounding (rotary's neg and cat each cost two instructions per element).
  bool exact_in(int x, c10::ScalarType t) const {
    // Memoised per op (a chain of selections would otherwise be walked once per path).
    std::vector<int8_t>& memo = exact_memo_[t];
    if (memo.size() < spec_.ops.size()) memo.resize(spec_.ops.size(), -1);
    if (memo[x] < 0) memo[x] = exact_uncached(x, t) ? 1 : 0;
    return memo[x] == 1;
  }

  bool exact_uncached(int x, c10::ScalarType t) const {
    const KOp& op = spec_.ops[x];
    auto all_exact = [&](size_t from) {
      for (size_t k = from; k < op.args.size(); ++k) {
        if (!exact_in(op.args[k], t)) return false;
      }
      return true;
    };
    switch (op.kind) {
      case KOpKind::kLoad:
        return spec_.inputs[op.input].dtype == t;
      case KOpKind::kRound:
        return op.round_to == t;
      case KOpKind::kConst:
        return op.fn.empty() && representable(op.value, t);
      case KOpKind::kUnary:
        return (op.fn == "neg" || op.fn == "abs" || op.fn == "relu") && all_exact(0);
      case KOpKind::kSelect:
        return all_exact(0);
      case KOpKind::kWhere:
        return all_exact(1);  // args[0] is the condition
      default:
        return false;
    }
  }

  static bool representable(double value, c10::ScalarType t) {
    if (std::isnan(value)) return true;
    switch (t) {
      case c10::ScalarType::BFloat16:
        return static_cast<double>(static_cast<float>(c10::BFloat16(static_cast<float>(value)))) ==
               value;
      case c10::ScalarType::Half:
        return static_cast<double>(static_cast<float>(c10::Half(static_cast<float>(value)))) ==
               value;
      case c10::ScalarType::Float:
        return static_cast<double>(static_cast<float>(value)) == value;
      default:
        return false;
    }
  }

  double scalar_of(const c10::IValue& v) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      MAGI_ASSERT(t.numel() == 1 && t.device().is_cpu(), "non-scalar constant in a fusion group");
      // Read the value directly: lowering may run under AOTAutograd's FakeTensorMode, where
      // item() would dispatch to the fake implementation.
      const void* p = t.const_data_ptr();
      switch (t.scalar_type()) {
        case c10::ScalarType::Double:
          return *static_cast<const double*>(p);
        case c10::ScalarType::Float:
          return *static_cast<const float*>(p);
        case c10::ScalarType::Long:
          return static_cast<double>(*static_cast<const int64_t*>(p));
        case c10::ScalarType::Int:
          return static_cast<double>(*static_cast<const int32_t*>(p));
        case c10::ScalarType::Bool:
          return *static_cast<const bool*>(p) ? 1.0 : 0.0;
        default:
          MAGI_ASSERT(false, "scalar constant of dtype ", c10::toString(t.scalar_type()));
      }
    }
    if (v.isDouble()) return v.toDouble();
    if (v.isInt()) return static_cast<double>(v.toInt());
    if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
    if (v.isScalar()) return v.toScalar().toDouble();
    MAGI_ASSERT(false, "constant of kind ", v.tagKind(), " used as a number");
    return 0.0;
  }

  void lower_constant(const ir::Node& node) {
    const c10::IValue& v = node.constant();
    if (v.isTensor() || v.isDouble() || v.isInt() || v.isBool()) {
      if (v.isTensor() && v.toTensor().numel() != 1) return;  // not used as a number
      set(node.output(), constant(scalar_of(v)));
    }
  }

  void set(const ir::Value* v, int op) { lowered_[{v, shift_}] = op; }

  // The KOp computing `v` at column c + shift of the kernel's column c (shift 0: v itself).
  // Constants and per-row values do not depend on the column; other values are lowered again
  // at each shift a cat or slice asks for, down to loads at that offset.
  int eval(const ir::Value* v, int64_t shift) {
    const ir::Node* p = v->producer();
    if (p->kind() == ir::NodeKind::kConstant) shift = 0;
    auto it = lowered_.find({v, shift});
    if (it != lowered_.end()) return it->second;
    auto at0 = lowered_.find({v, 0});
    if (at0 != lowered_.end() && spec_.ops[at0->second].per_row) return at0->second;
    if (p->kind() == ir::NodeKind::kInput) {
      KOp load;
      load.kind = KOpKind::kLoad;
      load.input = input_index_.at(v);
      load.shift = shift;
      const int op = add(std::move(load));
      lowered_[{v, shift}] = op;
      return op;
    }
    MAGI_ASSERT(p->kind() == ir::NodeKind::kAtenOp, "%", v->name(), " is not lowered");
    lower_op(*p, shift);
    return lowered_.at({v, shift});
  }

  int in(const ir::Node& node, size_t i) { return eval(node.input(i), shift_); }

  const c10::IValue& const_arg(const ir::Node& node, size_t i) {
    const ir::Node* p = node.input(i)->producer();
    MAGI_ASSERT(p->kind() == ir::NodeKind::kConstant, node.op_name(), " argument ", i,
                " is not a constant");
    return p->constant();
  }

  // Lowers `node` at column offset `shift` (see eval).
  void lower_op(const ir::Node& node, int64_t shift) {
    std::string reason;
    ir::OpInfo info = ir::op_info(node, &reason);
    MAGI_ASSERT(info.op_class != ir::OpClass::kOther, node.op_name(),
                " in a fusion group: ", reason);
    // Operands first: lowering them may lower other nodes (which sets shift_ and comment_).
    std::vector<int> pieces;  // a cat's pieces, each at its column offset
    std::vector<int64_t> piece_ends;
    if (info.op_class == ir::OpClass::kCat) {
      int64_t offset = 0;
      for (const ir::Value* piece : ir::cat_pieces(node)) {
        pieces.push_back(eval(piece, shift - offset));
        offset += piece->tensor_type()->sizes.back().constant_value();
        piece_ends.push_back(offset);
      }
    } else if (info.op_class == ir::OpClass::kPad) {
      // The pad value left of the input's columns and right of them: a cat of three pieces.
      const auto [left, right] = ir::pad_bounds(node);
      const int value = constant(scalar_of(const_arg(node, 2)));
      const int64_t width = node.output()->tensor_type()->sizes.back().constant_value();
      if (left > 0) {
        pieces.push_back(value);
        piece_ends.push_back(left);
      }
      pieces.push_back(eval(node.input(0), shift - left));
      piece_ends.push_back(right);
      if (right < width) {
        pieces.push_back(value);
        piece_ends.push_back(width);
      }
    } else if (info.op_class == ir::OpClass::kSlice) {
      set_at(node.output(), shift, eval(node.input(0), shift + ir::slice_bounds(node).first));
      return;
    } else if (info.op_class == ir::OpClass::kView) {
      // The kernel computes the values before a view at the element the view maps to the
      // index space (their inputs are read through the view's strides): nothing to compute.
      set_at(node.output(), shift, eval(node.input(0), shift));
      return;
    } else {
      MAGI_ASSERT(shift == 0 || info.op_class == ir::OpClass::kUnary ||
                      info.op_class == ir::OpClass::kBinary ||
                      info.op_class == ir::OpClass::kWhere || info.op_class == ir::OpClass::kCast,
                  node.op_name(), " at a column offset");
      for (const ir::Value* in : node.inputs()) {
        if (in->kind() == ir::ValueKind::kTensor &&
            in->producer()->kind() != ir::NodeKind::kConstant) {
          eval(in, shift);
        }
      }
    }
    shift_ = shift;
    comment_ = node.op_name();
    if (!node.provenance().source.empty()) comment_ += " @ " + node.provenance().source;
    const ir::Value& out = *node.output();

    switch (info.op_class) {
      case ir::OpClass::kPad:
        if (pieces.size() == 1) {  // nothing padded
          set(&out, round_as(pieces[0], out));
          break;
        }
        [[fallthrough]];
      case ir::OpClass::kCat: {
        KOp op;
        op.kind = KOpKind::kSelect;
        op.args = std::move(pieces);
        piece_ends.pop_back();  // the last piece takes every column after the others
        op.bounds = std::move(piece_ends);
        op.shift = shift;
        set(&out, round_as(add(std::move(op)), out));
        break;
      }
      case ir::OpClass::kUnary:
        set(&out, round_as(unary(info.fn, in(node, 0)), out));
        break;
      case ir::OpClass::kBinary: {
        if (info.fn.size() > 9 && info.fn.compare(info.fn.size() - 9, 9, "_backward") == 0) {
          set(&out, round_as(activation_grad(info.fn, in(node, 0), in(node, 1)), out));
          break;
        }
        int a = in(node, 0);
        int b = info.fn == "pow" ? constant(scalar_of(const_arg(node, 1))) : in(node, 1);
        if (info.fn == "rsub") {  // rsub(self, other, alpha) = other - alpha * self
          double alpha = scalar_of(const_arg(node, 2));
          if (alpha != 1.0) a = binary("mul", a, constant(alpha));
          set(&out, round_as(binary("sub", b, a), out));
          break;
        }
        if ((info.fn == "add" || info.fn == "sub") && node.inputs().size() > 2) {
          double alpha = scalar_of(const_arg(node, 2));
          if (alpha != 1.0) b = binary("mul", b, constant(alpha));
        }
        set(&out, round_as(binary(info.fn, a, b), out));
        break;
      }
      case ir::OpClass::kWhere: {
        KOp op;
        op.kind = KOpKind::kWhere;
        if (info.fn == "masked_fill") {
          // masked_fill(self, mask, value) is where(mask, value, self); the value is a number
          // or a 0-dim tensor.
          op.args = {in(node, 1), in(node, 2), in(node, 0)};
        } else {
          op.args = {in(node, 0), in(node, 1), in(node, 2)};
        }
        set(&out, round_as(add(std::move(op)), out));
        break;
      }
      case ir::OpClass::kCast:
        set(&out, round_as(in(node, 0), out));
        break;
      case ir::OpClass::kReduction: {
        if (info.fn == "var" || info.fn == "var_mean") {
          // Two passes over the row: the mean, then the squared deviations from it (the row is
          // in registers when it fits, so the second pass reads no memory; it is also more
          // accurate than a one-pass sum of squares).
          int x = in(node, 0);
          int cols = constant(0, "cols");
          int mean = binary("div", reduce(ReduceKind::kSum, x), cols);
          int d = binary("sub", x, mean);
          const c10::IValue& c = const_arg(node, 2);
          double correction = c.isNone() ? 1.0 : scalar_of(c);
          // max(cols - correction, 0), as eager: a correction past the row length gives inf.
          int divisor = correction == 0.0
                            ? cols
                            : binary("max", binary("sub", cols, constant(correction)), constant(0));
          int var = binary("div", reduce(ReduceKind::kSum, binary("mul", d, d)), divisor);
          set(node.output(0), round_as(var, *node.output(0)));
          if (info.fn == "var_mean") set(node.output(1), round_as(mean, *node.output(1)));
          break;
        }
        ReduceKind kind = info.fn == "max"   ? ReduceKind::kMax
                          : info.fn == "min" ? ReduceKind::kMin
                                             : ReduceKind::kSum;
        int r = reduce(kind, in(node, 0));
        if (info.fn == "mean") r = binary("div", r, constant(0, "cols"));
        set(&out, round_as(r, out));
        break;
      }
      case ir::OpClass::kColumnReduction: {
        ReduceKind kind = info.fn == "max"   ? ReduceKind::kMax
                          : info.fn == "min" ? ReduceKind::kMin
                                             : ReduceKind::kSum;
        int r = reduce(kind, in(node, 0));
        if (info.fn == "mean") r = binary("div", r, constant(0, "rows"));
        set(&out, round_as(r, out));
        break;
      }
      case ir::OpClass::kSoftmax: {
        int x = in(node, 0);
        int m = reduce(ReduceKind::kMax, x);
        int shifted = binary("sub", x, m);
        int e = unary("exp", shifted);
        int s = reduce(ReduceKind::kSum, e);
        int y =
            info.fn == "softmax" ? binary("div", e, s) : binary("sub", shifted, unary("log", s));
        set(&out, round_as(y, out));
        break;
      }
      case ir::OpClass::kLayerNorm: {
        // native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
        int x = in(node, 0);
        int cols = constant(0, "cols");
        int mean = binary("div", reduce(ReduceKind::kSum, x), cols);
        int d = binary("sub", x, mean);
        int var = binary("div", reduce(ReduceKind::kSum, binary("mul", d, d)), cols);
        double eps = scalar_of(const_arg(node, 4));
        int rstd = unary("rsqrt", binary("add", var, constant(eps)));
        int y = binary("mul", d, rstd);
        if (node.input(2)->kind() == ir::ValueKind::kTensor) y = binary("mul", y, in(node, 2));
        if (node.input(3)->kind() == ir::ValueKind::kTensor) y = binary("add", y, in(node, 3));
        set(node.output(0), round_as(y, *node.output(0)));
        set(node.output(1), round_as(mean, *node.output(1)));
        set(node.output(2), round_as(rstd, *node.output(2)));
        break;
      }
      default:
        MAGI_ASSERT(false, "unhandled op class for ", node.op_name());
    }
    comment_.clear();
    shift_ = 0;
  }

  const ir::Graph& group_;
  KernelSpec spec_;
  ir::SymExpr row_length_{0};
  std::vector<ir::SymExpr> space_;  ///< the index space of a column kernel
  void set_at(const ir::Value* v, int64_t shift, int op) { lowered_[{v, shift}] = op; }

  std::map<std::pair<const ir::Value*, int64_t>, int> lowered_;  ///< (value, shift) -> KOp
  std::unordered_map<const ir::Value*, int> input_index_;
  int64_t shift_ = 0;  ///< the column offset of the node being lowered
  std::string comment_;
  mutable std::map<c10::ScalarType, std::vector<int8_t>> exact_memo_;  // exact_in, per dtype
};

// The views after `node`'s values up to the index space (see input_view_chains).
const std::vector<const ir::Node*>& views_after(
    const ir::Node* node, std::unordered_map<const ir::Node*, std::vector<const ir::Node*>>& memo) {
  auto it = memo.find(node);
  if (it != memo.end()) return it->second;
  std::vector<const ir::Node*> chain;
  for (const ir::Value* out : node->outputs()) {
    if (out->users().empty()) continue;
    const ir::Node* user = out->users().front();  // all readers of a value share its views
    if (user->kind() == ir::NodeKind::kOutput) break;
    if (user->kind() == ir::NodeKind::kAtenOp &&
        ir::op_info(*user).op_class == ir::OpClass::kView) {
      chain.push_back(user);
    }
    const auto& rest = views_after(user, memo);
    chain.insert(chain.end(), rest.begin(), rest.end());
    break;
  }
  return memo[node] = std::move(chain);
}

}  // namespace

std::vector<std::vector<const ir::Node*>> input_view_chains(const ir::Graph& group) {
  std::unordered_map<const ir::Node*, std::vector<const ir::Node*>> memo;
  std::vector<std::vector<const ir::Node*>> chains;
  for (const ir::Value* in : group.inputs()) {
    chains.push_back(in->users().empty() ? std::vector<const ir::Node*>{}
                                         : views_after(in->users().front(), memo));
  }
  return chains;
}

KernelSpec lower_group(const ir::Graph& group, const std::string& name) {
  return Lowering(group, name).run();
}

}  // namespace magi::codegen
