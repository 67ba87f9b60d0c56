// Binds the executor. Python values cross into IValues here, the run itself happens with the
// GIL released (operators implemented in Python take it back themselves).
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "values.h"

#include <pybind11/stl.h>
#include "magi/common/error.h"
#include "magi/runtime/attention_choice.h"
#include "magi/runtime/cuda_graph.h"
#include "magi/runtime/executor.h"
#include "magi/runtime/fused_kernel.h"
#include "magi/runtime/guard.h"
#include "magi/runtime/offload.h"
#include "magi/runtime/offload_plan.h"

namespace magi::bindings {
namespace {

// The inputs of one run. With `steal`, a list argument is emptied once they are taken, so the
// graph holds the only references and frees each input after its last use.
std::vector<c10::IValue> take_inputs(py::sequence args, bool steal) {
  std::vector<c10::IValue> inputs;
  inputs.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) inputs.push_back(to_ivalue(args[i], i));
  if (steal && py::isinstance<py::list>(args)) args.attr("clear")();
  return inputs;
}

runtime::OffloadOptions offload_options(const py::dict& d) {
  runtime::OffloadOptions o;
  for (auto [key, value] : d) {
    const std::string k = key.cast<std::string>();
    if (k == "policy") {
      o.policy = runtime::parse_offload_policy(value.cast<std::string>());
    } else if (k == "resident_ratio") {
      o.resident_ratio = value.cast<double>();
    } else if (k == "safety_factor") {
      o.safety_factor = value.cast<double>();
    } else if (k == "link_gbps") {
      o.link_bytes_per_us = value.cast<double>() * 1e3;
    } else if (k == "lookahead") {
      o.lookahead = value.cast<size_t>();
    } else if (k == "alignment") {
      o.alignment = value.cast<int64_t>();
    } else if (k == "prefetch_across_calls") {
      o.prefetch_across_calls = value.cast<bool>();
    } else {
      MAGI_CHECK(false, "offload settings: unknown key '", k, "'");
    }
  }
  return o;
}

py::dict report_dict(const runtime::OffloadReport& r) {
  py::dict d;
  d["policy"] = r.policy;
  d["source"] = r.source;
  d["plan_version"] = r.plan_version;
  d["weights"] = r.weights;
  d["groups"] = r.groups;
  d["total_bytes"] = r.total_bytes;
  d["resident_bytes"] = r.resident_bytes;
  d["streamed_bytes"] = r.streamed_bytes;
  d["buffer_bytes"] = r.buffer_bytes;
  d["link_gbps"] = r.link_gbps;
  d["predicted_compute_ms"] = r.predicted_compute_ms;
  d["predicted_copy_ms"] = r.predicted_copy_ms;
  d["predicted_call_ms"] = r.predicted_call_ms;
  d["predicted_overlap"] = r.predicted_overlap;
  d["ratio_to_hide"] = r.ratio_to_hide;
  d["hidden"] = r.hidden;
  d["measured_call_ms"] = r.measured_call_ms;
  d["measured_compute_ms"] = r.measured_compute_ms;
  d["measured_overlap"] = r.measured_overlap;
  d["calls"] = r.calls;
  return d;
}

py::dict plan_dict(const runtime::OffloadPlan& plan) {
  py::dict d;
  d["policy"] = runtime::offload_policy_name(plan.policy);
  d["resident"] = plan.resident;
  d["offset"] = plan.offset;
  py::list groups;
  for (const auto& g : plan.groups) {
    py::dict gd;
    gd["weights"] = g.weights;
    gd["bytes"] = g.bytes;
    gd["first_use"] = g.first_use;
    gd["release"] = g.release;
    gd["gate"] = g.gate;
    gd["wraps"] = g.wraps;
    groups.append(gd);
  }
  d["groups"] = groups;
  d["total_bytes"] = plan.total_bytes;
  d["resident_bytes"] = plan.resident_bytes;
  d["streamed_bytes"] = plan.streamed_bytes;
  d["buffer_bytes"] = plan.buffer_bytes;
  d["compute_us"] = plan.compute_us;
  d["copy_us"] = plan.copy_us;
  d["call_us"] = plan.call_us;
  d["stall_us"] = plan.stall_us;
  d["overlap"] = plan.overlap;
  d["ratio_to_hide"] = plan.ratio_to_hide;
  d["hidden"] = plan.hidden();
  d["summary"] = plan.summary();
  return d;
}

}  // namespace

