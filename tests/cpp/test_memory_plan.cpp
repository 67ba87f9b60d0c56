// The memory arena: best-fit layout of blocks by liveness, their grouping into allocations
// within the run's peak, and executor runs that place intermediates while outputs stay the
// caller's.
#include "magi/runtime/memory_plan.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <random>

#include "magi/common/error.h"
#include "magi/runtime/executor.h"
#include "test_helpers.h"

namespace magi::runtime {
namespace {

using test::op;
using test::sym;

// Two blocks whose spans overlap never share a byte; the arena covers every block.
void expect_valid(const std::vector<ArenaBlock>& blocks, const ArenaLayout& layout) {
  ASSERT_EQ(layout.offsets.size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].bytes == 0) {
      EXPECT_EQ(layout.offsets[i], -1);
      continue;
    }
    EXPECT_GE(layout.offsets[i], 0);
    EXPECT_EQ(layout.offsets[i] % 256, 0);
    EXPECT_LE(layout.offsets[i] + blocks[i].bytes, layout.bytes);
    for (size_t j = 0; j < i; ++j) {
      if (blocks[j].bytes == 0 || blocks[i].reuses == static_cast<int32_t>(j) ||
          blocks[j].reuses == static_cast<int32_t>(i)) {
        continue;
      }
      const bool in_time = blocks[i].first <= blocks[j].last && blocks[j].first <= blocks[i].last;
      const bool in_memory = layout.offsets[i] < layout.offsets[j] + blocks[j].bytes &&
                             layout.offsets[j] < layout.offsets[i] + blocks[i].bytes;
      EXPECT_FALSE(in_time && in_memory) << "blocks " << j << " and " << i << " collide";
    }
  }
  EXPECT_GE(layout.bytes, layout.peak_live);
}

TEST(PlanArena, BlocksLiveAtDifferentTimesShareMemory) {
  // a [0, 1], b [1, 2], c [3, 4]: a and b overlap at step 1; c reuses a's place.
  std::vector<ArenaBlock> blocks = {{1024, 0, 1}, {512, 1, 2}, {1024, 3, 4}};
  ArenaLayout layout = plan_arena(blocks);
  expect_valid(blocks, layout);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 1024, 0}));
  EXPECT_EQ(layout.bytes, 1536);
  EXPECT_EQ(layout.peak_live, 1536);
}

TEST(PlanArena, PicksTheSmallestGapThatFits) {
  // Placed largest first, each into the smallest gap among the blocks it overlaps in time.
  std::vector<ArenaBlock> blocks = {
      {8192, 0, 9},  // at 0
      {2048, 0, 4},  // above it: 8192 .. 10240, free from step 5
      {1024, 0, 9},  // 10240 .. 11264
      {512, 0, 4},   // 11264 .. 11776, free from step 5
      {512, 0, 9},   // 11776 .. 12288
      {400, 5, 6},   // gaps over steps 5-6: 2048 bytes at 8192, 512 at 11264: the smaller
  };
  ArenaLayout layout = plan_arena(blocks);
  expect_valid(blocks, layout);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 8192, 10240, 11264, 11776, 11264}));
  EXPECT_EQ(layout.bytes, 12288);
}

TEST(PlanArena, AReusingBlockTakesTheOffsetOfTheOneItOverwrites) {
  // gate [0, 2] and up [1, 2] die at the product [2, 4], which is written over gate.
  std::vector<ArenaBlock> blocks = {
      {4096, 0, 2}, {4096, 1, 2}, {4096, 2, 4, /*reuses=*/0}, {512, 3, 4}};
  ArenaLayout layout = plan_arena(blocks);
  expect_valid(blocks, layout);
  EXPECT_EQ(layout.offsets[2], layout.offsets[0]);
  EXPECT_EQ(layout.bytes, 8192);      // two wide blocks, not three
  EXPECT_EQ(layout.peak_live, 8192);  // gate+up at step 1-2; product + 512 later
}

TEST(PlanArena, EmptyBlocksAreNotPlaced) {
  std::vector<ArenaBlock> blocks = {{0, 0, 3}, {100, 1, 2}};
  ArenaLayout layout = plan_arena(blocks);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{-1, 0}));
  EXPECT_EQ(layout.bytes, 256);  // aligned
}

TEST(PlanArena, RandomSpansNeverCollide) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ArenaBlock> blocks;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const size_t first = rng() % 30;
      blocks.push_back({static_cast<int64_t>(rng() % 5000), first, first + rng() % 10});
    }
    ArenaLayout layout = plan_arena(blocks);
    expect_valid(blocks, layout);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(PlanArena, ABlockCannotTakeOverOneStillLive) {
  std::vector<ArenaBlock> blocks = {{1024, 0, 5}, {1024, 2, 6, /*reuses=*/0}};
  EXPECT_THROW(plan_arena(blocks), InternalError);
}

