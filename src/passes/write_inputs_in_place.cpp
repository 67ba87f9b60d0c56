// write_inputs_in_place: an update of an input buffer is done in the buffer itself.
//
// A model that writes into one of its buffers (a static KV cache: `cache.index_copy_(2, pos,
// k)`, `cache[:, :, pos] = k`) reaches the pipeline functionalized. The inference capture keeps
// the mutation at the end of the graph (keep_inference_input_mutations):
//
//   new = index_copy(cache, 2, pos, k)   # a fresh copy of the whole cache, then the scatter
//   ...                                  # attention reads `new`
//   copy_(cache, new)                    # the copy written back into the buffer
//
// so every call copies the whole cache twice to change a few rows of it (on the GPU: two
// memcpys and the scatter per cache and layer). When nothing but that write-back reads the
// buffer, the update can write the buffer directly: the pass replaces the functional op with
// its in-place form on the buffer (index_copy_), hands its readers the buffer, and drops the
// write-back. The buffer then holds the new values from that point on, which is what the
// graph's result and the buffer's final contents already were.
//
// Applies to the indexing updates that have an in-place form with the same arguments
// (kUpdates) when:
// - the first argument (`cache`) is a graph input read by nothing else: no other operator,
//   no view of it, not the op's other arguments (the old values would be gone);
// - the op's result is written back into that input by aten::copy_ (whose result is unused),
//   and is not an output of the graph, nor is any view of it (an output would then share the
//   buffer's memory);
// - the result has the input's dtype, device, sizes and strides (the write-back is a plain
//   copy, and readers compiled against the result's layout see the same layout).
// A graph that reads the buffer elsewhere (say, its old values, or a view taken before the
// update) keeps the functional form.
//
// A graph with a boundary call (split_at_boundaries cuts it into pieces) keeps its write-backs
// too. The pieces of the layers are one piece stored once and called per layer, and with
// PIECEWISE CUDA graphs one graph serves every call of it: an input it reads from another
// layer's call than the capture's is copied into the graph's own buffer, so an update in the
// piece would write that copy, not the layer's cache. The write-backs stay in the graph's last
// piece, whose inputs are the caches themselves.
//
// Requires: a verified, unsplit graph. Guarantees: a verified graph computing the same outputs
// and leaving the same values in its inputs.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "magi/common/log.h"
#include "magi/ir/node.h"
#include "magi/ir/op_info.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

// Functional indexing updates, each with an in-place form of the same name plus "_", the same
// overload and the same arguments.
constexpr const char* kUpdates[] = {
    "aten::index_copy",
    "aten::index_put",
    "aten::index_add",
    "aten::index_fill.int_Scalar",
    "aten::index_fill.int_Tensor",
    "aten::scatter.src",
    "aten::scatter.value",
    "aten::scatter.reduce",
    "aten::scatter.value_reduce",
    "aten::scatter_add",
    "aten::masked_scatter",
};

bool is_update(const ir::Node& node) {
  if (node.kind() != ir::NodeKind::kAtenOp) return false;
  const std::string name = node.op_name();
  for (const char* u : kUpdates) {
    if (name == u) return true;
  }
  return false;
}

// The in-place form of `node`'s operator, when the dispatcher has one taking the same
// arguments and writing its first.
std::optional<c10::OperatorHandle> in_place_form(const ir::Node& node) {
  const c10::OperatorName& name = node.op().operator_name();
  auto handle = c10::Dispatcher::singleton().findSchema({name.name + "_", name.overload_name});
  if (!handle) return std::nullopt;
  const auto& functional = node.schema().arguments();
  const auto& in_place = handle->schema().arguments();
  if (functional.size() != in_place.size() || in_place.empty()) return std::nullopt;
  const auto* alias = in_place[0].alias_info();
  if (alias == nullptr || !alias->isWrite()) return std::nullopt;
  for (size_t i = 0; i < functional.size(); ++i) {
    if (*functional[i].type() != *in_place[i].type()) return std::nullopt;
  }
  if (handle->schema().returns().size() != 1) return std::nullopt;
  return handle;
}

