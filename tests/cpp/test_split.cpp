// split_at_boundaries on hand-built graphs: zero, one and several boundaries, boundaries at the
// start and the end, adjacent boundaries, dedupe of identical pieces, splitting_ops by name;
// and the verifier, printer and executor on split graphs (a split graph must compute exactly
// what the unsplit one does).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include <tuple>

#include "magi/common/error.h"
#include "magi/ir/op_registry.h"
#include "magi/ir/printer.h"
#include "magi/ir/structural_hash.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "magi/passes/pipeline.h"
#include "magi/runtime/executor.h"
#include "test_helpers.h"

// Custom operators standing in for FlashAttention-like kernels.
TORCH_LIBRARY(magi_split_test, m) {
  m.def("attn(Tensor q, Tensor k, Tensor v) -> Tensor");
  m.def("pair(Tensor x) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(magi_split_test, CPU, m) {
  m.impl("attn",
         [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) { return q * k + v; });
  m.impl("pair", [](const at::Tensor& x) { return std::make_tuple(x + 1, x * 2); });
}

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::Value;
using ir::ValueKind;
using test::contains;
using test::named;
using test::op;
using test::sym;
using test::tensor_type;

Value* attn(Graph& g, Value* x, const std::string& name = "attn") {
  return named(g.add_op(op("magi_split_test::attn"), {x, x, x}), name);
}

// relu(mm(h, w)): the layer repeated between boundaries.
Value* layer(Graph& g, Value* h, Value* w, const std::string& suffix = "") {
  Value* mm = named(g.add_op(op("aten::mm"), {h, w}), "mm" + suffix);
  return named(g.add_op(op("aten::relu"), {mm}), "relu" + suffix);
}

Value* add(Graph& g, Value* a, Value* b, const std::string& name = "add") {
  return named(g.add_op(op("aten::add", "Tensor"), {a, b, g.add_constant(1, ValueKind::kScalar)}),
               name);
}

// x, w -> add(neg(attn(relu(mm(x, w)))), x)
void one_boundary(Graph& g) {
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 8}));
  Value* w = g.add_tensor_input("w", tensor_type({8, 8}));
  Value* a = attn(g, layer(g, x, w));
  g.set_outputs({add(g, named(g.add_op(op("aten::neg"), {a}), "neg"), x)});
}

// `layers` times h = attn(relu(mm(h (+ x after the first layer), w))), then
// out = relu(mm(h, w)) + x. The middle pieces (residual add and layer) are all alike; the first
// and the last differ from them.
void stack(Graph& g, int layers) {
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 8}));
  Value* w = g.add_tensor_input("w", tensor_type({8, 8}));
  Value* h = x;
  for (int i = 0; i < layers; ++i) {
    std::string n = std::to_string(i);
    Value* r = layer(g, i == 0 ? h : add(g, h, x, "res" + n), w, n);
    h = attn(g, r, "attn" + n);
  }
  g.set_outputs({add(g, layer(g, h, w, "_out"), x, "out")});
}

size_t count(const Graph& g, NodeKind kind) {
  size_t n = 0;
  for (const Node* node : g.nodes()) n += node->kind() == kind;
  return n;
}

// Registers magi_split_test::attn and ::pair as boundaries for the duration of a test.
class SplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ir::OpRegistry::global().set_flags("magi_split_test::attn", {true, true});
    ir::OpRegistry::global().set_flags("magi_split_test::pair", {false, true});
    at::manual_seed(0);
  }
  void TearDown() override {
    ir::OpRegistry::global().erase("magi_split_test::attn");
    ir::OpRegistry::global().erase("magi_split_test::pair");
  }

  // Builds the graph twice, splits one copy, and checks that the split copy verifies and
  // computes exactly what the original does on random inputs (dynamic dims set to `rows`).
  template <typename Build>
  void split_and_compare(Build build, Graph& split, const std::vector<std::string>& ops = {},
                         int64_t rows = 5) {
    Graph original;
    build(original);
    build(split);
    split_at_boundaries(split, ops);
    ASSERT_TRUE(ir::verify_errors(split).empty()) << ir::to_string(split);
    std::vector<c10::IValue> inputs;
    for (const Value* in : original.inputs()) {
      std::vector<int64_t> sizes;
      for (const auto& s : in->tensor_type()->sizes) {
        sizes.push_back(s.is_constant() ? s.constant_value() : rows);
      }
      inputs.emplace_back(at::randn(sizes));
    }
    auto expected = runtime::Executable(original).run(inputs);
    auto actual = runtime::Executable(split).run(inputs);
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i) {
      EXPECT_TRUE(at::equal(actual[i].toTensor(), expected[i].toTensor())) << "output " << i;
    }
  }
};

