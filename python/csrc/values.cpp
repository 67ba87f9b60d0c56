// Python values as the runtime sees them, and back (values.h).
#include "values.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "magi/common/error.h"

namespace magi::bindings {

c10::IValue to_ivalue(py::handle h, size_t position) {
  PyObject* obj = h.ptr();
  if (THPVariable_Check(obj)) return THPVariable_Unpack(obj);
  if (h.is_none()) return {};
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::int_>(h)) return h.cast<int64_t>();
  if (py::isinstance<py::float_>(h)) return h.cast<double>();
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    c10::List<at::Tensor> list;
    for (py::handle item : h) {
      MAGI_CHECK(THPVariable_Check(item.ptr()), "input ", position,
                 " is a list with a non-tensor element; only lists of tensors are accepted");
      list.push_back(THPVariable_Unpack(item.ptr()));
    }
    return list;
  }
  MAGI_CHECK(false, "input ", position, " of the compiled graph has type ",
             py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>(),
             "; expected a tensor, int, float, bool or None");
  return {};
}

py::object to_python(const c10::IValue& v) {
  if (v.isTensor()) return py::cast(v.toTensor());
  if (v.isNone()) return py::none();
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isList()) {
    py::list out;
    for (const auto& item : v.toListRef()) out.append(to_python(item));
    return out;
  }
  MAGI_ASSERT(false, "cannot return a ", v.tagKind(), " to Python");
  return py::none();
}

runtime::GuardInput guard_input(PyObject* obj) {
  if (THPVariable_Check(obj)) return THPVariable_Unpack(obj);
  if (obj == Py_None) return c10::IValue();
  if (PyBool_Check(obj)) return c10::IValue(obj == Py_True);
  if (PyLong_CheckExact(obj)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    return overflow ? std::nullopt : runtime::GuardInput(c10::IValue(int64_t(v)));
  }
  if (PyFloat_CheckExact(obj)) return c10::IValue(PyFloat_AS_DOUBLE(obj));
  if (PyUnicode_CheckExact(obj)) return c10::IValue(py::handle(obj).cast<std::string>());
  return std::nullopt;
}

std::vector<runtime::GuardInput> guard_inputs(py::sequence args) {
  std::vector<runtime::GuardInput> out;
  out.reserve(args.size());
  for (py::handle h : args) out.push_back(guard_input(h.ptr()));
  return out;
}

}  // namespace magi::bindings
