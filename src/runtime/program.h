// An Executable's program: the instructions a graph is lowered to and the state its calls
// share. Internal to src/runtime: lower_program.cpp builds it, executor.cpp runs it.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "magi/runtime/attention_choice.h"
#include "magi/runtime/cuda_graph.h"
#include "magi/runtime/executor.h"
#include "magi/runtime/fused_kernel.h"
#include "magi/runtime/offload.h"
#include "magi/runtime/padding.h"

namespace magi::runtime {

// Operand reference: >= 0 is a register, < 0 is constant number -(ref + 1).
using Ref = int32_t;
constexpr Ref kUnused = std::numeric_limits<Ref>::min();

enum class InstrKind : uint8_t {
  kCall,
  kSym,
  kGetItem,
  kMakeList,
  kCallPiece,
  kFusion,
  kAttention,  // an SDPA call whose kernel an AttentionCall picks (attention_choice.h)
};

struct Instr {
  InstrKind kind;
  std::optional<c10::OperatorHandle> op;            // kCall
  std::optional<c10::OperatorHandle> out_op;        // kCall: its out= overload (memory arena)
  ir::SymOp sym = ir::SymOp::kAdd;                  // kSym
  ir::ValueKind list_kind = ir::ValueKind::kOther;  // kMakeList
  int64_t item_index = 0;                           // kGetItem
  size_t piece = 0;                                 // kCallPiece, kFusion: Program::pieces
  size_t attention = 0;                             // kAttention: Program::attention
  int64_t chunk_rows = 0;                           // kCallPiece: rows per chunk (0: whole)
  std::vector<bool> chunked;                        // kCallPiece: inputs cut into row chunks
  std::vector<Ref> in;
  std::vector<uint8_t> move_in;  // kCall, kCallPiece: move the register in (its last use)
  std::vector<Ref> out;          // kUnused for outputs nobody reads
  std::vector<Ref> release_after;
  std::string where;       // for error messages: "aten::mm (FX node mm, model.py:12)"
  bool pure = false;       // same operands, same results, nothing else touched (may run once)
  bool once = false;       // reads only constants: runs on the first call only (see Program)
  bool may_alias = false;  // results may share memory with operands (set with an arena)
};

// Whether an operator's results may share memory with its operands: returns its schema marks
// as aliases, aten::_unsafe_view (AOTAutograd's reshape of a fresh result, a view its schema
// does not mark), and lists of tensors (broadcast_tensors and meshgrid return unmarked views).
inline bool returns_may_alias(const c10::FunctionSchema& schema) {
  if (schema.name() == "aten::_unsafe_view") return true;
  for (const auto& ret : schema.returns()) {
    if (ret.alias_info() != nullptr || ret.type()->kind() == c10::TypeKind::ListType) return true;
  }
  return false;
}

// The memory arena (memory_plan.h): registers a run places in one block, chosen at lowering
// (plan_memory_arena in memory_arena.cpp); their offsets are laid out once per set of input
// sizes and kept.
struct ArenaValue {
  Ref reg;
  size_t first = 0, last = 0;  // the instruction writing it; the last reading it or a view of it
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<ir::SymExpr> sizes;  // contiguous
  int32_t reuses = -1;  // an arena value dying at `first` whose memory a pointwise kernel takes
};

// A symbol the planned sizes use, read from an input's size (dim >= 0) or an integer input.
struct ArenaSymbol {
  size_t input = 0;
  int64_t dim = -1;
  std::string name;
};

// A tensor the arena does not hold (an attention output, a custom op's result): where its
// memory is allocated and freed, which the layout needs to keep the run's peak (see
// Arena::layout_for).
struct ArenaOther {
  size_t first = 0;
  size_t last = kNeverFreed;  // the last step reading it or a view of it
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<ir::SymExpr> sizes;  // empty with `sized` false: counts whatever its size
  bool sized = false;
  static constexpr size_t kNeverFreed = std::numeric_limits<size_t>::max();
};

// The arena of one set of symbol values: blocks (segments), each holding some of the planned
// values over the stretch of instructions they live in; a value in none is allocated as usual.
struct ArenaLayoutForSizes {
  std::vector<int64_t> key;      // the symbols' values
  std::vector<int64_t> offsets;  // per ArenaValue; -1: allocated as usual
  std::vector<int32_t> segment;  // per ArenaValue with an offset
  std::vector<std::vector<int64_t>> sizes;
  std::vector<int64_t> segment_bytes;
  std::vector<size_t> segment_last;  // the last step reading a value of the segment
  int64_t bytes = 0;                 // the largest segment
  int64_t peak_live = 0;             // its most bytes live at once
  int64_t run_peak = 0;              // estimated peak of the run's tensors, as without an arena
};

struct Arena {
  std::vector<ArenaValue> values;
  std::vector<ArenaOther> others;
  std::vector<int32_t> value_of;  // per register: index into values, or -1
  std::vector<ArenaSymbol> symbols;
  size_t num_steps = 0;
  c10::Device device{c10::DeviceType::CPU};
  mutable std::mutex mutex;
  mutable std::vector<std::shared_ptr<const ArenaLayoutForSizes>> layouts;  // newest last
  mutable size_t laid_out = 0;  // sets of sizes laid out so far (under the mutex)
  mutable std::atomic<int64_t> last_bytes{0}, last_peak_live{0};
  mutable std::atomic<size_t> placed_calls{0};
  mutable std::atomic<size_t> unplanned_copies{0};  // results copied off the arena (executor.cpp)

