// Lowering a fusion group (a small graph of fusible ATen ops, see passes/fuse_groups.cpp)
// to a KernelSpec. Every op the fusion pass accepts (ir/op_info.h) lowers; anything else is
// an internal error, because the two read one table.
#pragma once

#include <string>

#include "magi/codegen/kernel_ir.h"
#include "magi/ir/graph.h"

namespace magi::codegen {

/// `group`'s inputs become kernel inputs and its outputs kernel outputs, in order.
KernelSpec lower_group(const ir::Graph& group, const std::string& name);

}  // namespace magi::codegen
