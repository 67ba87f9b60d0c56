// write_inputs_in_place on hand-built graphs: a functional update of a graph input written back
// by aten::copy_ (a static KV cache's index_copy_, index_put_, scatter_) becomes the in-place
// update, each condition that keeps the copy, and the pass in the pipeline.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

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
using ir::Value;
using ir::ValueKind;
using test::count_ops;

// A static KV cache's update as the inference capture records it: `updated` =
// `update`(cache, ...) of the graph input cache: [1, 4, 16, 8], read by a multiply the graph
// returns, and the write-back aten::copy_(cache, updated) last, its result unused. Each option
// after the dtype breaks one condition of the rewrite.
struct CacheUpdate {
  Graph g;
  Value* cache = nullptr;  // the buffer the update reads: the graph input unless buffer_computed
  Node* update = nullptr;
  Node* reader = nullptr;

  struct Options {
    const char* update = "aten::index_copy";  // or "aten::index_put", "aten::scatter.src"
    c10::ScalarType dtype = test::kF32;
    bool cache_read_elsewhere = false;  // aten::sum of the cache's old values is returned too
    bool source_is_cache = false;       // scatter.src only: the cache is also its source
    bool result_returned = false;       // the update's result is also a graph output
    bool view_returned = false;         // a view of the update's result is a graph output
    bool item_returned = false;         // an item of split(result) (a list of views) is one
    bool write_back = true;             // false: no aten::copy_ at all
    bool write_back_used = false;       // the copy_'s result is a graph output
    bool buffer_computed = false;       // the update's buffer is a multiply of the input, not it
  };

  explicit CacheUpdate(const Options& o) {
    test::Builder b(g);
    const ir::TensorType cache_type = test::tensor_type({1, 4, 16, 8}, o.dtype);
    cache = b.input("cache", {1, 4, 16, 8}, o.dtype);
    Value* k = b.input("k", {1, 4, 3, 8}, o.dtype);
    Value* old_sum = nullptr;
    if (o.cache_read_elsewhere) {
      old_sum = b.op("aten::sum", "", {cache, b.none()}, test::tensor_type({}, o.dtype), "old_sum");
    }
    if (o.buffer_computed) cache = b.mul(cache, cache, "scaled");
    const std::string name = o.update;
    Value* updated = nullptr;
    if (name == "aten::index_copy") {  // cache.index_copy(2, pos, k)
      Value* pos = b.input("pos", {3}, c10::ScalarType::Long);
      updated = b.op("aten::index_copy", "", {cache, b.integer(2), pos, k}, cache_type, "updated");
    } else if (name == "aten::index_put") {  // cache[:, :, pos] = k
      Value* pos = b.input("pos", {3}, c10::ScalarType::Long);
      Value* indices =
          g.add_list(ValueKind::kOptionalTensorList, {b.none(), b.none(), pos})->output();
      updated =
          b.op("aten::index_put", "", {cache, indices, k, b.flag(false)}, cache_type, "updated");
    } else {  // cache.scatter(2, index, k)
      Value* index = b.input("index", {1, 4, 3, 8}, c10::ScalarType::Long);
      updated =
          b.op("aten::scatter", "src", {cache, b.integer(2), index, o.source_is_cache ? cache : k},
               cache_type, "updated");
    }
    update = updated->producer();
    Value* y = b.mul(updated, updated, "y");
    reader = y->producer();
    std::vector<Value*> outputs = {y};
    if (old_sum != nullptr) outputs.push_back(old_sum);
    if (o.result_returned) outputs.push_back(updated);
    if (o.view_returned) outputs.push_back(b.op("aten::alias", "", {updated}, cache_type, "view"));
    if (o.item_returned) {
      Node* split =
          g.add_op(test::op("aten::split", "Tensor"), {updated, b.integer(2), b.integer(0)});
      outputs.push_back(g.add_getitem(split->output(), 0)->output());
    }
    if (o.write_back) {
      Value* copied = b.op("aten::copy_", "", {cache, updated, b.flag(false)}, cache_type, "copy_");
      if (o.write_back_used) outputs.push_back(copied);
    }
    g.set_outputs(outputs);
    ir::verify(g);
  }
};

