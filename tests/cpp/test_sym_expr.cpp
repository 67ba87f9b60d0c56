// SymExpr: normalisation, Python integer semantics, evaluation, printing.
#include "magi/ir/sym_expr.h"

#include <gtest/gtest.h>

#include "magi/common/error.h"
#include "test_helpers.h"

namespace magi::ir {
namespace {

using test::contains;
using test::message_of;
using test::sym;

class SymExprTest : public ::testing::Test {
 protected:
  SymExpr s0 = sym("s0");
  SymExpr s1 = sym("s1");
  SymExpr s2 = sym("s2");
};

TEST_F(SymExprTest, LeavesKeepTheirValue) {
  EXPECT_TRUE(SymExpr().is_constant());
  EXPECT_EQ(SymExpr().constant_value(), 0);
  EXPECT_EQ(SymExpr(-42).constant_value(), -42);
  EXPECT_EQ(s0.op(), SymExpr::Op::kSymbol);
  EXPECT_EQ(s0.symbol_name(), "s0");
  EXPECT_THROW(SymExpr::symbol(""), UserError);
  EXPECT_THROW(s0.constant_value(), InternalError);
}

TEST_F(SymExprTest, SumsCollectLikeTerms) {
  EXPECT_EQ(s0 + s0, 2 * s0);
  EXPECT_EQ((s0 + s0).str(), "2*s0");
  EXPECT_EQ((s0 * 4 + s0 * 4).str(), "8*s0");
  EXPECT_EQ((s1 + s0).str(), "s0 + s1");
  EXPECT_EQ(s1 + s0, s0 + s1);
  EXPECT_EQ((s0 + 3 + s1 - s0).str(), "s1 + 3");
  EXPECT_NE(s0 + s1, s0 + s2);
}

TEST_F(SymExprTest, ConstantsFold) {
  SymExpr seven = SymExpr(3) + SymExpr(4);
  ASSERT_TRUE(seven.is_constant());
  EXPECT_EQ(seven.constant_value(), 7);
  EXPECT_EQ((SymExpr(6) * SymExpr(-7)).constant_value(), -42);
  EXPECT_EQ((s0 + 3 + 4).str(), "s0 + 7");
  EXPECT_EQ((2 * (3 * s0)).str(), "6*s0");
  EXPECT_EQ(floor_div(SymExpr(7), SymExpr(2)).constant_value(), 3);
  EXPECT_EQ(mod(SymExpr(7), SymExpr(4)).constant_value(), 3);
}

TEST_F(SymExprTest, IdentitiesAndCancellation) {
  SymExpr times_zero = s0 * 0;
  ASSERT_TRUE(times_zero.is_constant());
  EXPECT_EQ(times_zero.constant_value(), 0);
  EXPECT_EQ((s0 + 0).str(), "s0");
  EXPECT_EQ((s0 * 1).str(), "s0");
  SymExpr difference = s0 - s0;
  ASSERT_TRUE(difference.is_constant());
  EXPECT_EQ(difference.constant_value(), 0);
  SymExpr square = (s0 + 1) * (s0 + 1);
  EXPECT_TRUE((square - square).is_constant());
  EXPECT_EQ(floor_div(s0, 1), s0);
  EXPECT_EQ(floor_div(s0 * s1, s0 * s1).str(), "1");
  EXPECT_EQ(mod(s0, 1).str(), "0");
  EXPECT_EQ(mod(s0, s0).str(), "0");
}

TEST_F(SymExprTest, ProductsFlattenAndDistributeOnlyOverOneSum) {
  EXPECT_EQ(s1 * s0, s0 * s1);
  EXPECT_EQ((s1 * s0 * 4).str(), "4*s0*s1");
  EXPECT_EQ((3 * (s0 + 1)).str(), "3*s0 + 3");
  EXPECT_EQ(((s0 + 1) * s1).str(), "(s0 + 1)*s1");
  EXPECT_EQ((s0 * s1 + 1).str(), "s0*s1 + 1");
}

TEST_F(SymExprTest, NegativeTermsReadAsSubtraction) {
  EXPECT_EQ((-s0).str(), "-s0");
  EXPECT_EQ((s0 - s1).str(), "s0 - s1");
  EXPECT_EQ((s1 - 2 * s0).str(), "-2*s0 + s1");
  EXPECT_EQ((s0 - 1).str(), "s0 - 1");
  EXPECT_EQ((-(s0 * s1)).str(), "-s0*s1");
}

// Floor division and modulo print as PyTorch's sympy FloorDiv does: always parenthesised,
// with a sum operand parenthesised too, so the text pastes into Python unchanged.
TEST_F(SymExprTest, DivisionAndModuloPrintLikePyTorch) {
  EXPECT_EQ(floor_div(s0, 8).str(), "(s0//8)");
  EXPECT_EQ(floor_div(s0 + 7, 8).str(), "((s0 + 7)//8)");
  EXPECT_EQ(mod(s0, 8).str(), "(s0%8)");
  EXPECT_EQ((2 * floor_div(s0, 8)).str(), "2*(s0//8)");
  EXPECT_EQ((s1 + floor_div(s0, 8)).str(), "(s0//8) + s1");
}

TEST(PythonIntegerSemantics, FloorDivisionRoundsTowardNegativeInfinity) {
  EXPECT_EQ(py_floor_div(7, 2), 3);
  EXPECT_EQ(py_floor_div(-7, 2), -4);
  EXPECT_EQ(py_floor_div(7, -2), -4);
  EXPECT_EQ(py_floor_div(-7, -2), 3);
  EXPECT_EQ(py_floor_div(-8, 2), -4);
  EXPECT_EQ(floor_div(SymExpr(-7), SymExpr(2)).constant_value(), -4);
}

TEST(PythonIntegerSemantics, ModuloTakesTheDivisorsSign) {
  EXPECT_EQ(py_mod(7, 2), 1);
  EXPECT_EQ(py_mod(-7, 2), 1);
  EXPECT_EQ(py_mod(7, -2), -1);
  EXPECT_EQ(py_mod(-7, -2), -1);
  EXPECT_EQ(py_mod(-8, 2), 0);
  EXPECT_EQ(mod(SymExpr(-7), SymExpr(2)).constant_value(), 1);
}

TEST_F(SymExprTest, DivisionByZeroIsAUserError) {
  EXPECT_TRUE(contains(message_of<UserError>([] { py_floor_div(1, 0); }), "division by zero"));
  EXPECT_TRUE(contains(message_of<UserError>([] { py_mod(1, 0); }), "modulo by zero"));
  EXPECT_TRUE(contains(message_of<UserError>([&] { floor_div(s0, 0); }), "s0 by zero"));
  EXPECT_THROW(mod(s0, 0), UserError);
  EXPECT_THROW(floor_div(s0, s1).evaluate({{"s0", 4}, {"s1", 0}}), UserError);
}

TEST_F(SymExprTest, MaxAndMin) {
  EXPECT_EQ(max(SymExpr(3), SymExpr(5)).constant_value(), 5);
  EXPECT_EQ(min(SymExpr(3), SymExpr(5)).constant_value(), 3);
  EXPECT_EQ(max(s0, s0), s0);
  EXPECT_EQ(max(s1, s0).str(), "max(s0, s1)");
  EXPECT_EQ(max(s1, s0), max(s0, s1));
  EXPECT_EQ(min(s0, 4).str(), "min(4, s0)");
  EXPECT_EQ(max(s0, 4).evaluate({{"s0", 2}}), 4);
  EXPECT_EQ(max(s0, 4).evaluate({{"s0", 9}}), 9);
  EXPECT_EQ(min(s0, 4).evaluate({{"s0", 9}}), 4);
}

TEST_F(SymExprTest, EvaluatesAgainstBindings) {
  SymbolBindings bindings{{"s0", 5}, {"s1", 3}};
  EXPECT_EQ((s0 * s1 + floor_div(s0, 2)).evaluate(bindings), 17);
  EXPECT_EQ((s0 - 2 * s1).evaluate(bindings), -1);
  EXPECT_EQ(floor_div(s0 - 12, s1).evaluate(bindings), -3);  // -7 // 3
  EXPECT_EQ(mod(s0 - 12, s1).evaluate(bindings), 2);         // -7 % 3
  EXPECT_EQ(SymExpr(11).evaluate({}), 11);
  EXPECT_EQ((s0 * s1).try_evaluate(bindings), 15);
}

TEST_F(SymExprTest, EvaluatingAnUnboundSymbolNamesIt) {
  SymExpr e = s0 * s2 + s1;
  EXPECT_EQ(e.try_evaluate({{"s0", 1}}), std::nullopt);
  std::string message = message_of<UserError>([&] { e.evaluate({{"s0", 1}}); });
  EXPECT_TRUE(contains(message, "cannot evaluate s0*s2 + s1"));
  EXPECT_TRUE(contains(message, "no value for symbol(s) s1, s2"));
}

TEST_F(SymExprTest, CollectsSymbols) {
  std::set<std::string> symbols;
  (s0 * s2 + max(s1, 3) + floor_div(s0, 4)).collect_symbols(symbols);
  EXPECT_EQ(symbols, (std::set<std::string>{"s0", "s1", "s2"}));
  std::set<std::string> none;
  (SymExpr(3) * 4).collect_symbols(none);
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace magi::ir
