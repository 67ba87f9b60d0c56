// Fusion and code generation on hand-built graphs: the grouping decisions of fuse_groups
// (chains, norms, cycles, single ops, matmuls, shapes, per-row operands), op_info's operand
// check, and the printed kernels of a pointwise, a row-reduction and a column-reduction group
// against golden files in tests/cpp/golden (MAGI_UPDATE_GOLDEN=1 rewrites them from the current
// output). The golden CUDA kernels are NVRTC-compiled for sm_90, the C++ ones host-compiled,
// and the groups run as FusedKernels against ATen.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "magi/codegen/compiler.h"
#include "magi/codegen/lower_group.h"
#include "magi/codegen/printers.h"
#include "magi/ir/op_info.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "magi/runtime/executor.h"
#include "magi/runtime/fused_kernel.h"
#include "test_helpers.h"

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::SymExpr;
using ir::TensorType;
using ir::Value;
using ir::ValueKind;
using test::sym;
using test::tensor_type;

constexpr auto kF32 = c10::ScalarType::Float;
constexpr auto kBF16 = c10::ScalarType::BFloat16;

// Adds ATen ops to a graph the way the FX importer does: typed, named outputs, constant
// arguments, and a source line for the kernel comments.
class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}

  Value* input(const std::string& name, std::vector<SymExpr> sizes, c10::ScalarType dtype = kF32) {
    return g_.add_tensor_input(name, tensor_type(std::move(sizes), dtype));
  }
  Value* op(const char* name, const char* overload, std::vector<Value*> inputs, TensorType type,
            const std::string& out_name, int line = 0) {
    Node* n = g_.add_op(test::op(name, overload), std::move(inputs));
    if (line > 0) n->provenance().source = "model.py:" + std::to_string(line) + " in forward";
    n->output()->set_tensor_type(std::move(type));
    return test::named(n, out_name);
  }

  // Argument constants.
  Value* number(double v) {  // a Python number read as a Tensor, as the importer wraps it
    at::Tensor t = at::scalar_tensor(v, at::kDouble);
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return g_.add_constant(t, ValueKind::kTensor);
  }
  Value* scalar(double v) { return g_.add_constant(v, ValueKind::kScalar); }
  Value* one() { return g_.add_constant(1, ValueKind::kScalar); }
  Value* integer(int64_t v) { return g_.add_constant(v, ValueKind::kInt); }
  Value* dims(std::vector<int64_t> d) {
    return g_.add_constant(c10::List<int64_t>(d), ValueKind::kIntList);
  }
  Value* flag(bool b) { return g_.add_constant(b, ValueKind::kBool); }
  Value* none() { return g_.add_constant(c10::IValue(), ValueKind::kNone); }
  Value* dtype(c10::ScalarType t) {
    return g_.add_constant(static_cast<int64_t>(t), ValueKind::kDtype);
  }

  // Ops, typed like `like` unless given a type.
  Value* unary(const char* name, Value* x, const std::string& out, int line = 0) {
    return op(name, "", {x}, *x->tensor_type(), out, line);
  }
  Value* binary(const char* name, Value* a, Value* b, TensorType type, const std::string& out,
                int line = 0) {
    std::string n = name;
    std::vector<Value*> in = {a, b};
    if (n == "aten::add" || n == "aten::sub") in.push_back(one());
    return op(name, "Tensor", std::move(in), std::move(type), out, line);
  }
  Value* add(Value* a, Value* b, const std::string& out, int line = 0) {
    return binary("aten::add", a, b, *a->tensor_type(), out, line);
  }
  Value* mul(Value* a, Value* b, const std::string& out, int line = 0) {
    return binary("aten::mul", a, b, *a->tensor_type(), out, line);
  }
  Value* cast(Value* x, c10::ScalarType to, const std::string& out, int line = 0) {
    TensorType t = *x->tensor_type();
    t.dtype = to;
    return op("aten::_to_copy", "", {x, dtype(to), none(), none(), none(), flag(false), none()}, t,
              out, line);
  }
  // A reduction over the leading dims 0..k-1.
  Value* column_reduce(const char* name, const char* overload, Value* x, int64_t k, bool keepdim,
                       const std::string& out, int line = 0) {
    TensorType t = *x->tensor_type();
    std::vector<int64_t> d;
    for (int64_t i = 0; i < k; ++i) {
      d.push_back(i);
      t.sizes[i] = SymExpr(1);
    }
    if (!keepdim) t.sizes.erase(t.sizes.begin(), t.sizes.begin() + k);
    std::vector<Value*> in = {x, dims(d), flag(keepdim)};
    if (std::string(name) != "aten::amax") in.push_back(none());
    return op(name, overload, std::move(in), t, out, line);
  }
  // x[..., start:end] (end past the size, as Python's x[..., start:] captures)
  Value* slice(Value* x, int64_t start, int64_t end, const std::string& out) {
    TensorType t = *x->tensor_type();
    const int64_t size = t.sizes.back().constant_value();
    t.sizes.back() = SymExpr(std::min(end, size) - start);
    return op("aten::slice", "Tensor", {x, integer(-1), integer(start), integer(end), integer(1)},
              t, out);
  }
  Value* cat_last(std::vector<Value*> pieces, const std::string& out) {
    TensorType t = *pieces[0]->tensor_type();
    int64_t width = 0;
    for (Value* p : pieces) width += p->tensor_type()->sizes.back().constant_value();
    t.sizes.back() = SymExpr(width);
    Value* list = g_.add_list(ValueKind::kTensorList, std::move(pieces))->output();
    return op("aten::cat", "", {list, integer(-1)}, t, out);
  }
  // x.view(sizes), the size list built as the importer builds it: a list of the graph input
  // `s0` (an int) and constants when a size is symbolic, else a constant list.
  Value* view(Value* x, std::vector<SymExpr> sizes, const std::string& out) {
    TensorType t = *x->tensor_type();
    t.sizes = sizes;
    t.strides.clear();
    std::vector<Value*> items;
    bool symbolic = false;
    for (const SymExpr& e : sizes) {
      symbolic |= !e.is_constant();
      items.push_back(e.is_constant() ? integer(e.constant_value()) : sym_input());
    }
    Value* list =
        symbolic ? g_.add_list(ValueKind::kIntList, std::move(items))->output() : dims([&] {
          std::vector<int64_t> d;
          for (const SymExpr& e : sizes) d.push_back(e.constant_value());
          return d;
        }());
    return op("aten::view", "", {x, list}, t, out);
  }
  Value* permute(Value* x, std::vector<int64_t> perm, const std::string& out) {
    TensorType t = *x->tensor_type();
    TensorType p = t;
    for (size_t d = 0; d < perm.size(); ++d) p.sizes[d] = t.sizes[perm[d]];
    p.strides.clear();
    return op("aten::permute", "", {x, dims(perm)}, p, out);
  }
  Value* sym_input() {
    if (s0_ == nullptr) s0_ = g_.add_input("s0", ValueKind::kInt);
    return s0_;
  }
  Value* row_reduce(const char* name, const char* overload, Value* x, bool keepdim,
                    const std::string& out, int line = 0) {
    TensorType t = *x->tensor_type();
    t.sizes.pop_back();
    if (keepdim) t.sizes.push_back(SymExpr(1));
    std::vector<Value*> in = {x, dims({-1}), flag(keepdim)};
    if (std::string(name) != "aten::amax") in.push_back(none());
    return op(name, overload, std::move(in), t, out, line);
  }

 private:
  Graph& g_;
  Value* s0_ = nullptr;
};

