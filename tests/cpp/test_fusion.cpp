// Fusion on hand-built graphs: the grouping decisions of fuse_groups (chains, norms, cycles,
// single ops, matmuls, shapes, per-row operands, views, slices and cat) and op_info's operand
// check. Groups around writes in place are in test_fusion_writes.cpp, the printed kernels in
// test_printers.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "magi/codegen/kernel_ir.h"
#include "magi/codegen/lower_group.h"
#include "magi/ir/op_info.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"

#include "fusion_builder.h"
#include "test_helpers.h"

namespace magi::test {
namespace {

using passes::fuse_groups;

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

TEST(FuseGroups, AGroupTakesAtMostSixteenTensors) {
  // x0 + x1 + ... + x19: one chain, but a kernel takes at most 16 tensors (inputs and outputs).
  Graph g;
  Builder b(g);
  Value* acc = b.input("x0", {sym("s0"), 16});
  for (int i = 1; i < 20; ++i) {
    acc = b.add(acc, b.input("x" + std::to_string(i), {sym("s0"), 16}), "add" + std::to_string(i));
  }
  g.set_outputs({acc});
  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 2u);
  size_t ops = 0;
  for (Node* f : fusions) {
    EXPECT_LE(f->inputs().size() + f->outputs().size(), 16u);
    ops += nodes_of_kind(*f->piece(), NodeKind::kAtenOp).size();
  }
  EXPECT_EQ(ops, 19u);  // every add still fused
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
  ASSERT_EQ(fusions.size(), 2u);  // sum_1, over another run of dims, is a column group alone
  EXPECT_EQ(op_list(*fusions[0]->piece()),
            "aten::mul.Tensor aten::sum.dim_IntList aten::mul.Tensor aten::_to_copy");
  EXPECT_EQ(op_list(*fusions[1]->piece()), "aten::sum.dim_IntList");
  EXPECT_EQ(op_list(g), "aten::sub.Tensor aten::amax");
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

// In bfloat16, eager rounds every op's result; an op whose result is already a bfloat16 value
// (negation and cat of loaded values) is not rounded again: rotate_half's kernel rounds after
// the two products and the sum only. The float32 group rounds nothing.
TEST(LowerGroup, ExactOpsOfBf16ValuesAreNotRoundedAgain) {
  for (c10::ScalarType dtype : {kBF16, kF32}) {
    Graph g;
    Builder b(g);
    Value* x = b.input("x", {sym("s0"), 16}, dtype);
    Value* cos = b.input("cos", {16}, dtype);
    Value* sin = b.input("sin", {16}, dtype);
    Value* lo = b.slice(x, 0, 8, "slice");
    Value* hi = b.slice(x, 8, INT64_MAX, "slice_1");
    Value* rot = b.cat_last({b.unary("aten::neg", hi, "neg"), lo}, "cat");
    g.set_outputs({b.add(b.mul(x, cos, "mul"), b.mul(rot, sin, "mul_1"), "add")});
    ASSERT_TRUE(fuse_groups(g));
    auto fusions = nodes_of_kind(g, NodeKind::kFusion);
    ASSERT_EQ(fusions.size(), 1u);
    codegen::KernelSpec spec = codegen::lower_group(*fusions[0]->piece(), "k");
    std::vector<std::string> rounded;  // what each rounding rounds
    for (const codegen::KOp& op : spec.ops) {
      if (op.kind != codegen::KOpKind::kRound) continue;
      const codegen::KOp& arg = spec.ops[op.args[0]];
      rounded.push_back(arg.kind == codegen::KOpKind::kBinary ? arg.fn : "other");
    }
    if (dtype == kBF16) {
      EXPECT_EQ(rounded, (std::vector<std::string>{"mul", "mul", "add"}));
    } else {
      EXPECT_TRUE(rounded.empty());
    }
  }
}

// The gradient of rotate_half, as the capture decomposes slice_backward: each half of the
// incoming gradient padded back to the full width with zeros. The pads, their slices and the
// sums are one kernel that selects per column; a pad of another dim or a crop stays in ATen.
TEST(FuseGroups, PadsOfTheLastDimJoinTheGroupTheirInputsCameFrom) {
  Graph g;
  Builder b(g);
  Value* grad = b.input("grad", {sym("s0"), 16});
  Value* cos = b.input("cos", {16});
  Value* sin = b.input("sin", {16});
  Value* rot_grad = b.mul(grad, sin, "mul");
  Value* lo = b.slice(rot_grad, 0, 8, "slice");
  Value* hi = b.slice(rot_grad, 8, INT64_MAX, "slice_1");
  Value* into_hi = b.pad(b.unary("aten::neg", lo, "neg"), {8, 0}, 0.0, "constant_pad_nd");
  Value* into_lo = b.pad(hi, {0, 8}, 0.0, "constant_pad_nd_1");
  Value* sum = b.add(b.add(into_hi, into_lo, "add"), b.mul(grad, cos, "mul_1"), "add_1");
  g.set_outputs({sum});
  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(op_list(g), "");
  EXPECT_EQ(op_list(*fusions[0]->piece()),
            "aten::mul.Tensor aten::slice.Tensor aten::slice.Tensor aten::neg "
            "aten::constant_pad_nd aten::constant_pad_nd aten::mul.Tensor aten::add.Tensor "
            "aten::add.Tensor");
  codegen::KernelSpec spec = codegen::lower_group(*fusions[0]->piece(), "k");
  std::vector<std::vector<int64_t>> selects;
  for (const codegen::KOp& op : spec.ops) {
    if (op.kind == codegen::KOpKind::kSelect) selects.push_back(op.bounds);
  }
  // Each pad is a select at column 8: zeros then the negated low half; the high half then zeros.
  EXPECT_EQ(selects, (std::vector<std::vector<int64_t>>{{8}, {8}}));

  for (const std::vector<int64_t>& widths : std::vector<std::vector<int64_t>>{
           {0, 0, 1, 0},  // a row of zeros before the first: a pad of dim 0
           {-2, 2},       // a crop of two columns on the left
       }) {
    Graph g2;
    Builder b2(g2);
    Value* x = b2.input("x", {4, 16});
    Value* e = b2.unary("aten::exp", x, "exp");
    Value* p = b2.pad(b2.unary("aten::neg", e, "neg"), widths, 0.0, "constant_pad_nd");
    g2.set_outputs({b2.unary("aten::relu", p, "relu")});
    fuse_groups(g2);
    ir::verify(g2);
    const std::string widths_text = std::to_string(widths[0]) + " " + std::to_string(widths[1]);
    EXPECT_EQ(op_list(g2).rfind("aten::constant_pad_nd", 0), 0u)
        << "pad widths " << widths_text << ": " << op_list(g2);
    auto groups = nodes_of_kind(g2, NodeKind::kFusion);
    ASSERT_FALSE(groups.empty()) << widths_text;
    EXPECT_EQ(op_list(*groups[0]->piece()), "aten::exp aten::neg") << widths_text;
  }
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

// A lone sum over the leading dims (a weight gradient whose product another group computed)
// is a column group; a lone row sum stays ATen's.
TEST(FuseGroups, LoneColumnSumIsAGroup) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 6, 32});
  Value* col = b.column_reduce("aten::sum", "dim_IntList", x, 2, false, "sum");
  Value* row = b.row_reduce("aten::sum", "dim_IntList", x, false, "sum_1");
  g.set_outputs({col, row});
  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  EXPECT_EQ(codegen::lower_group(*fusions[0]->piece(), "col").schedule, codegen::Schedule::kColumn);
  EXPECT_EQ(op_list(g), "aten::sum.dim_IntList");
}

