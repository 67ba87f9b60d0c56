// Memory arena layout: where each intermediate of one executor run sits, in a few blocks.
//
// A run's intermediates each live over a span of instructions (from the one that writes it to
// the last one reading it or a view of it). Given their byte sizes for one set of input sizes:
//
// plan_arena gives each block of one group an offset so that no two whose spans overlap share
// a byte. Placement is greedy by size: the largest first, each into the smallest gap between
// already placed blocks it overlaps in time (best fit), else above them. A block may instead
// be declared to take another's place (a pointwise kernel writing its output over an input
// that dies there): it gets that block's offset, and the pair counts as one block over both
// spans.
//
// plan_segments splits the blocks into groups (segments), each one allocation reserved at its
// full size from its first block's write to its last block's last read, such that the run's
// peak never rises above what an allocator freeing each tensor at its last read would reach
// (the budget, counting the other tensors the run allocates as well). A block alone in its
// segment is left to the allocator: it would cost the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace magi::runtime {

struct ArenaBlock {
  int64_t bytes = 0;    ///< 0: not placed (offset -1)
  size_t first = 0;     ///< instruction writing it
  size_t last = 0;      ///< last instruction reading it (inclusive), >= first
  int32_t reuses = -1;  ///< index of an earlier block whose memory this one takes over, or -1
};

struct ArenaLayout {
  std::vector<int64_t> offsets;  ///< per block; -1 for blocks of 0 bytes
  int64_t bytes = 0;             ///< size of the arena
  int64_t peak_live = 0;         ///< most bytes live at one instruction: the lower bound
};

/// The segments of plan_segments and the offsets within them.
struct SegmentedLayout {
  std::vector<int32_t> segment;  ///< per block; -1: left to the allocator
  std::vector<int64_t> offsets;  ///< per block, within its segment; -1 when in none
  std::vector<int64_t> segment_bytes;
  std::vector<size_t> segment_last;        ///< the last step reading a block of the segment
  std::vector<int64_t> segment_peak_live;  ///< the most bytes of the segment live at once
  int64_t budget = 0;  ///< the run's peak with every tensor allocated on its own
};

/// Groups `blocks` into segments: in the order they are written, each block (with those
/// taking it over, as one unit) joins the one of the last 8 segments it grows least while
/// every step stays within the budget, else opens its own. `others[t]`: the bytes of the
/// run's other tensors live at step t (one entry per step; blocks' spans past the end count
/// to the last step). A `reuses` that cannot hold (a larger block, or one still live) is
/// ignored.
SegmentedLayout plan_segments(const std::vector<ArenaBlock>& blocks,
                              const std::vector<int64_t>& others, int64_t alignment = 256);

/// Offsets aligned to `alignment` (a power of two) for the blocks. A block with `reuses` must
/// not be larger than the block it takes over, which must end at or before its first
/// instruction.
ArenaLayout plan_arena(const std::vector<ArenaBlock>& blocks, int64_t alignment = 256);

}  // namespace magi::runtime