std::vector<Node*> nodes_of_kind(const Graph& g, NodeKind kind) {
  std::vector<Node*> out;
  for (Node* n : g.nodes()) {
    if (n->kind() == kind) out.push_back(n);
  }
  return out;
}

// "aten::add.Tensor aten::silu ..." of the operators of `g`, in order.
std::string op_list(const Graph& g) {
  std::string s;
  for (const Node* n : g.nodes()) {
    if (n->is_operator()) s += (s.empty() ? "" : " ") + n->op_name();
  }
  return s;
}

// ---- grouping decisions ----------------------------------------------------------------------

TEST(FuseGroups, PointwiseChainBecomesOneGroup) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16});
  Value* y = b.input("y", {sym("s0"), 16});
  Value* h = b.unary("aten::silu", b.add(x, y, "add"), "silu");
  g.set_outputs({b.mul(h, y, "mul")});

  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::add.Tensor aten::silu aten::mul.Tensor");
  EXPECT_EQ(fusions[0]->inputs().size(), 2u);
  EXPECT_EQ(op_list(g), "");  // nothing left outside
  EXPECT_EQ(g.outputs()[0], fusions[0]->output());
}

TEST(FuseGroups, RmsNormIsOneRowGroup) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 64}, kBF16);
  Value* w = b.input("w", {64});
  Value* xf = b.cast(x, kF32, "xf");
  Value* sq = b.op("aten::pow", "Tensor_Scalar", {xf, b.scalar(2)}, *xf->tensor_type(), "pow");
  Value* var = b.row_reduce("aten::mean", "dim", sq, true, "mean");
  Value* r = b.unary("aten::rsqrt", b.add(var, b.number(1e-6), "add"), "rsqrt");
  Value* y = b.mul(b.mul(xf, r, "mul"), w, "mul_1");
  g.set_outputs({b.cast(y, kBF16, "out")});

  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  const Graph& group = *fusions[0]->piece();
  EXPECT_EQ(op_list(group),
            "aten::_to_copy aten::pow.Tensor_Scalar aten::mean.dim aten::add.Tensor aten::rsqrt "
            "aten::mul.Tensor aten::mul.Tensor aten::_to_copy");
  codegen::KernelSpec spec = codegen::lower_group(group, "rms");
  EXPECT_EQ(spec.schedule, codegen::Schedule::kRow);
  int reductions = 0;
  for (const auto& op : spec.ops) reductions += op.kind == codegen::KOpKind::kReduce;
  EXPECT_EQ(reductions, 1);
}