void bind_runtime(py::module_& m) {
  m.def(
      "plan_offload",
      [](const std::vector<double>& step_us, const std::vector<py::dict>& weights,
         const py::dict& settings) {
        std::vector<runtime::OffloadWeight> ws;
        for (const py::dict& w : weights) {
          runtime::OffloadWeight o;
          o.bytes = w["bytes"].cast<int64_t>();
          o.first_use = w["first_use"].cast<size_t>();
          o.last_use = w.contains("last_use") ? w["last_use"].cast<size_t>() : o.first_use;
          o.must_stay = w.contains("must_stay") && w["must_stay"].cast<bool>();
          ws.push_back(o);
        }
        return plan_dict(runtime::plan_offload(step_us, ws, offload_options(settings)));
      },
      py::arg("step_us"), py::arg("weights"), py::arg("settings"),
      "Plans weight offload for a synthetic program (offload_plan.h): step times in us, "
      "weights as dicts of bytes, first_use, last_use, must_stay; settings as for Executable.");
  m.def(
      "offload_to_host",
      [](const at::Tensor& t, const std::string& device) {
        return runtime::offload_to_host(t, c10::Device(device));
      },
      py::arg("tensor"), py::arg("device"),
      "A copy of `tensor` in pinned host memory, as a tensor on `device` (cuda:N or cpu).");
  m.def(
      "offloaded_view",
      [](const at::Tensor& t, const std::string& device) {
        return runtime::offloaded_view(t, c10::Device(device));
      },
      py::arg("tensor"), py::arg("device"), "The same offloaded memory seen from `device`.");
  m.def("is_offloaded", &runtime::is_offloaded, py::arg("tensor"));
  m.def("offload_host_bytes", &runtime::offload_host_bytes,
        "Pinned host bytes held for offloaded weights.");
  m.def("offload_resident_bytes", &runtime::resident_cache_bytes,
        "GPU bytes held for resident copies of offloaded weights.");
  m.def("host_link_gbps", &runtime::host_link_gbps, py::arg("device") = 0,
        "Measured pinned host-to-device copy rate in GB/s (once per device).");

  // CUDA-graph runners' getters and setters (the Executable's counters over its pieces'
  // runners among them) take the runners' lock, which a call in another thread holds while it
  // may wait for the GIL (a custom op's Python body): they let the GIL go first.
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  auto without_gil = [&no_gil](auto getter) { return py::cpp_function(getter, no_gil); };
  py::class_<runtime::Executable>(m, "Executable",
                                  "A graph lowered for the C++ executor (boxed ATen calls).")
      .def(py::init([](const ir::Graph& g, const std::string& attention_backend,
                       int64_t private_outputs_from, std::optional<py::dict> offload,
                       bool memory_arena, const std::vector<std::string>& disabled_passes) {
             runtime::ExecutorOptions options;
             options.memory_arena = memory_arena;
             options.disabled.insert(disabled_passes.begin(), disabled_passes.end());
             options.attention = runtime::parse_attention_backend(attention_backend);
             if (private_outputs_from >= 0) {
               options.private_outputs_from = static_cast<size_t>(private_outputs_from);
             }
             if (offload) options.offload = offload_options(*offload);
             return std::make_unique<runtime::Executable>(g, options);
           }),
           py::arg("graph"), py::arg("attention_backend") = "auto",
           py::arg("private_outputs_from") = -1, py::arg("offload") = py::none(),
           py::arg("memory_arena") = true, py::arg("disabled_passes") = std::vector<std::string>{},
           "Lowers `graph`. attention_backend: how CUDA SDPA calls of inference graphs pick "
           "their kernel (auto, graph, flash, cudnn, efficient; docs/config.md). "
           "private_outputs_from: outputs from this index on (a training forward's saved "
           "tensors) reach only the backward and may share values kept across calls. "
           "offload: weight offload settings (policy, resident_ratio, safety_factor, lookahead, "
           "prefetch_across_calls); inputs in offloaded host memory are then streamed. "
           "memory_arena: plan intermediates into the memory arena (inference graphs). "
           "disabled_passes: pipeline names to skip; the lowering steps fold_constants and "
           "plan_memory_arena among them are skipped here.")
      .def(
          "run",
          [](const runtime::Executable& exe, py::sequence args, bool steal_inputs) {
            std::vector<c10::IValue> inputs = take_inputs(args, steal_inputs);
            std::vector<c10::IValue> outputs;
            {
              py::gil_scoped_release no_gil;
              outputs = exe.run(std::move(inputs));
            }
            py::list result(outputs.size());
            for (size_t i = 0; i < outputs.size(); ++i) result[i] = to_python(outputs[i]);
            return result;
          },
          py::arg("args"), py::arg("steal_inputs") = false,
          "Runs the graph; returns the list of its outputs. With steal_inputs, `args` (a list) is "
          "emptied before the run, so each input is freed after its last use in the graph (the "
          "boxed calling convention; a backward's saved tensors).")
      .def(
          "precompile_kernels",
          [](const runtime::Executable& exe) {
            py::gil_scoped_release no_gil;
            return exe.precompile_kernels();
          },
          "Compiles the CUDA kernels the first call is expected to need, in parallel; returns "
          "how many.")
      .def_property_readonly("num_inputs", &runtime::Executable::num_inputs)
      .def_property_readonly("num_outputs", &runtime::Executable::num_outputs)
      .def_property_readonly("num_instructions", &runtime::Executable::num_instructions)
      .def_property_readonly("num_operator_calls", &runtime::Executable::num_operator_calls)
      .def_property_readonly("num_constant_instructions",
                             &runtime::Executable::num_constant_instructions,
                             "Instructions that read only constants: run by the first call only.")
      .def_property_readonly("num_folded_values", &runtime::Executable::num_folded_values,
                             "Results of constant instructions kept by the first call.")
      .def("enable_piece_cuda_graphs", &runtime::Executable::enable_piece_cuda_graphs,
           py::arg("max_graphs") = 64, py::arg("ladder") = std::vector<int64_t>{},
           py::arg("keyed_inputs") = std::vector<bool>{})
      .def_property_readonly(
          "padding", [](const runtime::Executable& e) { return e.padding().str(); },
          "Whether calls may be padded along a dynamic batch dim into CUDA-graph buckets, "
          "and how (or why not).")
      .def_property_readonly(
          "piece_paddings",
          [](const runtime::Executable& e) {
            std::vector<std::string> out;
            for (size_t i = 0; i < e.num_pieces(); ++i) out.push_back(e.piece(i).padding().str());
            return out;
          },
          "padding of each piece.")
      .def_property_readonly("num_piece_padded_calls",
                             without_gil(&runtime::Executable::num_piece_padded_calls))
      .def_property_readonly("draws_random_numbers", &runtime::Executable::draws_random_numbers,
                             "Whether some operator may draw random numbers its results depend "
                             "on (random ops, attention with dropout, custom ops).")
      .def_property_readonly("calls_custom_ops", &runtime::Executable::calls_custom_ops,
                             "Whether some instruction, pieces included, calls a custom "
                             "(non-ATen) operator.")
      .def_property_readonly("num_piece_graph_captures",
                             without_gil(&runtime::Executable::num_piece_graph_captures))
      .def_property_readonly("num_piece_graphs",
                             without_gil(&runtime::Executable::num_piece_graphs),
                             "CUDA graphs of the pieces captured now (PIECEWISE).")
      .def_property_readonly("num_fusions", &runtime::Executable::num_fusions,
                             "Fusion nodes (generated kernels) run per call, pieces included.")
      .def_property_readonly(
          "arena_stats",
          [](const runtime::Executable& exe) {
            const runtime::Executable::ArenaStats s = exe.arena_stats();
            py::dict d;
            d["planned_values"] = s.planned_values;
            d["runs"] = s.runs;
            d["last_bytes"] = s.last_bytes;
            d["last_peak_live"] = s.last_peak_live;
            d["unplanned_copies"] = s.unplanned_copies;
            return d;
          },
          "The memory arena: values chosen at lowering (pieces included), runs whose layout "
          "placed some value, the last run's largest block and the most bytes live in it at "
          "once, and results copied off it because an operator aliased it undeclared.")
      .def_property_readonly(
          "lowering_steps",
          [](const runtime::Executable& exe) {
            py::list out;
            for (const runtime::LoweringStep& s : exe.lowering_steps()) {
              py::dict d;
              d["name"] = s.name;
              d["ran"] = s.ran;
              d["ms"] = s.milliseconds;
              out.append(d);
            }
            return out;
          },
          "The lowering steps after the passes (plan_padding, fold_constants, "
          "plan_memory_arena), in order: name, ran, ms (this graph and its pieces).")
      .def_property_readonly("num_in_place_outputs", &runtime::Executable::num_in_place_outputs,
                             "Generated-kernel calls so far, pieces included, that wrote an "
                             "output over an input at its last use instead of a new buffer.")
      .def(
          "generated_kernels",
          [](const runtime::Executable& exe) {
            py::list out;
            for (const auto& k : exe.generated_kernels()) {
              py::dict d;
              d["symbol"] = k.symbol;
              d["target"] = k.target;
              d["source"] = k.source;
              d["fused_ops"] = k.fused_ops;
              out.append(d);
            }
            return out;
          },
          "Kernel variants generated and compiled so far: symbol, target, source, fused_ops.")
      .def(
          "offload_report",
          [](const runtime::Executable& exe) -> py::object {
            auto r = exe.offload_report();
            return r ? py::object(report_dict(*r)) : py::object(py::none());
          },
          "The weight offload plan and its measurements (a dict), or None without offload or "
          "before the first call with offloaded weights.")
      .def_property_readonly("num_piece_calls", &runtime::Executable::num_piece_calls)
      .def_property_readonly("num_pieces", &runtime::Executable::num_pieces)
      .def_property_readonly("num_chunked_pieces", &runtime::Executable::num_chunked_pieces)
      .def_property_readonly("piece_call_sequence", &runtime::Executable::piece_call_sequence,
                             "For each piece call, in order, the index of the piece it runs.");

  m.def("default_bucket_ladder", &runtime::default_bucket_ladder,
        "Batch sizes CUDA graphs are captured for when compile_sizes is empty.");
  py::class_<runtime::CudaGraphRunner>(m, "CudaGraphRunner",
                                       "Captures and replays an Executable as CUDA graphs.")
      .def(py::init<const runtime::Executable&, size_t, std::vector<int64_t>, std::vector<bool>>(),
           py::arg("executable"), py::arg("max_graphs") = 64,
           py::arg("ladder") = std::vector<int64_t>{}, py::arg("keyed") = std::vector<bool>{},
           py::keep_alive<1, 2>())
      .def(
          "run",
          [](runtime::CudaGraphRunner& runner, py::sequence args, bool steal_inputs) {
            std::vector<c10::IValue> inputs = take_inputs(args, steal_inputs);
            std::vector<c10::IValue> outputs;
            {
              py::gil_scoped_release no_gil;
              outputs = runner.run(std::move(inputs));
            }
            py::list result(outputs.size());
            for (size_t i = 0; i < outputs.size(); ++i) result[i] = to_python(outputs[i]);
            return result;
          },
          py::arg("args"), py::arg("steal_inputs") = false)
      .def_property_readonly("num_graphs", without_gil(&runtime::CudaGraphRunner::num_graphs))
      .def_property_readonly("num_captures", without_gil(&runtime::CudaGraphRunner::num_captures))
      .def_property_readonly("num_replays", without_gil(&runtime::CudaGraphRunner::num_replays))
      .def_property_readonly("num_padded_calls",
                             without_gil(&runtime::CudaGraphRunner::num_padded_calls))
      .def_property_readonly("num_direct_launches",
                             without_gil(&runtime::CudaGraphRunner::num_direct_launches))
      .def_property_readonly("num_fresh_output_buffers",
                             without_gil(&runtime::CudaGraphRunner::num_fresh_output_buffers))
      .def_property_readonly(
          "num_input_retargets", without_gil(&runtime::CudaGraphRunner::num_input_retargets),
          "Times an input copy node was pointed at another tensor (per input and replay).")
      .def_property_readonly("num_ungraphed_calls",
                             without_gil(&runtime::CudaGraphRunner::num_ungraphed_calls),
                             "Calls run without a graph because the graph would have written "
                             "its copy of an input (a written input passed as another tensor).")
      .def_property_readonly("num_executables",
                             without_gil(&runtime::CudaGraphRunner::num_executables),
                             "Executables of the graphs captured now, each writing its own "
                             "output buffers (two per graph from its capture, up to four while "
                             "its inputs arrive from a few addresses in turn).")
      .def_property_readonly("pads", &runtime::CudaGraphRunner::pads)
      .def("set_input_copy_nodes", &runtime::CudaGraphRunner::set_input_copy_nodes, py::arg("on"),
           no_gil,
           "Diagnostics: False copies inputs on the stream before each launch instead of "
           "through the graphs' copy nodes (default True).")
      .def("set_steady_inputs", &runtime::CudaGraphRunner::set_steady_inputs, py::arg("on"), no_gil,
           "Diagnostics: False compares every input on every call, ignoring a direct call's "
           "word that its parameters are the tensors the last call checked (default True).")
      .def("set_max_executables", &runtime::CudaGraphRunner::set_max_executables, py::arg("n"),
           no_gil,
           "Diagnostics: replays pick among at most n executables of a graph, and graphs get "
           "no more than n (clamped to 1..4; default 4; 2 keeps those of the capture alone).")
      .def("set_stage_timing", &runtime::CudaGraphRunner::set_stage_timing, py::arg("on"), no_gil,
           "Diagnostics: time the host stages of each replaying call (see stage_times).")
      .def("stage_times", &runtime::CudaGraphRunner::stage_times, no_gil,
           "Host microseconds per stage summed over the replays timed, and their count.")
      .def_static("available", &runtime::CudaGraphRunner::available);

  runtime::set_failure_cleanup([] {
    py::gil_scoped_acquire gil;
    PyErr_Clear();
  });
  m.def(
      "attention_choices",
      [] {
        py::list out;
        for (const auto& c : runtime::attention_choices()) {
          py::dict d;
          d["shape"] = c.shape;
          d["traced"] = c.traced;
          d["chosen"] = c.chosen;
          py::dict ms;
          for (const auto& [name, t] : c.ms) ms[py::str(name)] = t;
          d["ms"] = ms;
          d["rejected"] = c.rejected;
          out.append(d);
        }
        return out;
      },
      "The attention kernels chosen by probing (attention_backend=auto) in this process: shape, "
      "traced backend, chosen backend, median ms per backend timed, backends left out and why.");
  m.def("clear_attention_choices", &runtime::clear_attention_choices,
        "Forgets the attention choices; the next call of each shape probes again.");

  py::class_<runtime::GuardSignature>(m, "GuardSignature",
                                      "The input signature a compiled entry was captured for.")
      .def(py::init([](py::sequence args, std::vector<std::vector<int64_t>> dynamic_dims,
                       bool training) {
             return runtime::GuardSignature(guard_inputs(args), dynamic_dims, training);
           }),
           py::arg("args"), py::arg("dynamic_dims"), py::arg("training"))
      .def(
          "matches",
          [](const runtime::GuardSignature& g, py::sequence args, bool training) {
            return g.matches(guard_inputs(args), training);
          },
          py::arg("args"), py::arg("training"))
      .def(
          "mismatch",
          [](const runtime::GuardSignature& g, py::sequence args, bool training) {
            return g.mismatch(guard_inputs(args), training);
          },
          py::arg("args"), py::arg("training"))
      .def("__str__", &runtime::GuardSignature::str);
}

}  // namespace magi::bindings
