// The executor: runs graphs through the dispatcher and must give eager ATen's results, with
// Python's integer semantics for symbolic ops and errors that name the failing op.
#include "magi/runtime/executor.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "magi/common/error.h"
#include "test_helpers.h"

namespace magi::runtime {
namespace {

using ir::Graph;
using ir::Node;
using ir::SymOp;
using ir::Value;
using ir::ValueKind;
using test::contains;
using test::message_of;
using test::op;
using test::sym;
using test::tensor_type;

// x: f32[s0, 4], w: f32[4, 4] ->
//   relu(add(mm(x, w), x, alpha=1)), size(x, 0) * 2, split(relu, 2, dim=1)[1],
//   relu.view([size(x, 0), 2, 2])
class ExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::manual_seed(0);
    Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
    Value* w = g.add_tensor_input("w", tensor_type({4, 4}));
    Node* mm = g.add_op(op("aten::mm"), {x, w});
    mm->provenance().fx_name = "mm";
    mm->provenance().source = "model.py:12 in forward";
    Node* add = g.add_op(op("aten::add", "Tensor"),
                         {mm->output(), x, g.add_constant(1, ValueKind::kScalar)});
    Value* relu = g.add_op(op("aten::relu"), {add->output()})->output();

    Value* two = g.add_constant(2, ValueKind::kInt);
    Value* n = g.add_sym(SymOp::kSize, {x, g.add_constant(0, ValueKind::kInt)})->output();
    Value* doubled = g.add_sym(SymOp::kMul, {n, two})->output();

    Node* split =
        g.add_op(op("aten::split", "Tensor"), {relu, two, g.add_constant(1, ValueKind::kInt)});
    Value* piece = g.add_getitem(split->output(), 1)->output();

    Value* shape = g.add_list(ValueKind::kIntList, {n, two, two})->output();
    Value* view = g.add_op(op("aten::view"), {relu, shape})->output();
    g.set_outputs({relu, doubled, piece, view});
  }

  Graph g;
};

TEST_F(ExecutorTest, LowersToOneInstructionPerComputingNode) {
  Executable exe(g);
  EXPECT_EQ(exe.num_inputs(), 2u);
  EXPECT_EQ(exe.num_outputs(), 4u);
  EXPECT_EQ(exe.num_operator_calls(), 5u);  // mm, add, relu, split, view
  EXPECT_EQ(exe.num_instructions(), 9u);    // + size, mul, getitem, list
}

TEST_F(ExecutorTest, MatchesEagerAtenForEveryBatchSize) {
  Executable exe(g);
  for (int64_t s0 : {5, 3, 1}) {
    at::Tensor x = at::randn({s0, 4});
    at::Tensor w = at::randn({4, 4});
    at::Tensor x_before = x.clone();
    std::vector<c10::IValue> out = exe.run({x, w});
    ASSERT_EQ(out.size(), 4u);

    at::Tensor expected = at::relu(at::add(at::mm(x, w), x, /*alpha=*/1));
    EXPECT_TRUE(at::allclose(out[0].toTensor(), expected)) << "s0 = " << s0;
    ASSERT_TRUE(out[1].isInt());
    EXPECT_EQ(out[1].toInt(), 2 * s0);
    EXPECT_TRUE(at::allclose(out[2].toTensor(), expected.split(2, 1)[1])) << "s0 = " << s0;
    EXPECT_EQ(out[3].toTensor().sizes(), (std::vector<int64_t>{s0, 2, 2}));
    EXPECT_TRUE(at::allclose(out[3].toTensor(), expected.view({s0, 2, 2}))) << "s0 = " << s0;
    EXPECT_TRUE(at::equal(x, x_before)) << "the executor changed an input";
  }
}

TEST_F(ExecutorTest, RunsFromSeveralThreads) {
  Executable exe(g);
  at::Tensor x = at::randn({6, 4});
  at::Tensor w = at::randn({4, 4});
  at::Tensor expected = at::relu(at::mm(x, w) + x);
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < ok.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        auto out = exe.run({x, w});
        ok[t] += at::allclose(out[0].toTensor(), expected) && out[1].toInt() == 12;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ok, std::vector<int>(4, 20));
}

