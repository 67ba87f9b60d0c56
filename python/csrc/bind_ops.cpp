// Binds the operator registry (ir/op_registry.h): magi_register_custom_op records the flags of
// its operators here, and tests read them back.
#include <pybind11/stl.h>

#include "bindings.h"
#include "magi/ir/op_registry.h"

namespace magi::bindings {

void bind_ops(py::module_& m) {
  m.def(
      "set_op_flags",
      [](const std::string& name, bool compute_sensitive, bool subgraph_boundary) {
        ir::OpRegistry::global().set_flags(name, {compute_sensitive, subgraph_boundary});
      },
      py::arg("name"), py::kw_only(), py::arg("compute_sensitive") = false,
      py::arg("subgraph_boundary") = false,
      "Records the flags of operator `name` ('ns::op' or 'ns::op.overload'); read when a graph "
      "is compiled.");
  m.def(
      "op_flags",
      [](const std::string& name) -> py::object {
        auto flags = ir::OpRegistry::global().registered(name);
        if (!flags) return py::none();
        py::dict d;
        d["compute_sensitive"] = flags->compute_sensitive;
        d["subgraph_boundary"] = flags->subgraph_boundary;
        return d;
      },
      py::arg("name"), "The flags registered under `name`, or None.");
  m.def(
      "clear_op_flags",
      [](const std::string& name) { return ir::OpRegistry::global().erase(name); }, py::arg("name"),
      "Forgets the flags of `name`; returns whether it had any.");
  m.def(
      "registered_op_names",
      [] {
        std::vector<std::string> names;
        for (const auto& [name, flags] : ir::OpRegistry::global().entries()) names.push_back(name);
        return names;
      },
      "Names with registered flags, sorted.");
  m.def("canonical_op_name", &ir::canonical_op_name, py::arg("name"),
        "'ns.op.default' -> 'ns::op'; raises UserError for a name without a namespace.");
  m.def("is_default_compute_sensitive", &ir::is_default_compute_sensitive, py::arg("name"),
        "Is this ATen operator ('aten::mm') compute-sensitive without being registered?");
}

}  // namespace magi::bindings
