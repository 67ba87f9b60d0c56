// chunk_rows on hand-built graphs: an MLP-like stretch (mm into a wider hidden size, relu, mm
// back, residual) becomes a piece called in row chunks, whose results equal the unchunked
// graph's at row counts below, at and above the chunk size; a stretch too short to chunk (a
// constant or a compiling call's row count), and a stretch whose intermediates are no wider
// than its inputs and outputs, stay as they are.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "magi/ir/printer.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "magi/runtime/executor.h"
#include "test_helpers.h"

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::SymExpr;
using ir::Value;
using ir::ValueKind;
using test::named;
using test::op;
using test::sym;
using test::tensor_type;

Value* typed(Value* v, std::vector<SymExpr> sizes) {
  ir::TensorType t = tensor_type(std::move(sizes));
  t.strides = ir::TensorType::contiguous_strides(t.sizes);
  v->set_tensor_type(t);
  return v;
}

// out = mm(relu(mm(x, w1)), w2) + x, with x [rows, 8], w1 [8, hidden], w2 [hidden, 8].
void mlp(Graph& g, SymExpr rows, int64_t hidden) {
  Value* x = g.add_tensor_input("x", tensor_type({rows, 8}));
  typed(x, {rows, 8});
  Value* w1 = typed(g.add_tensor_input("w1", tensor_type({8, hidden})), {8, hidden});
  Value* w2 = typed(g.add_tensor_input("w2", tensor_type({hidden, 8})), {hidden, 8});
  Value* up = typed(named(g.add_op(op("aten::mm"), {x, w1}), "up"), {rows, hidden});
  Value* act = typed(named(g.add_op(op("aten::relu"), {up}), "act"), {rows, hidden});
  Value* down = typed(named(g.add_op(op("aten::mm"), {act, w2}), "down"), {rows, 8});
  Value* out = typed(
      named(g.add_op(op("aten::add", "Tensor"), {down, x, g.add_constant(1, ValueKind::kScalar)}),
            "out"),
      {rows, 8});
  g.set_outputs({out});
}

const Node* chunked_call(const Graph& g) {
  for (const Node* n : g.nodes()) {
    if (n->kind() == NodeKind::kCallPiece && n->chunk_rows() > 0) return n;
  }
  return nullptr;
}

TEST(ChunkRows, OutlinesAWideStretchAndMatchesTheUnchunkedGraph) {
  Graph original, chunked;
  mlp(original, sym("s0"), 32);
  mlp(chunked, sym("s0"), 32);
  ASSERT_TRUE(chunk_rows(chunked, 3, {{"s0", 10}}));  // compiled from a call of 10 rows
  ASSERT_TRUE(ir::verify_errors(chunked).empty()) << ir::to_string(chunked);
  const Node* call = chunked_call(chunked);
  ASSERT_NE(call, nullptr) << ir::to_string(chunked);
  EXPECT_EQ(call->chunk_rows(), 3);
  // x is cut into rows; the weights are passed whole.
  ASSERT_EQ(call->inputs().size(), 3u);
  EXPECT_EQ(call->chunked_inputs(), (std::vector<bool>{true, false, false}));
  EXPECT_TRUE(test::contains(ir::to_string(chunked), "in chunks of 3 rows of %x"));

  runtime::Executable plain(original), in_chunks(chunked);
  for (int64_t rows : {2, 3, 7, 9}) {  // one run, one run, 3 chunks (3, 3, 1), 3 chunks
    at::Tensor x = at::randn({rows, 8}), w1 = at::randn({8, 32}), w2 = at::randn({32, 8});
    const at::Tensor want = plain.run({x, w1, w2})[0].toTensor();
    const at::Tensor got = in_chunks.run({x, w1, w2})[0].toTensor();
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << rows << " rows";
  }
}

TEST(ChunkRows, LeavesShortAndNarrowStretches) {
  Graph short_rows, short_hint, narrow;
  mlp(short_rows, SymExpr(5), 32);  // 5 constant rows: fewer than twice 3
  mlp(short_hint, sym("s0"), 32);   // compiled from a call of 3 rows
  mlp(narrow, sym("s0"), 4);        // the hidden size is narrower than x and the output
  EXPECT_FALSE(chunk_rows(short_rows, 3));
  EXPECT_FALSE(chunk_rows(short_hint, 3, {{"s0", 3}}));
  EXPECT_FALSE(chunk_rows(short_hint, 3));  // no hint: a graph loaded from the cache
  EXPECT_FALSE(chunk_rows(narrow, 3, {{"s0", 10}}));
  EXPECT_EQ(chunked_call(short_rows), nullptr);
  EXPECT_EQ(chunked_call(short_hint), nullptr);
  EXPECT_EQ(chunked_call(narrow), nullptr);
}

TEST(ChunkRows, ASeedWithAPerRowBiasIsNoRegion) {
  // addmm(bias[rows, 32], x, w1): the bias varies by row, so it cannot be passed whole.
  Graph g;
  const SymExpr rows = sym("s0");
  Value* x = typed(g.add_tensor_input("x", tensor_type({rows, 8})), {rows, 8});
  Value* bias = typed(g.add_tensor_input("bias", tensor_type({rows, 32})), {rows, 32});
  Value* w1 = typed(g.add_tensor_input("w1", tensor_type({8, 32})), {8, 32});
  Value* w2 = typed(g.add_tensor_input("w2", tensor_type({32, 8})), {32, 8});
  Value* one = g.add_constant(1, ValueKind::kScalar);
  Value* up = typed(named(g.add_op(op("aten::addmm"), {bias, x, w1, one, one}), "up"), {rows, 32});
  Value* act = typed(named(g.add_op(op("aten::relu"), {up}), "act"), {rows, 32});
  Value* down = typed(named(g.add_op(op("aten::mm"), {act, w2}), "down"), {rows, 8});
  g.set_outputs({down});
  EXPECT_FALSE(chunk_rows(g, 3, {{"s0", 10}})) << ir::to_string(g);
}

}  // namespace
}  // namespace magi::passes
