// plan_padding on hand-built graphs: which graphs may run a batch padded to a larger size
// (every output row depends on its own input row alone), the rows per sample of each input and
// output, and the reason, naming the node, when a graph may not. And the bucket ladder.
#include "magi/runtime/padding.h"

#include <gtest/gtest.h>

#include "test_helpers.h"

namespace magi::runtime {
namespace {

using ir::Graph;
using ir::Node;
using ir::SymOp;
using ir::Value;
using ir::ValueKind;
using test::contains;
using test::op;
using test::sym;
using test::tensor_type;

Value* int_const(Graph& g, int64_t v) { return g.add_constant(v, ValueKind::kInt); }

// Gives a node's output the type the FX importer would have recorded.
Value* typed(Node* node, std::vector<ir::SymExpr> sizes) {
  node->output()->set_tensor_type(tensor_type(std::move(sizes)));
  return node->output();
}

// x: f32[s0, 4], w: f32[4, 4] -> relu(mm(x, w) + x), 2 * size(x, 0), split(relu, 2, dim=1)[1],
// relu.view([size(x, 0) * 2, 2])
TEST(Padding, RowwiseGraphPadsEveryBatchedInputAndOutput) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
  Value* w = g.add_tensor_input("w", tensor_type({4, 4}));
  Value* mm = typed(g.add_op(op("aten::mm"), {x, w}), {sym("s0"), 4});
  Value* add =
      typed(g.add_op(op("aten::add", "Tensor"), {mm, x, g.add_constant(1, ValueKind::kScalar)}),
            {sym("s0"), 4});
  Value* relu = typed(g.add_op(op("aten::relu"), {add}), {sym("s0"), 4});
  Value* n = g.add_sym(SymOp::kSize, {x, int_const(g, 0)})->output();
  n->set_sym(sym("s0"));  // as the FX importer records it
  Value* doubled = g.add_sym(SymOp::kMul, {n, int_const(g, 2)})->output();
  doubled->set_sym(ir::SymExpr(2) * sym("s0"));
  Node* split = g.add_op(op("aten::split", "Tensor"), {relu, int_const(g, 2), int_const(g, 1)});
  Value* piece = typed(g.add_getitem(split->output(), 1), {sym("s0"), 2});
  Value* shape = g.add_list(ValueKind::kIntList, {doubled, int_const(g, 2)})->output();
  Value* view = typed(g.add_op(op("aten::view"), {relu, shape}), {ir::SymExpr(2) * sym("s0"), 2});
  g.set_outputs({relu, doubled, piece, view});

  PaddingPlan plan = plan_padding(g);
  ASSERT_TRUE(plan.possible()) << plan.reason;
  EXPECT_EQ(plan.symbol, "s0");
  EXPECT_EQ(plan.input_rows, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(plan.output_rows, (std::vector<int64_t>{1, 2, 1, 2}));  // view: 2 rows per sample
  EXPECT_EQ(plan.output_dims, (std::vector<int64_t>{0, -1, 0, 0}));
  EXPECT_EQ(plan.str(),
            "s0: inputs 0 (x1); outputs 0 (dim 0, x1), 1 (x2), 2 (dim 0, x1), 3 (dim 0, x2)");
}

TEST(Padding, SumOverTheBatchDimIsNamed) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
  Value* dims = g.add_constant(c10::IValue(std::vector<int64_t>{0}), ValueKind::kIntList);
  Node* sum =
      g.add_op(op("aten::sum", "dim_IntList"), {x, dims, g.add_constant(false, ValueKind::kBool),
                                                g.add_constant(c10::IValue(), ValueKind::kNone)});
  typed(sum, {4});
  sum->provenance().source = "model.py:7 in forward";
  g.set_outputs({typed(g.add_op(op("aten::sub", "Tensor"),
                                {x, sum->output(), g.add_constant(1, ValueKind::kScalar)}),
                       {sym("s0"), 4})});
  PaddingPlan plan = plan_padding(g);
  EXPECT_FALSE(plan.possible());
  EXPECT_EQ(plan.reason,
            "aten::sum.dim_IntList (model.py:7 in forward) works across the batch dim (dim 0)");
  EXPECT_EQ(plan.str(), "not padded: " + plan.reason);
}

TEST(Padding, BatchSizeAsAValueIsNamed) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
  Value* n = g.add_sym(SymOp::kSize, {x, int_const(g, 0)})->output();
  n->set_sym(sym("s0"));
  g.set_outputs({typed(g.add_op(op("aten::mul", "Scalar"), {x, n}), {sym("s0"), 4})});
  PaddingPlan plan = plan_padding(g);
  EXPECT_FALSE(plan.possible());
  EXPECT_TRUE(
      contains(plan.reason, "aten::mul.Scalar takes the batch size as its argument 'other'"));
}

