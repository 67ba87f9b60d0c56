// The graph IR: building graphs with real ATen operators, use lists, removal, insertion
// order, schema type mapping and tensor types.
#include <gtest/gtest.h>

#include <algorithm>

#include "magi/common/error.h"
#include "magi/ir/graph.h"
#include "test_helpers.h"

namespace magi::ir {
namespace {

using test::contains;
using test::message_of;
using test::named;
using test::op;
using test::sym;
using test::tensor_type;

size_t count(const std::vector<Node*>& nodes, const Node* node) {
  return std::count(nodes.begin(), nodes.end(), node);
}

TEST(Graph, InputsAreNamedUniquely) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
  Value* x2 = g.add_input("x", ValueKind::kInt);
  EXPECT_EQ(x->name(), "x");
  EXPECT_EQ(x2->name(), "x_1");
  EXPECT_EQ(g.inputs(), (std::vector<Value*>{x, x2}));
  EXPECT_EQ(x->kind(), ValueKind::kTensor);
  ASSERT_TRUE(x->tensor_type().has_value());
  EXPECT_EQ(x->tensor_type()->str(), "f32[s0, 4]");
  EXPECT_EQ(x->producer()->kind(), NodeKind::kInput);
  EXPECT_EQ(x->producer()->provenance().fx_name, "x");
  EXPECT_EQ(x->owner(), &g);
  EXPECT_TRUE(g.outputs().empty());
  EXPECT_EQ(g.output_node(), nullptr);
}

TEST(Graph, OperatorNodesFollowTheirSchema) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 4}));
  Value* y = g.add_tensor_input("y", tensor_type({sym("s0"), 4}));
  Value* alpha = g.add_constant(1, ValueKind::kScalar);
  Node* add = g.add_op(op("aten::add", "Tensor"), {x, y, alpha});

  EXPECT_EQ(add->kind(), NodeKind::kAtenOp);
  EXPECT_TRUE(add->is_operator());
  EXPECT_EQ(add->op_name(), "aten::add.Tensor");
  EXPECT_EQ(add->schema().arguments().size(), 3u);
  EXPECT_EQ(add->inputs(), (std::vector<Value*>{x, y, alpha}));
  ASSERT_EQ(add->outputs().size(), 1u);
  EXPECT_EQ(add->output()->kind(), ValueKind::kTensor);
  EXPECT_EQ(add->output()->producer(), add);
  EXPECT_EQ(add->output()->index(), 0u);
  EXPECT_EQ(add->owner(), &g);
  EXPECT_EQ(alpha->name(), "v2");  // unnamed values are numbered, so printing never shows "%"
  EXPECT_EQ(add->output()->name(), "v3");
  EXPECT_EQ(g.add_op(op("aten::mm"), {x, y})->op_name(), "aten::mm");

  // An operator that returns two tensors gets two outputs, at their indices.
  Value* dim = g.add_constant(1, ValueKind::kInt);
  Value* keepdim = g.add_constant(false, ValueKind::kBool);
  Node* max = g.add_op(op("aten::max", "dim"), {x, dim, keepdim});
  ASSERT_EQ(max->outputs().size(), 2u);
  EXPECT_EQ(max->output(1)->index(), 1u);
  EXPECT_EQ(max->output(1)->kind(), ValueKind::kTensor);
}

TEST(Graph, NonOperatorNodesHaveNoHandle) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  EXPECT_FALSE(x->producer()->is_operator());
  EXPECT_EQ(x->producer()->op_name(), "input");
  EXPECT_THROW(x->producer()->op(), InternalError);
}

TEST(Graph, ConstantsKeepTheirValueAndKind) {
  Graph g;
  Value* four = g.add_constant(4, ValueKind::kInt);
  EXPECT_EQ(four->producer()->kind(), NodeKind::kConstant);
  EXPECT_EQ(four->producer()->constant().toInt(), 4);
  ASSERT_TRUE(four->sym().has_value());
  EXPECT_EQ(four->sym()->str(), "4");

  // An int IValue read as a dtype is not a symbolic integer.
  Value* dtype = g.add_constant(static_cast<int64_t>(c10::ScalarType::Half), ValueKind::kDtype);
  EXPECT_EQ(dtype->kind(), ValueKind::kDtype);
  EXPECT_FALSE(dtype->sym().has_value());

  Value* none = g.add_constant(c10::IValue(), ValueKind::kNone);
  EXPECT_TRUE(none->producer()->constant().isNone());
  EXPECT_EQ(none->type_str(), "None");
}