// y = x * w.float() with w narrower than x: the cast moves into x's group (the kernel loads
// the bf16 weight and casts it) instead of running alone; a cast read by two groups stays out.
TEST(FuseGroups, LoneCastOfANarrowOperandJoinsItsReadersGroup) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 64});
  Value* w = b.input("w", {64}, kBF16);
  Value* wf = b.cast(w, kF32, "wf");
  Value* y = b.mul(b.unary("aten::silu", x, "silu"), wf, "mul");
  g.set_outputs({y});

  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::_to_copy aten::silu aten::mul.Tensor");
  EXPECT_EQ(fusions[0]->input(0), w);  // the bf16 weight itself, in first-use order
  EXPECT_EQ(op_list(g), "");

  Graph g2;
  Builder b2(g2);
  Value* x2 = b2.input("x", {sym("s0"), 64});
  Value* w2 = b2.input("w", {64}, kBF16);
  Value* wf2 = b2.cast(w2, kF32, "wf");
  Value* y2 = b2.mul(b2.unary("aten::silu", x2, "silu"), wf2, "mul");
  Value* m =
      b2.op("aten::mm", "", {y2, b2.input("v", {64, 64})}, tensor_type({sym("s0"), 64}), "mm");
  g2.set_outputs({b2.add(b2.unary("aten::exp", m, "exp"), wf2, "add")});
  EXPECT_TRUE(fuse_groups(g2));
  ir::verify(g2);
  EXPECT_EQ(op_list(g2), "aten::_to_copy aten::mm");
}

// exp(x) and sin(y) start two groups; the mul that reads both joins the later one, and the
// earlier merges into it: one kernel. When the second chain reads the first through an op
// outside both (an mm), they stay apart: merged, the group would feed the mm and wait for it.
TEST(FuseGroups, SiblingChainsMergeUnlessAPathLeavesThem) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16});
  Value* y = b.input("y", {sym("s0"), 16});
  Value* e = b.unary("aten::exp", x, "exp");
  Value* s = b.unary("aten::sin", y, "sin");
  g.set_outputs({b.mul(e, s, "mul")});
  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::exp aten::sin aten::mul.Tensor");
  EXPECT_EQ(op_list(g), "");

  Graph g2;
  Builder b2(g2);
  Value* x2 = b2.input("x", {sym("s0"), 16});
  Value* e2 = b2.unary("aten::neg", b2.unary("aten::exp", x2, "exp"), "neg");
  Value* m =
      b2.op("aten::mm", "", {e2, b2.input("w", {16, 16})}, tensor_type({sym("s0"), 16}), "mm");
  Value* s2 = b2.unary("aten::sin", m, "sin");
  g2.set_outputs({b2.mul(e2, s2, "mul")});
  EXPECT_TRUE(fuse_groups(g2));
  ir::verify(g2);
  EXPECT_EQ(op_list(g2), "aten::mm");
  EXPECT_EQ(nodes_of_kind(g2, NodeKind::kFusion).size(), 2u);
}

// amax(x) starts a row group and x * 3 a pointwise one; their sum joins the pointwise group,
// which then merges into the row group: one row kernel. Two row groups never merge.
TEST(FuseGroups, PointwiseChainMergesIntoARowGroupItMeets) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16});
  Value* m = b.row_reduce("aten::amax", "", x, true, "amax");
  Value* t = b.mul(x, b.number(3.0), "mul");
  g.set_outputs({b.binary("aten::add", m, t, *t->tensor_type(), "add")});
  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::amax aten::mul.Tensor aten::add.Tensor");
  EXPECT_EQ(codegen::lower_group(*fusions[0]->piece(), "k").schedule, codegen::Schedule::kRow);

  Graph g2;
  Builder b2(g2);
  Value* x2 = b2.input("x", {sym("s0"), 16});
  Value* y2 = b2.input("y", {sym("s0"), 16});
  Value* mx = b2.row_reduce("aten::amax", "", b2.unary("aten::exp", x2, "exp"), true, "amax");
  Value* my = b2.row_reduce("aten::amax", "", b2.unary("aten::sin", y2, "sin"), true, "amax_1");
  g2.set_outputs({b2.add(mx, my, "add")});
  EXPECT_TRUE(fuse_groups(g2));
  ir::verify(g2);
  EXPECT_EQ(nodes_of_kind(g2, NodeKind::kFusion).size(), 2u);
}

