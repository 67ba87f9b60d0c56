// The printer: golden text of a small graph with symbolic shapes, inline literals and lists,
// a getitem, a dtype constant, source comments and the return line.
#include "magi/ir/printer.h"

#include <gtest/gtest.h>

#include "test_helpers.h"

namespace magi::ir {
namespace {

using test::named;
using test::op;
using test::sym;
using test::tensor_type;

constexpr auto kBF16 = c10::ScalarType::BFloat16;

// Builds, as the FX importer would:
//   def forward(x, w):
//       mm = x @ w                         # model.py:12
//       h = mm.view(mm.size(0), 4, 4)      # model.py:13
//       a, b = h.split(2, dim=1)
//       return a.float(), mm.size(0) * 2
class PrinterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SymExpr s0 = sym("s0");
    Value* x = g.add_tensor_input("x", tensor_type({s0, 16}, kBF16));
    Value* w = g.add_tensor_input("w", tensor_type({16, 16}, kBF16));

    Node* mm_node = g.add_op(op("aten::mm"), {x, w});
    mm_node->provenance().source = "model.py:12 in forward";
    Value* mm = typed(named(mm_node, "mm"), tensor_type({s0, 16}, kBF16));

    Value* n = named(g.add_sym(SymOp::kSize, {mm, g.add_constant(0, ValueKind::kInt)}), "sym_size");
    n->set_sym(s0);
    Value* four = g.add_constant(4, ValueKind::kInt);
    Value* shape = g.add_list(ValueKind::kIntList, {n, four, four})->output();
    Node* view_node = g.add_op(op("aten::view"), {mm, shape});
    view_node->provenance().source = "model.py:13 in forward";
    Value* view = typed(named(view_node, "view"), tensor_type({s0, 4, 4}, kBF16));

    Value* split = named(
        g.add_op(op("aten::split", "Tensor"),
                 {view, g.add_constant(2, ValueKind::kInt), g.add_constant(1, ValueKind::kInt)}),
        "split");
    Value* a = typed(named(g.add_getitem(split, 0), "getitem"), tensor_type({s0, 2, 4}, kBF16));

    Value* float32 =
        g.add_constant(static_cast<int64_t>(c10::ScalarType::Float), ValueKind::kDtype);
    Value* no = g.add_constant(false, ValueKind::kBool);
    Value* none = g.add_constant(c10::IValue(), ValueKind::kNone);
    Value* to = typed(named(g.add_op(op("aten::to", "dtype"), {a, float32, no, no, none}), "to"),
                      tensor_type({s0, 2, 4}));

    Value* doubled = named(g.add_sym(SymOp::kMul, {n, g.add_constant(2, ValueKind::kInt)}), "mul");
    doubled->set_sym(2 * s0);
    g.set_outputs({to, doubled});
  }

  static Value* typed(Value* v, TensorType t) {
    v->set_tensor_type(std::move(t));
    return v;
  }

  Graph g;
};

TEST_F(PrinterTest, Golden) {
  EXPECT_EQ(
      to_string(g),
      "graph(%x: bf16[s0, 16], %w: bf16[16, 16]):\n"
      "  %mm: bf16[s0, 16] = aten::mm(%x, %w)                        # model.py:12 in forward\n"
      "  %sym_size: int(s0) = size(%mm, 0)\n"
      "  %view: bf16[s0, 4, 4] = aten::view(%mm, [%sym_size, 4, 4])  # model.py:13 in forward\n"
      "  %split: Tensor[] = aten::split.Tensor(%view, 2, 1)\n"
      "  %getitem: bf16[s0, 2, 4] = %split[0]\n"
      "  %to: f32[s0, 2, 4] = aten::to.dtype(%getitem, torch.float32, False, False, None)\n"
      "  %mul: int(2*s0) = mul(%sym_size, 2)\n"
      "  return (%to, %mul)\n");
}

TEST_F(PrinterTest, OptionsDropTypesAndSources) {
  PrintOptions bare;
  bare.show_types = false;
  bare.show_source = false;
  EXPECT_EQ(to_string(g, bare),
            "graph(%x, %w):\n"
            "  %mm = aten::mm(%x, %w)\n"
            "  %sym_size = size(%mm, 0)\n"
            "  %view = aten::view(%mm, [%sym_size, 4, 4])\n"
            "  %split = aten::split.Tensor(%view, 2, 1)\n"
            "  %getitem = %split[0]\n"
            "  %to = aten::to.dtype(%getitem, torch.float32, False, False, None)\n"
            "  %mul = mul(%sym_size, 2)\n"
            "  return (%to, %mul)\n");
}

// Regression: comments used to be padded to a fixed column, so a commented line longer than
// that pushed its comment out of line with the others.
TEST_F(PrinterTest, SourceCommentsShareOneColumn) {
  g.output_node()->input(0)->producer()->provenance().source = "model.py:15 in forward";
  std::string text = to_string(g);
  std::vector<size_t> columns;
  for (size_t start = 0, end; (end = text.find('\n', start)) != std::string::npos;
       start = end + 1) {
    size_t hash = text.substr(start, end - start).find("  # ");
    if (hash != std::string::npos) columns.push_back(hash);
  }
  ASSERT_EQ(columns.size(), 3u) << text;
  EXPECT_EQ(columns[0], columns[2]) << text;
  EXPECT_EQ(columns[1], columns[2]) << text;
}

TEST(Printer, FormatsOperandsInline) {
  Graph g;
  Value* x = g.add_tensor_input("x", test::tensor_type({4}));
  Value* n = g.add_input("n", ValueKind::kInt);
  EXPECT_EQ(format_operand(x), "%x");
  EXPECT_EQ(format_operand(g.add_constant(4096, ValueKind::kInt)), "4096");
  EXPECT_EQ(format_operand(g.add_constant(0.5, ValueKind::kFloat)), "0.5");
  EXPECT_EQ(format_operand(g.add_constant(1.0, ValueKind::kFloat)), "1.0");
  EXPECT_EQ(format_operand(g.add_constant(true, ValueKind::kBool)), "True");
  EXPECT_EQ(format_operand(g.add_constant(std::string("tanh"), ValueKind::kString)), "'tanh'");
  EXPECT_EQ(format_operand(g.add_constant(c10::IValue(), ValueKind::kNone)), "None");
  EXPECT_EQ(format_operand(
                g.add_constant(static_cast<int64_t>(c10::ScalarType::BFloat16), ValueKind::kDtype)),
            "torch.bfloat16");
  EXPECT_EQ(format_operand(g.add_constant(std::vector<int64_t>{2, 3}, ValueKind::kIntList)),
            "[2, 3]");
  Value* list = g.add_list(ValueKind::kIntList, {n, g.add_constant(16, ValueKind::kInt)})->output();
  EXPECT_EQ(format_operand(list), "[%n, 16]");
}

}  // namespace
}  // namespace magi::ir
