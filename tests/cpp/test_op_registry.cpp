// The operator flag registry: name spellings, overload precedence, compute-sensitivity defaults
// for ATen operators, per-node queries, and concurrent use.
#include "magi/ir/op_registry.h"

#include <gtest/gtest.h>

#include <thread>

#include "magi/common/error.h"
#include "magi/ir/graph.h"
#include "test_helpers.h"

namespace magi::ir {
namespace {

using test::contains;
using test::message_of;
using test::op;
using test::tensor_type;

TEST(OpRegistry, CanonicalNamesAcceptCppAndPythonSpellings) {
  EXPECT_EQ(canonical_op_name("athena::flash_attn"), "athena::flash_attn");
  EXPECT_EQ(canonical_op_name("athena::flash_attn.default"), "athena::flash_attn");
  EXPECT_EQ(canonical_op_name("athena.flash_attn"), "athena::flash_attn");
  EXPECT_EQ(canonical_op_name("athena.flash_attn.default"), "athena::flash_attn");
  EXPECT_EQ(canonical_op_name("torch.ops.aten.add.Tensor"), "aten::add.Tensor");
  EXPECT_EQ(canonical_op_name("aten::add.Tensor"), "aten::add.Tensor");
  for (const char* bad : {"flash_attn", "", "::x", "ns::", "a.b.c.d", "ns::op.a.b"}) {
    EXPECT_TRUE(contains(message_of<UserError>([&] { canonical_op_name(bad); }),
                         "is not of the form 'namespace::name'"))
        << bad;
  }
}

TEST(OpRegistry, RecordsReplacesAndForgetsFlags) {
  OpRegistry registry;
  EXPECT_FALSE(registry.registered("t::op").has_value());
  registry.set_flags("t.op.default", {true, false});
  ASSERT_TRUE(registry.registered("t::op").has_value());
  EXPECT_EQ(*registry.registered("t::op"), (OpFlags{true, false}));
  registry.set_flags("t::op", {false, true});
  EXPECT_EQ(*registry.registered("t::op"), (OpFlags{false, true}));
  EXPECT_EQ(registry.entries().size(), 1u);
  EXPECT_TRUE(registry.erase("t::op"));
  EXPECT_FALSE(registry.erase("t::op"));
  EXPECT_TRUE(registry.entries().empty());
}

TEST(OpRegistry, AnOverloadEntryWinsOverTheNameEntry) {
  OpRegistry registry;
  registry.set_flags("t::op", {false, true});
  registry.set_flags("t::op.out", {true, false});
  EXPECT_EQ(*registry.lookup("t::op", ""), (OpFlags{false, true}));
  EXPECT_EQ(*registry.lookup("t::op", "Tensor"), (OpFlags{false, true}));
  EXPECT_EQ(*registry.lookup("t::op", "out"), (OpFlags{true, false}));
  EXPECT_FALSE(registry.lookup("t::other", "").has_value());
  auto entries = registry.entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].first, "t::op");  // sorted
  EXPECT_EQ(entries[1].first, "t::op.out");
}

TEST(OpRegistry, AtenDefaultsCoverMatmulConvolutionAndAttention) {
  for (const char* name :
       {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul", "aten::linear",
        "aten::convolution", "aten::convolution_backward", "aten::_convolution", "aten::conv2d",
        "aten::cudnn_convolution", "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_cudnn_attention_backward", "aten::_flash_attention_forward",
        "aten::_efficient_attention_backward", "aten::_cudnn_attention_forward"}) {
    EXPECT_TRUE(is_default_compute_sensitive(name)) << name;
  }
  for (const char* name : {"aten::add", "aten::relu", "aten::_softmax", "aten::mul", "aten::mean",
                           "aten::conj", "athena::mm", "mm"}) {
    EXPECT_FALSE(is_default_compute_sensitive(name)) << name;
  }
}

TEST(OpRegistry, PerNodeQueriesUseFlagsThenDefaults) {
  Graph g;
  Value* x = g.add_tensor_input("x", tensor_type({4, 4}));
  Node* mm = g.add_op(op("aten::mm"), {x, x});
  Node* relu = g.add_op(op("aten::relu"), {mm->output()});
  Node* add = g.add_op(op("aten::add", "Tensor"),
                       {relu->output(), x, g.add_constant(1, ValueKind::kScalar)});
  Node* size = g.add_sym(SymOp::kNumel, {x});
  g.set_outputs({add->output(), size->output()});

  OpRegistry registry;
  EXPECT_TRUE(is_compute_sensitive(*mm, registry));
  EXPECT_FALSE(is_compute_sensitive(*relu, registry));
  EXPECT_FALSE(is_compute_sensitive(*size, registry));
  EXPECT_FALSE(is_subgraph_boundary(*mm, registry));

  registry.set_flags("aten::relu", {true, true});        // a registered flag counts...
  registry.set_flags("aten::mm", {false, false});        // ...and overrides the default
  registry.set_flags("aten::add.Scalar", {true, true});  // another overload: no effect
  EXPECT_TRUE(is_compute_sensitive(*relu, registry));
  EXPECT_TRUE(is_subgraph_boundary(*relu, registry));
  EXPECT_FALSE(is_compute_sensitive(*mm, registry));
  EXPECT_FALSE(is_compute_sensitive(*add, registry));
  EXPECT_FALSE(is_subgraph_boundary(*add, registry));
  registry.set_flags("aten::add.Tensor", {false, true});
  EXPECT_TRUE(is_subgraph_boundary(*add, registry));
}

TEST(OpRegistry, GlobalRegistryIsSafeToUseFromSeveralThreads) {
  OpRegistry& registry = OpRegistry::global();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&registry, t] {
      for (int i = 0; i < 200; ++i) {
        std::string name = "magi_registry_test::op" + std::to_string(t) + "_" + std::to_string(i);
        registry.set_flags(name, {i % 2 == 0, true});
        EXPECT_TRUE(registry.lookup(name, "").has_value());
        registry.entries();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 200; ++i) {
      std::string name = "magi_registry_test::op" + std::to_string(t) + "_" + std::to_string(i);
      ASSERT_EQ(registry.registered(name)->compute_sensitive, i % 2 == 0);
      registry.erase(name);
    }
  }
}

}  // namespace
}  // namespace magi::ir
