// The verifier: a well-formed graph passes, and each invariant of graph.h, broken on purpose,
// yields a message that names it.
#include "magi/ir/verifier.h"

#include <gtest/gtest.h>

#include "magi/common/error.h"
#include "test_helpers.h"

namespace magi::ir {
namespace {

using test::contains;
using test::has_error;
using test::message_of;
using test::named;
using test::op;
using test::sym;
using test::tensor_type;

// x: f32[s0, 4], w: f32[4, 4] -> mm -> add(mm, x, alpha=1) -> relu; size(x, 0); split.
class VerifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
    w = g.add_tensor_input("w", tensor_type({4, 4}));
    mm = g.add_op(op("aten::mm"), {x, w});
    alpha = g.add_constant(1, ValueKind::kScalar);
    add = g.add_op(op("aten::add", "Tensor"), {mm->output(), x, alpha});
    relu = g.add_op(op("aten::relu"), {add->output()});
    zero = g.add_constant(0, ValueKind::kInt);
    size = g.add_sym(SymOp::kSize, {x, zero});
    two = g.add_constant(2, ValueKind::kInt);
    split = g.add_op(op("aten::split", "Tensor"),
                     {relu->output(), two, g.add_constant(1, ValueKind::kInt)});
    first = g.add_getitem(split->output(), 0);
  }

  /// Finishes the graph and returns its verifier messages.
  std::vector<std::string> finish_and_verify() {
    g.set_outputs({first->output(), size->output()});
    return verify_errors(g);
  }

  Graph g;
  Value *x = nullptr, *w = nullptr, *alpha = nullptr, *zero = nullptr, *two = nullptr;
  Node *mm = nullptr, *add = nullptr, *relu = nullptr, *size = nullptr, *split = nullptr,
       *first = nullptr;
};

TEST_F(VerifierTest, WellFormedGraphPasses) {
  EXPECT_TRUE(finish_and_verify().empty());
  EXPECT_NO_THROW(verify(g));
}

TEST_F(VerifierTest, SchemaArgumentsAcceptCompatibleKinds) {
  // sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None):
  // a list for an optional list, None for an optional dtype.
  Value* dims = g.add_list(ValueKind::kIntList, {zero})->output();
  Value* keepdim = g.add_constant(false, ValueKind::kBool);
  Value* none = g.add_constant(c10::IValue(), ValueKind::kNone);
  g.add_op(op("aten::sum", "dim_IntList"), {x, dims, keepdim, none});
  // A float or an int is a Scalar; an int where a float is expected promotes.
  g.add_op(op("aten::pow", "Tensor_Scalar"), {x, g.add_constant(2.5, ValueKind::kFloat)});
  g.add_op(op("aten::clamp_min"), {x, g.add_constant(0, ValueKind::kInt)});
  g.add_op(op("aten::dropout"), {x, zero, keepdim});  // dropout(Tensor, float p, bool train)
  EXPECT_TRUE(finish_and_verify().empty());
}

// Regression: dtype arguments were checked against the schema's fake type (int), so a dtype
// constant was rejected. Both a dtype and a plain int (the boxed form) are accepted now.
TEST_F(VerifierTest, DtypeArgumentsAcceptDtypesAndInts) {
  auto to_dtype = [&](Value* dtype) {
    Value* no = g.add_constant(false, ValueKind::kBool);
    Value* none = g.add_constant(c10::IValue(), ValueKind::kNone);
    g.add_op(op("aten::to", "dtype"), {x, dtype, no, no, none});
  };
  const auto half = static_cast<int64_t>(c10::ScalarType::Half);
  to_dtype(g.add_constant(half, ValueKind::kDtype));
  to_dtype(g.add_constant(half, ValueKind::kInt));
  EXPECT_TRUE(finish_and_verify().empty());
}

TEST_F(VerifierTest, DtypeArgumentsRejectOtherKinds) {
  Value* no = g.add_constant(false, ValueKind::kBool);
  Value* none = g.add_constant(c10::IValue(), ValueKind::kNone);
  g.add_op(op("aten::to", "dtype"), {x, g.add_constant(1.5, ValueKind::kFloat), no, no, none});
  EXPECT_TRUE(
      has_error(finish_and_verify(), "argument 'dtype' expects ScalarType but gets a float"));
}

