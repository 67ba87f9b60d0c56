// eliminate_common_subexpressions on hand-built graphs: what merges (operators on the same
// inputs, equal literals, small equal tensor literals, chains), what stays (random ops, custom
// ops, reads of memory an op writes, returned duplicates, literals that differ in their bits).
#include <gtest/gtest.h>

#include <torch/library.h>

#include "magi/ir/printer.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"

#include "fusion_builder.h"
#include "test_helpers.h"

// An operator of a user library: its schema says it is functional, but the pass does not take
// a custom op's word for that.
TORCH_LIBRARY(magi_cse_test, m) { m.def("twice(Tensor x) -> Tensor"); }

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Value;
using test::count_ops;

constexpr int64_t kN = 8;

// Runs the pass, checks the graph is still valid, and says whether it changed it.
bool cse(Graph& g) {
  const bool changed = eliminate_common_subexpressions(g);
  for (const std::string& e : ir::verify_errors(g)) ADD_FAILURE() << e << "\n" << ir::to_string(g);
  return changed;
}

TEST(CommonSubexpressions, AnOperatorRepeatedOnTheSameInputsRunsOnce) {
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kN});
  Value* e1 = b.unary("aten::exp", x, "e1");
  Value* e2 = b.unary("aten::exp", x, "e2");
  g.set_outputs({b.add(e1, e2, "sum")});
  EXPECT_TRUE(cse(g));
  EXPECT_EQ(count_ops(g, "aten::exp"), 1u);
  EXPECT_EQ(ir::to_string(g),
            "graph(%x: f32[8]):\n"
            "  %e1: f32[8] = aten::exp(%x)\n"
            "  %sum: f32[8] = aten::add.Tensor(%e1, %e1, 1)\n"
            "  return (%sum)\n");
  EXPECT_FALSE(cse(g));  // nothing left to merge
}

TEST(CommonSubexpressions, ChainsMergeThroughEqualConstants) {
  // Each layer of a model builds the same table from its own literals: (x * 2.0) + 1 twice.
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kN});
  Value* outs[2];
  for (int i = 0; i < 2; ++i) {
    Value* scaled = b.binary("aten::mul", x, b.number(2.0), *x->tensor_type(), "scaled");
    outs[i] = b.binary("aten::add", scaled, b.number(1.0), *x->tensor_type(), "shifted");
  }
  g.set_outputs({b.binary("aten::mul", outs[0], outs[1], *x->tensor_type(), "product")});
  EXPECT_TRUE(cse(g));
  EXPECT_EQ(count_ops(g, "aten::mul.Tensor"), 2u);  // one scaling and the product
  EXPECT_EQ(count_ops(g, "aten::add.Tensor"), 1u);
}

TEST(CommonSubexpressions, LiteralsMergeOnlyWhenTheirBitsAgree) {
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kN});
  auto times = [&](Value* factor, const char* name) {
    return b.op("aten::mul", "Scalar", {x, factor}, *x->tensor_type(), name);
  };
  Value* zero = times(b.scalar(0.0), "zero");
  Value* negative_zero = times(b.scalar(-0.0), "negative_zero");
  Value* two_as_float = times(b.scalar(2.0), "two_float");
  Value* two_as_int = times(g.add_constant(2, ir::ValueKind::kScalar), "two_int");
  Value* a = b.add(zero, negative_zero, "a");
  g.set_outputs({b.add(a, b.add(two_as_float, two_as_int, "b"), "c")});
  const size_t before = g.num_nodes();
  EXPECT_TRUE(cse(g));  // the three adds' alphas (1) are one constant now
  EXPECT_EQ(g.num_nodes(), before - 2);
  EXPECT_EQ(count_ops(g, "aten::mul.Scalar"), 4u);
}

