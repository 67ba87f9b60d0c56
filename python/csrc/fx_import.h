// FX -> IR importer: turns an ATen-level torch.fx.GraphModule (as AOTAutograd produces it)
// into a magi::ir::Graph.
//
// Every call_function target that is an OpOverload is bound to its c10::OperatorHandle and
// its arguments are normalised to the schema (positional order, kwargs placed, defaults
// filled). aten::sym_size/sym_stride/sym_numel and Python's integer operators on SymInts
// become symbolic nodes. Sizes and strides come from each node's meta["val"] (FakeTensors
// with SymInts), converted from sympy to SymExpr. Each node keeps its FX name and the last
// frame of its stack trace (the user's source line).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "magi/ir/graph.h"

namespace magi::bindings {

std::unique_ptr<ir::Graph> import_fx_graph(pybind11::handle graph_module);

}  // namespace magi::bindings