// A column group (weight-gradient shape): the pass over the index space evaluates x * y and
// sums it over the leading dims; the per-column ops after the sum (times a [cols] operand, a
// cast) join. A full-size op reading the per-column sum does not (it would need the sum
// during the pass), nor does a row reduction, nor a sum over a different run of dims.
TEST(FuseGroups, ColumnReductionGroupTakesPerColumnOpsOnly) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 4, 16});
  Value* y = b.input("y", {sym("s0"), 4, 16});
  Value* w = b.input("w", {16});
  Value* p = b.mul(x, y, "mul");
  Value* s = b.column_reduce("aten::sum", "dim_IntList", p, 2, false, "sum");
  Value* sw = b.binary("aten::mul", s, w, *s->tensor_type(), "mul_w");
  Value* out = b.cast(sw, kBF16, "out");
  Value* centered = b.binary("aten::sub", p, s, *p->tensor_type(), "sub");
  Value* rows = b.row_reduce("aten::amax", "", p, true, "amax");
  Value* s1 = b.column_reduce("aten::sum", "dim_IntList", p, 1, false, "sum_1");
  g.set_outputs({out, centered, rows, s1});
  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(*fusions[0]->piece()),
            "aten::mul.Tensor aten::sum.dim_IntList aten::mul.Tensor aten::_to_copy");
  EXPECT_EQ(op_list(g), "aten::sub.Tensor aten::amax aten::sum.dim_IntList");
  codegen::KernelSpec spec = codegen::lower_group(*fusions[0]->piece(), "k");
  EXPECT_EQ(spec.schedule, codegen::Schedule::kColumn);
  EXPECT_EQ(spec.column_dims, 2);
  EXPECT_TRUE(spec.inputs[2].per_row);    // w: one value per column
  EXPECT_FALSE(spec.outputs[0].per_row);  // x * y, read outside
  EXPECT_TRUE(spec.outputs[1].per_row);
}

// rotate_half: x * cos + cat(-x[..., 8:], x[..., :8]) * sin. Each slice starts a group; the
// cat merges them and joins, and the rest follows: one pointwise kernel, whose cat reads x at
// column offsets +8 and -8. When a slice's value is also read outside, nothing of the slices
// and cat is fused (the kernel never writes a slice's value).
// A view of a pointwise group's value joins when no value computed before it is read outside:
// the index space becomes the view's shape, the input read before the view gets the view as
// its chain, and the view's symbolic size list becomes constants with -1. A permute joins
// alike. A view of a value also read outside stays an ATen call.
TEST(FuseGroups, ViewsJoinWhenTheValuesBeforeThemStayInside) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 4, 32});
  Value* y = b.input("y", {8});
  Value* v = b.view(b.mul(x, b.number(2.0), "mul"), {sym("s0"), 4, 4, 8}, "view");
  g.set_outputs({b.mul(v, y, "mul_1")});
  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  const Graph& group = *fusions[0]->piece();
  EXPECT_EQ(op_list(group), "aten::mul.Tensor aten::view aten::mul.Tensor");
  EXPECT_TRUE(nodes_of_kind(g, NodeKind::kMakeList).empty());  // the size list went with it
  for (const Node* n : group.nodes()) {
    if (n->op_name() == "aten::view") {
      EXPECT_EQ(n->input(1)->producer()->constant().toIntList().vec(),
                (std::vector<int64_t>{-1, 4, 4, 8}));
    }
  }
  auto chains = codegen::input_view_chains(group);
  ASSERT_EQ(chains.size(), 2u);
  EXPECT_EQ(chains[0].size(), 1u);  // x, read before the view
  EXPECT_TRUE(chains[1].empty());   // y, read after it

  Graph g2;
  Builder b2(g2);
  Value* x2 = b2.input("x", {sym("s0"), 6, 8});
  Value* z2 = b2.input("z", {sym("s0"), 8, 6});
  Value* p = b2.permute(b2.unary("aten::sigmoid", x2, "sigmoid"), {0, 2, 1}, "permute");
  g2.set_outputs({b2.add(p, z2, "add")});
  EXPECT_TRUE(fuse_groups(g2));
  ir::verify(g2);
  auto f2 = nodes_of_kind(g2, NodeKind::kFusion);
  ASSERT_EQ(f2.size(), 1u);
  EXPECT_EQ(op_list(*f2[0]->piece()), "aten::sigmoid aten::permute aten::add.Tensor");

  Graph g3;
  Builder b3(g3);
  Value* x3 = b3.input("x", {sym("s0"), 32});
  Value* a = b3.unary("aten::exp", b3.mul(x3, b3.number(2.0), "mul"), "exp");
  Value* v3 = b3.view(a, {sym("s0"), 4, 8}, "view");
  g3.set_outputs({a, b3.unary("aten::sin", v3, "sin")});
  EXPECT_TRUE(fuse_groups(g3));  // mul and exp still fuse
  ir::verify(g3);
  EXPECT_EQ(nodes_of_kind(g3, NodeKind::kFusion).size(), 1u);
  EXPECT_NE(op_list(g3).find("aten::view"), std::string::npos);
  EXPECT_NE(op_list(g3).find("aten::sin"), std::string::npos);
}