TEST_F(SplitTest, ZeroBoundariesLeaveTheGraphAlone) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 8}));
  Value* w = g.add_tensor_input("w", tensor_type({8, 8}));
  g.set_outputs({layer(g, x, w)});
  std::string before = ir::to_string(g);
  EXPECT_FALSE(split_at_boundaries(g));
  EXPECT_EQ(ir::to_string(g), before);
  EXPECT_EQ(g.num_pieces(), 0u);
}

TEST_F(SplitTest, OneBoundaryMakesTwoPieces) {
  Graph g;
  one_boundary(g);
  EXPECT_TRUE(split_at_boundaries(g));
  EXPECT_TRUE(ir::verify_errors(g).empty());
  EXPECT_EQ(ir::to_string(g),
            "graph(%x: f32[s0, 8], %w: f32[8, 8]):\n"
            "  %relu: Tensor = piece_0(%x, %w)\n"
            "  %attn: Tensor = magi_split_test::attn(%relu, %relu, %relu)\n"
            "  %add: Tensor = piece_1(%attn, %x)\n"
            "  return (%add)\n"
            "\n"
            "piece_0 = graph(%x: f32[s0, 8], %w: f32[8, 8]):\n"
            "  %mm: Tensor = aten::mm(%x, %w)\n"
            "  %relu: Tensor = aten::relu(%mm)\n"
            "  return (%relu)\n"
            "\n"
            "piece_1 = graph(%attn: Tensor, %x: f32[s0, 8]):\n"
            "  %neg: Tensor = aten::neg(%attn)\n"
            "  %add: Tensor = aten::add.Tensor(%neg, %x, 1)\n"
            "  return (%add)\n");
  // The constant 1 moved into piece_1; the graph keeps 2 inputs, 2 calls, attn and Output.
  EXPECT_EQ(g.num_nodes(), 6u);
}

TEST_F(SplitTest, OneBoundaryComputesWhatTheUnsplitGraphDoes) {
  Graph g;
  split_and_compare(one_boundary, g);
  EXPECT_EQ(count(g, NodeKind::kCallPiece), 2u);
}

TEST_F(SplitTest, SeveralBoundariesKeepTheOrderAndShareIdenticalPieces) {
  Graph g;
  split_and_compare([](Graph& graph) { stack(graph, 4); }, g);
  // Five segments around four attention calls: the first, three alike, the last.
  EXPECT_EQ(count(g, NodeKind::kCallPiece), 5u);
  EXPECT_EQ(count(g, NodeKind::kCustomOp), 4u);
  EXPECT_EQ(g.num_pieces(), 3u);
  std::vector<std::string> order;
  for (const Node* n : g.nodes()) {
    if (n->kind() == NodeKind::kCallPiece || n->is_operator()) order.push_back(n->op_name());
  }
  EXPECT_EQ(order,
            (std::vector<std::string>{"piece_0", "magi_split_test::attn", "piece_1",
                                      "magi_split_test::attn", "piece_1", "magi_split_test::attn",
                                      "piece_1", "magi_split_test::attn", "piece_2"}));
  runtime::Executable exe(g);
  EXPECT_EQ(exe.num_piece_calls(), 5u);
  EXPECT_EQ(exe.num_pieces(), 3u);
  EXPECT_EQ(exe.piece_call_sequence(), (std::vector<size_t>{0, 1, 1, 1, 2}));
  // 2 ops in the first piece, 3 in each other, 4 attention calls.
  EXPECT_EQ(exe.num_operator_calls(), 2u + 4 * 3 + 4);
}