TEST(PlanSegments, SharesAnAllocationOnlyWhereThePeakHolds) {
  // a, b, c: a chain of products, each live over two steps; the result (another tensor) from
  // step 3 on. The peak is two products at once. A segment of a and b would hold both until
  // step 2, beside c; a and c take turns in one, and b is left to the allocator.
  std::vector<ArenaBlock> blocks = {{256, 0, 1}, {256, 1, 2}, {256, 2, 3}};
  std::vector<int64_t> others = {0, 0, 0, 256};
  SegmentedLayout layout = plan_segments(blocks, others);
  EXPECT_EQ(layout.budget, 512);
  EXPECT_EQ(layout.segment, (std::vector<int32_t>{0, -1, 0}));
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, -1, 0}));
  EXPECT_EQ(layout.segment_bytes, (std::vector<int64_t>{256}));
  EXPECT_EQ(layout.segment_last, (std::vector<size_t>{3}));
}

TEST(PlanSegments, AUnitWrittenOverItsInputStaysTogether) {
  // gate and up die at the product, written over gate; a small block follows. gate and the
  // product share one place; up with them would hold a second wide block beside the small
  // one, above the peak, so up and the small block take turns in a segment of their own.
  std::vector<ArenaBlock> blocks = {
      {4096, 0, 2}, {4096, 1, 2}, {4096, 2, 4, /*reuses=*/0}, {512, 3, 4}};
  SegmentedLayout layout = plan_segments(blocks, std::vector<int64_t>(5, 0));
  EXPECT_EQ(layout.budget, 8192);
  EXPECT_EQ(layout.segment, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(layout.segment_bytes, (std::vector<int64_t>{4096, 4096}));
}

TEST(PlanSegments, RandomRunsNeverExceedTheBudget) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t steps = 5 + rng() % 40;
    std::vector<ArenaBlock> blocks;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {
      const size_t first = rng() % steps;
      const size_t last = std::min(steps - 1, first + rng() % 8);
      blocks.push_back({256 * static_cast<int64_t>(1 + rng() % 16), first, last});
    }
    std::vector<int64_t> others(steps);
    for (int64_t& o : others) o = 256 * static_cast<int64_t>(rng() % 8);
    SegmentedLayout layout = plan_segments(blocks, others);
    // At every step: the segments reserved, the blocks left out and the other tensors.
    std::vector<int64_t> memory = others;
    std::vector<size_t> seg_first(layout.segment_bytes.size(), steps);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const int32_t seg = layout.segment[i];
      if (seg < 0) {
        for (size_t t = blocks[i].first; t <= blocks[i].last; ++t) memory[t] += blocks[i].bytes;
      } else {
        seg_first[seg] = std::min(seg_first[seg], blocks[i].first);
      }
    }
    for (size_t k = 0; k < seg_first.size(); ++k) {
      for (size_t t = seg_first[k]; t <= layout.segment_last[k]; ++t) {
        memory[t] += layout.segment_bytes[k];
      }
    }
    for (size_t t = 0; t < steps; ++t) ASSERT_LE(memory[t], layout.budget) << "step " << t;
    // Within a segment, blocks live at once never share a byte.
    for (size_t i = 0; i < blocks.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (layout.segment[i] < 0 || layout.segment[i] != layout.segment[j]) continue;
        const bool in_time = blocks[i].first <= blocks[j].last && blocks[j].first <= blocks[i].last;
        const bool in_memory = layout.offsets[i] < layout.offsets[j] + blocks[j].bytes &&
                               layout.offsets[j] < layout.offsets[i] + blocks[i].bytes;
        ASSERT_FALSE(in_time && in_memory) << "blocks " << j << " and " << i;
      }
    }
  }
}

ir::TensorType dense(std::vector<ir::SymExpr> sizes) {
  ir::TensorType t = test::tensor_type(std::move(sizes));
  t.strides = ir::TensorType::contiguous_strides(t.sizes);
  return t;
}