TEST(WriteInputsInPlace, AnIndexCopyWrittenBackWritesTheInput) {
  for (c10::ScalarType dtype : {test::kF32, test::kBF16}) {
    CacheUpdate::Options o;
    o.dtype = dtype;
    CacheUpdate cu(o);
    EXPECT_TRUE(write_inputs_in_place(cu.g)) << dtype;
    ir::verify(cu.g);
    EXPECT_EQ(count_ops(cu.g, "aten::index_copy"), 0u) << dtype;
    EXPECT_EQ(count_ops(cu.g, "aten::copy_"), 0u) << dtype;
    ASSERT_EQ(count_ops(cu.g, "aten::index_copy_"), 1u) << dtype;
    const Node* in_place = cu.reader->input(0)->producer();
    EXPECT_EQ(in_place->op_name(), "aten::index_copy_") << dtype;
    EXPECT_EQ(in_place->input(0), cu.cache) << dtype;
    EXPECT_EQ(cu.reader->input(1), in_place->output()) << dtype;
    EXPECT_EQ(in_place->output()->name(), "updated") << dtype;
    EXPECT_EQ(in_place->output()->tensor_type()->dtype, dtype);
    EXPECT_EQ(cu.g.outputs(), std::vector<Value*>{cu.reader->output()}) << dtype;
    EXPECT_FALSE(write_inputs_in_place(cu.g)) << dtype << ": a second run changes nothing";
  }
}

TEST(WriteInputsInPlace, IndexPutAndScatterWriteTheInputToo) {
  for (const auto& [functional, in_place] :
       {std::pair<const char*, const char*>{"aten::index_put", "aten::index_put_"},
        {"aten::scatter.src", "aten::scatter_.src"}}) {
    CacheUpdate::Options o;
    o.update = functional;
    o.dtype = test::kBF16;
    CacheUpdate cu(o);
    const std::vector<Value*> arguments = cu.update->inputs();
    EXPECT_TRUE(write_inputs_in_place(cu.g)) << functional;
    ir::verify(cu.g);
    EXPECT_EQ(count_ops(cu.g, functional), 0u) << functional;
    EXPECT_EQ(count_ops(cu.g, "aten::copy_"), 0u) << functional;
    ASSERT_EQ(count_ops(cu.g, in_place), 1u) << functional;
    const Node* update = cu.reader->input(0)->producer();
    EXPECT_EQ(update->op_name(), in_place);
    EXPECT_EQ(update->inputs(), arguments) << functional << ": the same arguments";
    EXPECT_EQ(cu.reader->input(1), update->output()) << functional;
    EXPECT_FALSE(write_inputs_in_place(cu.g)) << functional;
  }
}

TEST(WriteInputsInPlace, LeavesUpdatesItCannotRewrite) {
  const auto unchanged = [](const CacheUpdate::Options& o, const char* why) {
    CacheUpdate cu(o);
    const size_t nodes = cu.g.num_nodes();
    const std::string before = ir::to_string(cu.g);
    EXPECT_FALSE(write_inputs_in_place(cu.g)) << why;
    ir::verify(cu.g);
    EXPECT_EQ(cu.g.num_nodes(), nodes) << why;
    EXPECT_EQ(ir::to_string(cu.g), before) << why;
    EXPECT_EQ(count_ops(cu.g, "aten::index_copy"), 1u) << why;
    EXPECT_EQ(count_ops(cu.g, "aten::index_copy_"), 0u) << why;
    EXPECT_EQ(count_ops(cu.g, "aten::copy_"), o.write_back ? 1u : 0u) << why;
    EXPECT_EQ(cu.reader->input(0), cu.update->output()) << why;
  };
  CacheUpdate::Options o;
  o.cache_read_elsewhere = true;
  unchanged(o, "the cache's old values are read besides the update");
  o = {};
  o.result_returned = true;
  unchanged(o, "the update's result is a graph output");
  o = {};
  o.view_returned = true;
  unchanged(o, "a view of the update's result is a graph output");
  o = {};
  o.item_returned = true;
  unchanged(o, "an item of a split of the update's result is a graph output");
  o = {};
  o.write_back = false;
  unchanged(o, "the update is not written back");
  o = {};
  o.write_back_used = true;
  unchanged(o, "the write-back's result is read");
  o = {};
  o.buffer_computed = true;
  unchanged(o, "the updated buffer is an intermediate, not a graph input");
}

