// The bindings of the direct calls (direct_call.h): DirectCall, Routes, DirectEntry and the
// registration epoch, which _fast_dispatch.py drives.
#include "direct_call.h"

namespace magi::bindings {

void bind_dispatch(py::module_& m) {
  py::class_<DirectCall>(m, "DirectCall",
                         "A learned direct call of one captured inference signature, run from "
                         "C++ (_fast_dispatch.py).")
      .def(py::init<py::object, py::object, std::vector<std::string>,
                    std::vector<std::pair<std::string, py::object>>, py::object, const py::list&,
                    const std::string&, bool, bool, py::object, py::object, py::object, py::object,
                    const std::vector<size_t>&>(),
           py::arg("signature"), py::arg("guard_check"), py::arg("frame_names"), py::arg("cells"),
           py::arg("target"), py::arg("slots"), py::arg("result"), py::arg("method"),
           py::arg("memoize") = false, py::arg("planner") = py::none(),
           py::arg("routes") = py::none(), py::arg("builder") = py::none(),
           py::arg("varargs") = py::none(), py::arg("through") = std::vector<size_t>(),
           "signature: the GuardSignature; guard_check: Dynamo's guard check of the cache "
           "entry, called with the frame's locals; frame_names: the function's parameters, "
           "self included; cells: (name, cell) of its closure; target: a CudaGraphRunner or "
           "Executable; slots: per graph input ('arg', i) | ('size', i, dim) | ('item', i, "
           "index) (an item of a tuple argument) | ('fixed', dict, key); result: 'tensor', "
           "'tuple', 'list' or 'call' (builder(list of outputs)); method: argument 0 is the "
           "module; memoize: evaluate Dynamo's guards once per argument layout and process "
           "state (fast_dispatch_guards='arguments'); planner: (frame) -> what the guard tree "
           "reads (_guard_watch.py) or None, run after each check that passed when not "
           "memoize: verdicts are then reused while that state holds; routes: the Routes "
           "through which the fixed inputs' dicts are reached, or None; builder: see result; "
           "varargs: None when Dynamo's frame holds the bound parameters (frame_names), else "
           "(owner, args, kwargs): the frame's names for the owner (None: it is args[0]), the "
           "call's positional arguments and a copy of its keywords (None: no **kwargs); through: "
           "the graph inputs the result returns as they came in, given to builder after the "
           "outputs in this order.")
      .def_property_readonly("arity", &DirectCall::arity)
      .def_property_readonly("num_guard_checks", &DirectCall::num_guard_checks,
                             "Calls that evaluated Dynamo's guards.")
      .def_property_readonly("guard_reuse", &DirectCall::guard_reuse,
                             "How verdicts of Dynamo's guards are reused: 'arguments', "
                             "'watched', 'unwatched' or 'unplanned'.")
      .def("__call__", &DirectCall::call, py::arg("args"),
           "The result of the call with these positional arguments (self first for a method), "
           "or None when the path does not apply and an ordinary call must be made.");

  py::class_<Routes>(m, "Routes",
                     "The submodules a direct call reads parameters through, checked on each "
                     "call (_fast_dispatch.py).")
      .def(py::init<const py::list&>(), py::arg("steps"),
           "steps: (a module, a name in its _modules, the submodule there) each.")
      .def("hold", &Routes::hold, "True while every step leads to the same submodule.")
      .def("__len__", &Routes::size);

  py::class_<DirectEntry>(m, "DirectEntry",
                          "The direct calls of one module instance's compiled method (or one "
                          "function), tried from C++ by its wrapper (_fast_dispatch.py).")
      .def(py::init<py::object>(), py::arg("owner_ref"),
           "owner_ref: a weak reference to the module, or None for a function.")
      .def("reset", &DirectEntry::reset,
           "Forgets every direct call; later ones belong to the current registration epoch.")
      .def("add", &DirectEntry::add, py::arg("native"), "Adds a DirectCall.")
      .def("set_parameters", &DirectEntry::set_parameters, py::arg("names"), py::arg("defaults"),
           py::arg("required"), py::arg("var_keyword"),
           "How keyword and left-out arguments bind: the parameters after the owner, their "
           "defaults (`required` for none) and the index of **kwargs (-1: none).")
      .def("__len__", &DirectEntry::size)
      // A copy (copy.deepcopy of a compiled module copies its compiled entry) has the same
      // owner and no direct calls: the copy learns its own.
      .def("__copy__", [](const DirectEntry& e) { return e.empty_copy(); })
      .def(
          "__deepcopy__", [](const DirectEntry& e, const py::dict&) { return e.empty_copy(); },
          py::arg("memo"))
      .def("__call__", &DirectEntry::call,
           "The result of the first direct call that applies to these arguments (the owner is "
           "put first; keywords and defaults bound as set_parameters says), or None.");
  m.def("bump_registration_epoch", &bump_registration_epoch,
        "Marks every direct call learned so far stale (a submodule they read through was "
        "replaced).");
  m.def("registration_epoch", &registration_epoch, "The number of registrations seen so far.");
  m.def("direct_entry_calls", &direct_entry_calls,
        "Calls DirectEntry objects ran directly since the last reset.");
  m.def("reset_direct_entry_calls", &reset_direct_entry_calls,
        "Sets direct_entry_calls() back to zero.");
}

}  // namespace magi::bindings
