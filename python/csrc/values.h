// Python values as the runtime sees them, and back: the conversions every binding that runs a
// graph shares (graph inputs, guard inputs, outputs).
#pragma once

#include <ATen/core/ivalue.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "magi/runtime/guard.h"

namespace magi::bindings {

namespace py = pybind11;

/// One graph input: a tensor, None, bool, int, float or a list of tensors. Anything else is a
/// UserError naming input `position`.
c10::IValue to_ivalue(py::handle h, size_t position);

/// A graph output back to Python (tensors, None, scalars, lists of them).
py::object to_python(const c10::IValue& v);

/// One argument as the guard signature compares it: tensors and scalars (int, float, bool,
/// str, None); nullopt for anything else, which the signature does not compare.
runtime::GuardInput guard_input(PyObject* obj);
std::vector<runtime::GuardInput> guard_inputs(py::sequence args);

}  // namespace magi::bindings