TEST(Graph, ListsAndGetItems) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0"), 8}));
  Value* split_size = g.add_constant(2, ValueKind::kInt);
  Value* dim = g.add_constant(1, ValueKind::kInt);
  Node* split = g.add_op(op("aten::split", "Tensor"), {x, split_size, dim});
  ASSERT_EQ(split->outputs().size(), 1u);
  EXPECT_EQ(split->output()->kind(), ValueKind::kTensorList);
  EXPECT_EQ(split->output()->type_str(), "Tensor[]");

  Node* second = g.add_getitem(split->output(), 1);
  EXPECT_EQ(second->kind(), NodeKind::kGetItem);
  EXPECT_EQ(second->item_index(), 1);
  EXPECT_EQ(second->output()->kind(), ValueKind::kTensor);
  EXPECT_EQ(second->input(0), split->output());

  Value* n = g.add_sym(SymOp::kSize, {x, g.add_constant(0, ValueKind::kInt)})->output();
  Value* four = g.add_constant(4, ValueKind::kInt);
  Node* list = g.add_list(ValueKind::kIntList, {n, four, n});
  EXPECT_EQ(list->kind(), NodeKind::kMakeList);
  EXPECT_EQ(list->output()->kind(), ValueKind::kIntList);
  EXPECT_EQ(list->inputs(), (std::vector<Value*>{n, four, n}));
  EXPECT_EQ(count(n->users(), list), 2u);
  EXPECT_EQ(g.add_getitem(list->output(), 0)->output()->kind(), ValueKind::kInt);

  EXPECT_THROW(g.add_list(ValueKind::kInt, {n}), InternalError);
}

TEST(Graph, SymbolicOpsProduceIntsBoolsOrFloats) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({sym("s0")}));
  Value* zero = g.add_constant(0, ValueKind::kInt);
  Node* size = g.add_sym(SymOp::kSize, {x, zero});
  EXPECT_EQ(size->kind(), NodeKind::kSymArith);
  EXPECT_EQ(size->sym_op(), SymOp::kSize);
  EXPECT_EQ(size->op_name(), "size");
  EXPECT_EQ(size->output()->kind(), ValueKind::kInt);
  Value* n = size->output();
  EXPECT_EQ(g.add_sym(SymOp::kMul, {n, n})->output()->kind(), ValueKind::kInt);
  EXPECT_EQ(g.add_sym(SymOp::kLt, {n, zero})->output()->kind(), ValueKind::kBool);
  EXPECT_EQ(g.add_sym(SymOp::kTrueDiv, {n, n})->output()->kind(), ValueKind::kFloat);
}

TEST(Graph, UsersCountEachUse) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Value* alpha = g.add_constant(1, ValueKind::kScalar);
  Node* twice = g.add_op(op("aten::add", "Tensor"), {x, x, alpha});
  Node* relu = g.add_op(op("aten::relu"), {x});
  EXPECT_EQ(x->users().size(), 3u);
  EXPECT_EQ(count(x->users(), twice), 2u);
  EXPECT_EQ(count(x->users(), relu), 1u);
  EXPECT_EQ(alpha->users(), std::vector<Node*>{twice});
  EXPECT_TRUE(relu->output()->users().empty());
  Node* out = g.set_outputs({relu->output(), relu->output()});
  EXPECT_EQ(relu->output()->users(), (std::vector<Node*>{out, out}));
  EXPECT_EQ(g.outputs(), (std::vector<Value*>{relu->output(), relu->output()}));
}

TEST(Graph, SetInputMovesTheUse) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Value* y = g.add_tensor_input("y", tensor_type({4}));
  Value* alpha = g.add_constant(1, ValueKind::kScalar);
  Node* add = g.add_op(op("aten::add", "Tensor"), {x, x, alpha});
  add->set_input(1, y);
  EXPECT_EQ(add->inputs(), (std::vector<Value*>{x, y, alpha}));
  EXPECT_EQ(x->users(), std::vector<Node*>{add});
  EXPECT_EQ(y->users(), std::vector<Node*>{add});
  EXPECT_THROW(add->set_input(3, y), InternalError);
}

TEST(Graph, EraseRemovesTheNodeAndItsUses) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Node* relu = g.add_op(op("aten::relu"), {x});
  Node* neg = g.add_op(op("aten::neg"), {relu->output()});
  ASSERT_EQ(g.num_nodes(), 3u);

  std::string message = message_of<InternalError>([&] { g.erase(relu); });
  EXPECT_TRUE(contains(message, "erase() of aten::relu"));
  EXPECT_TRUE(contains(message, "still used"));
  EXPECT_THROW(g.erase(x->producer()), InternalError);

  Value* relu_out = relu->output();
  g.erase(neg);
  EXPECT_TRUE(relu_out->users().empty());
  g.erase(relu);
  EXPECT_TRUE(x->users().empty());
  EXPECT_EQ(g.nodes(), std::vector<Node*>{x->producer()});
  EXPECT_FALSE(g.owns(relu_out));

  Graph other;
  Node* foreign = other.add_op(op("aten::relu"), {other.add_tensor_input("z", tensor_type({4}))});
  EXPECT_THROW(g.erase(foreign), InternalError);
}

