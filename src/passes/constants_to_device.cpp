// constants_to_device: a host constant that an update copies into device memory becomes a
// constant on that device.
//
// `mask[pos] = True` on a CUDA tensor reaches the pipeline as
//
//   c = constant(tensor(True))       # a 0-dim tensor in host memory
//   v = lift_fresh_copy(c)
//   m = index_put(mask, [pos], v)    # copies v to the GPU, then scatters it
//
// so every call copies the value from pageable host memory, and CUDA graph capture refuses the
// copy ("Cannot copy between CPU and CUDA tensors during CUDA graph capture"): the compiled model
// failed on its first captured call. The pass gives the update a copy of the constant on the
// device of the tensor it writes, made once here, when the graph is compiled.
//
// Applies to the argument of each op in copied_arguments() that the op copies into its first
// argument's memory (index_put's values, index_copy's source, copy_'s src, ...) when that first
// argument is a tensor outside host memory and the argument is a host tensor constant, directly or
// through lift_fresh_copy. The ops only read the argument, so the fresh copy lift_fresh_copy makes
// is not needed. The constant's other readers keep the host tensor (an op that takes a 0-dim host
// tensor as a number, such as add, reads it without a copy).
//
// Requires: a verified graph. Guarantees: a verified graph computing the same values, without
// the lift_fresh_copy nodes and host constants the rewrite left unread.
#include <map>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "magi/common/log.h"
#include "magi/ir/node.h"
#include "magi/ir/structural_hash.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

// Ops that copy one tensor argument (by position) into the memory of their first.
const std::map<std::string, size_t>& copied_arguments() {
  static const std::map<std::string, size_t> table = {
      {"aten::index_put", 2},
      {"aten::index_put_", 2},
      {"aten::_index_put_impl_", 2},
      {"aten::_unsafe_index_put", 2},
      {"aten::index_copy", 3},
      {"aten::index_copy_", 3},
      {"aten::index_add", 3},
      {"aten::index_add_", 3},
      {"aten::index_reduce", 3},
      {"aten::index_reduce_", 3},
      {"aten::scatter.src", 3},
      {"aten::scatter_.src", 3},
      {"aten::scatter.reduce", 3},
      {"aten::scatter_.reduce", 3},
      {"aten::scatter_add", 3},
      {"aten::scatter_add_", 3},
      {"aten::scatter_reduce.two", 3},
      {"aten::scatter_reduce_.two", 3},
      {"aten::masked_scatter", 2},
      {"aten::masked_scatter_", 2},
      {"aten::copy", 1},
      {"aten::copy_", 1},
  };
  return table;
}

// The host tensor constant `v` is, or is a lift_fresh_copy of; nullptr otherwise (and for a
// tensor subclass, such as a fake tensor, whose copy only its Python code knows how to make).
const ir::Node* host_constant(const ir::Value* v) {
  const ir::Node* p = v->producer();
  if (p->kind() == ir::NodeKind::kAtenOp && p->op_name() == "aten::lift_fresh_copy") {
    p = p->input(0)->producer();
  }
  if (p->kind() != ir::NodeKind::kConstant || !p->constant().isTensor()) return nullptr;
  const at::Tensor& t = p->constant().toTensor();
  return t.device().is_cpu() && !t.key_set().has(c10::DispatchKey::Python) ? p : nullptr;
}

// The type of constant tensor `t`.
ir::TensorType type_of(const at::Tensor& t) {
  ir::TensorType type;
  type.dtype = t.scalar_type();
  type.device = t.device();
  for (int64_t d = 0; d < t.dim(); ++d) {
    type.sizes.emplace_back(t.size(d));
    type.strides.emplace_back(t.stride(d));
  }
  return type;
}

}  // namespace

bool constants_to_device(ir::Graph& graph) {
  // One device copy per constant and device, shared by all the updates reading it. Equal small
  // constants (the `True` of every layer's `mask[pos] = True`, each its own `_tensor_constant`)
  // are one constant here, as in structural_key: they share one copy, so identical layers still
  // make identical pieces, which split_at_boundaries stores once.
  std::map<std::pair<std::string, std::string>, ir::Value*> moved;
  bool changed = false;
  for (ir::Node* node : graph.nodes()) {
    if (node->kind() != ir::NodeKind::kAtenOp) continue;
    const auto entry = copied_arguments().find(node->op_name());
    if (entry == copied_arguments().end()) continue;
    const size_t arg = entry->second;
    const auto& dest = node->input(0)->tensor_type();
    if (!dest || dest->device.is_cpu() || node->input(arg)->kind() != ir::ValueKind::kTensor) {
      continue;
    }
    const ir::Node* constant = host_constant(node->input(arg));
    if (constant == nullptr) continue;
    const at::Tensor& host = constant->constant().toTensor();
    ir::Value*& copy = moved[{ir::tensor_key(host), dest->device.str()}];
    if (copy == nullptr) {
      // Past Python's dispatch modes: the pipeline may run while AOTAutograd's FakeTensorMode is
      // active, which would make the copy a fake tensor.
      const c10::impl::ExcludeDispatchKeyGuard no_modes(
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
      const at::Tensor on_device = host.to(dest->device);
      // Before this update, the first to read it: the later ones follow it.
      graph.set_insert_point(node);
      copy = graph.add_constant(c10::IValue(on_device), ir::ValueKind::kTensor);
      graph.set_insert_point(nullptr);
      copy->set_tensor_type(type_of(on_device));
    }
    MAGI_LOG_DEBUG("constants_to_device: ", node->op_name(), " reads its argument ", arg,
                   " from a constant on ", dest->device.str(), " instead of host memory");
    ir::Value* old = node->input(arg);
    node->set_input(arg, copy);
    changed = true;
    // The lift_fresh_copy and the host constant, when nothing else reads them.
    for (ir::Node* p = old->producer(); p != nullptr && p->output()->users().empty();) {
      ir::Node* next = p->kind() == ir::NodeKind::kConstant ? nullptr : p->input(0)->producer();
      graph.erase(p);
      p = next;
    }
  }
  return changed;
}

}  // namespace magi::passes
