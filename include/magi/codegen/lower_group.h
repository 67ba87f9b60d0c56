// Lowering a fusion group (a small graph of fusible ATen ops, see passes/fuse_groups.cpp)
// to a KernelSpec. Every op the fusion pass accepts (ir/op_info.h) lowers; anything else is
// an internal error, because the two read one table.
#pragma once

#include <string>
#include <vector>

#include "magi/codegen/kernel_ir.h"
#include "magi/ir/graph.h"

namespace magi::codegen {

/// `group`'s inputs become kernel inputs and its outputs kernel outputs, in order.
KernelSpec lower_group(const ir::Graph& group, const std::string& name);

/// For each input of `group`: the views (ir::OpClass::kView nodes) between the ops reading it
/// and the group's index space, first to last; empty for an input read in the index space. A
/// kernel reads the input through the strides those views give it.
std::vector<std::vector<const ir::Node*>> input_view_chains(const ir::Graph& group);

}  // namespace magi::codegen