TEST(Padding, ReshapeWithTheBatchInsideIsRejected) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
  Value* t = typed(g.add_op(op("aten::t"), {x}), {4, sym("s0")});  // fine by itself
  Value* n = g.add_sym(SymOp::kSize, {x, int_const(g, 0)})->output();
  n->set_sym(sym("s0"));
  Value* flat = g.add_sym(SymOp::kMul, {n, int_const(g, 4)})->output();
  flat->set_sym(ir::SymExpr(4) * sym("s0"));
  Value* shape = g.add_list(ValueKind::kIntList, {flat})->output();
  g.set_outputs({typed(g.add_op(op("aten::reshape"), {t, shape}), {ir::SymExpr(4) * sym("s0")})});
  PaddingPlan plan = plan_padding(g);
  EXPECT_FALSE(plan.possible());
  EXPECT_TRUE(contains(plan.reason, "aten::reshape reshapes with the batch dim not outermost"));
}

TEST(Padding, UnknownShapesCountAsBatched) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
  Value* t = g.add_op(op("aten::t"), {x})->output();  // no type recorded
  g.set_outputs({typed(g.add_op(op("aten::relu"), {t}), {4, sym("s0")})});
  EXPECT_EQ(plan_padding(g).reason,
            "aten::t makes a tensor of unknown shape, whose batch size is not k * s0 in one dim");
}

TEST(Padding, UnreadExtraOutputsOfUnknownShapeDoNotCount) {
  // var_mean's second output (the mean) left untyped and unread, as CUDA attention's RNG state.
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
  Value* dims = g.add_constant(c10::IValue(std::vector<int64_t>{1}), ValueKind::kIntList);
  Node* vm = g.add_op(op("aten::var_mean", "correction"),
                      {x, dims, g.add_constant(c10::IValue(), ValueKind::kNone),
                       g.add_constant(true, ValueKind::kBool)});
  vm->output(0)->set_tensor_type(tensor_type({sym("s0"), 1}));
  g.set_outputs({vm->output(0)});
  EXPECT_TRUE(plan_padding(g).possible()) << plan_padding(g).reason;
}

TEST(Padding, StaticGraphHasNothingToPad) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({3, 4}));
  g.set_outputs({g.add_op(op("aten::relu"), {x})->output()});
  EXPECT_EQ(plan_padding(g).str(), "not padded: no tensor input has a dynamic dim 0");
}

TEST(Padding, BucketIsTheNextLadderSizeOrTheSizeItself) {
  const std::vector<int64_t> ladder = default_bucket_ladder();
  ASSERT_EQ(ladder.size(), 35u);
  EXPECT_EQ(ladder.front(), 1);
  EXPECT_EQ(ladder.back(), 256);
  EXPECT_EQ(bucket_for(ladder, 1), 1);
  EXPECT_EQ(bucket_for(ladder, 3), 4);
  EXPECT_EQ(bucket_for(ladder, 5), 8);
  EXPECT_EQ(bucket_for(ladder, 8), 8);
  EXPECT_EQ(bucket_for(ladder, 9), 16);
  EXPECT_EQ(bucket_for(ladder, 256), 256);
  EXPECT_EQ(bucket_for(ladder, 257), 257);
  EXPECT_EQ(bucket_for({}, 7), 7);
}

}  // namespace
}  // namespace magi::runtime