// A lone copy of a non-contiguous operand into a contiguous result (repeat_kv's clone of an
// expand, a cast of a transposed tensor) is a group: a generated kernel reads the operand
// through its strides. A lone copy of a contiguous operand, or one keeping the operand's layout,
// stays one ATen call.
TEST(FuseGroups, LoneCopyOfAStridedOperandIsAGroup) {
  for (const bool strided : {true, false}) {
    for (const bool cast : {false, true}) {
      Graph g;
      Builder b(g);
      Value* x = b.input("x", {sym("s0"), 8, 16});
      Value* operand = x;
      if (strided) {  // x.transpose(1, 2), with the strides the importer records
        operand = b.permute(x, {0, 2, 1}, "permute");
        TensorType t = *operand->tensor_type();
        t.strides = {SymExpr(128), SymExpr(1), SymExpr(16)};
        operand->set_tensor_type(t);
      }
      TensorType out = *operand->tensor_type();
      out.strides = TensorType::contiguous_strides(out.sizes);
      Value* copy = cast ? b.cast(operand, kBF16, "to_copy")
                         : b.op("aten::clone", "", {operand, b.none()}, out, "clone");
      out.dtype = copy->tensor_type()->dtype;
      copy->set_tensor_type(out);  // into a contiguous result (contiguous_format)
      Value* w = b.input("w", {out.sizes[2], SymExpr(8)}, out.dtype);
      g.set_outputs({b.op("aten::matmul", "", {copy, w}, out, "matmul")});
      SCOPED_TRACE(std::string(strided ? "strided" : "contiguous") + (cast ? " cast" : " clone"));
      EXPECT_EQ(fuse_groups(g), strided);
      ir::verify(g);
      auto fusions = nodes_of_kind(g, NodeKind::kFusion);
      ASSERT_EQ(fusions.size(), strided ? 1u : 0u);
      if (strided) {
        EXPECT_EQ(op_list(*fusions[0]->piece()),
                  std::string(cast ? "aten::_to_copy" : "aten::clone"));
      }
    }
  }
  Graph g;  // x.transpose(1, 2).clone(): preserve_format keeps the transposed layout
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 8, 16});
  Value* p = b.permute(x, {0, 2, 1}, "permute");
  TensorType t = *p->tensor_type();
  t.strides = {SymExpr(128), SymExpr(1), SymExpr(16)};
  p->set_tensor_type(t);
  g.set_outputs({b.op("aten::clone", "", {p, b.none()}, t, "clone")});
  EXPECT_FALSE(fuse_groups(g));
}

