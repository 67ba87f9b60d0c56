// The executor: runs a graph on CPU or CUDA tensors without Python.
//
// Construction lowers the graph to a flat instruction list over a register file of
// c10::IValues: every operator becomes one boxed call through the c10 dispatcher (so any op
// eager PyTorch can run, we can run, with eager's numbers), symbolic integer nodes become
// integer arithmetic, and constants live in a table built once. Each register is released at
// its last use (moved into the callee's stack, so in-place reuse and early frees both work).
// A graph split into pieces (passes/split_at_boundaries.cpp) lowers each piece it owns to an
// Executable of its own, once, and a CallPiece becomes one call of that Executable; boundary
// operators between the pieces are ordinary dispatcher calls. Operators implemented in Python
// (torch.library custom ops) take the GIL themselves, so callers run this without it.
// run() may be called from several threads. What it changes is kept behind locks: the first
// call's results of instructions that read only constants, the attention kernels chosen, and
// the weight offload engine (calls with offloaded weights run one at a time).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "magi/codegen/compiler.h"
#include "magi/ir/graph.h"
#include "magi/runtime/attention_choice.h"
#include "magi/runtime/offload.h"
#include "magi/runtime/padding.h"

namespace magi::runtime {

struct GeneratedKernel;

/// Choices made when a graph is lowered; pieces inherit their graph's.
struct ExecutorOptions {
  /// Kernel behind CUDA SDPA calls whose only used output is the attention output.
  AttentionBackend attention = AttentionBackend::kAuto;
  /// Outputs from this index on reach only our own backward graph (a training forward's saved
  /// tensors): they may be values kept across calls instead of fresh copies.
  size_t private_outputs_from = std::numeric_limits<size_t>::max();
  /// Weight offload (top-level graphs only; pieces never get it): inputs that live in
  /// offloaded host memory are streamed or kept on the GPU by an OffloadEngine (offload.h).
  std::optional<OffloadOptions> offload;
  /// Plan intermediates into the memory arena (memory_arena.cpp; the plan_memory_arena step,
  /// unless disabled). Inference graphs only: a training graph's backward frees its saved
  /// inputs as it reads them, which the arena's peak estimate does not see, and arena blocks
  /// then held memory the allocator would have reused, raising the activation peak.
  bool memory_arena = true;
  /// Pipeline names switched off (passes::pass_enabled, with MAGI_DISABLE_PASSES): the lowering
  /// steps plan_padding, fold_constants and plan_memory_arena are skipped when named here.
  std::set<std::string> disabled;
  /// Pieces: which of the piece's outputs an operator other than our generated kernels reads
  /// where the piece is called (empty: none). A fused kernel that writes such an output stores
  /// it without the streaming hint (KOutput::keep).
  std::vector<bool> outputs_read_by_library;
};

/// A named step of lowering a graph (passes::pipeline_pass_names lists them after the passes),
/// as the dumps show it.
struct LoweringStep {
  std::string name;
  bool ran = false;           ///< false when disabled by name, or not for this graph kind
  double milliseconds = 0.0;  ///< its time, over the graph and its pieces
};

/// While one lives, runs on this thread use no memory arena (CUDA graph captures: a replay
/// makes no allocator calls, and the graph's pool is laid out by the allocator as before).
class ArenaOffScope {
 public:
  ArenaOffScope();
  ~ArenaOffScope();
  ArenaOffScope(const ArenaOffScope&) = delete;
  ArenaOffScope& operator=(const ArenaOffScope&) = delete;
  static bool active();

 private:
  bool previous_;
};

class Executable {
 public:
  /// Lowers `graph` (which must verify). The graph is not kept.
  explicit Executable(const ir::Graph& graph, const ExecutorOptions& options = {});
  ~Executable();
  Executable(Executable&&) noexcept;

  /// Runs with one IValue per graph input; returns one IValue per graph output.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs) const;

