// The one place where C++ errors become Python exceptions, and where logging is controlled:
//   magi::UserError        -> magi_compiler.UserError        (a ValueError)
//   magi::UnsupportedError -> magi_compiler.UnsupportedError (a NotImplementedError)
//   magi::InternalError    -> magi_compiler.InternalError    (a RuntimeError)
//   magi::DeviceError      -> magi_compiler.DeviceError      (a RuntimeError)
//   c10::Error and kin     -> as PyTorch raises them (torch.OutOfMemoryError, IndexError, ...)
#include <torch/csrc/Exceptions.h>

#include "bindings.h"
#include "magi/common/error.h"
#include "magi/common/log.h"

namespace magi::bindings {

void bind_errors(py::module_& m) {
  py::register_exception<magi::UserError>(m, "UserError", PyExc_ValueError);
  py::register_exception<magi::UnsupportedError>(m, "UnsupportedError", PyExc_NotImplementedError);
  py::register_exception<magi::InternalError>(m, "InternalError", PyExc_RuntimeError);
  py::register_exception<magi::DeviceError>(m, "DeviceError", PyExc_RuntimeError);
  // ATen calls the executor makes fail with c10's errors (the executor adds the step that
  // failed and keeps the type): raised as eager PyTorch raises them.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::Error&) {
      torch::translate_exception_to_python(std::current_exception());
    }
  });

  m.def(
      "set_log_level", [](const std::string& level) { log::set_level(log::parse_level(level)); },
      py::arg("level"), "Sets the C++ log level (trace, debug, info, warning, error, off).");
}

}  // namespace magi::bindings
