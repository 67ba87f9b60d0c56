// plan_arena: best-fit placement of a run's intermediates in one block (see memory_plan.h).
#include "magi/runtime/memory_plan.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "magi/common/error.h"

namespace magi::runtime {
namespace {

int64_t align_up(int64_t n, int64_t alignment) { return (n + alignment - 1) & ~(alignment - 1); }

// Blocks joined by `reuses` share one place: a group's size is its first block's, its span
// runs from the first block's first instruction to the last member's last.
struct Group {
  int64_t bytes = 0;
  size_t first = 0, last = 0;
  int64_t offset = -1;
};

}  // namespace

ArenaLayout plan_arena(const std::vector<ArenaBlock>& blocks, int64_t alignment) {
  MAGI_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0, "arena alignment ", alignment,
              " is not a power of two");
  std::vector<int32_t> group_of(blocks.size(), -1);
  std::vector<Group> groups;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const ArenaBlock& b = blocks[i];
    MAGI_ASSERT(b.first <= b.last, "arena block ", i, " ends before it starts");
    if (b.bytes <= 0) continue;
    if (b.reuses >= 0) {
      MAGI_ASSERT(static_cast<size_t>(b.reuses) < i, "arena block ", i, " reuses a later block");
      const int32_t g = group_of[b.reuses];
      MAGI_ASSERT(g >= 0 && groups[g].bytes >= b.bytes && groups[g].last <= b.first, "arena block ",
                  i, " cannot take over block ", b.reuses);
      group_of[i] = g;
      groups[g].last = b.last;
      continue;
    }
    group_of[i] = static_cast<int32_t>(groups.size());
    groups.push_back({align_up(b.bytes, alignment), b.first, b.last});
  }

  std::vector<size_t> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return groups[a].bytes != groups[b].bytes ? groups[a].bytes > groups[b].bytes
                                              : groups[a].first < groups[b].first;
  });
  ArenaLayout layout;
  std::vector<const Group*> placed;
  std::vector<std::pair<int64_t, int64_t>> taken;  // [offset, end) of those overlapping in time
  for (size_t gi : order) {
    Group& g = groups[gi];
    taken.clear();
    for (const Group* other : placed) {
      if (other->first <= g.last && g.first <= other->last) {
        taken.emplace_back(other->offset, other->offset + other->bytes);
      }
    }
    std::sort(taken.begin(), taken.end());
    int64_t best = -1, best_gap = 0, end = 0;
    for (const auto& [start, stop] : taken) {
      const int64_t gap = start - end;
      if (gap >= g.bytes && (best < 0 || gap < best_gap)) {
        best = end;
        best_gap = gap;
      }
      end = std::max(end, stop);
    }
    g.offset = best >= 0 ? best : end;
    layout.bytes = std::max(layout.bytes, g.offset + g.bytes);
    placed.push_back(&g);
  }

  layout.offsets.assign(blocks.size(), -1);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (group_of[i] >= 0) layout.offsets[i] = groups[group_of[i]].offset;
  }
  std::map<size_t, int64_t> delta;  // bytes live from an instruction on
  for (const Group& g : groups) {
    delta[g.first] += g.bytes;
    delta[g.last + 1] -= g.bytes;
  }
  int64_t live = 0;
  for (const auto& [step, d] : delta) {
    live += d;
    layout.peak_live = std::max(layout.peak_live, live);
  }
  return layout;
}

}  // namespace magi::runtime