TEST(FuseGroups, RotateHalfSlicesAndCatAreOneGroup) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16});
  Value* cos = b.input("cos", {16});
  Value* sin = b.input("sin", {16});
  Value* lo = b.slice(x, 0, 8, "slice");
  Value* hi = b.slice(x, 8, INT64_MAX, "slice_1");
  Value* rot = b.cat_last({b.unary("aten::neg", hi, "neg"), lo}, "cat");
  g.set_outputs({b.add(b.mul(x, cos, "mul"), b.mul(rot, sin, "mul_1"), "add")});
  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(*fusions[0]->piece()),
            "aten::slice.Tensor aten::slice.Tensor aten::neg aten::cat aten::mul.Tensor "
            "aten::mul.Tensor aten::add.Tensor");
  codegen::KernelSpec spec = codegen::lower_group(*fusions[0]->piece(), "k");
  std::vector<int64_t> shifts;
  for (const codegen::KOp& op : spec.ops) {
    if (op.kind == codegen::KOpKind::kLoad && op.shift != 0) shifts.push_back(op.shift);
    if (op.kind == codegen::KOpKind::kSelect) {
      EXPECT_EQ(op.bounds, std::vector<int64_t>{8});
    }
  }
  EXPECT_EQ(shifts, (std::vector<int64_t>{8, -8}));

  Graph g2;
  Builder b2(g2);
  Value* x2 = b2.input("x", {sym("s0"), 16});
  Value* lo2 = b2.slice(x2, 0, 8, "slice");
  Value* hi2 = b2.unary("aten::neg", b2.slice(x2, 8, 16, "slice_1"), "neg");
  Value* cat2 = b2.cat_last({hi2, lo2}, "cat");
  g2.set_outputs({b2.mul(cat2, x2, "mul"), b2.unary("aten::exp", lo2, "exp")});
  fuse_groups(g2);
  ir::verify(g2);
  EXPECT_EQ(op_list(g2),
            "aten::slice.Tensor aten::slice.Tensor aten::neg aten::cat aten::mul.Tensor aten::exp");
}

// a = neg(exp(x)) is a group; m = mm(a, w) reads it; add(a, m) must not join the group: the
// group would then both feed and wait for the mm (a cycle). It starts a group with the relu.
TEST(FuseGroups, OperandDependingOnTheGroupIsNotMerged) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {8, 8});
  Value* w = b.input("w", {8, 8});
  Value* a = b.unary("aten::neg", b.unary("aten::exp", x, "exp"), "neg");
  Value* m = b.op("aten::mm", "", {a, w}, tensor_type({8, 8}), "mm");
  Value* s = b.unary("aten::relu", b.add(a, m, "add"), "relu");
  g.set_outputs({s});

  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);  // in particular: every value defined before its use
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 2u);
  EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::exp aten::neg");
  EXPECT_EQ(op_list(*fusions[1]->piece()), "aten::add.Tensor aten::relu");
  EXPECT_EQ(op_list(g), "aten::mm");
}

TEST(FuseGroups, SingleOpsAreNotFused) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16});
  Value* w = b.input("w", {16, 16});
  Value* r = b.unary("aten::relu", x, "relu");
  Value* m = b.op("aten::mm", "", {r, w}, tensor_type({sym("s0"), 16}), "mm");
  g.set_outputs({b.unary("aten::sigmoid", m, "sigmoid")});

  EXPECT_FALSE(fuse_groups(g));
  EXPECT_TRUE(nodes_of_kind(g, NodeKind::kFusion).empty());
  EXPECT_EQ(op_list(g), "aten::relu aten::mm aten::sigmoid");
}

// A lone softmax is still a group: one row kernel replaces ATen's softmax.
TEST(FuseGroups, LoneSoftmaxIsARowGroup) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16});
  Value* sm =
      b.op("aten::_softmax", "", {x, b.integer(-1), b.flag(false)}, *x->tensor_type(), "softmax");
  Value* w = b.input("w", {16, 16});
  g.set_outputs({b.op("aten::mm", "", {sm, w}, tensor_type({sym("s0"), 16}), "mm")});

  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::_softmax");
  EXPECT_EQ(codegen::lower_group(*fusions[0]->piece(), "sm").schedule, codegen::Schedule::kRow);
  EXPECT_EQ(op_list(g), "aten::mm");
}

TEST(FuseGroups, MatmulBreaksGroups) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16});
  Value* w = b.input("w", {16, 16});
  Value* h = b.unary("aten::relu", b.unary("aten::neg", x, "neg"), "relu");
  Value* m = b.op("aten::mm", "", {h, w}, tensor_type({sym("s0"), 16}), "mm");
  Value* y = b.mul(b.unary("aten::sigmoid", m, "sigmoid"), x, "mul");
  g.set_outputs({y});

  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 2u);
  EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::neg aten::relu");
  EXPECT_EQ(op_list(*fusions[1]->piece()), "aten::sigmoid aten::mul.Tensor");
  EXPECT_EQ(op_list(g), "aten::mm");
}

// exp over [4, 8], then an add that broadcasts it to [2, 4, 8]: two index spaces, two groups
// (the exp alone stays an ATen call).
TEST(FuseGroups, DifferentShapesAreNotMerged) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {4, 8});
  Value* y = b.input("y", {2, 4, 8});
  Value* e = b.unary("aten::exp", x, "exp");
  Value* s = b.binary("aten::add", e, y, tensor_type({2, 4, 8}), "add");
  g.set_outputs({b.unary("aten::relu", s, "relu")});

  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::add.Tensor aten::relu");
  EXPECT_EQ(op_list(g), "aten::exp");
}