bool same_layout(const ir::Value& a, const ir::Value& b) {
  const auto& x = a.tensor_type();
  const auto& y = b.tensor_type();
  return x && y && x->dtype == y->dtype && x->device == y->device && x->sizes == y->sizes &&
         x->strides == y->strides;
}

// Whether a graph output is `v`, a view of it or a list holding one (through any chain of
// views, lists of views and their items).
bool reaches_output(const ir::Value* v) {
  for (const ir::Node* user : v->users()) {
    switch (user->kind()) {
      case ir::NodeKind::kOutput:
        return true;
      case ir::NodeKind::kGetItem:
      case ir::NodeKind::kMakeList:
        if (reaches_output(user->output())) return true;
        break;
      default:
        if (!user->is_operator()) break;
        for (size_t k = 0; k < user->outputs().size(); ++k) {
          if (ir::output_aliases_input(*user, k) && reaches_output(user->output(k))) return true;
        }
    }
  }
  return false;
}

// The write-back `copy_(input, update)` of an update of a graph input, when the update can be
// done in the input itself (see the conditions above); nullptr otherwise.
ir::Node* write_back_to_reuse(const ir::Node& update) {
  ir::Value* buffer = update.input(0);
  ir::Value* result = update.output();
  if (buffer->producer()->kind() != ir::NodeKind::kInput) return nullptr;
  if (!same_layout(*buffer, *result)) return nullptr;
  if (reaches_output(result)) return nullptr;
  ir::Node* write_back = nullptr;
  for (ir::Node* user : result->users()) {
    if (user->is_operator() && user->op_name() == "aten::copy_" && user->input(0) == buffer &&
        user->input(1) == result) {
      if (write_back != nullptr) return nullptr;  // two write-backs: leave it
      write_back = user;
    }
  }
  if (write_back == nullptr || !write_back->output()->users().empty()) return nullptr;
  // The buffer's readers: the update (as its first argument only) and the write-back.
  size_t update_uses = 0;
  for (const ir::Node* user : buffer->users()) {
    if (user == &update) {
      ++update_uses;
    } else if (user != write_back) {
      return nullptr;
    }
  }
  if (update_uses != 1) return nullptr;
  for (size_t i = 1; i < write_back->inputs().size(); ++i) {
    if (write_back->input(i) == buffer) return nullptr;
  }
  return write_back;
}

}  // namespace

bool write_inputs_in_place(ir::Graph& graph, const std::vector<std::string>& splitting_ops) {
  // A graph cut into pieces keeps its write-backs (see the top of the file).
  for (const ir::Node* node : graph.nodes()) {
    if (is_boundary_call(*node, splitting_ops)) return false;
  }
  // Found first, rewritten after: a rewrite erases nodes later in the order.
  struct Found {
    ir::Node* update;
    ir::Node* write_back;
    c10::OperatorHandle in_place;
  };
  std::vector<Found> found;
  for (ir::Node* update : graph.nodes()) {
    if (!is_update(*update)) continue;
    auto handle = in_place_form(*update);
    if (!handle) continue;
    if (ir::Node* write_back = write_back_to_reuse(*update))
      found.push_back({update, write_back, *handle});
  }
  for (const Found& f : found) {
    graph.set_insert_point(f.update);
    ir::Node* in_place = graph.add_op(f.in_place, f.update->inputs());
    graph.set_insert_point(nullptr);
    in_place->provenance() = f.update->provenance();
    ir::Value* buffer = f.update->input(0);
    ir::Value* written = in_place->output();
    written->set_tensor_type(*buffer->tensor_type());
    graph.erase(f.write_back);
    const std::vector<ir::Node*> readers = f.update->output()->users();
    for (ir::Node* reader : readers) reader->replace_input(f.update->output(), written);
    std::string name = f.update->output()->name();
    graph.erase(f.update);
    written->set_name(std::move(name));
    MAGI_LOG_DEBUG("write_inputs_in_place: ", in_place->op_name(), " writes input '",
                   buffer->name(), "' in place (", in_place->provenance().source, ")");
  }
  return !found.empty();
}

}  // namespace magi::passes
