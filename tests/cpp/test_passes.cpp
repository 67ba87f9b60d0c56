// Passes and the pipeline: eliminate_dead_code graph-in -> graph-out, how run_pipeline
// reports, disables and verifies passes, and simulate_peak's byte counts on hand-built graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "magi/common/error.h"
#include "magi/ir/printer.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "magi/passes/pipeline.h"

#include "fusion_builder.h"
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

// ---- simulate_peak -----------------------------------------------------------------------------

constexpr int64_t kSide = 1024;
constexpr int64_t kTensor = kSide * kSide * 4;  // a [1024, 1024] float32 tensor: 4 MiB

// The index in g.nodes() of the node producing `v`, as ProgramPeak::node counts.
int64_t index_of(const Graph& g, const Value* v) {
  const auto nodes = g.nodes();
  return std::find(nodes.begin(), nodes.end(), v->producer()) - nodes.begin();
}

TEST(SimulatePeak, AChainHoldsTwoTensorsAtOnce) {
  Graph g;
  test::Builder b(g);
  Value* a = b.input("a", {kSide, kSide});
  Value* r1 = b.unary("aten::relu", a, "relu");
  Value* r2 = b.unary("aten::relu", r1, "relu_1");
  g.set_outputs({r2});

  // The first relu writes its output while `a` is alive; `a` dies after it.
  ProgramPeak peak = simulate_peak(g, {});
  EXPECT_EQ(peak.bytes, 2 * kTensor);
  EXPECT_EQ(peak.node, index_of(g, r1));
  EXPECT_EQ(peak.where, "aten::relu");
  // `a` not counted: the first relu holds one tensor, the second still two.
  peak = simulate_peak(g, {}, {false});
  EXPECT_EQ(peak.bytes, 2 * kTensor);
  EXPECT_EQ(peak.node, index_of(g, r2));
  EXPECT_THROW(simulate_peak(g, {}, {true, false}), UserError);
}

TEST(SimulatePeak, AnUncountedInputCostsItsBytesLess) {
  // relu(relu(a)) * a: `a` is alive to the end, so counting it adds its bytes to the peak.
  Graph g;
  test::Builder b(g);
  Value* a = b.input("a", {kSide, kSide});
  Value* r1 = b.unary("aten::relu", a, "relu");
  Value* r2 = b.unary("aten::relu", r1, "relu_1");
  g.set_outputs({b.mul(r2, a, "mul")});

  const ProgramPeak counted = simulate_peak(g, {}, {true});
  EXPECT_EQ(counted.bytes, 3 * kTensor);  // a, r1 and r2 in the second relu
  EXPECT_EQ(counted.node, index_of(g, r2));
  const ProgramPeak uncounted = simulate_peak(g, {}, {false});
  EXPECT_EQ(uncounted.bytes, 2 * kTensor);
  EXPECT_EQ(counted.bytes - uncounted.bytes, kTensor);
  EXPECT_EQ(simulate_peak(g, {}).bytes, counted.bytes);  // no flags: every input counted
}

TEST(SimulatePeak, AViewKeepsItsBaseAliveUntilItsLastReader) {
  // e = exp(x); v = e[:, :512] (a view); s = sin(neg(e)); c = cos(v). neg is e's last direct
  // reader, but cos reads it through v, so e is alive in sin: e + neg + sin = 12 MiB. Were v
  // a tensor of its own (2 MiB) and e freed after neg, the peak would be 10 MiB.
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kSide, kSide});
  Value* e = b.unary("aten::exp", x, "exp");
  Value* v = b.slice(e, 0, kSide / 2, "slice");
  Value* s = b.unary("aten::sin", b.unary("aten::neg", e, "neg"), "sin");
  g.set_outputs({s, b.unary("aten::cos", v, "cos")});

  const ProgramPeak peak = simulate_peak(g, {});
  EXPECT_EQ(peak.bytes, 3 * kTensor);
  EXPECT_EQ(peak.node, index_of(g, s));
  EXPECT_EQ(peak.where, "aten::sin");
}

TEST(SimulatePeak, AFusionGroupsOutputsAreAllocatedBesideItsInputs) {
  // exp(x) and sin(exp(x)), both returned. Op by op, x dies after exp and the peak is two
  // tensors; fused into one group, x, exp and sin are alive together in the kernel.
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kSide, kSide});
  Value* e = b.unary("aten::exp", x, "exp");
  g.set_outputs({e, b.unary("aten::sin", e, "sin")});
  EXPECT_EQ(simulate_peak(g, {}).bytes, 2 * kTensor);

  ASSERT_TRUE(fuse_groups(g));
  ir::verify(g);
  const auto fusions = test::nodes_of_kind(g, ir::NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  ASSERT_EQ(fusions[0]->outputs().size(), 2u);
  const ProgramPeak peak = simulate_peak(g, {});
  EXPECT_EQ(peak.bytes, 3 * kTensor);
  EXPECT_EQ(peak.node, index_of(g, fusions[0]->output(0)));
  EXPECT_EQ(peak.where, "fusion");
  EXPECT_EQ(simulate_peak(g, {}, {false}).bytes, 2 * kTensor);  // its outputs alone
}

TEST(SimulatePeak, ATensorInAListLivesUntilTheListIsRead) {
  // a = exp(x); s = sin(x); cat([a, s]) along the last dim (x not counted). The list node reads
  // a and s, but they stay alive until cat reads the list: a + s + cat's output (two tensors
  // wide) = 4 tensors. Were the items freed at the list node, the peak would be 2 tensors.
  Graph g;
  test::Builder b(g);
  Value* x = b.input("x", {kSide, kSide});
  Value* a = b.unary("aten::exp", x, "exp");
  Value* s = b.unary("aten::sin", x, "sin");
  Value* c = b.cat_last({a, s}, "cat");
  g.set_outputs({c});

  const ProgramPeak peak = simulate_peak(g, {}, {false});
  EXPECT_EQ(peak.bytes, 4 * kTensor);
  EXPECT_EQ(peak.node, index_of(g, c));
}

}  // namespace
}  // namespace magi::passes
