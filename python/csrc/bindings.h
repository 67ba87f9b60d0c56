// One entry point per binding area; module.cpp calls them in order.
#pragma once

#include <pybind11/pybind11.h>

namespace magi::bindings {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_ir(py::module_& m);
void bind_import(py::module_& m);
void bind_runtime(py::module_& m);
void bind_dispatch(py::module_& m);
void bind_ops(py::module_& m);
void bind_codegen(py::module_& m);
void bind_recompute(py::module_& m);

}  // namespace magi::bindings