TEST_F(ExecutorTest, WrongNumberOfInputsIsAUserError) {
  Executable exe(g);
  std::string message = message_of<UserError>([&] { exe.run({at::randn({2, 4})}); });
  EXPECT_TRUE(contains(message, "takes 2 inputs but was called with 1"));
}

// The operator's own error keeps its type (c10's, as ATen threw it), with the step added.
TEST_F(ExecutorTest, FailingOperatorIsNamedWithItsSource) {
  Executable exe(g);
  std::string message = message_of<c10::Error>([&] {
    exe.run({at::randn({5, 4}), at::randn({3, 3})});
  });
  EXPECT_TRUE(contains(message, "aten::mm (FX node mm, model.py:12 in forward) failed"));
}

TEST(Executor, RejectsAMalformedGraph) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  g.set_outputs({g.add_op(op("aten::add", "Tensor"), {x, x})->output()});
  EXPECT_THROW(Executable{g}, InternalError);
}

TEST(Executor, ValueReadTwiceInputsAndConstantsAsOutputs) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({3}));
  Value* sum =
      g.add_op(op("aten::add", "Tensor"), {x, x, g.add_constant(2, ValueKind::kScalar)})->output();
  g.set_outputs({sum, x, g.add_constant(7, ValueKind::kInt)});
  Executable exe(g);
  at::Tensor in = at::randn({3});
  auto out = exe.run({in});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(at::allclose(out[0].toTensor(), in * 3));
  EXPECT_TRUE(out[1].toTensor().is_same(in));
  EXPECT_EQ(out[2].toInt(), 7);
}

TEST(Executor, SymbolicOpsFollowPython) {
  Graph g;
  Value* a = g.add_input("a", ValueKind::kInt);
  Value* b = g.add_input("b", ValueKind::kInt);
  std::vector<Value*> outs;
  for (SymOp o : {SymOp::kFloorDiv, SymOp::kMod, SymOp::kTrueDiv, SymOp::kMax, SymOp::kMin,
                  SymOp::kSub, SymOp::kLt, SymOp::kGe}) {
    outs.push_back(g.add_sym(o, {a, b})->output());
  }
  outs.push_back(g.add_sym(SymOp::kNeg, {a})->output());
  g.set_outputs(outs);
  Executable exe(g);
  auto out = exe.run({int64_t{-7}, int64_t{2}});
  ASSERT_EQ(out.size(), 9u);
  EXPECT_EQ(out[0].toInt(), -4);  // -7 // 2
  EXPECT_EQ(out[1].toInt(), 1);   // -7 % 2
  EXPECT_DOUBLE_EQ(out[2].toDouble(), -3.5);
  EXPECT_EQ(out[3].toInt(), 2);
  EXPECT_EQ(out[4].toInt(), -7);
  EXPECT_EQ(out[5].toInt(), -9);
  EXPECT_TRUE(out[6].toBool());
  EXPECT_FALSE(out[7].toBool());
  EXPECT_EQ(out[8].toInt(), 7);

  EXPECT_THROW(exe.run({int64_t{1}, int64_t{0}}), UserError);  // 1 // 0
}

// x + arange(8) * 2: the arange and the mul read only constants, so the first run computes
// them and keeps the product; later runs start from it and still give eager's numbers.
TEST(Executor, ConstantInstructionsRunOnce) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({8}));
  Node* arange = g.add_op(op("aten::arange"),
                          {g.add_constant(8, ValueKind::kScalar),
                           g.add_constant(static_cast<int64_t>(at::kFloat), ValueKind::kDtype),
                           g.add_constant(c10::IValue(), ValueKind::kNone),
                           g.add_constant(c10::IValue(), ValueKind::kNone),
                           g.add_constant(c10::IValue(), ValueKind::kNone)});
  Value* scaled =
      g.add_op(op("aten::mul", "Scalar"), {arange->output(), g.add_constant(2, ValueKind::kScalar)})
          ->output();
  g.set_outputs(
      {g.add_op(op("aten::add", "Tensor"), {x, scaled, g.add_constant(1, ValueKind::kScalar)})
           ->output()});
  Executable exe(g);
  EXPECT_EQ(exe.num_constant_instructions(), 2u);
  EXPECT_EQ(exe.num_folded_values(), 0u);
  const at::Tensor expected = at::arange(8, at::kFloat) * 2;
  for (int i = 0; i < 3; ++i) {
    at::Tensor in = at::randn({8});
    EXPECT_TRUE(at::allclose(exe.run({in})[0].toTensor(), in + expected));
    EXPECT_EQ(exe.num_folded_values(), 1u);  // the product, kept after the first run
  }
}