// w = float(x + y) feeds an mm through exp in one group and, after the mm, a mul in another.
// Writing w (float32) and reading it back costs 8 bytes per element; writing x + y (bf16) and
// casting it where the mul reads it costs 4: the mul's group recomputes the cast. When an ATen
// call (the mm) reads w itself, w stays written.
TEST(FuseGroups, CheapWideValueIsRecomputedWhereItIsRead) {
  for (const bool mm_reads_cast : {false, true}) {
    Graph g;
    Builder b(g);
    Value* x = b.input("x", {sym("s0"), 16}, kBF16);
    Value* y = b.input("y", {sym("s0"), 16}, kBF16);
    Value* sum = b.add(x, y, "add");
    Value* w = b.cast(sum, kF32, "to_copy");
    Value* t = b.unary("aten::exp", w, "exp");
    Value* mm = b.op("aten::mm", "", {mm_reads_cast ? w : t, b.input("m", {16, 16})},
                     tensor_type({sym("s0"), 16}), "mm");
    g.set_outputs({b.mul(w, mm, "mul"), t});
    SCOPED_TRACE(mm_reads_cast ? "the mm reads the cast" : "only groups read the cast");

    EXPECT_TRUE(fuse_groups(g));
    ir::verify(g);
    auto fusions = nodes_of_kind(g, NodeKind::kFusion);
    ASSERT_EQ(fusions.size(), mm_reads_cast ? 1u : 2u);
    std::vector<std::string> written;
    for (const Value* out : fusions[0]->outputs()) {
      written.push_back(ir::dtype_short_name(out->tensor_type()->dtype));
    }
    if (mm_reads_cast) {  // the mul stays a lone ATen call
      EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::add.Tensor aten::_to_copy aten::exp");
      EXPECT_EQ(written, (std::vector<std::string>{"f32", "f32"}));  // the cast and exp
      EXPECT_EQ(op_list(g), "aten::mm aten::mul.Tensor");
      continue;
    }
    EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::add.Tensor aten::_to_copy aten::exp");
    EXPECT_EQ(written, (std::vector<std::string>{"bf16", "f32"}));  // the sum and exp
    EXPECT_EQ(op_list(*fusions[1]->piece()), "aten::_to_copy aten::mul.Tensor");
    EXPECT_EQ(fusions[1]->input(0), fusions[0]->output(0));  // reads the bf16 sum
    EXPECT_EQ(op_list(g), "aten::mm");
  }
}

// The same graph with y.add_(x) between the groups: the recomputed cast would read x + y after
// the write, so the float32 cast stays written.
TEST(FuseGroups, NoRecomputationAcrossAWrite) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16}, kBF16);
  Value* y = b.input("y", {sym("s0"), 16}, kBF16);
  Value* w = b.cast(b.add(x, y, "add"), kF32, "to_copy");
  Value* t = b.unary("aten::exp", w, "exp");
  Value* mm = b.op("aten::mm", "", {t, b.input("m", {16, 16})}, tensor_type({sym("s0"), 16}), "mm");
  b.op("aten::add_", "Tensor", {y, x, b.one()}, *y->tensor_type(), "add_");
  g.set_outputs({b.mul(w, b.unary("aten::exp", mm, "exp_1"), "mul"), t});

  EXPECT_TRUE(fuse_groups(g));
  ir::verify(g);
  auto fusions = nodes_of_kind(g, NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 2u);
  EXPECT_EQ(op_list(*fusions[1]->piece()), "aten::exp aten::mul.Tensor");  // no cast recomputed
  EXPECT_EQ(fusions[0]->output(0)->tensor_type()->dtype, kF32);
}

