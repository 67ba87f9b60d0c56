// plan_arena: best-fit placement of blocks in one allocation; plan_segments: which blocks share
// an allocation without raising the run's peak (see memory_plan.h).
#include "magi/runtime/memory_plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

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

SegmentedLayout plan_segments(const std::vector<ArenaBlock>& blocks,
                              const std::vector<int64_t>& others, int64_t alignment) {
  auto aligned = [&](int64_t n) { return align_up(n, alignment); };
  // Units: a block and those taking it over, placed together.
  struct Unit {
    std::vector<size_t> members;
    int64_t bytes;
    size_t first, last;
  };
  std::vector<Unit> units;
  std::vector<int32_t> unit_of(blocks.size(), -1);
  std::vector<int32_t> reuses(blocks.size(), -1);  // the valid ones
  for (size_t i = 0; i < blocks.size(); ++i) {
    const ArenaBlock& b = blocks[i];
    if (b.bytes <= 0) continue;
    const int32_t r = b.reuses;
    if (r >= 0 && static_cast<size_t>(r) < i && unit_of[r] >= 0 && blocks[r].bytes >= b.bytes &&
        units[unit_of[r]].last <= b.first) {
      Unit& u = units[unit_of[r]];
      u.members.push_back(i);
      u.last = std::max(u.last, b.last);
      unit_of[i] = unit_of[r];
      reuses[i] = r;
      continue;
    }
    unit_of[i] = static_cast<int32_t>(units.size());
    units.push_back({{i}, aligned(b.bytes), b.first, b.last});
  }

  // Bytes held at each step: every unit on its own, and the other tensors.
  const size_t steps = std::max<size_t>(others.size(), 1);
  std::vector<int64_t> memory(steps, 0);
  for (size_t t = 0; t < others.size(); ++t) memory[t] = others[t];
  auto hold = [&](int64_t b, size_t first, size_t last) {
    for (size_t t = first; t <= std::min(last, steps - 1); ++t) memory[t] += b;
  };
  for (const Unit& u : units) hold(u.bytes, u.first, u.last);
  SegmentedLayout out;
  out.budget = *std::max_element(memory.begin(), memory.end());

  struct Segment {
    std::vector<size_t> units;
    int64_t bytes;
    size_t first, last;
  };
  std::vector<Segment> segments;
  // plan_arena over the segment's blocks; `order` receives the block index of each entry.
  auto layout_of = [&](const std::vector<size_t>& seg_units, std::vector<size_t>* order) {
    std::vector<ArenaBlock> group;
    std::vector<int32_t> index(blocks.size(), -1);
    for (size_t u : seg_units) {
      for (size_t i : units[u].members) {
        ArenaBlock block{blocks[i].bytes, blocks[i].first, blocks[i].last, -1};
        if (reuses[i] >= 0 && index[reuses[i]] >= 0) block.reuses = index[reuses[i]];
        index[i] = static_cast<int32_t>(group.size());
        group.push_back(block);
        if (order != nullptr) order->push_back(i);
      }
    }
    return plan_arena(group, alignment);
  };
  // Grows `seg` by unit `u` to `grown` bytes if every step stays within the budget; the
  // grown segment's reservation then replaces both in `memory`.
  auto try_grow = [&](Segment& seg, size_t u, int64_t grown) {
    const Unit& unit = units[u];
    const size_t first = std::min(seg.first, unit.first), last = std::max(seg.last, unit.last);
    hold(-unit.bytes, unit.first, unit.last);
    hold(-seg.bytes, seg.first, seg.last);
    hold(grown, first, last);
    bool fits = true;
    for (size_t t = first; t <= std::min(last, steps - 1) && fits; ++t) {
      fits = memory[t] <= out.budget;
    }
    if (!fits) {
      hold(-grown, first, last);
      hold(seg.bytes, seg.first, seg.last);
      hold(unit.bytes, unit.first, unit.last);
      return false;
    }
    seg.units.push_back(u);
    seg.bytes = grown;
    seg.first = first;
    seg.last = last;
    return true;
  };
  std::vector<size_t> by_first(units.size());
  std::iota(by_first.begin(), by_first.end(), 0);
  std::stable_sort(by_first.begin(), by_first.end(),
                   [&](size_t a, size_t b) { return units[a].first < units[b].first; });
  // Only the last kSearched segments are tried: a unit rarely fits an old segment's stretch,
  // and a graph of thousands of values stays quick to lay out.
  constexpr size_t kSearched = 8;
  for (size_t u : by_first) {
    std::vector<std::pair<int64_t, size_t>> growth;  // (extra bytes, segment)
    for (size_t k = segments.size() > kSearched ? segments.size() - kSearched : 0;
         k < segments.size(); ++k) {
      std::vector<size_t> grown = segments[k].units;
      grown.push_back(u);
      growth.emplace_back(layout_of(grown, nullptr).bytes - segments[k].bytes, k);
    }
    std::stable_sort(growth.begin(), growth.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    bool placed = false;
    for (const auto& [extra, k] : growth) {
      if ((placed = try_grow(segments[k], u, segments[k].bytes + extra))) break;
    }
    if (!placed) segments.push_back({{u}, units[u].bytes, units[u].first, units[u].last});
  }

  out.segment.assign(blocks.size(), -1);
  out.offsets.assign(blocks.size(), -1);
  for (const Segment& seg : segments) {
    if (seg.units.size() == 1 && units[seg.units[0]].members.size() == 1) continue;
    std::vector<size_t> order;
    const ArenaLayout planned = layout_of(seg.units, &order);
    const int32_t index = static_cast<int32_t>(out.segment_bytes.size());
    for (size_t k = 0; k < order.size(); ++k) {
      out.offsets[order[k]] = planned.offsets[k];
      out.segment[order[k]] = index;
    }
    out.segment_bytes.push_back(planned.bytes);
    out.segment_last.push_back(seg.last);
    out.segment_peak_live.push_back(planned.peak_live);
  }
  return out;
}

}  // namespace magi::runtime