TEST(Executor, RandomOperatorsRunOnEveryCall) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Value* shape = g.add_constant(c10::List<int64_t>({4}), ValueKind::kIntList);
  Value* none = g.add_constant(c10::IValue(), ValueKind::kNone);
  Value* noise = g.add_op(op("aten::rand"), {shape, none, none, none, none})->output();
  g.set_outputs(
      {g.add_op(op("aten::add", "Tensor"), {x, noise, g.add_constant(1, ValueKind::kScalar)})
           ->output()});
  Executable exe(g);
  EXPECT_EQ(exe.num_constant_instructions(), 0u);
  at::Tensor zeros = at::zeros({4});
  EXPECT_FALSE(at::equal(exe.run({zeros})[0].toTensor(), exe.run({zeros})[0].toTensor()));
}

// A constant an in-place operator only reads (the index of a cache's index_copy_) is folded
// like any other; the written buffer is an input, fresh on every call.
TEST(Executor, AConstantAnInPlaceOperatorOnlyReadsIsFolded) {
  Graph g;
  Value* cache = g.add_tensor_input("cache", tensor_type({6, 2}));
  Value* rows = g.add_tensor_input("rows", tensor_type({3, 2}));
  Value* none = g.add_constant(c10::IValue(), ValueKind::kNone);
  Value* index = g.add_op(op("aten::arange"),
                          {g.add_constant(3, ValueKind::kScalar),
                           g.add_constant(static_cast<int64_t>(at::kLong), ValueKind::kDtype), none,
                           none, none})
                     ->output();
  Value* updated =
      g.add_op(op("aten::index_copy_"), {cache, g.add_constant(0, ValueKind::kInt), index, rows})
          ->output();
  g.set_outputs({updated});
  Executable exe(g);
  EXPECT_EQ(exe.num_constant_instructions(), 1u);
  for (int i = 0; i < 3; ++i) {
    at::Tensor c = at::zeros({6, 2}), r = at::randn({3, 2});
    exe.run({c, r});
    EXPECT_TRUE(at::equal(c.narrow(0, 0, 3), r)) << "call " << i;
    EXPECT_TRUE(at::equal(c.narrow(0, 3, 3), at::zeros({3, 2})));
    EXPECT_EQ(exe.num_folded_values(), 1u);  // the index, kept after the first run
  }
}

// A constant result that an operator writes in place must be fresh on every call.
TEST(Executor, NothingFoldsWhenAConstantIsWrittenInPlace) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Value* none = g.add_constant(c10::IValue(), ValueKind::kNone);
  Value* ones =
      g.add_op(op("aten::ones"), {g.add_constant(c10::List<int64_t>({4}), ValueKind::kIntList),
                                  none, none, none, none})
          ->output();
  Value* sum =
      g.add_op(op("aten::add_", "Tensor"), {ones, x, g.add_constant(1, ValueKind::kScalar)})
          ->output();
  g.set_outputs({sum});
  Executable exe(g);
  EXPECT_EQ(exe.num_constant_instructions(), 0u);
  for (int i = 0; i < 3; ++i) {
    at::Tensor in = at::randn({4});
    EXPECT_TRUE(at::allclose(exe.run({in})[0].toTensor(), in + 1));
  }
}

}  // namespace
}  // namespace magi::runtime
