// Memory arena layout: where each intermediate of one executor run sits in a single block.
//
// A run's intermediates each live over a span of instructions (from the one that writes it to
// the last one reading it or a view of it). Given their byte sizes for one set of input sizes,
// the layout gives each an offset so that no two whose spans overlap share a byte; the run then
// makes one allocation, the arena, and every planned value is a tensor on its memory.
// Placement is greedy by size: the largest block first, each into the smallest gap between
// already placed blocks it overlaps in time (best fit), else above them. A block may instead
// be declared to take another's place (a pointwise kernel writing its output over an input
// that dies there): it gets that block's offset, and the pair counts as one block over both
// spans.
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

/// Offsets aligned to `alignment` (a power of two) for the blocks. A block with `reuses` must
/// not be larger than the block it takes over, which must end at or before its first
/// instruction.
ArenaLayout plan_arena(const std::vector<ArenaBlock>& blocks, int64_t alignment = 256);

}  // namespace magi::runtime