TEST_F(SplitTest, BoundaryAtTheStartMakesNoEmptyPiece) {
  Graph g;
  split_and_compare(
      [](Graph& graph) {
        Value* x = graph.add_tensor_input("x", tensor_type({sym("s0"), 8}));
        Value* w = graph.add_tensor_input("w", tensor_type({8, 8}));
        graph.set_outputs({layer(graph, attn(graph, x), w)});
      },
      g);
  EXPECT_EQ(ir::to_string(g),
            "graph(%x: f32[s0, 8], %w: f32[8, 8]):\n"
            "  %attn: Tensor = magi_split_test::attn(%x, %x, %x)\n"
            "  %relu: Tensor = piece_0(%attn, %w)\n"
            "  return (%relu)\n"
            "\n"
            "piece_0 = graph(%attn: Tensor, %w: f32[8, 8]):\n"
            "  %mm: Tensor = aten::mm(%attn, %w)\n"
            "  %relu: Tensor = aten::relu(%mm)\n"
            "  return (%relu)\n");
}

TEST_F(SplitTest, BoundaryAtTheEndMakesNoEmptyPiece) {
  Graph g;
  split_and_compare(
      [](Graph& graph) {
        Value* x = graph.add_tensor_input("x", tensor_type({sym("s0"), 8}));
        Value* w = graph.add_tensor_input("w", tensor_type({8, 8}));
        Value* r = layer(graph, x, w);
        graph.set_outputs({attn(graph, r), r});
      },
      g);
  EXPECT_EQ(ir::to_string(g),
            "graph(%x: f32[s0, 8], %w: f32[8, 8]):\n"
            "  %relu: Tensor = piece_0(%x, %w)\n"
            "  %attn: Tensor = magi_split_test::attn(%relu, %relu, %relu)\n"
            "  return (%attn, %relu)\n"
            "\n"
            "piece_0 = graph(%x: f32[s0, 8], %w: f32[8, 8]):\n"
            "  %mm: Tensor = aten::mm(%x, %w)\n"
            "  %relu: Tensor = aten::relu(%mm)\n"
            "  return (%relu)\n");
}

TEST_F(SplitTest, AdjacentBoundariesAndMultiOutputBoundaries) {
  Graph g;
  split_and_compare(
      [](Graph& graph) {
        Value* x = graph.add_tensor_input("x", tensor_type({sym("s0"), 8}));
        Value* r = named(graph.add_op(op("aten::relu"), {x}), "relu");
        Node* pair = graph.add_op(op("magi_split_test::pair"), {r});
        Value* a = attn(graph, pair->output(0));
        graph.set_outputs({add(graph, a, pair->output(1))});
      },
      g);
  EXPECT_EQ(count(g, NodeKind::kCallPiece), 2u);
  EXPECT_EQ(g.num_pieces(), 2u);
  EXPECT_TRUE(contains(ir::to_string(g), "magi_split_test::pair(%relu)\n  %attn"));
}

TEST_F(SplitTest, OnlyBoundariesIsNoChange) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  g.set_outputs({attn(g, attn(g, x, "a"), "b")});
  EXPECT_FALSE(split_at_boundaries(g));
  EXPECT_EQ(g.num_pieces(), 0u);
  EXPECT_TRUE(ir::verify_errors(g).empty());
}

TEST_F(SplitTest, PiecesDifferingInConstantsAreNotShared) {
  Graph g;
  split_and_compare(
      [](Graph& graph) {
        Value* x = graph.add_tensor_input("x", tensor_type({sym("s0"), 8}));
        auto scaled = [&](Value* v, double by) {
          return named(graph.add_op(op("aten::mul", "Scalar"),
                                    {v, graph.add_constant(by, ValueKind::kScalar)}),
                       "mul");
        };
        Value* a = attn(graph, named(graph.add_op(op("aten::relu"), {x}), "relu"));
        Value* b = attn(graph, scaled(a, 2.0));
        Value* c = attn(graph, scaled(b, 2.0));
        graph.set_outputs({scaled(c, 3.0)});
      },
      g);
  EXPECT_EQ(count(g, NodeKind::kCallPiece), 4u);
  EXPECT_EQ(g.num_pieces(), 3u);  // relu, then "* 2" twice, then "* 3"
}