TEST(CommonSubexpressions, SmallTensorLiteralsMergeByValueLargeOnesNever) {
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kN});
  const ir::TensorType t = *x->tensor_type();
  // The lifted divisor of `x / 128` in two layers, one of `x / 64`, and a 0-dim tensor of 128
  // that is no wrapped number (it takes part in type promotion as a tensor).
  Value* d1 = b.binary("aten::div", x, b.number(128), t, "d1");
  Value* d2 = b.binary("aten::div", x, b.number(128), t, "d2");
  Value* d3 = b.binary("aten::div", x, b.number(64), t, "d3");
  Value* d4 = b.binary(
      "aten::div", x, g.add_constant(at::scalar_tensor(128.0, at::kDouble), ir::ValueKind::kTensor),
      t, "d4");
  // Two equal tensors of 100 elements: above the size whose bytes the pass compares.
  Value* big1 = g.add_constant(at::ones({100}), ir::ValueKind::kTensor);
  Value* big2 = g.add_constant(at::ones({100}), ir::ValueKind::kTensor);
  Value* s1 = b.op("aten::sum", "", {big1, b.none()}, test::tensor_type({}), "s1");
  Value* s2 = b.op("aten::sum", "", {big2, b.none()}, test::tensor_type({}), "s2");
  g.set_outputs({b.add(d1, d2, "a"), d3, d4, s1, s2});
  EXPECT_TRUE(cse(g));
  EXPECT_EQ(count_ops(g, "aten::div.Tensor"), 3u);  // d2 is d1; d3 divides by 64, d4 by a tensor
  EXPECT_EQ(count_ops(g, "aten::sum"), 2u);
}

TEST(CommonSubexpressions, RandomAndCustomOpsStay) {
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kN});
  const ir::TensorType t = *x->tensor_type();
  auto dropout = [&](const char* name) {
    return b.op("aten::dropout", "", {x, b.floating(0.5), b.flag(true)}, t, name);
  };
  Value* r1 = dropout("r1");
  Value* r2 = dropout("r2");
  Value* c1 = b.op("magi_cse_test::twice", "", {x}, t, "c1");
  Value* c2 = b.op("magi_cse_test::twice", "", {x}, t, "c2");
  g.set_outputs({b.add(r1, r2, "r"), b.add(c1, c2, "c")});
  cse(g);  // merges the equal constants only
  EXPECT_EQ(count_ops(g, "aten::dropout"), 2u);
  EXPECT_EQ(count_ops(g, "magi_cse_test::twice"), 2u);
}

TEST(CommonSubexpressions, ReadsOfMemoryAnOpWritesStay) {
  // neg(y) before and after add_(y, x) differ, and so do reads of a view of y; an op on x alone
  // still merges.
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kN});
  Value* y = b.input("y", {kN});
  Value* view = b.op("aten::view", "", {y, b.dims({2, 4})}, test::tensor_type({2, 4}), "view");
  Value* before = b.unary("aten::neg", y, "before");
  Value* view_before = b.unary("aten::neg", view, "view_before");
  Value* e1 = b.unary("aten::exp", x, "e1");
  test::named(g.add_op(test::op("aten::add_", "Tensor"), {y, x, b.one()}), "add_");
  Value* after = b.unary("aten::neg", y, "after");
  Value* view_after = b.unary("aten::neg", view, "view_after");
  Value* e2 = b.unary("aten::exp", x, "e2");
  g.set_outputs(
      {b.add(before, after, "a"), b.add(view_before, view_after, "b"), b.add(e1, e2, "c")});
  EXPECT_TRUE(cse(g));
  EXPECT_EQ(count_ops(g, "aten::neg"), 4u);
  EXPECT_EQ(count_ops(g, "aten::exp"), 1u);
}

