// The DOT printer and the list of unfused ATen calls, on a small graph split at a boundary and
// fused: x @ w (the boundary), then sin and cos (one fusion group inside the piece after it).
#include "magi/ir/dot_printer.h"

#include <gtest/gtest.h>

#include "magi/common/error.h"
#include "magi/ir/fallbacks.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "test_helpers.h"

namespace magi::ir {
namespace {

using test::contains;
using test::named;
using test::op;
using test::sym;
using test::tensor_type;

class DotPrinterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 8}));
    Value* w = g.add_tensor_input("w", tensor_type({8, 8}));
    Value* h = typed(g.add_op(op("aten::mm"), {x, w}), "mm", "model.py:3 in forward");
    Value* s = typed(g.add_op(op("aten::sin"), {h}), "sin", "model.py:4 in forward");
    Value* c = typed(g.add_op(op("aten::cos"), {s}), "cos", "model.py:5 in forward");
    Value* t = typed(g.add_op(op("aten::t"), {c}), "t", "model.py:6 in forward");
    g.set_outputs({t});
    ASSERT_TRUE(passes::split_at_boundaries(g, {"aten::mm"}));
    ASSERT_TRUE(passes::fuse_groups(g));
    verify(g);
  }

  Value* typed(Node* node, const std::string& name, const std::string& source) {
    node->provenance().source = source;
    Value* v = named(node, name);
    v->set_tensor_type(tensor_type({sym("s0"), 8}));
    return v;
  }

  std::string dot(DotDetail detail) {
    DotOptions options;
    options.detail = detail;
    options.is_boundary = [](const Node& n) { return passes::is_boundary_call(n, {"aten::mm"}); };
    return to_dot(g, options);
  }

  Graph g;
};

TEST_F(DotPrinterTest, DrawsBoundariesPiecesAndFusionGroups) {
  std::string text = dot(DotDetail::kShape);
  EXPECT_TRUE(contains(text, "digraph magi {"));
  EXPECT_TRUE(contains(text, "\"mm\" [style=filled, fillcolor=\"#f4cccc\", color=\"#cc0000\""));
  EXPECT_TRUE(contains(text, "label=\"aten::mm\\n[boundary]\\n%mm: f32[s0, 8]\""));
  EXPECT_TRUE(contains(text, "subgraph \"cluster_piece_"));
  EXPECT_TRUE(contains(text, "fused kernel: 2 ops"));
  // Edges skip the fusion group's own inputs and outputs: mm's value flows straight into sin.
  EXPECT_TRUE(contains(text, "/sin\" -> \""));
  EXPECT_TRUE(contains(text, "/fused_cos/cos\" -> \""));
  // Edges come after every cluster, so no producer is pulled into a cluster by an edge.
  EXPECT_GT(text.find(" -> "), text.rfind("subgraph"));
}

TEST_F(DotPrinterTest, DetailLevelsChangeTheLabels) {
  std::string op_only = dot(DotDetail::kOp);
  std::string shape = dot(DotDetail::kShape);
  std::string source = dot(DotDetail::kSource);
  EXPECT_TRUE(contains(op_only, "label=\"aten::sin\","));
  EXPECT_TRUE(contains(shape, "label=\"aten::sin\\n%sin: f32[s0, 8]\","));
  EXPECT_TRUE(contains(source, "label=\"aten::sin\\n%sin: f32[s0, 8]\\nmodel.py:4 in forward\""));
  // Tooltips carry the names and source lines at every level.
  EXPECT_TRUE(contains(op_only, "tooltip=\"%sin = aten::sin  model.py:4 in forward\""));
}

TEST(DotDetail, ParsesTheThreeLevels) {
  EXPECT_EQ(parse_dot_detail("op"), DotDetail::kOp);
  EXPECT_EQ(parse_dot_detail("Shape"), DotDetail::kShape);
  EXPECT_EQ(parse_dot_detail("SOURCE"), DotDetail::kSource);
  std::string message = test::message_of<UserError>([] { parse_dot_detail("all"); });
  EXPECT_TRUE(contains(message, "'all' is not one of op, shape, source"));
}

TEST_F(DotPrinterTest, FallbacksListUnfusedAtenCallsWithReasons) {
  std::vector<AtenFallback> calls = aten_fallbacks(g);
  ASSERT_EQ(calls.size(), 2u);  // mm in the graph, t in the piece; sin and cos are fused
  EXPECT_EQ(calls[0].op, "aten::mm");
  EXPECT_EQ(calls[0].where, "");
  EXPECT_EQ(calls[0].source, "model.py:3 in forward");
  EXPECT_EQ(calls[0].reason, "not fusible: aten::mm has no generated form");
  EXPECT_EQ(calls[1].op, "aten::t");
  EXPECT_EQ(calls[1].where.rfind("piece_", 0), 0u);
}

}  // namespace
}  // namespace magi::ir