// Regression: sum(x, -1) of x [s0, 4, 8] is [s0, 4], one value per row. An operand of that
// shape from outside the group was read by element of [s0, 4, 8] at run time (a size
// mismatch, or silently wrong values when the sizes happened to broadcast). A 0-dim operand
// may join.
TEST(FuseGroups, PerRowValueWithoutDimTakesOnlyScalarOperands) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 4, 8});
  Value* z = b.input("z", {sym("s0"), 4});
  Value* t = b.input("t", {});
  Value* s = b.row_reduce("aten::sum", "dim_IntList", b.mul(x, b.number(2), "mul"), false, "sum");
  Value* st = b.mul(s, t, "mul_t");
  g.set_outputs({b.mul(st, z, "mul_z")});

  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(*fusions[0]->piece()),
            "aten::mul.Tensor aten::sum.dim_IntList aten::mul.Tensor");
  EXPECT_EQ(op_list(g), "aten::mul.Tensor");  // the one reading z
}

// Regression: an int64 operand was accepted, then the printer had no type for it and the
// kernel fell back to ATen with an internal-error log line on every new variant. A CPU scalar
// tensor read by a CUDA op (eager allows it) would have made the launch fail an assertion.
TEST(FuseGroups, OperandsKernelsCannotLoadAreNotFusible) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 8});
  Value* p = b.input("p", {8}, c10::ScalarType::Long);
  Value* m = b.binary("aten::mul", x, p, *x->tensor_type(), "mul");
  TensorType on_gpu = tensor_type({sym("s0"), 8});
  on_gpu.device = c10::Device(c10::DeviceType::CUDA, 0);
  Value* xg = g.add_tensor_input("xg", on_gpu);
  Value* t = b.input("t", {});
  Value* mg = b.binary("aten::mul", xg, t, on_gpu, "mul_gpu");
  g.set_outputs({b.unary("aten::exp", m, "exp"), b.unary("aten::exp", mg, "exp_gpu")});

  std::string reason;
  EXPECT_EQ(ir::op_info(*m->producer(), &reason).op_class, ir::OpClass::kOther);
  EXPECT_TRUE(test::contains(reason, "dtype Long"));
  EXPECT_EQ(ir::op_info(*mg->producer(), &reason).op_class, ir::OpClass::kOther);
  EXPECT_TRUE(test::contains(reason, "another device"));
  EXPECT_FALSE(fuse_groups(g));
}

// ---- printed kernels -------------------------------------------------------------------------

std::string golden_path(const std::string& name) {
  return std::string(MAGI_GOLDEN_DIR) + "/" + name;
}

// Compares `text` with golden file `name`, or rewrites the file when MAGI_UPDATE_GOLDEN=1.
void expect_golden(const std::string& text, const std::string& name) {
  const char* update = std::getenv("MAGI_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(golden_path(name)) << text;
    return;
  }
  std::ifstream in(golden_path(name));
  ASSERT_TRUE(in.good()) << golden_path(name) << " is missing; run with MAGI_UPDATE_GOLDEN=1";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(text, expected.str()) << "printed kernel differs from " << golden_path(name)
                                  << " (MAGI_UPDATE_GOLDEN=1 rewrites it after review)";
}

// silu(x + bias) * u in bfloat16; u is read through general strides.
std::unique_ptr<Graph> silu_mul_group() {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  SymExpr rows = sym("s0"), cols = sym("s1");
  Value* x = b.input("x", {rows, cols}, kBF16);
  Value* bias = b.input("bias", {cols}, kBF16);
  Value* u = b.input("u", {rows, cols}, kBF16);
  Value* h = b.unary("aten::silu", b.add(x, bias, "add", 20), "silu", 20);
  g->set_outputs({b.mul(h, u, "mul", 21)});
  return g;
}

// h = x + residual; out = rmsnorm(h) * w, in bfloat16 with float32 math; returns (out, h).
std::unique_ptr<Graph> add_rmsnorm_group() {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  SymExpr rows = sym("s0");
  Value* x = b.input("x", {rows, 64}, kBF16);
  Value* residual = b.input("residual", {rows, 64}, kBF16);
  Value* w = b.input("w", {64});
  Value* h = b.add(x, residual, "add", 30);
  Value* hf = b.cast(h, kF32, "float", 31);
  Value* sq = b.op("aten::pow", "Tensor_Scalar", {hf, b.scalar(2)}, *hf->tensor_type(), "pow", 32);
  Value* var = b.row_reduce("aten::mean", "dim", sq, true, "mean", 32);
  Value* r = b.unary("aten::rsqrt", b.add(var, b.number(1e-6), "add_eps", 33), "rsqrt", 33);
  Value* y = b.mul(b.mul(hf, r, "mul", 33), w, "mul_w", 34);
  g->set_outputs({b.cast(y, kBF16, "out", 34), h});
  return g;
}