TEST(CommonSubexpressions, ReturnedDuplicatesStayTwoTensors) {
  // Returned twice: two tensors, as eager returns them. Returned once and read once: the read
  // takes the returned one.
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kN});
  Value* e1 = b.unary("aten::exp", x, "e1");
  Value* e2 = b.unary("aten::exp", x, "e2");
  Value* n1 = b.unary("aten::neg", x, "n1");
  Value* n2 = b.unary("aten::neg", x, "n2");
  // A view of a duplicate returned: merged, it would share memory with the other output.
  Value* s1 = b.unary("aten::sin", x, "s1");
  Value* s2 = b.unary("aten::sin", x, "s2");
  Value* s2_view = b.op("aten::view", "", {s2, b.dims({2, 4})}, test::tensor_type({2, 4}), "v");
  g.set_outputs({e1, e2, n1, b.unary("aten::cos", n2, "cos"), s1, s2_view});
  EXPECT_TRUE(cse(g));
  EXPECT_EQ(count_ops(g, "aten::exp"), 2u);
  EXPECT_EQ(count_ops(g, "aten::neg"), 1u);
  EXPECT_EQ(count_ops(g, "aten::sin"), 2u);
}

TEST(CommonSubexpressions, ListViewsOfARepeatStayApartWhenReturned) {
  // (x + 1).unbind(0)[0] twice, both returned: unbind's result is a list of views of its input
  // (`Tensor(a)[]`), so merging the adds would return two views of one buffer.
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {2, 4});
  Value* items[2];
  for (int i = 0; i < 2; ++i) {
    Value* shifted = b.binary("aten::add", x, b.number(1.0), *x->tensor_type(), "shifted");
    Value* parts =
        test::named(g.add_op(test::op("aten::unbind", "int"), {shifted, b.integer(0)}), "parts");
    items[i] = test::named(g.add_getitem(parts, 0), "item");
    items[i]->set_kind(ir::ValueKind::kTensor);
    items[i]->set_tensor_type(test::tensor_type({4}));
  }
  g.set_outputs({items[0], items[1]});
  cse(g);
  EXPECT_EQ(count_ops(g, "aten::add.Tensor"), 2u);
  EXPECT_EQ(count_ops(g, "aten::unbind.int"), 2u);
}

TEST(CommonSubexpressions, EmptyOpsStay) {
  // Uninitialised memory: two empty_like results are two buffers, whatever fills them later.
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kN});
  auto empty = [&](const char* name) {
    return b.op("aten::empty_like", "", {x, b.none(), b.none(), b.none(), b.none(), b.none()},
                *x->tensor_type(), name);
  };
  Value* e1 = empty("e1");
  Value* e2 = empty("e2");
  g.set_outputs({b.add(e1, e2, "sum")});
  cse(g);
  EXPECT_EQ(count_ops(g, "aten::empty_like"), 2u);
}

TEST(CommonSubexpressions, RepeatsAcrossABoundaryCallStayInTheirPieces) {
  // exp(x) before and after a boundary call (named in splitting_ops): each stretch becomes a
  // piece, and each piece keeps its own exp; a third exp after the boundary merges with the
  // second. Without the boundary all three merge.
  for (bool boundary : {true, false}) {
    Graph g;
    test::Builder b(g);
    Value* x = b.input("x", {kN});
    Value* e1 = b.unary("aten::exp", x, "e1");
    Value* r = b.unary("aten::relu", e1, "r");
    Value* e2 = b.unary("aten::exp", x, "e2");
    Value* e3 = b.unary("aten::exp", x, "e3");
    g.set_outputs({b.add(b.add(r, e2, "a"), e3, "b")});
    const std::vector<std::string> splitting =
        boundary ? std::vector<std::string>{"aten::relu"} : std::vector<std::string>{};
    EXPECT_TRUE(eliminate_common_subexpressions(g, splitting));
    EXPECT_TRUE(ir::verify_errors(g).empty());
    EXPECT_EQ(count_ops(g, "aten::exp"), boundary ? 2u : 1u) << ir::to_string(g);
  }
}

}  // namespace
}  // namespace magi::passes
