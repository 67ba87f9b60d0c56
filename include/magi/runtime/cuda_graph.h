// CUDA graph capture and replay of an Executable.
//
// One graph per input signature (the sizes, strides and dtypes of the tensor inputs and the
// values of the integer inputs, e.g. the dynamic batch size): the first call with a signature
// runs eagerly (warm-up: kernels load, library handles are created), the second captures
// and replays, later calls only replay. All graphs of a runner share one memory pool.
//
// Inputs: an input whose address was the same in the warm-up and the capture (parameters,
// buffers) is used in place; others are copied into static buffers: by copy nodes at the
// start of the graph for dense inputs (each replay points the node at the call's tensor, only
// when it is another tensor than the last launch's), else on the stream before the launch. If
// a parameter-like input later arrives at a different address (the parameter was replaced),
// the graph is dropped and captured again.
//
// Keyed inputs: inputs the caller marks `keyed` (a model's parameters and buffers) enter the
// signature by identity (their TensorImpl) as well. One compiled layer called for each layer
// instance of a model then gets a graph per instance, each reading its own weights in place,
// rather than one graph that copies the weights of whichever instance calls into its static
// buffers. `max_graphs` counts signatures without the identities. An entry whose keyed tensors
// nobody else holds any more (the model dropped those weights) is erased when a new entry is
// made, so replaced weights are not kept alive by their old graphs. Keyed inputs that are new
// tensors call after call (entries erased before their capture, four times), or more than 512
// instances of one signature, turn the keys off for the runner.
//
// Outputs: a graph ends by copying each dense output into a buffer of the runner (outside
// the graphs' pool), and the caller gets a new tensor on that buffer's memory. Each graph has
// two sets of buffers from its capture (two executables of the graph, each copying into its
// own set; one set for graphs replayed through CUDAGraph::replay()). A replay writes a set the
// caller holds no tensor on (the output, or any view of it: the buffer's storage is
// referenced from outside the runner): the one whose executable's input copy nodes already
// read the call's tensors, else the one replayed longest ago; when every set is held, the
// held buffers are left to the caller and the set gets new ones (num_fresh_output_buffers).
// So a replay never overwrites memory a tensor outside the runner refers to, and a loop
// `y = f(x)` over one input tensor alternates between the two sets with no allocation and no
// copy call on the host. A graph whose inputs arrive from a few addresses in turn (a call
// that finds no free set reading its tensors, with the same tensors as one of the last four
// such calls) gets another executable and set, up to four, when one set is small (at most
// 4 MiB of outputs, a decode step's): inputs that come from up to four addresses in turn, as
// a caching allocator hands them out, then each keep an executable whose copy nodes read them
// (while the caller holds fewer outputs than there are addresses), and a replay updates no
// node. Inputs from more addresses, or new ones every call, add none. Outputs that are not
// dense (or whose batch dim is not outermost in a padded call) are copied out after the
// replay instead. Buffers used on a stream they were not made on are recorded on it
// (recordStream). A replay on another stream than the runner's last replay (of any of its
// graphs: they share the pool) waits for that one, and for the stream of its set's last
// replay, where the caller may have read those outputs until it dropped them (two threads
// with a stream each).
//
// Buckets: with a ladder of batch sizes and an executable whose padding plan allows it
// (padding.h), a call with batch b runs in the graph of the smallest ladder size B >= b: its
// batched inputs (dense with dim 0 outermost; others run at their exact size) are copied into the
// first rows of the graph's B-row buffers, and the first b rows of the batched outputs are copied
// out. Batched inputs are then always copied, never read in place. Sizes above the ladder get
// a graph of their own, as without a ladder.
//
// Threads: calls from several threads take turns. Every member but pads() holds one lock,
// shared by all runners of the process, for its whole length, so the choice of an output set,
// the launch and the tensors handed out are one step that no other call sees half done. One
// lock rather than one per runner: a capture may call another compiled module (a custom op's
// body), and with a lock per runner two threads could each hold one and wait for the other's.
// Callers release the GIL first (a warm-up may run Python custom ops). The GPU work of calls
// from different threads still overlaps as their streams allow; only the host part of the
// calls (a few microseconds for a replay, the whole run for a warm-up) takes turns.
//
// Without a CUDA build (or for CPU inputs) run() simply calls the executable.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace magi::runtime {