// A weight gradient in bfloat16: p = g * xn (also an output), dw = sum(p, 0) * w cast to
// bfloat16, w one value per column.
std::unique_ptr<Graph> column_weight_grad_group() {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  SymExpr rows = sym("s0");
  Value* grad = b.input("grad", {rows, 64}, kBF16);
  Value* xn = b.input("xn", {rows, 64}, kBF16);
  Value* w = b.input("w", {64});
  Value* p = b.mul(grad, xn, "mul", 40);
  Value* pf = b.cast(p, kF32, "float", 41);
  Value* dw = b.column_reduce("aten::sum", "dim_IntList", pf, 1, false, "sum", 41);
  Value* scaled = b.binary("aten::mul", dw, w, *dw->tensor_type(), "mul_w", 42);
  g->set_outputs({b.cast(scaled, kBF16, "dw", 42), p});
  return g;
}

using codegen::AccessClass;

codegen::KernelVariant variant(const codegen::KernelSpec& spec, std::vector<AccessClass> access,
                               int width) {
  codegen::KernelVariant v;
  v.spec = &spec;
  v.access = std::move(access);
  v.vector_width = width;
  return v;
}

struct Case {
  const char* name;
  std::unique_ptr<Graph> (*build)();
  std::vector<AccessClass> access;
  int cuda_width;
  bool rows_in_warps = false;  // the GPU form for rows of at most 32 threads
  bool streamed_rows = false;  // the GPU form for rows too long for registers
};

const Case kCases[] = {
    {"pointwise_silu_mul",
     &silu_mul_group,
     {AccessClass::kContiguous, AccessClass::kColumn, AccessClass::kStrided},
     8},
    {"row_add_rmsnorm",
     &add_rmsnorm_group,
     {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn},
     8},
    {"column_weight_grad",
     &column_weight_grad_group,
     {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn},
     8},
    {"row_add_rmsnorm_warps",
     &add_rmsnorm_group,
     {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn},
     8,
     true},
    {"row_add_rmsnorm_streamed",
     &add_rmsnorm_group,
     {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn},
     8,
     false,
     true},
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class PrintedKernel : public ::testing::TestWithParam<Case> {};

TEST_P(PrintedKernel, CudaMatchesGoldenAndCompiles) {
  const Case& c = GetParam();
  std::unique_ptr<Graph> group = c.build();
  ir::verify(*group);
  codegen::KernelSpec spec = codegen::lower_group(*group, std::string("fused_") + c.name);
  codegen::KernelVariant v = variant(spec, c.access, c.cuda_width);
  v.rows_in_warps = c.rows_in_warps;
  v.streamed_rows = c.streamed_rows;
  std::string source = codegen::print_cuda(v);
  expect_golden(source, std::string(c.name) + ".cu");
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "NVRTC is not installed on this machine";
  std::vector<char> cubin = codegen::compile_cuda_to_cubin(
      std::string(codegen::kCudaPreamble) + "\n" + source, v.symbol(), 90);
  EXPECT_FALSE(cubin.empty());
}

TEST_P(PrintedKernel, CppMatchesGoldenAndCompiles) {
  const Case& c = GetParam();
  if (c.rows_in_warps || c.streamed_rows) {
    GTEST_SKIP() << "a GPU layout: the C++ printer has one row form";
  }
  std::unique_ptr<Graph> group = c.build();
  codegen::KernelSpec spec = codegen::lower_group(*group, std::string("fused_") + c.name);
  codegen::KernelVariant v = variant(spec, c.access, 1);
  std::string source = codegen::print_cpp(v);
  expect_golden(source, std::string(c.name) + ".cpp");
  EXPECT_NE(
      codegen::get_cpu_function(std::string(codegen::kCpuPreamble) + "\n" + source, v.symbol()),
      nullptr);
}

// The group as a FusedKernel (the golden variants: a transposed u, a [cols] bias or weight)
// against the same group run op by op through ATen.
TEST_P(PrintedKernel, RunsLikeAten) {
  const Case& c = GetParam();
  std::unique_ptr<Graph> group = c.build();
  runtime::FusedKernel kernel(*group, std::string("fused_") + c.name);
  runtime::Executable reference(*group);
  const int64_t rows = 7, cols = 64;
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < c.access.size(); ++i) {
    const auto& type = *group->inputs()[i]->tensor_type();
    auto options = at::TensorOptions().dtype(type.dtype);
    switch (c.access[i]) {
      case AccessClass::kColumn:
        inputs.push_back(at::randn({cols}, options));
        break;
      case AccessClass::kStrided:
        inputs.push_back(at::randn({cols, rows}, options).t());
        break;
      default:
        inputs.push_back(at::randn({rows, cols}, options));
    }
  }
  std::vector<at::Tensor> got = kernel.run(inputs);
  std::vector<c10::IValue> want = reference.run({inputs.begin(), inputs.end()});
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    at::Tensor e = want[k].toTensor().to(at::kDouble), a = got[k].to(at::kDouble);
    ASSERT_EQ(a.sizes(), e.sizes());
    double rel = (a - e).abs().max().item<double>() / e.abs().max().item<double>();
    EXPECT_LE(rel, 1e-2) << "output " << k;
  }
  std::string access;
  for (AccessClass a : c.access) access += static_cast<char>(a);
  ASSERT_EQ(kernel.generated().size(), 1u);
  EXPECT_EQ(kernel.generated()[0].symbol, std::string("fused_") + c.name + "_" + access + "_v1");
}