  size_t num_inputs() const;
  size_t num_outputs() const;
  size_t num_instructions() const;
  /// Number of boxed dispatcher calls per run, those inside pieces included.
  size_t num_operator_calls() const;
  /// Instructions that read only constants (and results of such instructions): pure operators,
  /// symbolic arithmetic, lists, fused kernels. The first run executes them and keeps the
  /// results later instructions read (up to 64 MiB); later runs skip them.
  size_t num_constant_instructions() const;
  /// Values kept by the first run for later runs (0 before it, or past the 64 MiB cap).
  size_t num_folded_values() const;
  /// Number of piece calls per run (0 when the graph was not split).
  size_t num_piece_calls() const;
  /// Number of distinct pieces (each lowered once, however often it is called).
  size_t num_pieces() const;
  /// Of those, the pieces called in row chunks (passes/chunk_rows.cpp): never CUDA-graphed on
  /// their own, so a graph whose only pieces are these runs as one graph.
  size_t num_chunked_pieces() const;
  /// Piece i, in the order of the graph's pieces().
  const Executable& piece(size_t i) const;
  /// PIECEWISE CUDA graphs: run each piece through its own CudaGraphRunner (boundary ops stay
  /// eager between them). Not thread-safe: one caller at a time.
  /// `ladder`: batch sizes captured, smaller batches padded up to the next (padding.h); empty:
  /// one graph per exact size. `keyed_inputs`: per graph input, whether it is a parameter or
  /// buffer; a piece input that every call of the piece takes from one is keyed by identity
  /// (cuda_graph.h), so a piece called for each layer gets a graph per layer.
  void enable_piece_cuda_graphs(size_t max_graphs, std::vector<int64_t> ladder = {},
                                const std::vector<bool>& keyed_inputs = {});
  size_t num_piece_graph_captures() const;
  /// CUDA graphs of the pieces captured now (all pieces together).
  size_t num_piece_graphs() const;
  /// Piece calls that ran in a larger bucket's CUDA graph (padded).
  size_t num_piece_padded_calls() const;
  /// Fusion nodes run per call (generated kernels), those inside pieces included.
  size_t num_fusions() const;
  /// Generated-kernel calls so far, pieces included, that wrote an output over an input at
  /// its last use instead of allocating (FusedKernel::num_in_place_outputs).
  size_t num_in_place_outputs() const;
  /// Every kernel variant generated and compiled so far, pieces included.
  std::vector<struct GeneratedKernel> generated_kernels() const;
  /// Compiles, all at once on a small thread pool, the CUDA kernel each fused group of the
  /// graph (pieces included) is expected to need, so that the first call finds them compiled
  /// instead of compiling one after another. Returns how many sources were compiled or found
  /// cached; a failure is left for the first call to report (it compiles lazily then).
  size_t precompile_kernels() const;
  /// The CUDA sources precompile_kernels compiles, by device index: one per distinct kernel
  /// each fused group (pieces included) is expected to need.
  std::map<int, std::vector<codegen::CudaSource>> expected_cuda_sources() const;
  /// For each piece call, in execution order, the index of the piece it runs.
  std::vector<size_t> piece_call_sequence() const;
  /// The weight offload plan and what was measured of it; nullopt without offload or before
  /// the first call with offloaded inputs.
  std::optional<OffloadReport> offload_report() const;
  /// Whether some output may share memory with some input (a view of it), and whether some
  /// operator writes an input in place (pieces included): what offload needs of a piece.
  bool outputs_may_alias_inputs() const;
  bool writes_inputs() const;
  /// Whether an operator (in a piece too) may write input `i`, or a view of it, in place.
  bool input_written(size_t i) const;
  /// The inputs output `k` may share memory with (it is a view of them, or a list of such).
  const std::vector<int32_t>& inputs_output_may_alias(size_t k) const;
  /// Whether some operator may draw random numbers its results depend on (pieces included):
  /// random operators, attention with a dropout probability other than the constant 0, custom
  /// operators (opaque). A CUDA graph without such operators needs no generator refresh.
  bool draws_random_numbers() const;
  /// Whether some instruction, pieces included, calls a custom (non-ATen) operator.
  bool calls_custom_ops() const;
  /// Whether (and how) calls may be padded along a dynamic batch dim: decided at lowering.
  const PaddingPlan& padding() const;
  /// The memory arena (memory_plan.h): intermediates a run places in shared blocks, this
  /// graph's and its pieces' (each piece call has its own); what the last run laid out.
  struct ArenaStats {
    size_t planned_values = 0;   ///< values chosen at lowering
    size_t runs = 0;             ///< runs whose layout placed some value
    int64_t last_bytes = 0;      ///< the last run's largest block (pieces included)
    int64_t last_peak_live = 0;  ///< the most bytes of values live at once in that block
    /// Results an operator returned on arena memory the plan did not give it (an alias its
    /// schema does not declare), copied off so that later values cannot overwrite them.
    size_t unplanned_copies = 0;
  };
  ArenaStats arena_stats() const;
  /// The lowering steps in the order they ran (plan_padding, fold_constants, plan_memory_arena),
  /// with the time each took in this graph and its pieces.
  std::vector<LoweringStep> lowering_steps() const;

 private:
  struct Program;
  /// After the first call: keeps the results of the instructions that read only constants.
  static void keep_folded_values(Program& p, std::vector<std::pair<int32_t, c10::IValue>> values);
  static void analyse_input_uses(Program& p, const ExecutorOptions& options);
  /// Chooses the values a run places in its memory arena (memory_arena.cpp).
  static void plan_arena(Program& p, const std::vector<const ir::Node*>& nodes,
                         const std::vector<const ir::Value*>& inputs);
  std::unique_ptr<Program> program_;
};

}  // namespace magi::runtime
