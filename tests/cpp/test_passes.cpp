// Passes and the pipeline: eliminate_dead_code graph-in -> graph-out, and how run_pipeline
// reports, disables and verifies passes.
#include <gtest/gtest.h>

#include <cstdlib>

#include "magi/common/error.h"
#include "magi/ir/printer.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "magi/passes/pipeline.h"
#include "test_helpers.h"

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::SymOp;
using ir::Value;
using ir::ValueKind;
using test::contains;
using test::message_of;
using test::named;
using test::op;
using test::tensor_type;

// A graph whose result is relu(x), with dead code of every removable kind next to operators
// that must stay although nobody reads their result.
class DeadCodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Value* x = g.add_tensor_input("x", tensor_type({4}));
    Value* y = g.add_tensor_input("y", tensor_type({4}));
    g.add_tensor_input("unused", tensor_type({4}));
    Value* relu = named(g.add_op(op("aten::relu"), {x}), "relu");

    // Dead: an operator chain, symbolic arithmetic, a list, a split and its getitem.
    Value* neg = named(g.add_op(op("aten::neg"), {x}), "neg");
    named(g.add_op(op("aten::exp"), {neg}), "exp");
    Value* n = named(g.add_sym(SymOp::kSize, {x, g.add_constant(0, ValueKind::kInt)}), "size");
    named(g.add_sym(SymOp::kMul, {n, g.add_constant(2, ValueKind::kInt)}), "twice");
    g.add_list(ValueKind::kIntList, {n, n});
    Value* split =
        named(g.add_op(op("aten::split", "Tensor"),
                       {x, g.add_constant(2, ValueKind::kInt), g.add_constant(0, ValueKind::kInt)}),
              "split");
    named(g.add_getitem(split, 0), "getitem");

    // Kept: an in-place write, a random op, and an op without results.
    named(g.add_op(op("aten::add_", "Tensor"), {y, x, g.add_constant(1, ValueKind::kScalar)}),
          "add_");
    named(g.add_op(op("aten::dropout"), {x, g.add_constant(0.5, ValueKind::kFloat),
                                         g.add_constant(true, ValueKind::kBool)}),
          "dropout");
    g.add_op(op("aten::_assert_async", "msg"),
             {x, g.add_constant(std::string("x is bad"), ValueKind::kString)});
    g.set_outputs({relu});
    ASSERT_TRUE(ir::verify_errors(g).empty());
  }

  Graph g;
};

TEST_F(DeadCodeTest, RemovesUnusedNodesAndKeepsSideEffects) {
  EXPECT_TRUE(eliminate_dead_code(g));
  EXPECT_EQ(ir::to_string(g),
            "graph(%x: f32[4], %y: f32[4], %unused: f32[4]):\n"
            "  %relu: Tensor = aten::relu(%x)\n"
            "  %add_: Tensor = aten::add_.Tensor(%y, %x, 1)\n"
            "  %dropout: Tensor = aten::dropout(%x, 0.5, True)\n"
            "  aten::_assert_async.msg(%x, 'x is bad')\n"
            "  return (%relu)\n");
  EXPECT_TRUE(ir::verify_errors(g).empty());
  // Constants and lists print inline, so count nodes to see they went too: 3 inputs, 4
  // operators, the 4 constants they read, and the Output node.
  EXPECT_EQ(g.num_nodes(), 12u);
}

TEST_F(DeadCodeTest, ReportsNoChangeWhenNothingIsDead) {
  ASSERT_TRUE(eliminate_dead_code(g));
  size_t before = g.num_nodes();
  EXPECT_FALSE(eliminate_dead_code(g));
  EXPECT_EQ(g.num_nodes(), before);
}

TEST_F(DeadCodeTest, PipelineRecordsOnePerPassInOrder) {
  std::vector<std::string> changed_by;
  PipelineOptions options;
  options.after_pass = [&](const std::string& pass, const Graph& graph) {
    EXPECT_EQ(&graph, &g);
    changed_by.push_back(pass);
  };
  auto records = run_pipeline(g, options);
  auto names = pipeline_pass_names();
  ASSERT_EQ(records.size(), names.size());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].name, names[i]);
    EXPECT_TRUE(records[i].ran) << records[i].name;
    EXPECT_GE(records[i].milliseconds, 0.0);
  }
  EXPECT_EQ(names.front(), "eliminate_dead_code");
  EXPECT_TRUE(records.front().changed);
  EXPECT_EQ(changed_by.front(), "eliminate_dead_code");

  // A second run finds nothing to do and calls no hook.
  changed_by.clear();
  for (const auto& r : run_pipeline(g, options)) EXPECT_FALSE(r.changed) << r.name;
  EXPECT_TRUE(changed_by.empty());
}

TEST_F(DeadCodeTest, DisabledPassesDoNotRun) {
  size_t before = g.num_nodes();
  PipelineOptions options;
  options.disabled = {"eliminate_dead_code"};
  auto records = run_pipeline(g, options);
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.front().name, "eliminate_dead_code");
  EXPECT_FALSE(records.front().ran);
  EXPECT_FALSE(records.front().changed);
  EXPECT_EQ(g.num_nodes(), before);
}

TEST_F(DeadCodeTest, EnvironmentDisablesPassesToo) {
  size_t before = g.num_nodes();
  ASSERT_EQ(setenv("MAGI_DISABLE_PASSES", ",eliminate_dead_code,", 1), 0);
  auto records = run_pipeline(g);
  unsetenv("MAGI_DISABLE_PASSES");
  EXPECT_FALSE(records.front().ran);
  EXPECT_EQ(g.num_nodes(), before);
}

TEST(Pipeline, UnknownDisabledPassIsAUserErrorNamingIt) {
  Graph g;
  g.set_outputs({g.add_tensor_input("x", tensor_type({4}))});
  PipelineOptions options;
  options.disabled = {"fuse_everything"};
  std::string message = message_of<UserError>([&] { run_pipeline(g, options); });
  EXPECT_TRUE(contains(message, "unknown pass 'fuse_everything'"));
  EXPECT_TRUE(contains(message, "known passes: eliminate_dead_code"));

  ASSERT_EQ(setenv("MAGI_DISABLE_PASSES", "eliminate_dead_cod", 1), 0);
  message = message_of<UserError>([&] { run_pipeline(g); });
  unsetenv("MAGI_DISABLE_PASSES");
  EXPECT_TRUE(contains(message, "'eliminate_dead_cod'"));
}

TEST(Pipeline, VerifiesAfterEachPass) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Node* bad = g.add_getitem(x, 0);  // a getitem of a tensor: malformed, but used
  g.set_outputs({bad->output()});
  EXPECT_THROW(run_pipeline(g), InternalError);
  PipelineOptions options;
  options.verify_each = false;
  EXPECT_NO_THROW(run_pipeline(g, options));
}

}  // namespace
}  // namespace magi::passes
