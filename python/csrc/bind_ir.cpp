// Read-only view of the graph IR for Python: printing, verification, inspection (tests and
// dumps use it), and the pass pipeline.
#include "bindings.h"

#include <pybind11/stl.h>

#include "magi/ir/dot_printer.h"
#include "magi/ir/fallbacks.h"
#include "magi/ir/graph.h"
#include "magi/ir/op_registry.h"
#include "magi/ir/printer.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "magi/passes/pipeline.h"
#include "magi/passes/recognize_attention.h"

namespace magi::bindings {

void bind_ir(py::module_& m) {
  py::class_<ir::Graph>(m, "Graph", "A captured graph in magi-compiler's C++ IR.")
      .def("__str__", [](const ir::Graph& g) { return ir::to_string(g); })
      .def(
          "to_string",
          [](const ir::Graph& g, bool types, bool source) {
            return ir::to_string(g, ir::PrintOptions{types, source});
          },
          py::arg("types") = true, py::arg("source") = true)
      .def("verify", [](const ir::Graph& g) { ir::verify(g); })
      .def("verify_errors", [](const ir::Graph& g) { return ir::verify_errors(g); })
      .def_property_readonly("num_nodes", &ir::Graph::num_nodes)
      .def_property_readonly("num_inputs", [](const ir::Graph& g) { return g.inputs().size(); })
      .def_property_readonly("num_outputs", [](const ir::Graph& g) { return g.outputs().size(); })
      .def(
          "op_names",
          [](const ir::Graph& g) {
            std::vector<std::string> names;
            for (const ir::Node* n : g.nodes()) {
              if (n->is_operator() || n->kind() == ir::NodeKind::kSymArith ||
                  n->kind() == ir::NodeKind::kGetItem) {
                names.push_back(n->op_name());
              }
            }
            return names;
          },
          "Operators and symbolic ops in execution order ('aten::mm', 'size', ...).")
      .def("nodes",
           [](const ir::Graph& g) {
             // (kind, op name, output type strings, FX name, source) per node.
             py::list out;
             for (const ir::Node* n : g.nodes()) {
               std::vector<std::string> types;
               for (const ir::Value* v : n->outputs()) types.push_back(v->type_str());
               out.append(py::make_tuple(ir::node_kind_name(n->kind()), n->op_name(), types,
                                         n->provenance().fx_name, n->provenance().source));
             }
             return out;
           })
      .def("input_types",
           [](const ir::Graph& g) {
             std::vector<std::string> out;
             for (const ir::Value* v : g.inputs()) {
               out.push_back(v->kind() == ir::ValueKind::kInt && v->sym()
                                 ? "int(" + v->sym()->str() + ")"
                                 : v->type_str());
             }
             return out;
           })
      .def("output_types",
           [](const ir::Graph& g) {
             std::vector<std::string> out;
             for (const ir::Value* v : g.outputs()) out.push_back(v->type_str());
             return out;
           })
      .def_property_readonly("pieces", &ir::Graph::pieces,
                             py::return_value_policy::reference_internal,
                             "The distinct pieces this graph calls (empty when it was not split).")
      .def_property_readonly(
          "num_piece_calls",
          [](const ir::Graph& g) {
            size_t n = 0;
            for (const ir::Node* node : g.nodes()) n += node->kind() == ir::NodeKind::kCallPiece;
            return n;
          },
          "Calls of pieces per run (0 when the graph was not split).")
      .def(
          "boundary_op_names",
          [](const ir::Graph& g, const std::vector<std::string>& splitting_ops) {
            std::vector<std::string> names;
            for (const ir::Node* n : g.nodes()) {
              if (passes::is_boundary_call(*n, splitting_ops)) names.push_back(n->op_name());
            }
            return names;
          },
          py::arg("splitting_ops") = std::vector<std::string>{},
          "Calls of this graph (not of its pieces) that are subgraph boundaries, in order.")
      .def(
          "compute_sensitive_op_names",
          [](const ir::Graph& g) {
            std::vector<std::string> names;
            for (const ir::Node* n : g.nodes()) {
              if (ir::is_compute_sensitive(*n)) names.push_back(n->op_name());
            }
            return names;
          },
          "Operators of this graph (not of its pieces) whose outputs are expensive to recompute.")
      .def(
          "run_pipeline",
          [](ir::Graph& g, const std::vector<std::string>& disabled,
             const std::vector<std::string>& splitting_ops, py::object after_pass,
             int64_t chunk_rows, const std::unordered_map<std::string, int64_t>& size_hints) {
            passes::PipelineOptions options;
            options.chunk_rows = chunk_rows;
            options.size_hints = ir::SymbolBindings(size_hints.begin(), size_hints.end());
            options.disabled.insert(disabled.begin(), disabled.end());
            options.splitting_ops = splitting_ops;
            if (!after_pass.is_none()) {
              options.after_pass = [&after_pass](const std::string& pass, const ir::Graph&) {
                after_pass(pass);
              };
            }
            py::list records;
            for (const auto& r : passes::run_pipeline(g, options)) {
              py::dict d;
              d["name"] = r.name;
              d["ran"] = r.ran;
              d["changed"] = r.changed;
              d["ms"] = r.milliseconds;
              records.append(d);
            }
            return records;
          },
          py::arg("disabled") = std::vector<std::string>{},
          py::arg("splitting_ops") = std::vector<std::string>{}, py::arg("after_pass") = py::none(),
          py::arg("chunk_rows") = 0,
          py::arg("size_hints") = std::unordered_map<std::string, int64_t>{},
          "Runs the pass pipeline in place; returns one record per pass. `splitting_ops` names "
          "operators to split at besides those registered as subgraph boundaries; "
          "`after_pass(name)` is called after each pass that changed the graph (dumps); "
          "`chunk_rows`: rows per chunk of the chunk_rows pass (0: off); `size_hints`: the "
          "compiling call's value of each symbolic size.")
      .def(
          "to_dot",
          [](const ir::Graph& g, const std::string& detail,
             const std::vector<std::string>& splitting_ops) {
            ir::DotOptions options;
            options.detail = ir::parse_dot_detail(detail);
            options.is_boundary = [&splitting_ops](const ir::Node& n) {
              return passes::is_boundary_call(n, splitting_ops);
            };
            return ir::to_dot(g, options);
          },
          py::arg("detail") = "shape", py::arg("splitting_ops") = std::vector<std::string>{},
          "Graphviz DOT of the graph; `detail` is op, shape or source (how much labels show).")
      .def(
          "aten_fallbacks",
          [](const ir::Graph& g) {
            py::list out;
            for (const auto& f : ir::aten_fallbacks(g)) {
              py::dict d;
              d["op"] = f.op;
              d["name"] = f.name;
              d["source"] = f.source;
              d["where"] = f.where;
              d["reason"] = f.reason;
              out.append(d);
            }
            return out;
          },
          "ATen calls outside fusion groups (pieces included), each with why it was not fused.");

  m.def("pipeline_pass_names", &passes::pipeline_pass_names);
  m.def(
      "attention_patterns",
      [] {
        py::list out;
        for (const auto& p : passes::attention_patterns()) {
          py::dict d;
          d["where"] = p.where;
          d["rewritten"] = p.rewritten;
          d["detail"] = p.detail;
          if (!p.pass.empty()) d["pass"] = p.pass;
          out.append(d);
        }
        return out;
      },
      "Every decision of the recognize_attention pass in this process, oldest first: where "
      "(the softmax), rewritten, detail (the call made, or why the chain was left as written); "
      "recognize_causal_masks' decisions carry pass='recognize_causal_masks'.");
  m.def("clear_attention_patterns", &passes::clear_attention_patterns);
}

}  // namespace magi::bindings