TEST_F(SplitTest, SymbolsAreMatchedByPosition) {
  Graph g;
  split_and_compare(
      [](Graph& graph) {
        Value* x = graph.add_tensor_input("x", tensor_type({sym("s0"), 8}));
        Value* y = graph.add_tensor_input("y", tensor_type({sym("s1"), 8}));
        Value* a = attn(graph, named(graph.add_op(op("aten::relu"), {x}), "rx"));
        Value* b = named(graph.add_op(op("aten::relu"), {y}), "ry");
        graph.set_outputs({a, b});
      },
      g);
  EXPECT_EQ(count(g, NodeKind::kCallPiece), 2u);
  EXPECT_EQ(g.num_pieces(), 1u);  // relu of f32[s0, 8] and of f32[s1, 8]
}

TEST_F(SplitTest, ValuesCrossingSeveralBoundariesArePieceResults) {
  Graph g;
  split_and_compare(
      [](Graph& graph) {
        Value* x = graph.add_tensor_input("x", tensor_type({sym("s0"), 8}));
        Value* early = named(graph.add_op(op("aten::exp"), {x}), "early");
        Value* a = attn(graph, named(graph.add_op(op("aten::neg"), {early}), "neg"), "a");
        Value* b = attn(graph, named(graph.add_op(op("aten::sin"), {a}), "sin"), "b");
        graph.set_outputs({add(graph, b, early)});
      },
      g);
  EXPECT_TRUE(contains(ir::to_string(g), "%early: Tensor, %neg: Tensor = piece_0(%x)"));
}

TEST_F(SplitTest, SplittingOpsNameOperatorsToo) {
  ir::OpRegistry::global().erase("magi_split_test::attn");
  for (const char* spelling : {"magi_split_test::attn", "magi_split_test.attn.default",
                               "torch.ops.magi_split_test.attn"}) {
    Graph g;
    one_boundary(g);
    EXPECT_TRUE(split_at_boundaries(g, {spelling})) << spelling;
    EXPECT_EQ(count(g, NodeKind::kCallPiece), 2u) << spelling;
  }
  Graph g;
  split_and_compare(one_boundary, g, {"aten::mm"});
  EXPECT_EQ(count(g, NodeKind::kCallPiece), 1u);  // nothing before mm; everything after it
  EXPECT_TRUE(contains(ir::to_string(g), "= aten::mm(%x, %w)\n"));
}

TEST_F(SplitTest, UnknownSplittingOpsAreIgnored) {
  ir::OpRegistry::global().erase("magi_split_test::attn");
  Graph g;
  one_boundary(g);
  std::string before = ir::to_string(g);
  EXPECT_FALSE(split_at_boundaries(g, {"no_such_ns::no_such_op", "not a name", "aten::mm.nope"}));
  EXPECT_FALSE(split_at_boundaries(g, {"no_such_ns::no_such_op"}));  // second time: no warning
  EXPECT_EQ(ir::to_string(g), before);
}

TEST_F(SplitTest, IsBoundaryCallMatchesWhatTheSplitCuts) {
  Graph g;
  one_boundary(g);
  for (const Node* n : g.nodes()) {
    bool expected = n->op_name() == "magi_split_test::attn";
    EXPECT_EQ(is_boundary_call(*n), expected) << n->op_name();
    EXPECT_EQ(is_boundary_call(*n, {"aten::mm"}), expected || n->op_name() == "aten::mm");
  }
}

TEST_F(SplitTest, PipelineSplitsWithItsSplittingOpsAndCanBeDisabled) {
  ir::OpRegistry::global().erase("magi_split_test::attn");
  Graph g;
  one_boundary(g);
  PipelineOptions options;
  options.splitting_ops = {"magi_split_test::attn"};
  bool split = false;
  for (const auto& record : run_pipeline(g, options)) {
    if (record.name == "split_at_boundaries") split = record.changed;
  }
  EXPECT_TRUE(split);
  EXPECT_EQ(g.num_pieces(), 2u);

  Graph h;
  one_boundary(h);
  options.disabled = {"split_at_boundaries"};
  run_pipeline(h, options);
  EXPECT_EQ(h.num_pieces(), 0u);
}

TEST_F(SplitTest, SplitRunsOnce) {
  Graph g;
  one_boundary(g);
  EXPECT_TRUE(split_at_boundaries(g));
  std::string once = ir::to_string(g);
  EXPECT_FALSE(split_at_boundaries(g));
  EXPECT_EQ(ir::to_string(g), once);
}

