// The recompute planner for Python's partition_fn: plan_recompute over an imported joint graph,
// returning the FX names to recompute and the figures of the report.
#include "bindings.h"

#include <pybind11/stl.h>

#include "magi/passes/passes.h"
#include "magi/passes/pipeline.h"
#include "magi/passes/plan_recompute.h"

namespace magi::bindings {

void bind_recompute(py::module_& m) {
  m.def(
      "plan_recompute",
      [](const ir::Graph& joint, const std::string& policy, double memory_budget,
         int64_t memory_budget_bytes, const std::vector<std::string>& compute_sensitive_ops,
         const std::unordered_map<std::string, int64_t>& size_hints,
         const std::vector<std::string>& forward_names, size_t num_forward_outputs,
         const std::vector<std::string>& disabled_passes) {
        passes::RecomputeOptions options;
        options.policy = passes::parse_recompute_policy(policy);
        options.memory_budget = memory_budget;
        options.peak_budget_bytes = memory_budget_bytes;
        options.compute_sensitive_ops = compute_sensitive_ops;
        options.size_hints = ir::SymbolBindings(size_hints.begin(), size_hints.end());
        options.forward_names.insert(forward_names.begin(), forward_names.end());
        options.num_forward_outputs = num_forward_outputs;
        options.grouped_attention = passes::pass_enabled(
            "group_query_attention", {disabled_passes.begin(), disabled_passes.end()});
        const passes::RecomputePlan plan = passes::plan_recompute(joint, options);
        py::dict d;
        d["policy"] = passes::recompute_policy_name(plan.policy);
        d["recomputed"] = plan.recomputed_names();
        d["num_recomputed_ops"] = plan.recomputed_ops.size();
        d["saved"] = plan.saved_names();
        std::vector<std::string> kept;
        for (const ir::Node* n : plan.kept) kept.push_back(n->provenance().fx_name);
        d["kept"] = kept;
        d["saved_bytes"] = plan.saved_bytes;
        d["no_recompute_bytes"] = plan.no_recompute_bytes;
        d["recomputed_bytes"] = plan.recomputed_bytes;
        d["predicted_peak_bytes"] = plan.predicted_peak_bytes;
        d["predicted_forward_peak_bytes"] = plan.predicted_forward_peak_bytes;
        d["no_recompute_peak_bytes"] = plan.no_recompute_peak_bytes;
        d["lowest_peak_bytes"] = plan.lowest_peak_bytes;
        d["recompute_seconds"] = plan.recompute_seconds;
        d["step_seconds"] = plan.step_seconds;
        d["budget_met"] = plan.budget_met;
        d["note"] = plan.note;
        d["report"] = plan.report();
        return d;
      },
      py::arg("joint"), py::arg("policy") = "HEURISTIC", py::arg("memory_budget") = 0.5,
      py::arg("memory_budget_bytes") = 0,
      py::arg("compute_sensitive_ops") = std::vector<std::string>{},
      py::arg("size_hints") = std::unordered_map<std::string, int64_t>{},
      py::arg("forward_names") = std::vector<std::string>{}, py::arg("num_forward_outputs") = 0,
      py::arg("disabled_passes") = std::vector<std::string>{},
      "Plans recomputation for a joint forward+backward graph (passes/plan_recompute.h): which "
      "forward nodes (FX names) the backward recomputes, which values it saves, and the report.");
  m.def(
      "simulate_peak",
      [](const ir::Graph& graph, const std::unordered_map<std::string, int64_t>& size_hints,
         const std::vector<bool>& counted_inputs) {
        const passes::ProgramPeak peak = passes::simulate_peak(
            graph, ir::SymbolBindings(size_hints.begin(), size_hints.end()), counted_inputs);
        py::dict d;
        d["bytes"] = peak.bytes;
        d["node"] = peak.node;
        d["where"] = peak.where;
        return d;
      },
      py::arg("graph"), py::arg("size_hints") = std::unordered_map<std::string, int64_t>{},
      py::arg("counted_inputs") = std::vector<bool>{},
      "The most tensor memory a lowered graph holds at once, simulated in node order "
      "(passes::simulate_peak): {'bytes', 'node', 'where'}. Inputs flagged False in "
      "`counted_inputs` are not counted (parameters).");
}

}  // namespace magi::bindings
