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
  ir::SymOp sym = ir::SymOp::kAdd;                  // kSym
  ir::ValueKind list_kind = ir::ValueKind::kOther;  // kMakeList
  int64_t item_index = 0;                           // kGetItem
  size_t piece = 0;                                 // kCallPiece, kFusion: Program::pieces
  size_t attention = 0;                             // kAttention: Program::attention
  std::vector<Ref> in;
  std::vector<uint8_t> move_in;  // kCall, kCallPiece: move the register in (its last use)
  std::vector<Ref> out;          // kUnused for outputs nobody reads
  std::vector<Ref> release_after;
  std::string where;  // for error messages: "aten::mm (FX node mm, model.py:12)"
  bool pure = false;  // same operands, same results, nothing else touched (may run once)
  bool once = false;  // reads only constants: runs on the first call only (see Program)
};

struct Executable::Program {
  std::vector<Instr> instrs;
  std::vector<std::unique_ptr<Executable>> pieces;  // one per called piece of the graph
  std::vector<std::unique_ptr<FusedKernel>> fused;  // one per fusion group (same indexing)
  // PIECEWISE CUDA graphs: one runner per called piece (same indexing), when enabled.
  std::vector<std::unique_ptr<CudaGraphRunner>> piece_graphs;
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
  bool outputs_alias_inputs = false;       // some output may be a view of some input
  bool writes_inputs = false;              // some operator writes an input in place
  std::unique_ptr<OffloadEngine> offload;  // ExecutorOptions::offload, top level only
  PaddingPlan padding;                     // plan_padding() of the graph
};

// Folded values kept per executable at most; past it every call recomputes them.
constexpr int64_t kMaxFoldedBytes = 64ll << 20;

}  // namespace magi::runtime