TEST(Graph, NodesKeepCreationOrderUnlessAnInsertPointIsSet) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Node* a = g.add_op(op("aten::relu"), {x});
  Node* c = g.add_op(op("aten::neg"), {a->output()});
  g.set_insert_point(c);
  Node* b = g.add_op(op("aten::abs"), {a->output()});
  g.set_insert_point(nullptr);
  Node* d = g.add_op(op("aten::exp"), {c->output()});
  EXPECT_EQ(g.nodes(), (std::vector<Node*>{x->producer(), a, b, c, d}));
  EXPECT_EQ(g.num_nodes(), 5u);
}

TEST(Graph, TheOutputNodeStaysLast) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Node* relu = g.add_op(op("aten::relu"), {x});
  Node* out = g.set_outputs({relu->output()});
  EXPECT_EQ(g.output_node(), out);
  EXPECT_EQ(out->kind(), NodeKind::kOutput);
  EXPECT_TRUE(out->outputs().empty());

  EXPECT_TRUE(contains(message_of<UserError>([&] { g.add_op(op("aten::neg"), {x}); }),
                       "after the graph's Output node"));
  EXPECT_THROW(g.set_outputs({x}), UserError);

  // With an insert point, new nodes go before it; a second set_outputs still refuses.
  g.set_insert_point(out);
  Node* neg = g.add_op(op("aten::neg"), {x});
  EXPECT_EQ(g.nodes(), (std::vector<Node*>{x->producer(), relu, neg, out}));
  EXPECT_THROW(g.set_outputs({x}), UserError);
}

TEST(Graph, OwnershipIsPerGraph) {
  Graph g, other;
  Value* x = g.add_tensor_input("x", tensor_type({4}));
  Value* z = other.add_tensor_input("z", tensor_type({4}));
  EXPECT_TRUE(g.owns(x));
  EXPECT_FALSE(g.owns(z));
  EXPECT_TRUE(g.owns(x->producer()));
  EXPECT_FALSE(g.owns(z->producer()));
}

TEST(ValueKinds, SchemaTypesMapToValueKinds) {
  using c10::ListType;
  using c10::OptionalType;
  EXPECT_EQ(value_kind_of(c10::TensorType::get()), ValueKind::kTensor);
  EXPECT_EQ(value_kind_of(c10::IntType::get()), ValueKind::kInt);
  EXPECT_EQ(value_kind_of(c10::SymIntType::get()), ValueKind::kInt);
  EXPECT_EQ(value_kind_of(c10::FloatType::get()), ValueKind::kFloat);
  EXPECT_EQ(value_kind_of(c10::BoolType::get()), ValueKind::kBool);
  EXPECT_EQ(value_kind_of(c10::NumberType::get()), ValueKind::kScalar);
  EXPECT_EQ(value_kind_of(c10::NoneType::get()), ValueKind::kNone);
  EXPECT_EQ(value_kind_of(c10::StringType::get()), ValueKind::kString);
  EXPECT_EQ(value_kind_of(c10::ScalarTypeType::get()), ValueKind::kDtype);
  EXPECT_EQ(value_kind_of(c10::DeviceObjType::get()), ValueKind::kDevice);
  EXPECT_EQ(value_kind_of(c10::LayoutType::get()), ValueKind::kLayout);
  EXPECT_EQ(value_kind_of(c10::MemoryFormatType::get()), ValueKind::kMemoryFormat);
  EXPECT_EQ(value_kind_of(OptionalType::create(c10::TensorType::get())), ValueKind::kTensor);
  EXPECT_EQ(value_kind_of(ListType::ofInts()), ValueKind::kIntList);
  EXPECT_EQ(value_kind_of(ListType::ofFloats()), ValueKind::kFloatList);
  EXPECT_EQ(value_kind_of(ListType::ofBools()), ValueKind::kBoolList);
  EXPECT_EQ(value_kind_of(ListType::ofTensors()), ValueKind::kTensorList);
  EXPECT_EQ(value_kind_of(ListType::ofOptionalTensors()), ValueKind::kOptionalTensorList);
  EXPECT_EQ(value_kind_of(ListType::ofStrings()), ValueKind::kOther);
  EXPECT_EQ(value_kind_of(c10::DictType::create(c10::StringType::get(), c10::IntType::get())),
            ValueKind::kOther);
}

