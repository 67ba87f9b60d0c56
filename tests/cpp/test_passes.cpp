// Passes and the pipeline: eliminate_dead_code graph-in -> graph-out, how run_pipeline
// reports, disables and verifies passes, group_query_attention's rewrite, and simulate_peak's
// byte counts on hand-built graphs. write_inputs_in_place's are in test_write_inputs_in_place.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "magi/common/error.h"
#include "magi/ir/op_info.h"
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
using test::count_ops;
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
  // The names end with the lowering steps, which the Executable runs.
  ASSERT_EQ(names.back(), "plan_memory_arena");
  ASSERT_EQ(records.size() + 3, names.size());
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
  // Both passes that would change this graph (its constants repeat).
  options.disabled = {"eliminate_dead_code", "eliminate_common_subexpressions"};
  auto records = run_pipeline(g, options);
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.front().name, "eliminate_dead_code");
  EXPECT_FALSE(records.front().ran);
  EXPECT_FALSE(records.front().changed);
  EXPECT_EQ(g.num_nodes(), before);
}

TEST_F(DeadCodeTest, EnvironmentDisablesPassesToo) {
  size_t before = g.num_nodes();
  ASSERT_EQ(
      setenv("MAGI_DISABLE_PASSES", ",eliminate_dead_code,eliminate_common_subexpressions,", 1), 0);
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
  // tensors; fused into one group, x, exp and sin are alive together in the kernel. x dies
  // there, but a graph input is never written over (its Python object still refers to it).
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

// x @ w: a tensor the graph makes (matmuls are not fused), x and w kept by the caller.
Value* product(test::Builder& b) {
  Value* x = b.input("x", {kSide, kSide});
  Value* w = b.input("w", {kSide, kSide});
  return b.op("aten::mm", "", {x, w}, *x->tensor_type(), "mm");
}

TEST(SimulatePeak, APointwiseGroupWritesAnOutputOverAnInputThatDiesThere) {
  // exp(x @ w) and sin(exp(x @ w)), both returned: the product dies in the group, so exp is
  // written over it (the runtime's FusedKernel::reusable_input) and the kernel holds two
  // tensors, not three.
  Graph g;
  test::Builder b(g);
  Value* e = b.unary("aten::exp", product(b), "exp");
  g.set_outputs({e, b.unary("aten::sin", e, "sin")});
  ASSERT_TRUE(fuse_groups(g));
  ir::verify(g);
  const auto fusions = test::nodes_of_kind(g, ir::NodeKind::kFusion);
  ASSERT_EQ(fusions.size(), 1u);
  ASSERT_EQ(fusions[0]->outputs().size(), 2u);
  const ProgramPeak peak = simulate_peak(g, {}, {false, false});
  EXPECT_EQ(peak.bytes, 2 * kTensor);
  EXPECT_EQ(peak.node, index_of(g, fusions[0]->output(0)));
}

TEST(SimulatePeak, AGroupReadingAtAColumnShiftWritesOnlyNewTensors) {
  // exp(cat(-p[:, 512:], p[:, :512])) of p = x @ w (rotate_half's shape), p dying in the
  // group: a lane's store could land where another lane still reads, so the output is new
  // and the kernel holds two tensors.
  Graph g;
  test::Builder b(g);
  Value* p = product(b);
  Value* hi = b.unary("aten::neg", b.slice(p, kSide / 2, kSide, "slice_hi"), "neg");
  Value* lo = b.slice(p, 0, kSide / 2, "slice_lo");
  g.set_outputs({b.unary("aten::exp", b.cat_last({hi, lo}, "cat"), "exp")});
  ASSERT_TRUE(fuse_groups(g));
  ir::verify(g);
  ASSERT_EQ(test::nodes_of_kind(g, ir::NodeKind::kFusion).size(), 1u);
  EXPECT_EQ(simulate_peak(g, {}, {false, false}).bytes, 2 * kTensor);
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

// ---- group_query_attention ----------------------------------------------------------------

// Grouped-query attention as the capture records it: key and value heads repeated
// (repeat_interleave along dim 1) before an attention call of `attention` (an operator name).
struct GroupedAttention {
  Graph g;
  Value* k = nullptr;
  Value* v = nullptr;
  Node* attention = nullptr;

  // Besides the attention output, the graph returns: "lse" its logsumexp (a training forward
  // saves it), "k_rep" the repeated key.
  explicit GroupedAttention(const char* attention_op, int64_t unsqueeze_dim = 2,
                            const std::string& also_returns = "", double dropout = 0.0) {
    test::Builder b(g);
    const auto b_ = test::sym("s0");
    Value* q = b.input("q", {b_, 4, 8, 16}, test::kBF16);
    k = b.input("k", {b_, 2, 8, 16}, test::kBF16);
    v = b.input("v", {b_, 2, 8, 16}, test::kBF16);
    Value* k_rep = repeat(b, k, unsqueeze_dim, "k");
    Value* v_rep = repeat(b, v, unsqueeze_dim, "v");
    std::vector<Value*> args = {q, k_rep, v_rep};
    const std::string name = attention_op;
    if (name == "aten::_scaled_dot_product_flash_attention") {
      args.insert(args.end(), {b.floating(dropout), b.flag(true), b.flag(false), b.none()});
    } else {  // cudnn: attn_bias, compute_log_sumexp, dropout_p, is_causal, debug mask, scale
      args.insert(args.end(), {b.none(), b.flag(false), b.floating(dropout), b.flag(true),
                               b.flag(false), b.none()});
    }
    Value* out = b.op(attention_op, "", args, *q->tensor_type(), "attention");
    attention = out->producer();
    if (also_returns == "lse") {
      g.set_outputs({out, attention->output(1)});
    } else if (also_returns == "k_rep") {
      g.set_outputs({out, k_rep});
    } else {
      g.set_outputs({out});
    }
  }

  // view(clone(expand(unsqueeze(x, dim), [b, 2, 2, 8, 16])), [b, 4, 8, 16]) of x: [b, 2, 8, 16]
  // (of head dim `d`, x's dtype and device)
  static Value* repeat(test::Builder& b, Value* x, int64_t dim, const std::string& name,
                       int64_t d = 16) {
    const ir::SymExpr s0 = x->tensor_type()->sizes[0];
    const auto type = [&](std::vector<ir::SymExpr> sizes) {
      ir::TensorType t = test::tensor_type(std::move(sizes), x->tensor_type()->dtype);
      t.device = x->tensor_type()->device;
      return t;
    };
    Value* u = b.op("aten::unsqueeze", "", {x, b.integer(dim)}, type({s0, 2, 1, 8, d}),
                    name + "_unsqueeze");
    Value* e = b.op("aten::expand", "", {u, b.dims({-1, 2, 2, 8, d}), b.flag(false)},
                    type({s0, 2, 2, 8, d}), name + "_expand");
    Value* c = b.op("aten::clone", "", {e, b.none()}, type({s0, 2, 2, 8, d}), name + "_clone");
    return b.view(c, {s0, 4, 8, d}, name + "_rep");
  }
};

TEST(GroupQueryAttention, FlashAndCudnnReadTheUnrepeatedKeyAndValue) {
  for (const char* name :
       {"aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention"}) {
    GroupedAttention ga(name);
    ASSERT_EQ(count_ops(ga.g, "aten::clone"), 2u);
    EXPECT_TRUE(group_query_attention(ga.g)) << name;
    ir::verify(ga.g);
    EXPECT_EQ(ga.attention->input(1), ga.k) << name;
    EXPECT_EQ(ga.attention->input(2), ga.v) << name;
    // The copies, their views and the size lists they read are gone.
    for (const char* copy : {"aten::unsqueeze", "aten::expand", "aten::clone", "aten::view"}) {
      EXPECT_EQ(count_ops(ga.g, copy), 0u) << name << ": " << copy << " left";
    }
    for (const Node* node : ga.g.nodes()) {
      EXPECT_NE(node->kind(), ir::NodeKind::kMakeList) << name << ": a size list left";
    }
    EXPECT_FALSE(group_query_attention(ga.g)) << name << ": a second run changes nothing";
  }
}

TEST(GroupQueryAttention, CudnnWithAMaskReadsTheUnrepeatedHeadsToo) {
  {
    Graph g;
    test::Builder b(g);
    Value* q = b.input("q", {4, 4, 1, 16}, test::kBF16);
    Value* mask = b.input("mask", {4, 1, 1, 8}, test::kBF16);
    Value* k = GroupedAttention::repeat(b, b.input("k", {4, 2, 8, 16}, test::kBF16), 2, "k");
    Value* v = GroupedAttention::repeat(b, b.input("v", {4, 2, 8, 16}, test::kBF16), 2, "v");
    Value* out = b.op(
        "aten::_scaled_dot_product_cudnn_attention", "",
        {q, k, v, mask, b.flag(false), b.floating(0.0), b.flag(false), b.flag(false), b.none()},
        *q->tensor_type(), "attention");
    g.set_outputs({out});
    EXPECT_TRUE(group_query_attention(g));
    ir::verify(g);
    EXPECT_EQ(count_ops(g, "aten::clone"), 0u);
    EXPECT_EQ(out->producer()->input(3), mask);
  }
}

// Memory-efficient attention over repeated heads, as SDPA traces a masked call whose mask
// recognize_causal_masks replaced by is_causal: head dim `head_dim`, dtype `dtype`, on `device`.
struct EfficientAttention {
  Graph g;
  Value *k = nullptr, *v = nullptr, *out = nullptr;

  EfficientAttention(c10::Device device, c10::ScalarType dtype = test::kBF16, int64_t head_dim = 16,
                     bool bias = false, bool lse_read = false) {
    test::Builder b(g);
    const auto input = [&](const char* name, int64_t heads) {
      ir::TensorType t = test::tensor_type({4, heads, 8, head_dim}, dtype);
      t.device = device;
      return g.add_tensor_input(name, t);
    };
    Value* q = input("q", 4);
    k = input("k", 2);
    v = input("v", 2);
    Value* k_rep = GroupedAttention::repeat(b, k, 2, "k", head_dim);
    Value* v_rep = GroupedAttention::repeat(b, v, 2, "v", head_dim);
    Value* mask = bias ? input("mask", 4) : b.none();
    out = b.op("aten::_scaled_dot_product_efficient_attention", "",
               {q, k_rep, v_rep, mask, b.flag(lse_read), b.floating(0.0), b.flag(true), b.none()},
               *q->tensor_type(), "attention");
    if (lse_read) {
      g.set_outputs({out, out->producer()->output(1)});
    } else {
      g.set_outputs({out});
    }
  }
};

TEST(GroupQueryAttention, AnUnmaskedEfficientCallOnCudaRunsAsFlashOverGroupedHeads) {
  EfficientAttention ea(c10::Device(c10::kCUDA, 0));
  const ir::TensorType out_type = *ea.out->tensor_type();
  EXPECT_TRUE(group_query_attention(ea.g));
  ir::verify(ea.g);
  EXPECT_EQ(count_ops(ea.g, "aten::_scaled_dot_product_efficient_attention"), 0u);
  ASSERT_EQ(count_ops(ea.g, "aten::_scaled_dot_product_flash_attention"), 1u);
  const Value* result = ea.g.outputs()[0];
  const Node* flash = result->producer();
  EXPECT_EQ(flash->op_name(), "aten::_scaled_dot_product_flash_attention");
  EXPECT_EQ(flash->input(1), ea.k);
  EXPECT_EQ(flash->input(2), ea.v);
  EXPECT_EQ(ir::constant_input(*flash, 4)->toBool(), true) << "is_causal carried over";
  EXPECT_EQ(ir::constant_input(*flash, 5)->toBool(), false) << "no debug mask";
  EXPECT_TRUE(ir::constant_input(*flash, 6)->isNone()) << "the scale carried over";
  EXPECT_EQ(result->tensor_type()->sizes, out_type.sizes);
  EXPECT_EQ(result->tensor_type()->strides, out_type.strides);
  EXPECT_EQ(result->tensor_type()->device, out_type.device);
  EXPECT_EQ(count_ops(ea.g, "aten::clone"), 0u);
  EXPECT_FALSE(group_query_attention(ea.g)) << "a second run changes nothing";
}

TEST(GroupQueryAttention, LeavesEfficientCallsFlashCannotTake) {
  const auto untouched = [](const char* why, EfficientAttention&& ea) {
    EXPECT_FALSE(group_query_attention(ea.g)) << why;
    EXPECT_EQ(count_ops(ea.g, "aten::_scaled_dot_product_efficient_attention"), 1u) << why;
    EXPECT_EQ(count_ops(ea.g, "aten::clone"), 2u) << why;
  };
  const c10::Device cuda(c10::kCUDA, 0);
  untouched("on the CPU", EfficientAttention(c10::Device(c10::kCPU)));
  untouched("float32", EfficientAttention(cuda, test::kF32));
  untouched("head dim 20", EfficientAttention(cuda, test::kBF16, 20));
  untouched("head dim 512", EfficientAttention(cuda, test::kBF16, 512));
  untouched("a mask", EfficientAttention(cuda, test::kBF16, 16, /*bias=*/true));
  untouched("its logsumexp read",
            EfficientAttention(cuda, test::kBF16, 16, false, /*lse_read=*/true));
}

TEST(GroupQueryAttention, LeavesCallsItCannotRewrite) {
  // Memory-efficient attention takes no grouped heads.
  {
    Graph g;
    test::Builder b(g);
    Value* q = b.input("q", {4, 4, 8, 16}, test::kBF16);
    Value* k = GroupedAttention::repeat(b, b.input("k", {4, 2, 8, 16}, test::kBF16), 2, "k");
    Value* v = GroupedAttention::repeat(b, b.input("v", {4, 2, 8, 16}, test::kBF16), 2, "v");
    Value* out = b.op("aten::_scaled_dot_product_efficient_attention", "",
                      {q, k, v, b.none(), b.flag(false), b.floating(0.0), b.flag(true), b.none()},
                      *q->tensor_type(), "attention");
    g.set_outputs({out});
    EXPECT_FALSE(group_query_attention(g));
    EXPECT_EQ(count_ops(g, "aten::clone"), 2u);
  }
  // A training forward with dropout: its logsumexp and RNG state go to a backward that may
  // still read the repeated heads, whose random mask could differ.
  {
    GroupedAttention ga("aten::_scaled_dot_product_flash_attention", 2, "lse", 0.1);
    EXPECT_FALSE(group_query_attention(ga.g));
    EXPECT_NE(ga.attention->input(1), ga.k);
  }
  // A head dim added elsewhere than after the heads is not a repeat of each head.
  {
    GroupedAttention ga("aten::_scaled_dot_product_flash_attention", /*unsqueeze_dim=*/1);
    EXPECT_FALSE(group_query_attention(ga.g));
    EXPECT_EQ(count_ops(ga.g, "aten::clone"), 2u);
  }
}

TEST(GroupQueryAttention, ATrainingForwardWithoutDropoutReadsTheUnrepeatedHeads) {
  // Its output and logsumexp are the same with grouped heads, whichever heads the backward reads.
  for (const char* name :
       {"aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention"}) {
    GroupedAttention ga(name, 2, "lse");
    EXPECT_TRUE(group_query_attention(ga.g)) << name;
    ir::verify(ga.g);
    EXPECT_EQ(ga.attention->input(1), ga.k) << name;
    EXPECT_EQ(ga.attention->input(2), ga.v) << name;
    EXPECT_EQ(count_ops(ga.g, "aten::clone"), 0u) << name;
  }
}

TEST(GroupQueryAttention, ACopyReadElsewhereStays) {
  GroupedAttention ga("aten::_scaled_dot_product_flash_attention", 2, "k_rep");
  EXPECT_TRUE(group_query_attention(ga.g));
  ir::verify(ga.g);
  EXPECT_EQ(ga.attention->input(1), ga.k);
  EXPECT_EQ(count_ops(ga.g, "aten::clone"), 1u);  // the key's copy is an output; the value's went
}

// A training backward of grouped-query attention as the capture records it: flash's or cuDNN's
// backward reads the repeated key and value heads, and each of their gradients is summed over
// its group as _decompositions.py writes the expand's gradient (float32 adds of the selects),
// then transposed back to [b, s, hkv, d] and read by a multiply.
struct GroupedBackward {
  Graph g;
  Value* k = nullptr;
  Value* v = nullptr;
  Node* backward = nullptr;
  Value* key_sum = nullptr;
  Value* value_sum = nullptr;
  int64_t r = 0;

  struct Options {
    const char* op = "aten::_scaled_dot_product_cudnn_attention_backward";
    int64_t kv_heads = 2;  // of 4 query heads
    double dropout = 0.0;
    bool bias = false;               // cuDNN: an attention bias input
    bool key_grad_returned = false;  // the repeated heads' key gradient is also an output
    bool swapped_adds = false;       // the key's sum adds its terms in another order
    bool viewed_sum = false;         // the key's sum is read through aten::view
  };

  explicit GroupedBackward(const Options& o) {
    test::Builder b(g);
    const auto b_ = test::sym("s0");
    const int64_t hkv = o.kv_heads;
    r = 4 / hkv;
    Value* go = b.input("grad_out", {b_, 4, 8, 16}, test::kBF16);
    Value* q = b.input("q", {b_, 4, 8, 16}, test::kBF16);
    k = b.input("k", {b_, hkv, 8, 16}, test::kBF16);
    v = b.input("v", {b_, hkv, 8, 16}, test::kBF16);
    // k is the transpose of a contiguous [b, 8, hkv, 16] projection, as in a Llama block.
    ir::TensorType kt = *k->tensor_type();
    kt.strides = {ir::SymExpr(8 * hkv * 16), ir::SymExpr(16), ir::SymExpr(hkv * 16),
                  ir::SymExpr(1)};
    k->set_tensor_type(kt);
    Value* out = b.input("out", {b_, 4, 8, 16}, test::kBF16);
    Value* lse = b.input("lse", {b_, 4, 8, 1});
    Value* seed = b.input("seed", {}, c10::ScalarType::Long);
    Value* offset = b.input("offset", {}, c10::ScalarType::Long);
    Value* k_rep = test::repeat_heads(b, k, r, "k");
    Value* v_rep = test::repeat_heads(b, v, r, "v");
    const std::string name = o.op;
    // AOTAutograd passes None to the Tensor parameters it leaves unset; the importer makes them
    // undefined tensors.
    const auto unset = [&] {
      return g.add_constant(c10::IValue(at::Tensor()), ValueKind::kTensor);
    };
    std::vector<Value*> args = {go, q, k_rep, v_rep, out, lse};
    if (name == "aten::_scaled_dot_product_flash_attention_backward") {
      args.insert(args.end(), {unset(), unset(), b.integer(8), b.integer(8), b.floating(o.dropout),
                               b.flag(true), seed, offset, b.none()});
    } else {
      Value* bias = o.bias ? b.input("bias", {b_, 1, 8, 8}, test::kBF16) : unset();
      args.insert(args.end(), {seed, offset, bias, unset(), unset(), b.integer(8), b.integer(8),
                               b.floating(o.dropout), b.flag(true), b.none()});
    }
    Value* dq = b.op(o.op, "", args, *q->tensor_type(), "backward");
    backward = dq->producer();
    for (size_t j = 1; j < 3; ++j) backward->output(j)->set_tensor_type(*q->tensor_type());
    key_sum = test::sum_head_groups(b, backward->output(1), hkv, "dk", o.swapped_adds);
    value_sum = test::sum_head_groups(b, backward->output(2), hkv, "dv");
    Value* dk = o.viewed_sum ? b.view(key_sum, {b_, hkv * 8 * 16}, "dk_flat")
                             : transposed(b, key_sum, "dk");
    std::vector<Value*> outputs = {dq, dk, transposed(b, value_sum, "dv")};
    if (o.key_grad_returned) outputs.push_back(backward->output(1));
    g.set_outputs(outputs);
  }

  static Value* transposed(test::Builder& b, Value* x, const std::string& name) {
    const auto& s = x->tensor_type()->sizes;
    Value* t = b.op("aten::transpose", "int", {x, b.integer(1), b.integer(2)},
                    test::tensor_type({s[0], s[2], s[1], s[3]}, test::kBF16), name + "_t");
    return b.mul(t, t, name + "_sq");
  }
};

TEST(GroupQueryAttention, BackwardsReadTheUnrepeatedHeadsAndReturnGroupedGradients) {
  for (const char* name : {"aten::_scaled_dot_product_cudnn_attention_backward",
                           "aten::_scaled_dot_product_flash_attention_backward"}) {
    for (int64_t kv_heads : {2, 1}) {
      GroupedBackward::Options o;
      o.op = name;
      o.kv_heads = kv_heads;
      GroupedBackward gb(o);
      const std::vector<Node*> key_readers = gb.key_sum->users();
      const std::vector<Node*> value_readers = gb.value_sum->users();
      ASSERT_EQ(count_ops(gb.g, "aten::add.Tensor"), size_t(2 * (gb.r - 1)));
      EXPECT_TRUE(group_query_attention(gb.g)) << name << " " << kv_heads;
      ir::verify(gb.g);
      EXPECT_EQ(gb.backward->input(2), gb.k) << name;
      EXPECT_EQ(gb.backward->input(3), gb.v) << name;
      // The gradients have the key's and value's sizes and layout, and the sums' readers read
      // them; the repeats, the sums and their views are gone.
      for (size_t j = 1; j < 3; ++j) {
        const ir::TensorType& t = *gb.backward->output(j)->tensor_type();
        const ir::TensorType& src = *(j == 1 ? gb.k : gb.v)->tensor_type();
        EXPECT_EQ(t.sizes, src.sizes) << name;
        EXPECT_EQ(t.strides, src.strides) << name;
        EXPECT_EQ(t.dtype, c10::ScalarType::BFloat16);
      }
      EXPECT_EQ(key_readers.front()->input(0), gb.backward->output(1)) << name;
      EXPECT_EQ(value_readers.front()->input(0), gb.backward->output(2)) << name;
      for (const char* gone :
           {"aten::clone", "aten::expand", "aten::select.int", "aten::add.Tensor", "aten::_to_copy",
            "aten::view", "aten::unsqueeze"}) {
        EXPECT_EQ(count_ops(gb.g, gone), 0u) << name << ": " << gone << " left";
      }
      EXPECT_FALSE(group_query_attention(gb.g)) << name << ": a second run changes nothing";
    }
  }
}

TEST(GroupQueryAttention, LeavesBackwardsItCannotRewrite) {
  const auto unchanged = [](const GroupedBackward::Options& o, const char* why) {
    GroupedBackward gb(o);
    const size_t nodes = gb.g.num_nodes();
    EXPECT_FALSE(group_query_attention(gb.g)) << why;
    EXPECT_NE(gb.backward->input(2), gb.k) << why;
    EXPECT_EQ(gb.g.num_nodes(), nodes) << why;
    ir::verify(gb.g);
  };
  GroupedBackward::Options o;
  o.dropout = 0.1;
  unchanged(o, "dropout: the random mask of grouped heads could differ");
  o = {};
  o.bias = true;
  unchanged(o, "cuDNN's backward with an attention bias was not probed with grouped heads");
  o = {};
  o.key_grad_returned = true;
  unchanged(o, "the repeated heads' gradient is read besides the sum");
  o = {};
  o.swapped_adds = true;
  unchanged(o, "not the sum _decompositions.py writes");
  o = {};
  o.viewed_sum = true;
  unchanged(o, "a view of the sum needs its contiguous layout");
}

}  // namespace
}  // namespace magi::passes