TEST(WriteInputsInPlace, LeavesGraphsCutIntoPieces) {
  // A boundary call (here the reader, named in splitting_ops) cuts the graph into pieces that
  // layers share: the write-back stays (see the pass's file comment).
  CacheUpdate cu(CacheUpdate::Options{});
  EXPECT_FALSE(write_inputs_in_place(cu.g, {"aten::mul"}));
  EXPECT_EQ(count_ops(cu.g, "aten::index_copy"), 1u);
  EXPECT_EQ(count_ops(cu.g, "aten::copy_"), 1u);
  EXPECT_TRUE(write_inputs_in_place(cu.g, {"aten::add"}));  // no call of it: rewritten
}

TEST(WriteInputsInPlace, LeavesAScatterOfTheCacheIntoItself) {
  // The update's source would read values the in-place form has already overwritten.
  CacheUpdate::Options o;
  o.update = "aten::scatter.src";
  o.source_is_cache = true;
  CacheUpdate cu(o);
  EXPECT_FALSE(write_inputs_in_place(cu.g));
  EXPECT_EQ(count_ops(cu.g, "aten::scatter.src"), 1u);
  EXPECT_EQ(count_ops(cu.g, "aten::copy_"), 1u);
}

TEST(WriteInputsInPlace, RunsInThePipelineAndCanBeDisabled) {
  const auto record_of = [](const std::vector<PassRecord>& records) {
    auto it = std::find_if(records.begin(), records.end(),
                           [](const PassRecord& r) { return r.name == "write_inputs_in_place"; });
    EXPECT_NE(it, records.end());
    return it == records.end() ? PassRecord{} : *it;
  };
  // The graph as the pass left it (later passes may move its nodes into pieces).
  const auto after_pass = [](std::string& ops) {
    return [&ops](const std::string& pass, const Graph& g) {
      if (pass == "write_inputs_in_place") ops = test::op_list(g);
    };
  };
  {
    CacheUpdate cu({});
    std::string ops;
    PipelineOptions options;
    options.after_pass = after_pass(ops);
    const PassRecord record = record_of(run_pipeline(cu.g, options));
    EXPECT_TRUE(record.ran);
    EXPECT_TRUE(record.changed);
    EXPECT_EQ(ops, "aten::index_copy_ aten::mul.Tensor");
    EXPECT_EQ(count_ops(cu.g, "aten::copy_"), 0u);
  }
  {
    CacheUpdate cu({});
    PipelineOptions options;
    options.disabled = {"write_inputs_in_place"};
    options.after_pass = [](const std::string& pass, const Graph&) {
      EXPECT_NE(pass, "write_inputs_in_place");
    };
    const PassRecord record = record_of(run_pipeline(cu.g, options));
    EXPECT_FALSE(record.ran);
    EXPECT_FALSE(record.changed);
    EXPECT_EQ(count_ops(cu.g, "aten::copy_"), 1u);
    EXPECT_EQ(count_ops(cu.g, "aten::index_copy"), 1u);
  }
  {
    CacheUpdate cu({});
    ASSERT_EQ(setenv("MAGI_DISABLE_PASSES", "write_inputs_in_place", 1), 0);
    const PassRecord record = record_of(run_pipeline(cu.g));
    unsetenv("MAGI_DISABLE_PASSES");
    EXPECT_FALSE(record.ran);
    EXPECT_EQ(count_ops(cu.g, "aten::copy_"), 1u);
  }
}

}  // namespace
}  // namespace magi::passes