// x: f32[s0, 8], w: f32[8, 8]: a = x @ w, b = a @ w, c = b @ w, out = relu(c).
// Each product lives over two steps; a and c never overlap.
void build_three_products(ir::Graph& g) {
  ir::Value* x = g.add_tensor_input("x", dense({sym("s0"), 8}));
  ir::Value* w = g.add_tensor_input("w", dense({8, 8}));
  ir::Value* v = x;
  for (int i = 0; i < 3; ++i) {
    v = g.add_op(op("aten::mm"), {v, w})->output();
    v->set_tensor_type(dense({sym("s0"), 8}));
  }
  ir::Value* relu = g.add_op(op("aten::relu"), {v})->output();
  relu->set_tensor_type(dense({sym("s0"), 8}));
  g.set_outputs({relu});
}

TEST(MemoryArena, SharesABlockWhereThatKeepsThePeak) {
  // The run's peak is two products (or a product and the result) at once. A block for a and b
  // would hold two products until b dies, beside c: above it. a and c take turns in one
  // block; b, alone in none, is the allocator's.
  ir::Graph g;
  build_three_products(g);
  Executable exe(g);
  EXPECT_EQ(exe.arena_stats().planned_values, 3u);
  for (int64_t s0 : {5, 9, 5}) {
    at::Tensor x = at::randn({s0, 8}), w = at::randn({8, 8});
    std::vector<c10::IValue> out = exe.run({x, w});
    EXPECT_TRUE(at::allclose(out[0].toTensor(), at::relu(at::mm(at::mm(at::mm(x, w), w), w))));
    const int64_t block = (s0 * 8 * 4 + 255) / 256 * 256;
    EXPECT_EQ(exe.arena_stats().last_bytes, block) << "s0 = " << s0;
  }
  EXPECT_EQ(exe.arena_stats().runs, 3u);
}

// x: f32[s0, 8], w: f32[8, 8]: a = x @ w; b = a @ w; out = relu(b + a), (b @ w).view(-1).
void build_two_products(ir::Graph& g) {
  ir::Value* x = g.add_tensor_input("x", dense({sym("s0"), 8}));
  ir::Value* w = g.add_tensor_input("w", dense({8, 8}));
  ir::Value* a = g.add_op(op("aten::mm"), {x, w})->output();
  a->set_tensor_type(dense({sym("s0"), 8}));
  ir::Value* b = g.add_op(op("aten::mm"), {a, w})->output();
  b->set_tensor_type(dense({sym("s0"), 8}));
  ir::Value* sum =
      g.add_op(op("aten::add", "Tensor"), {b, a, g.add_constant(1, ir::ValueKind::kScalar)})
          ->output();
  sum->set_tensor_type(dense({sym("s0"), 8}));
  ir::Value* relu = g.add_op(op("aten::relu"), {sum})->output();
  relu->set_tensor_type(dense({sym("s0"), 8}));
  ir::Value* c = g.add_op(op("aten::mm"), {b, w})->output();
  c->set_tensor_type(dense({sym("s0"), 8}));
  ir::Value* shape =
      g.add_list(ir::ValueKind::kIntList, {g.add_constant(-1, ir::ValueKind::kInt)})->output();
  ir::Value* flat = g.add_op(op("aten::view"), {c, shape})->output();
  g.set_outputs({relu, flat});
}

TEST(MemoryArena, LeavesOutputsToTheCallerAndBlocksThatWouldRaiseThePeak) {
  // c is returned (through a view): never planned. a and b: one block for both would stay
  // reserved beside the sum and the result after a dies, above the peak: neither is placed.
  ir::Graph g;
  build_two_products(g);
  Executable exe(g);
  EXPECT_EQ(exe.arena_stats().planned_values, 2u);
  at::Tensor x = at::randn({6, 8}), w = at::randn({8, 8});
  std::vector<c10::IValue> out = exe.run({x, w});
  at::Tensor a = at::mm(x, w), b = at::mm(a, w);
  EXPECT_TRUE(at::allclose(out[0].toTensor(), at::relu(b + a)));
  EXPECT_TRUE(at::allclose(out[1].toTensor(), at::mm(b, w).view(-1)));
  EXPECT_EQ(exe.arena_stats().runs, 0u);
}

TEST(MemoryArena, AutogradRecordingCallsKeepTheFunctionalOperator) {
  // mm.out refuses inputs that require grad while grad mode records: the run falls back to
  // mm for that call (and its result to the allocator), with the same numbers.
  ir::Graph g;
  build_three_products(g);
  Executable exe(g);
  at::Tensor x = at::randn({4, 8}), w = at::randn({8, 8}).requires_grad_();
  std::vector<c10::IValue> out = exe.run({x, w});
  EXPECT_TRUE(at::allclose(out[0].toTensor(), at::relu(at::mm(at::mm(at::mm(x, w), w), w))));
}

}  // namespace
}  // namespace magi::runtime