TEST_F(SplitTest, DeadCodeEliminationKeepsPieceCalls) {
  Graph g;
  one_boundary(g);
  split_at_boundaries(g);
  EXPECT_FALSE(eliminate_dead_code(g));
  EXPECT_EQ(count(g, NodeKind::kCallPiece), 2u);
}

// --- CallPiece in the IR: verifier and structural keys ------------------------------------

TEST(CallPiece, VerifierChecksArityOwnershipAndKinds) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  auto piece = std::make_unique<Graph>();
  Value* px = piece->add_tensor_input("px", tensor_type({4}));
  piece->set_outputs({named(piece->add_op(op("aten::relu"), {px}), "r")});
  Graph* owned = g.add_piece(std::move(piece));
  Node* call = g.add_call_piece(owned, {x, x});  // one input too many
  Value* n = g.add_sym(ir::SymOp::kNumel, {x})->output();
  g.add_call_piece(owned, {n});  // an int where the piece takes a tensor
  g.set_outputs({call->output()});
  auto errors = ir::verify_errors(g);
  EXPECT_TRUE(test::has_error(errors, "has 2 inputs, expected 1"));
  EXPECT_TRUE(test::has_error(errors, "input 0 is a int but the piece's input %px is a Tensor"));

  Graph other;
  Value* y = other.add_tensor_input("y", tensor_type({4}));
  Node* foreign = other.clone_node(*call, {y});  // calls a piece `other` does not own
  other.set_outputs({foreign->output()});
  EXPECT_TRUE(test::has_error(ir::verify_errors(other), "calls a piece this graph does not own"));
}

// Which inputs a graph writes, through the pieces it calls: the piece writes its second input
// (the caller's `cache`) and only reads its first (`x`), so the caller's `cache` is written
// and `x` is not (what the CUDA graph runner and weight offload ask of each input).
TEST(CallPiece, AnInputIsWrittenOnlyWhereAPieceWritesIt) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Value* cache = g.add_tensor_input("cache", tensor_type({4}));
  Value* w = g.add_tensor_input("w", tensor_type({4}));
  auto piece = std::make_unique<Graph>();
  Value* px = piece->add_tensor_input("px", tensor_type({4}));
  Value* pc = piece->add_tensor_input("pc", tensor_type({4}));
  Node* relu = piece->add_op(op("aten::relu"), {px});
  Node* write = piece->add_op(op("aten::copy_"),
                              {pc, relu->output(), piece->add_constant(false, ValueKind::kBool)});
  named(write, "copy_");
  piece->set_outputs({named(relu, "r")});
  Graph* owned = g.add_piece(std::move(piece));
  Node* call = g.add_call_piece(owned, {x, cache});
  Node* mul = g.add_op(op("aten::mul", "Tensor"), {call->output(), w});
  g.set_outputs({named(mul, "out")});
  ir::verify(g);

  runtime::Executable exe(g);
  EXPECT_TRUE(exe.writes_inputs());
  EXPECT_FALSE(exe.input_written(0));
  EXPECT_TRUE(exe.input_written(1));
  EXPECT_FALSE(exe.input_written(2));
  at::Tensor in = at::randn({4}), c = at::zeros({4}), weights = at::randn({4});
  const at::Tensor out = exe.run({in, c, weights})[0].toTensor();
  EXPECT_TRUE(at::allclose(out, at::relu(in) * weights));
  EXPECT_TRUE(at::equal(c, at::relu(in)));  // the caller's tensor holds what the piece wrote
}

// A piece returning a view of its first input and a copy of its second: a write into the
// copy after the call writes neither input (each output shares memory only with the inputs
// it is a view of).
TEST(CallPiece, AWriteIntoAPieceOutputWritesOnlyTheInputsItViews) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Value* y = g.add_tensor_input("y", tensor_type({4}));
  auto piece = std::make_unique<Graph>();
  Value* px = piece->add_tensor_input("px", tensor_type({4}));
  Value* py = piece->add_tensor_input("py", tensor_type({4}));
  Node* view = piece->add_op(op("aten::alias"), {px});
  Node* copy =
      piece->add_op(op("aten::clone"), {py, piece->add_constant(c10::IValue(), ValueKind::kNone)});
  piece->set_outputs({named(view, "v"), named(copy, "c")});
  Graph* owned = g.add_piece(std::move(piece));
  Node* call = g.add_call_piece(owned, {x, y});
  Node* write =
      g.add_op(op("aten::copy_"), {call->output(1), x, g.add_constant(false, ValueKind::kBool)});
  Node* sum = g.add_op(op("aten::add", "Tensor"),
                       {call->output(0), write->output(), g.add_constant(1, ValueKind::kScalar)});
  g.set_outputs({named(sum, "out")});
  ir::verify(g);

  runtime::Executable exe(g);
  EXPECT_FALSE(exe.input_written(0));
  EXPECT_FALSE(exe.input_written(1));
  EXPECT_EQ(exe.inputs_output_may_alias(0), std::vector<int32_t>{});  // a new tensor
  at::Tensor in_x = at::randn({4}), in_y = at::randn({4});
  const at::Tensor before = in_y.clone();
  EXPECT_TRUE(at::allclose(exe.run({in_x, in_y})[0].toTensor(), in_x * 2));
  EXPECT_TRUE(at::equal(in_y, before));
}

