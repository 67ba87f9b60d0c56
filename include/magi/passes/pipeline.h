// The one ordered list of passes run on every captured graph, followed by the steps of its
// lowering to an Executable (plan_padding, fold_constants, plan_memory_arena). Both can be switched
// off by name with MAGI_DISABLE_PASSES=name1,name2 (or PipelineOptions, ExecutorOptions), for
// bisecting a problem.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "magi/ir/graph.h"

namespace magi::passes {

struct PassRecord {
  std::string name;
  bool ran = false;  ///< false when disabled
  bool changed = false;
  double milliseconds = 0.0;
};

struct PipelineOptions {
  std::set<std::string> disabled;  ///< merged with MAGI_DISABLE_PASSES
  /// Operators to split at besides those registered as boundaries (CompileConfig.splitting_ops).
  std::vector<std::string> splitting_ops;
  /// Rows per chunk of the chunk_rows pass (CompileConfig.chunk_rows; 0 for training graphs,
  /// which save the intermediates for their backward anyway): 0 switches it off.
  int64_t chunk_rows = 0;
  /// The compiling call's value of each symbolic size (chunk_rows reads them).
  ir::SymbolBindings size_hints;
  bool verify_each = true;  ///< run the verifier after every pass
  /// Called after each pass that changed the graph (dumps hook in here).
  std::function<void(const std::string& pass, const ir::Graph&)> after_pass;
};

/// Names of all passes, in pipeline order, then the lowering steps.
std::vector<std::string> pipeline_pass_names();

/// Does the pass named `name` run, given `disabled` (PipelineOptions::disabled) and
/// MAGI_DISABLE_PASSES?
bool pass_enabled(const std::string& name, const std::set<std::string>& disabled = {});

/// Runs the passes in order; returns one record per pass (not for the lowering steps).
std::vector<PassRecord> run_pipeline(ir::Graph& graph, const PipelineOptions& options = {});

}  // namespace magi::passes