TEST(ValueKinds, RealSchemasMapAsExpected) {
  const auto& view = op("aten::view").schema();  // view(Tensor(a) self, SymInt[] size)
  EXPECT_EQ(value_kind_of(view.arguments()[1].type()), ValueKind::kIntList);
  const auto& add = op("aten::add", "Tensor").schema();  // alpha: Scalar
  EXPECT_EQ(value_kind_of(add.arguments()[2].type()), ValueKind::kScalar);
  // to(self, ScalarType dtype, ...): the schema's type() of a dtype is int, its real_type()
  // is ScalarType.
  const auto& to = op("aten::to", "dtype").schema();
  EXPECT_EQ(value_kind_of(to.arguments()[1].type()), ValueKind::kInt);
  EXPECT_EQ(value_kind_of(to.arguments()[1].real_type()), ValueKind::kDtype);
  const auto& index = op("aten::index", "Tensor").schema();  // indices: Tensor?[]
  EXPECT_EQ(value_kind_of(index.arguments()[1].type()), ValueKind::kOptionalTensorList);
}

TEST(ValueKinds, NamesAndListKinds) {
  EXPECT_STREQ(value_kind_name(ValueKind::kTensorList), "Tensor[]");
  EXPECT_STREQ(value_kind_name(ValueKind::kInt), "int");
  EXPECT_TRUE(is_list_kind(ValueKind::kIntList));
  EXPECT_TRUE(is_list_kind(ValueKind::kOptionalTensorList));
  EXPECT_FALSE(is_list_kind(ValueKind::kTensor));
  EXPECT_FALSE(is_list_kind(ValueKind::kOther));
  EXPECT_STREQ(node_kind_name(NodeKind::kGetItem), "getitem");
  EXPECT_STREQ(sym_op_name(SymOp::kFloorDiv), "floordiv");
  EXPECT_EQ(sym_op_arity(SymOp::kNeg), 1);
  EXPECT_EQ(sym_op_arity(SymOp::kSize), 2);
}

TEST(TensorType, StrShowsDtypeSizesAndOnlyUnusualLayout) {
  TensorType t = tensor_type({sym("s0"), 4096});
  EXPECT_EQ(t.str(), "f32[s0, 4096]");
  EXPECT_EQ(t.rank(), 2);
  t.strides = {4096, 1};
  EXPECT_EQ(t.str(), "f32[s0, 4096]");

  TensorType transposed = tensor_type({8, 4}, c10::ScalarType::BFloat16);
  transposed.strides = {1, 8};
  EXPECT_EQ(transposed.str(), "bf16[8, 4]{1, 8}");

  TensorType on_gpu = tensor_type({4}, c10::ScalarType::Long);
  on_gpu.device = c10::Device(c10::DeviceType::CUDA, 0);
  EXPECT_EQ(on_gpu.str(), "i64[4]@cuda:0");
  EXPECT_EQ(tensor_type({}, c10::ScalarType::Bool).str(), "b8[]");
}

TEST(TensorType, ContiguityIsSymbolic) {
  SymExpr s0 = sym("s0"), s1 = sym("s1");
  auto strides = TensorType::contiguous_strides({s0, s1, 4});
  ASSERT_EQ(strides.size(), 3u);
  EXPECT_EQ(strides[0].str(), "4*s1");
  EXPECT_EQ(strides[1].str(), "4");
  EXPECT_EQ(strides[2].str(), "1");

  TensorType t = tensor_type({s0, s1, 4});
  EXPECT_TRUE(t.is_contiguous());  // strides unknown
  t.strides = {s1 * 4, 4, 1};
  EXPECT_TRUE(t.is_contiguous());
  t.strides = {4, s0 * 4, 1};
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.str(), "f32[s0, s1, 4]{4, 4*s0, 1}");

  // A size-1 dimension may have any stride.
  TensorType row = tensor_type({1, s0});
  row.strides = {7, 1};
  EXPECT_TRUE(row.is_contiguous());
}

TEST(Value, TypeStrFallsBackToTheKind) {
  Graph g;
  Value* typed = g.add_tensor_input("x", tensor_type({sym("s0"), 16}));
  Value* untyped = g.add_input("y", ValueKind::kTensor);
  Value* n = g.add_input("n", ValueKind::kInt);
  EXPECT_EQ(typed->type_str(), "f32[s0, 16]");
  EXPECT_EQ(untyped->type_str(), "Tensor");
  EXPECT_EQ(n->type_str(), "int");
  Value* relu = named(g.add_op(op("aten::relu"), {typed}), "relu");
  EXPECT_EQ(relu->name(), "relu");
  EXPECT_EQ(relu->type_str(), "Tensor");  // shape inference is the importer's job
}

}  // namespace
}  // namespace magi::ir