TEST_F(VerifierTest, ValueOfAnotherGraph) {
  Graph other;
  Value* z = other.add_tensor_input("z", tensor_type({4}));
  g.add_op(op("aten::relu"), {z});
  EXPECT_TRUE(has_error(finish_and_verify(), "input 0 is a value of another graph"));
}

TEST_F(VerifierTest, UseBeforeDefinition) {
  // relu reads the output of a neg created after it.
  Node* neg = g.add_op(op("aten::neg"), {x});
  named(neg, "neg");
  relu->set_input(0, neg->output());
  EXPECT_TRUE(has_error(finish_and_verify(), "input 0 (%neg) is used before it is produced"));
}

TEST_F(VerifierTest, OperatorArity) {
  named(g.add_op(op("aten::add", "Tensor"), {x, x}), "bad_add");
  auto errors = finish_and_verify();
  EXPECT_TRUE(has_error(errors, "%bad_add = aten::add.Tensor: has 2 inputs, expected 3"));
}

TEST_F(VerifierTest, ArgumentKindMismatch) {
  g.add_op(op("aten::relu"), {two});
  EXPECT_TRUE(has_error(finish_and_verify(), "argument 'self' expects Tensor but gets a int"));
}

TEST_F(VerifierTest, MissingOutputNode) {
  EXPECT_TRUE(has_error(verify_errors(g), "graph has 0 Output nodes, expected 1"));
}

// The Graph API cannot put a node after the Output node (appending then is a UserError and an
// insert point always lies before an existing node), nor create a second Output node; test_ir
// covers that. The verifier's checks for those cases guard graphs mutated by other means.
TEST_F(VerifierTest, TheApiKeepsTheOutputNodeLast) {
  g.set_outputs({first->output()});
  g.set_insert_point(g.output_node());
  g.add_op(op("aten::neg"), {x});
  EXPECT_EQ(g.nodes().back(), g.output_node());
  EXPECT_TRUE(verify_errors(g).empty());
}

TEST_F(VerifierTest, GetItemOfANonList) {
  g.add_getitem(relu->output(), 0);
  EXPECT_TRUE(has_error(finish_and_verify(), "getitem of a Tensor, which is not a list"));
}

TEST_F(VerifierTest, SymbolicOpArity) {
  named(g.add_sym(SymOp::kMul, {size->output()}), "half_mul");
  named(g.add_sym(SymOp::kNeg, {size->output(), two}), "wide_neg");
  auto errors = finish_and_verify();
  EXPECT_TRUE(has_error(errors, "%half_mul = mul: has 1 inputs, expected 2"));
  EXPECT_TRUE(has_error(errors, "%wide_neg = neg: has 2 inputs, expected 1"));
}

TEST_F(VerifierTest, ListNodeMustProduceAList) {
  Node* list = g.add_list(ValueKind::kIntList, {zero, two});
  list->output()->set_kind(ValueKind::kInt);
  EXPECT_TRUE(has_error(finish_and_verify(), "a list node must produce one list value"));
}

TEST_F(VerifierTest, MessagesNameTheFxNode) {
  Node* bad = g.add_op(op("aten::relu"), {two});
  bad->provenance().fx_name = "relu_3";
  EXPECT_TRUE(has_error(finish_and_verify(), "(from FX node relu_3): argument 'self'"));
}

TEST_F(VerifierTest, VerifyThrowsAnInternalErrorWithEveryViolationAndTheGraph) {
  named(g.add_op(op("aten::add", "Tensor"), {x, x}), "bad_add");
  g.add_getitem(relu->output(), 0);
  std::string message = message_of<InternalError>([&] { verify(g); });
  EXPECT_TRUE(contains(message, "graph verification failed:"));
  EXPECT_TRUE(contains(message, "has 2 inputs, expected 3"));
  EXPECT_TRUE(contains(message, "which is not a list"));
  EXPECT_TRUE(contains(message, "Output nodes, expected 1"));
  EXPECT_TRUE(contains(message, "graph(%x: f32[s0, 4], %w: f32[4, 4]):"));
}

}  // namespace
}  // namespace magi::ir