// silu(a) * u and exp(a * u) both read a and u, and neither reads the other: one kernel reads
// them once. The mm reading the first group's value moves after it. Groups that share only a
// narrow operand (a [16] weight) stay apart.
TEST(FuseGroups, PointwiseSiblingsReadingOneTensorMerge) {
  for (const bool share_full : {true, false}) {
    Graph g;
    Builder b(g);
    Value* a = b.input("a", {sym("s0"), 16});
    Value* u = b.input("u", {sym("s0"), 16});
    Value* c = b.input("c", {16});
    Value* h = b.mul(b.unary("aten::silu", a, "silu"), share_full ? u : c, "mul");
    Value* mm =
        b.op("aten::mm", "", {h, b.input("m", {16, 16})}, tensor_type({sym("s0"), 16}), "mm");
    Value* e = b.unary("aten::exp",
                       b.mul(share_full ? a : b.input("z", {sym("s0"), 16}), c, "mul_1"), "exp");
    g.set_outputs({mm, e});
    SCOPED_TRACE(share_full ? "a and u shared" : "only c shared");

    EXPECT_TRUE(fuse_groups(g));
    ir::verify(g);
    auto fusions = nodes_of_kind(g, NodeKind::kFusion);
    if (!share_full) {
      EXPECT_EQ(fusions.size(), 2u);
      continue;
    }
    ASSERT_EQ(fusions.size(), 1u);
    EXPECT_EQ(op_list(*fusions[0]->piece()),
              "aten::silu aten::mul.Tensor aten::mul.Tensor aten::exp");
    EXPECT_EQ(fusions[0]->inputs(), (std::vector<Value*>{a, u, c}));
    EXPECT_EQ(op_list(g), "aten::mm");
    const auto nodes = g.nodes();
    EXPECT_LT(std::find(nodes.begin(), nodes.end(), fusions[0]),
              std::find(nodes.begin(), nodes.end(), mm->producer()));
  }
}

// RMSNorm's gradient as the capture decomposes it: a row sum, scaled per row by the cube of
// the rsqrt (saved, so read through a detach, or a graph input), expanded to the row and
// divided by its length, then combined with full-size values. The detach and the expand fold
// away (elementwise ops broadcast), the per-row scaling joins the row group, and the whole
// gradient is one row kernel.
TEST(FuseGroups, NormGradientWithExpandAndDetachIsOneRowGroup) {
  for (const bool saved_rsqrt_is_input : {false, true}) {
    Graph g;
    Builder b(g);
    Value* x = b.cast(b.input("x", {8, 64}, kBF16), kF32, "xf");
    Value* dy = b.input("dy", {8, 64});
    Value* ms = b.row_reduce("aten::mean", "dim", b.mul(x, x, "sq"), true, "mean");
    Value* r = b.unary("aten::rsqrt", ms, "rsqrt");
    Value* cubed_of = saved_rsqrt_is_input
                          ? b.input("r_saved", {8, 1})
                          : b.op("aten::detach", "", {r}, *r->tensor_type(), "detach");
    Value* cube =
        b.op("aten::pow", "Tensor_Scalar", {cubed_of, b.scalar(3)}, *r->tensor_type(), "pow");
    Value* s = b.row_reduce("aten::sum", "dim_IntList", b.mul(dy, x, "dyx"), true, "sum");
    Value* t = b.mul(s, cube, "scaled");
    Value* e = b.op("aten::expand", "", {t, b.dims({8, 64}), b.flag(false)}, tensor_type({8, 64}),
                    "expand");
    Value* d = b.op("aten::div", "Scalar", {e, b.scalar(64)}, tensor_type({8, 64}), "div");
    g.set_outputs({b.add(b.mul(dy, r, "dyr"), b.mul(d, x, "dx"), "grad")});
    SCOPED_TRACE(saved_rsqrt_is_input ? "rsqrt saved as an input" : "rsqrt through a detach");

    EXPECT_TRUE(fuse_groups(g));
    ir::verify(g);
    auto fusions = nodes_of_kind(g, NodeKind::kFusion);
    ASSERT_EQ(fusions.size(), 1u);
    EXPECT_EQ(op_list(g), "");  // no expand, detach or pow left to ATen
    const Graph& group = *fusions[0]->piece();
    EXPECT_EQ(codegen::lower_group(group, "norm_grad").schedule, codegen::Schedule::kRow);
    for (const Node* n : group.nodes()) {
      if (n->op_name() == "aten::div.Scalar") {  // computed once a row
        EXPECT_EQ(n->output()->tensor_type()->sizes, (std::vector<SymExpr>{8, 1}));
      }
    }
  }
}

// An expand that a matmul reads is no broadcast an elementwise op could do: it stays.
TEST(FuseGroups, ExpandReadByAMatmulStays) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {8, 1});
  Value* e =
      b.op("aten::expand", "", {b.unary("aten::exp", x, "exp"), b.dims({8, 16}), b.flag(false)},
           tensor_type({8, 16}), "expand");
  g.set_outputs({b.op("aten::mm", "", {e, b.input("w", {16, 4})}, tensor_type({8, 4}), "mm")});
  EXPECT_FALSE(fuse_groups(g));
  EXPECT_EQ(op_list(g), "aten::exp aten::expand aten::mm");
}

// ---- printed kernels -------------------------------------------------------------------------

}  // namespace
}  // namespace magi::test