  /// The layout for the sizes of `inputs` (laid out on first sight; the 8 most recently used
  /// are kept; after 64 sets of sizes, new ones get an empty layout).
  std::shared_ptr<const ArenaLayoutForSizes> layout_for(
      const std::vector<c10::IValue>& inputs) const;
};

/// A tensor of `sizes` (contiguous) and `dtype` on the arena's storage at `offset` bytes.
at::Tensor arena_tensor(const at::Tensor& arena, int64_t offset, c10::ScalarType dtype,
                        c10::IntArrayRef sizes);

struct Executable::Program {
  std::vector<Instr> instrs;
  std::vector<std::unique_ptr<Executable>> pieces;  // one per called piece of the graph
  std::vector<std::unique_ptr<FusedKernel>> fused;  // one per fusion group (same indexing)
  // PIECEWISE CUDA graphs: one runner per called piece (same indexing), when enabled.
  std::vector<std::unique_ptr<CudaGraphRunner>> piece_graphs;
  // Per piece (same indexing): called in row chunks (no CUDA graph of its own: the loop is
  // part of the caller's run).
  std::vector<bool> chunked_pieces;
  std::vector<std::unique_ptr<AttentionCall>> attention;
  std::vector<c10::IValue> constants;
  std::vector<Ref> input_regs;  // kUnused for inputs nobody reads
  std::vector<Ref> output_refs;
  size_t num_registers = 0;
  size_t num_calls = 0;
  size_t num_piece_calls = 0;
  size_t num_fusions = 0;
  size_t max_stack = 0;
  bool draws_random = false;      // see Executable::draws_random_numbers
  bool calls_custom_ops = false;  // see Executable::calls_custom_ops
  // Instructions marked `once` compute the same values on every call (rotary tables of a
  // static sequence length, masks from arange): the first call runs them and keeps the values
  // later instructions read; later calls start from those. Filled once, under the mutex.
  std::mutex folded_mutex;
  std::atomic<bool> folded_ready{false};
  std::atomic<bool> folding_off{false};  // the kept values would exceed kMaxFoldedBytes
  bool folding = false;                  // any `once` instruction
  std::vector<bool> keep_folded;         // per register: a `once` result read by other instructions
  std::vector<std::pair<Ref, c10::IValue>> folded;
  size_t private_outputs_from = std::numeric_limits<size_t>::max();  // ExecutorOptions
  bool outputs_alias_inputs = false;  // some output may be a view of some input
  bool writes_inputs = false;         // some operator writes an input in place
  std::vector<bool> written_inputs;   // per input: an operator may write it (or a view of it)
  // Per output: the inputs it may share memory with (it, or a list holding it, is a view).
  std::vector<std::vector<int32_t>> output_input_roots;
  std::unique_ptr<OffloadEngine> offload;  // ExecutorOptions::offload, top level only
  PaddingPlan padding;                     // plan_padding() of the graph
  std::vector<LoweringStep> steps;         // the lowering steps, this graph's own
  std::unique_ptr<Arena> arena;  // null: no value is planned (or plan_memory_arena is off)
};

// Folded values kept per executable at most; past it every call recomputes them.
constexpr int64_t kMaxFoldedBytes = 64ll << 20;

/// The lowering step fold_constants (fold_constants.cpp): marks the pure instructions that read
/// only constants and results of such instructions `once`, and sets `keep` (per register) for
/// their results that the rest of the program or `output_refs` read. Returns whether any
/// instruction was marked.
bool mark_constant_instructions(std::vector<Instr>& instrs, size_t num_registers,
                                const std::vector<Ref>& output_refs, std::vector<bool>* keep);

}  // namespace magi::runtime
