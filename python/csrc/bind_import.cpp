// Binds the FX importer.
#include "bindings.h"
#include "fx_import.h"

namespace magi::bindings {

void bind_import(py::module_& m) {
  m.def("import_fx_graph", &import_fx_graph, py::arg("graph_module"),
        "Imports an ATen-level torch.fx.GraphModule into a magi Graph.");
}

}  // namespace magi::bindings