class Executable;

/// What a caller knows of some of a call's inputs: those with `steady[i]` set are the very
/// tensors (same TensorImpl, storage, dtype, device, requires_grad, sizes and strides) they were
/// on the last call that carried the same nonzero `generation`. A caller takes a new
/// process-wide unique generation whenever one of them may have changed. The runner then skips
/// their part of the signature check when the last call replayed the same graph (for a model's
/// parameters, most of that check).
struct SteadyInputs {
  uint64_t generation = 0;
  const std::vector<bool>* steady = nullptr;
};

class CudaGraphRunner {
 public:
  /// `max_graphs`: signatures captured at most; further ones run without graphs. `ladder`:
  /// batch sizes to pad up to (sorted here; empty or an unpaddable executable: exact sizes).
  /// `keyed`: per input, whether its identity is part of the signature (see above; empty:
  /// none).
  CudaGraphRunner(const Executable& executable, size_t max_graphs = 64,
                  std::vector<int64_t> ladder = {}, std::vector<bool> keyed = {});
  ~CudaGraphRunner();

  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs, const SteadyInputs& steady = {});
  /// run() on inputs the caller keeps (a direct call keeps its parameters' entries across
  /// calls): a replay reads them in place, and the paths that run the executable copy them.
  std::vector<c10::IValue> run_borrowed(const std::vector<c10::IValue>& inputs,
                                        const SteadyInputs& steady = {});

  size_t num_graphs() const;    ///< graphs currently captured
  size_t num_captures() const;  ///< captures so far (re-captures included)
  size_t num_replays() const;
  size_t num_padded_calls() const;  ///< calls that ran in a larger bucket's graph
  /// Replays launched with cudaGraphLaunch alone: graphs none of whose kernels uses random
  /// numbers (Executable::draws_random_numbers) skip CUDAGraph::replay()'s generator update.
  size_t num_direct_launches() const;
  /// Output buffers allocated because the caller still held tensors on both sets of a graph.
  size_t num_fresh_output_buffers() const;
  /// Times a replay pointed an input's copy node at another tensor than the one the
  /// executable's last launch read, one per input (the same tensor as last time sets nothing).
  size_t num_input_retargets() const;
  /// Calls run without a graph because it would have written its own copy of an input the
  /// caller passed (a written input that is another tensor than the last call's).
  size_t num_ungraphed_calls() const;
  /// Executables of the graphs captured now (each with its own output buffers): two per graph
  /// from its capture (one for a graph that copies no output itself or that draws random
  /// numbers), up to four while its inputs arrive from a few addresses in turn.
  size_t num_executables() const;
  /// Whether calls are padded into the ladder's buckets (a ladder and a paddable executable).
  bool pads() const;
  /// Diagnostics of the host time of replays: with timing on, each replaying call adds the
  /// host time of its stages (signature, lookup, checks, input copies, launch, outputs) to
  /// totals that stage_times() returns in microseconds, with the number of replays timed (turn
  /// it on after warm-up and capture: their signature and lookup time counts, their calls not).
  void set_stage_timing(bool on);
  /// Diagnostics: with false, replays copy every input on the stream before the launch and
  /// leave the graphs' input copy nodes idle (to compare the two ways; default true).
  void set_input_copy_nodes(bool on);
  /// Diagnostics: with false, run() compares every input on every call and ignores what its
  /// SteadyInputs say (to measure what they save; default true).
  void set_steady_inputs(bool on);
  /// Diagnostics: replays pick among at most `n` executables of a graph (clamped to 1..4;
  /// default 4), and graphs get no more than `n` (2: those of the capture alone).
  void set_max_executables(size_t n);
  std::vector<std::pair<std::string, double>> stage_times() const;
  static bool available();  ///< built with CUDA graph support

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace magi::runtime
