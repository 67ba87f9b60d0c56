// Fusion around writes in place (a KV cache's index_copy_, a custom op writing a list): which
// groups fuse_groups lets span a write, on hand-built graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"

#include "fusion_builder.h"
#include "test_helpers.h"

namespace magi::test {
namespace {

using passes::fuse_groups;

// A write between two groups (a KV cache's index_copy_ between a layer's ops) keeps them
// apart only when something in their span reads the memory it writes: the write to `cache`
// lets the siblings silu(a) * u and exp(a * u) merge, and a chain exp(a * u) spanning it stay
// one group. The same write to `u` (which the groups read before it) keeps both apart, as does
// one to a view of `u`, or a matmul between them that reads `cache` and the group's a * u (it
// would move after the kernel, past the write, and read the new cache).
TEST(FuseGroups, GroupsSpanAWriteOfMemoryTheyDoNotRead) {
  for (const char* target : {"cache", "cache read between", "u", "view of u"}) {
    for (const bool siblings : {true, false}) {
      Graph g;
      Builder b(g);
      Value* a = b.input("a", {sym("s0"), 16});
      Value* u = b.input("u", {sym("s0"), 16});
      Value* cache = b.input("cache", {16, 16});
      Value* src = b.input("src", {1, 16});
      Value* pos = b.input("pos", {1}, c10::ScalarType::Long);
      Value* h = siblings ? b.mul(b.unary("aten::silu", a, "silu"), u, "mul") : nullptr;
      Value* au = b.mul(a, u, "mul_1");
      const std::string t = target;
      std::vector<Value*> outputs;
      if (siblings) outputs.push_back(h);
      Node* read_between = nullptr;
      if (t == "cache read between") {
        outputs.push_back(b.op("aten::mm", "", {au, cache}, tensor_type({sym("s0"), 16}), "mm"));
        read_between = outputs.back()->producer();
      }
      Node* write = nullptr;
      if (t == "cache" || t == "cache read between") {
        write = b.op("aten::index_copy_", "", {cache, b.integer(0), pos, src},
                     *cache->tensor_type(), "index_copy_")
                    ->producer();
      } else {
        Value* written = t == "u" ? u : b.op("aten::alias", "", {u}, *u->tensor_type(), "alias");
        write = b.op("aten::add_", "Tensor", {written, a, b.one()}, *u->tensor_type(), "add_")
                    ->producer();
      }
      outputs.push_back(b.unary("aten::exp", au, "exp"));
      g.set_outputs(outputs);
      SCOPED_TRACE(std::string(target) + (siblings ? ", siblings" : ", chain"));

      fuse_groups(g);
      ir::verify(g);
      const auto fusions = nodes_of_kind(g, NodeKind::kFusion);
      const bool apart = t != "cache";
      if (siblings) {
        // Apart: silu(a) * u and a * u merge before the write; exp stays an ATen call after it.
        ASSERT_EQ(fusions.size(), 1u);
        EXPECT_EQ(op_list(*fusions[0]->piece()),
                  apart ? "aten::silu aten::mul.Tensor aten::mul.Tensor"
                        : "aten::silu aten::mul.Tensor aten::mul.Tensor aten::exp");
      } else if (apart) {
        EXPECT_TRUE(fusions.empty());  // a * u and exp alone: single ops stay ATen calls
      } else {
        ASSERT_EQ(fusions.size(), 1u);
        EXPECT_EQ(op_list(*fusions[0]->piece()), "aten::mul.Tensor aten::exp");
      }
      EXPECT_EQ(op_list(g).find("aten::exp") != std::string::npos, apart);
      if (read_between != nullptr) {  // the old cache is read before the write, as traced
        const auto nodes = g.nodes();
        EXPECT_LT(std::find(nodes.begin(), nodes.end(), read_between),
                  std::find(nodes.begin(), nodes.end(), write));
      }
    }
  }
}

// A call writing the tensors of a list (Tensor(a!)[], as a custom op with a list in
// mutates_args is imported: a clone of each tensor, listed, then the call) is a write of each
// item: y = x * 3 and y + 1 read the clone it scales, so they stay apart (y + 1 reads the
// scaled clone after the call).
TEST(FuseGroups, AWriteThroughAListKeepsTheReadersOfItsItemsApart) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16});
  Value* y = b.op("aten::clone", "", {b.mul(x, b.number(3.0), "mul"), b.none()}, *x->tensor_type(),
                  "clone");
  Value* list = g.add_list(ValueKind::kTensorList, {y})->output();
  Node* scale = g.add_op(test::op("aten::_foreach_mul_", "Scalar"), {list, b.scalar(2.0)});
  Value* out = b.add(y, b.number(1.0), "add");
  g.set_outputs({out});

  fuse_groups(g);
  ir::verify(g);
  const auto nodes = g.nodes();
  // The add still runs after the write, reading the scaled clone.
  const Node* add = out->producer();
  EXPECT_LT(std::find(nodes.begin(), nodes.end(), scale),
            std::find(nodes.begin(), nodes.end(), add));
  for (const Node* f : nodes_of_kind(g, NodeKind::kFusion)) {
    EXPECT_EQ(op_list(*f->piece()).find("aten::add"), std::string::npos)
        << "y + 1 fused with the ops before the write: " << op_list(*f->piece());
  }
}

}  // namespace
}  // namespace magi::test