TEST(CallPiece, VerifierReportsErrorsInsidePieces) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  auto piece = std::make_unique<Graph>();
  piece->add_tensor_input("px", tensor_type({4}));  // and no Output node
  Graph* owned = g.add_piece(std::move(piece));
  g.add_call_piece(owned, {x});
  g.set_outputs({x});
  EXPECT_TRUE(test::has_error(ir::verify_errors(g), "piece_0: graph has 0 Output nodes"));
}

TEST(StructuralKey, IgnoresNamesAndProvenanceButNotStructure) {
  auto build = [](Graph& g, const std::string& name, const std::string& symbol, double scale) {
    Value* x = g.add_tensor_input(name, tensor_type({sym(symbol), 4}));
    Node* mul = g.add_op(op("aten::mul", "Scalar"), {x, g.add_constant(scale, ValueKind::kScalar)});
    mul->provenance().fx_name = name + "_mul";
    g.set_outputs({named(mul, name + "_out")});
  };
  Graph a, b, c, d;
  build(a, "x", "s0", 2.0);
  build(b, "hidden", "s7", 2.0);
  build(c, "x", "s0", 2.5);
  d.add_tensor_input("x", tensor_type({sym("s0"), 5}));
  d.set_outputs({d.inputs()[0]});
  EXPECT_EQ(ir::structural_key(a), ir::structural_key(b));
  EXPECT_EQ(ir::structural_hash(a), ir::structural_hash(b));
  EXPECT_NE(ir::structural_key(a), ir::structural_key(c));
  EXPECT_NE(ir::structural_key(a), ir::structural_key(d));
}

TEST(StructuralKey, SmallTensorConstantsMatchByValueOthersByIdentity) {
  auto build = [](Graph& g, const at::Tensor& constant) {
    Value* x = g.add_tensor_input("x", tensor_type({4}));
    Value* c = g.add_constant(constant, ValueKind::kTensor);
    g.set_outputs(
        {named(g.add_op(op("aten::add", "Tensor"), {x, c, g.add_constant(1, ValueKind::kScalar)}),
               "add")});
  };
  auto literal = [](double v) {  // what the importer makes of `x + 1e-6`
    at::Tensor t = at::scalar_tensor(v, at::kDouble);
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  };
  Graph a, b, c, d, e;
  build(a, literal(1e-6));
  build(b, literal(1e-6));
  build(c, literal(2e-6));
  at::Tensor big = at::ones({1024});
  build(d, big);
  build(e, at::ones({1024}));
  EXPECT_EQ(ir::structural_key(a), ir::structural_key(b));
  EXPECT_NE(ir::structural_key(a), ir::structural_key(c));
  EXPECT_NE(ir::structural_key(a), ir::structural_key(d));
  EXPECT_NE(ir::structural_key(d), ir::structural_key(e));  // equal values, other tensor
  // A conjugate's bytes are its input's: it is named by identity, not by those bytes.
  const at::Tensor z = at::ones({2}, at::kComplexFloat);
  EXPECT_EQ(ir::tensor_key(z), ir::tensor_key(at::ones({2}, at::kComplexFloat)));
  EXPECT_NE(ir::tensor_key(z.conj()), ir::tensor_key(z));
  EXPECT_EQ(ir::tensor_key(z.conj()).rfind("tensor@", 0), 0u);
}

}  // namespace
}  // namespace magi::passes
