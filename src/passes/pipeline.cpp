// The pass pipeline: the order of passes lives here and only here.
#include "magi/passes/pipeline.h"

#include <chrono>
#include <cstdlib>
#include <sstream>

#include "magi/common/log.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "magi/passes/recognize_attention.h"

namespace magi::passes {
namespace {

struct PassEntry {
  const char* name;
  bool (*run)(ir::Graph&, const PipelineOptions&);
};

// The passes in the order they run; docs/passes.md describes each. Passes after
// split_at_boundaries that work on straight-line code (fusion) recurse into each piece.
constexpr PassEntry kPipeline[] = {
    {"eliminate_dead_code",
     [](ir::Graph& g, const PipelineOptions&) { return eliminate_dead_code(g); }},
    {"eliminate_common_subexpressions",
     [](ir::Graph& g, const PipelineOptions& o) {
       return eliminate_common_subexpressions(g, o.splitting_ops);
     }},
    {"constants_to_device",
     [](ir::Graph& g, const PipelineOptions&) { return constants_to_device(g); }},
    {"recognize_attention",
     [](ir::Graph& g, const PipelineOptions&) { return recognize_attention(g); }},
    {"recognize_causal_masks",
     [](ir::Graph& g, const PipelineOptions&) { return recognize_causal_masks(g); }},
    {"group_query_attention",
     [](ir::Graph& g, const PipelineOptions&) { return group_query_attention(g); }},
    {"write_inputs_in_place",
     [](ir::Graph& g, const PipelineOptions& o) {
       return write_inputs_in_place(g, o.splitting_ops);
     }},
    {"split_at_boundaries",
     [](ir::Graph& g, const PipelineOptions& o) {
       return split_at_boundaries(g, o.splitting_ops);
     }},
    {"chunk_rows",
     [](ir::Graph& g, const PipelineOptions& o) {
       return chunk_rows(g, o.chunk_rows, o.size_hints);
     }},
    {"fuse_groups", [](ir::Graph& g, const PipelineOptions&) { return fuse_groups(g); }},
};

// Steps of lowering a graph to an Executable (src/runtime/lower_program.cpp), after the passes,
// switched off by name like them.
constexpr const char* kLoweringSteps[] = {"plan_padding", "fold_constants", "plan_memory_arena"};

bool known_name(const std::string& name) {
  for (const auto& p : kPipeline) {
    if (name == p.name) return true;
  }
  for (const char* step : kLoweringSteps) {
    if (name == step) return true;
  }
  return false;
}

std::set<std::string> disabled_from_env() {
  std::set<std::string> out;
  const char* env = std::getenv("MAGI_DISABLE_PASSES");
  if (env == nullptr) return out;
  std::stringstream ss(env);
  std::string name;
  while (std::getline(ss, name, ',')) {
    if (!name.empty()) out.insert(name);
  }
  return out;
}

}  // namespace

bool pass_enabled(const std::string& name, const std::set<std::string>& disabled) {
  MAGI_ASSERT(known_name(name), "pass_enabled: no pass is named '", name, "'");
  return !disabled.count(name) && !disabled_from_env().count(name);
}

std::vector<std::string> pipeline_pass_names() {
  std::vector<std::string> names;
  for (const auto& p : kPipeline) names.emplace_back(p.name);
  for (const char* step : kLoweringSteps) names.emplace_back(step);
  return names;
}

std::vector<PassRecord> run_pipeline(ir::Graph& graph, const PipelineOptions& options) {
  std::set<std::string> disabled = disabled_from_env();
  disabled.insert(options.disabled.begin(), options.disabled.end());
  std::string known_names;
  for (const std::string& n : pipeline_pass_names()) {
    known_names += (known_names.empty() ? "" : ", ") + n;
  }
  for (const auto& name : disabled) {
    MAGI_CHECK(
        known_name(name), "cannot disable unknown pass '", name,
        "' (from PipelineOptions::disabled or MAGI_DISABLE_PASSES); known passes: ", known_names);
  }
  std::vector<PassRecord> records;
  for (const auto& pass : kPipeline) {
    PassRecord record{pass.name};
    if (!disabled.count(pass.name)) {
      auto start = std::chrono::steady_clock::now();
      record.changed = pass.run(graph, options);
      record.ran = true;
      record.milliseconds =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      if (options.verify_each) ir::verify(graph);
      if (record.changed && options.after_pass) options.after_pass(pass.name, graph);
      MAGI_LOG_DEBUG("pass ", pass.name, record.changed ? " changed the graph" : " made no change",
                     " in ", record.milliseconds, " ms");
    }
    records.push_back(record);
  }
  return records;
}

}  // namespace magi::passes