// Moves every tensor of `g` to `device`, keeping sizes and dtypes; `strides` (when given)
// replaces the first input's strides.
void place_on(Graph& g, c10::Device device, std::vector<SymExpr> strides = {}) {
  auto move = [&](Value* v, bool first_input) {
    if (!v->tensor_type()) return;
    TensorType t = *v->tensor_type();
    t.device = device;
    if (first_input && !strides.empty()) t.strides = strides;
    v->set_tensor_type(std::move(t));
  };
  for (size_t i = 0; i < g.inputs().size(); ++i) move(g.inputs()[i], i == 0);
  for (Node* n : g.nodes()) {
    if (n->kind() == NodeKind::kInput) continue;
    for (Value* out : n->outputs()) move(out, false);
  }
}

// Before the first call, the variant it will need is predicted from the traced layouts and its
// source printed exactly as the call prints it, so compiling it ahead makes the call a cache
// hit: contiguous activations and a per-column weight give 16-byte vectors; rows of 64 values
// take 8 lanes each, several rows to a block; a transposed activation is read through strides;
// a graph on the CPU has nothing to precompile.
TEST(FusedKernel, ExpectedCudaSourceFollowsTheTracedLayouts) {
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  auto g = add_rmsnorm_group();
  place_on(*g, cuda);
  runtime::FusedKernel kernel(*g, "fused_add_rmsnorm");
  auto expected = kernel.expected_cuda_source();
  ASSERT_TRUE(expected.has_value());
  auto call = variant(
      kernel.spec(), {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn}, 8);
  call.rows_in_warps = true;
  EXPECT_EQ(expected->name, call.symbol());
  EXPECT_EQ(expected->source,
            std::string(codegen::kCudaPreamble) + "\n" + codegen::print_cuda(call));
  if (codegen::nvrtc_available()) {
    EXPECT_FALSE(codegen::compile_cuda_batch({*expected}, 90).front().empty());
  }

  auto transposed = add_rmsnorm_group();
  place_on(*transposed, cuda, {SymExpr(1), sym("s0")});
  runtime::FusedKernel strided(*transposed, "fused_add_rmsnorm_t");
  auto expected_strided = strided.expected_cuda_source();
  ASSERT_TRUE(expected_strided.has_value());
  auto strided_call = variant(
      strided.spec(), {AccessClass::kStrided, AccessClass::kContiguous, AccessClass::kColumn}, 8);
  strided_call.rows_in_warps = true;
  EXPECT_EQ(expected_strided->name, strided_call.symbol());

  auto on_cpu = add_rmsnorm_group();
  EXPECT_FALSE(runtime::FusedKernel(*on_cpu, "fused_cpu").expected_cuda_source().has_value());
}

INSTANTIATE_TEST_SUITE_P(Golden, PrintedKernel, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace magi::passes

// The multiply-and-shift division of the generated kernels' index arithmetic against integer
// division: small divisors exhaustively at their edges, random ones anywhere up to 2^31, and
// the largest dividends.
TEST(DivisionConstants, MultiplyAndShiftDividesExactlyBelowTwoToThe31) {
  std::mt19937_64 rng(20261124);
  std::vector<int64_t> divisors = {1,
                                   2,
                                   3,
                                   7,
                                   64,
                                   127,
                                   128,
                                   129,
                                   4095,
                                   4096,
                                   8192,
                                   65535,
                                   (int64_t{1} << 30) + 1,
                                   (int64_t{1} << 31) - 1,
                                   int64_t{1} << 31};
  for (int64_t d = 1; d <= 2048; ++d) divisors.push_back(d);
  for (int i = 0; i < 2000; ++i) divisors.push_back(1 + static_cast<int64_t>(rng() % (1u << 31)));
  const uint64_t top = (uint64_t{1} << 31) - 1;
  for (int64_t d : divisors) {
    unsigned magic = 0, shift = 0;
    magi::runtime::division_constants(d, magic, shift);
    std::vector<uint64_t> dividends = {0, 1, top, top - 1};
    for (uint64_t k : {1, 2, 3, 1000}) {
      if (k * d - 1 <= top) dividends.insert(dividends.end(), {k * d - 1, k * d});
    }
    for (int i = 0; i < 64; ++i) dividends.push_back(rng() % (top + 1));
    for (uint64_t n : dividends) {
      if (n > top) continue;
      const uint64_t high = (n * magic) >> 32;
      const uint64_t q = ((high + n) & 0xffffffffu) >> shift;
      ASSERT_EQ(q, n / static_cast<uint64_t>(d)) << n << " / " << d;
    }
  }
}
