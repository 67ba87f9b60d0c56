// magi_compiler._C: the compiled core. Each area binds itself; this file only lists them.
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "magi-compiler C++ core: graph IR, FX importer, passes and executor";
  magi::bindings::bind_errors(m);
  magi::bindings::bind_ir(m);
  magi::bindings::bind_import(m);
  magi::bindings::bind_runtime(m);
  magi::bindings::bind_dispatch(m);
  magi::bindings::bind_ops(m);
  magi::bindings::bind_codegen(m);
  magi::bindings::bind_recompute(m);
}
