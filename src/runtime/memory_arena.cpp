// The memory arena of an executor run: which intermediates go into it (decided once, at
// lowering), in which block and where each sits for a given set of input sizes
// (plan_segments in memory_plan.h, within the run's peak), and the tensors made on it.
// executor.cpp allocates a block when a run first writes one of its values and hands out
// views of it; the block's memory is freed when the last of them dies.
//
// Planned: the contiguous outputs of generated kernels, and of the matmul family and cat,
// which write into the arena through their out= overloads. Not planned: a value any view or
// list of which is a graph output (the caller keeps it), reaches a custom operator (opaque: it
// may keep a reference), or is kept across calls (folded constants). A value's span ends at
// the last instruction reading it or anything that may alias it (views, lists, pieces whose
// outputs may alias their inputs). A pointwise kernel's output may take over the memory of a
// contiguous input of the same type that dies there, as it would without the arena
// (FusedKernel::reusable_input).
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <set>

#include "magi/common/log.h"
#include "magi/runtime/memory_plan.h"
#include "program.h"

namespace magi::runtime {
namespace {

constexpr size_t kMaxLayouts = 8;
constexpr size_t kMaxLaidOut = 64;

// Operators whose out= overload writes the same result into a given tensor.
bool has_planned_out_overload(const std::string& name) {
  static const std::set<std::string> names = {"aten::mm", "aten::bmm", "aten::addmm",
                                              "aten::baddbmm", "aten::cat"};
  return names.count(name) > 0;
}

std::optional<c10::OperatorHandle> out_overload(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (!schema.overload_name().empty() || schema.returns().size() != 1 ||
      !has_planned_out_overload(schema.name())) {
    return std::nullopt;
  }
  auto out = c10::Dispatcher::singleton().findSchema({schema.name(), "out"});
  if (!out) return std::nullopt;
  // The functional arguments, then one `out`.
  const auto& args = out->schema().arguments();
  if (args.size() != schema.arguments().size() + 1 || args.back().name() != "out") {
    return std::nullopt;
  }
  return out;
}

// Whether the step's outputs may share memory with its tensor inputs.
bool may_alias_inputs(const Instr& instr, const std::vector<std::unique_ptr<Executable>>& pieces) {
  switch (instr.kind) {
    case InstrKind::kCall:
      return returns_may_alias(instr.op->schema());
    case InstrKind::kGetItem:
    case InstrKind::kMakeList:
      return true;
    case InstrKind::kCallPiece:
      return pieces[instr.piece]->outputs_may_alias_inputs();
    default:
      return false;
  }
}

thread_local bool arena_off = false;  // see ArenaOffScope

}  // namespace

ArenaOffScope::ArenaOffScope() : previous_(arena_off) { arena_off = true; }
ArenaOffScope::~ArenaOffScope() { arena_off = previous_; }
bool ArenaOffScope::active() { return arena_off; }

at::Tensor arena_tensor(const at::Tensor& arena, int64_t offset, c10::ScalarType dtype,
                        c10::IntArrayRef sizes) {
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(arena.storage()), arena.key_set(), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  t.unsafeGetTensorImpl()->set_storage_offset(offset / item);
  return t;
}

std::shared_ptr<const ArenaLayoutForSizes> Arena::layout_for(
    const std::vector<c10::IValue>& inputs) const {
  std::vector<int64_t> key;
  key.reserve(symbols.size());
  for (const ArenaSymbol& s : symbols) {
    const c10::IValue& v = inputs[s.input];
    if (s.dim >= 0) {
      key.push_back(v.isTensor() && v.toTensor().dim() > s.dim ? v.toTensor().size(s.dim) : -1);
    } else {
      key.push_back(v.isInt() ? v.toInt() : -1);
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  for (size_t i = layouts.size(); i-- > 0;) {
    if (layouts[i]->key != key) continue;
    auto hit = layouts[i];  // most recently used last
    layouts.erase(layouts.begin() + static_cast<std::ptrdiff_t>(i));
    layouts.push_back(hit);
    return hit;
  }
  // Sizes that keep changing (a decode step's growing cache length) would lay out on every
  // call: past kMaxLaidOut sizes, new ones run without the arena.
  if (laid_out >= kMaxLaidOut) {
    static const auto none = std::make_shared<const ArenaLayoutForSizes>();
    if (laid_out++ == kMaxLaidOut) {
      MAGI_LOG_DEBUG("memory arena: ", kMaxLaidOut,
                     " sets of sizes laid out; later new ones run without the arena");
    }
    return none;
  }
  ++laid_out;
  auto layout = std::make_shared<ArenaLayoutForSizes>();
  layout->key = key;
  ir::SymbolBindings bindings;
  for (size_t i = 0; i < symbols.size(); ++i) bindings[symbols[i].name] = key[i];
  auto bytes_of = [&](c10::ScalarType dtype, const std::vector<ir::SymExpr>& sizes,
                      std::vector<int64_t>* concrete) -> int64_t {
    int64_t numel = 1;
    for (const ir::SymExpr& e : sizes) {
      const auto n = e.try_evaluate(bindings);
      if (!n || *n < 0) return -1;
      if (concrete != nullptr) concrete->push_back(*n);
      numel *= *n;
    }
    return numel * static_cast<int64_t>(c10::elementSize(dtype));
  };
  std::vector<ArenaBlock> blocks(values.size());
  layout->sizes.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const ArenaValue& v = values[i];
    blocks[i] = {bytes_of(v.dtype, v.sizes, &layout->sizes[i]), v.first, v.last, v.reuses};
  }
  // The other tensors' bytes at each step (those of unknown size count nothing).
  std::vector<int64_t> other_bytes(std::max<size_t>(num_steps, 1), 0);
  for (const ArenaOther& o : others) {
    const int64_t b = o.sized ? bytes_of(o.dtype, o.sizes, nullptr) : -1;
    for (size_t t = o.first; b > 0 && t <= std::min(o.last, other_bytes.size() - 1); ++t) {
      other_bytes[t] += (b + 255) / 256 * 256;
    }
  }
  SegmentedLayout planned = plan_segments(blocks, other_bytes);
  layout->offsets = std::move(planned.offsets);
  layout->segment = std::move(planned.segment);
  layout->segment_bytes = std::move(planned.segment_bytes);
  layout->segment_last = std::move(planned.segment_last);
  layout->run_peak = planned.budget;
  for (size_t k = 0; k < layout->segment_bytes.size(); ++k) {
    if (layout->segment_bytes[k] <= layout->bytes) continue;
    layout->bytes = layout->segment_bytes[k];
    layout->peak_live = planned.segment_peak_live[k];
  }
  size_t placed = 0;
  for (int64_t o : layout->offsets) placed += o >= 0;
  MAGI_LOG_DEBUG("memory arena: ", placed, " of ", values.size(), " values in ",
                 layout->segment_bytes.size(), " segments, the largest ", layout->bytes, " bytes (",
                 layout->peak_live, " live at most; the run's estimated peak ", layout->run_peak,
                 " bytes), for symbol values ", c10::IntArrayRef(key));
  if (layouts.size() == kMaxLayouts) layouts.erase(layouts.begin());
  layouts.push_back(layout);
  return layout;
}

void Executable::plan_arena(Program& p, const std::vector<const ir::Node*>& nodes,
                            const std::vector<const ir::Value*>& inputs) {
  auto arena = std::make_unique<Arena>();
  arena->value_of.assign(p.num_registers, -1);
  std::optional<c10::Device> device;
  // Candidates: contiguous tensor outputs of generated kernels and of operators with a planned
  // out= overload, on one device, from instructions that run on every call.
  for (size_t s = 0; s < p.instrs.size(); ++s) {
    Instr& instr = p.instrs[s];
    if (instr.once) continue;
    const ir::Node* node = nodes[s];
    if (instr.kind == InstrKind::kCall) {
      if (node->kind() != ir::NodeKind::kAtenOp) continue;
      instr.out_op = out_overload(*instr.op);
      if (!instr.out_op) continue;
    } else if (instr.kind == InstrKind::kFusion) {
      if (p.fused[instr.piece]->has_strided_outputs()) continue;
    } else {
      continue;
    }
    for (size_t k = 0; k < instr.out.size(); ++k) {
      const Ref r = instr.out[k];
      const auto& type = node->outputs()[k]->tensor_type();
      if (r == kUnused || !type || !type->is_contiguous()) continue;
      if (instr.kind == InstrKind::kCall && type->strides.empty()) continue;
      if (device && *device != type->device) continue;
      device = type->device;
      arena->value_of[r] = static_cast<int32_t>(arena->values.size());
      arena->values.push_back({r, s, s, type->dtype, type->sizes, -1});
    }
  }
  if (arena->values.empty()) return;
  arena->device = *device;

  // Which planned values each register may share memory with; from that, each value's span
  // and whether it escapes.
  std::vector<std::vector<int32_t>> owners(p.num_registers);
  for (size_t i = 0; i < arena->values.size(); ++i) {
    owners[arena->values[i].reg] = {static_cast<int32_t>(i)};
  }
  std::vector<bool> dropped(arena->values.size(), false);
  for (size_t s = 0; s < p.instrs.size(); ++s) {
    Instr& instr = p.instrs[s];
    instr.may_alias = may_alias_inputs(instr, p.pieces);
    // Custom operators are opaque (they may keep a reference), in a piece as well.
    const bool custom =
        (instr.kind == InstrKind::kCall && nodes[s]->kind() == ir::NodeKind::kCustomOp) ||
        (instr.kind == InstrKind::kCallPiece && p.pieces[instr.piece]->calls_custom_ops());
    std::vector<int32_t> read;
    for (Ref r : instr.in) {
      if (r < 0) continue;
      for (int32_t v : owners[r]) {
        arena->values[v].last = std::max(arena->values[v].last, s);
        dropped[v] = dropped[v] || custom || instr.once;
        read.push_back(v);
      }
    }
    if (read.empty() || !instr.may_alias) continue;
    std::sort(read.begin(), read.end());
    read.erase(std::unique(read.begin(), read.end()), read.end());
    for (Ref r : instr.out) {
      if (r != kUnused) owners[r].insert(owners[r].end(), read.begin(), read.end());
    }
  }
  for (Ref r : p.output_refs) {
    if (r < 0) continue;
    for (int32_t v : owners[r]) dropped[v] = true;
  }
  for (size_t r = 0; r < p.keep_folded.size(); ++r) {
    if (!p.keep_folded[r]) continue;
    for (int32_t v : owners[r]) dropped[v] = true;
  }
  // Pointwise kernels writing over an input that dies there: the input must be a planned
  // value read only by this step from here on (its last use, no live view of it), of the
  // output's dtype and symbolic sizes. -1 when there is none.
  // The operand may be a contiguous view of the whole value (a reshape of a matmul's result).
  std::vector<const ir::TensorType*> type_of(p.num_registers, nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (p.input_regs[i] >= 0 && inputs[i]->tensor_type()) {
      type_of[p.input_regs[i]] = &*inputs[i]->tensor_type();
    }
  }
  for (size_t s = 0; s < p.instrs.size(); ++s) {
    for (size_t k = 0; k < p.instrs[s].out.size(); ++k) {
      const Ref r = p.instrs[s].out[k];
      const auto& type = nodes[s]->outputs()[k]->tensor_type();
      if (r != kUnused && type) type_of[r] = &*type;
    }
  }
  auto numel = [](const std::vector<ir::SymExpr>& sizes) {
    ir::SymExpr n = 1;
    for (const ir::SymExpr& e : sizes) n = n * e;
    return n;
  };
  auto dying_input = [&](size_t step, const ir::TensorType& out,
                         const std::vector<bool>& taken) -> int32_t {
    const Instr& instr = p.instrs[step];
    const FusedKernel& kernel = *p.fused[instr.piece];
    for (size_t j = 0; j < instr.in.size(); ++j) {
      const Ref r = instr.in[j];
      if (r < 0 || !kernel.can_write_over_input(j) || owners[r].size() != 1) continue;
      const int32_t v = owners[r][0];
      const ir::TensorType* type = type_of[r];
      if (dropped[v] || taken[v] || arena->values[v].last != step || type == nullptr ||
          !type->is_contiguous() || type->dtype != out.dtype ||
          arena->values[v].dtype != out.dtype || type->sizes != out.sizes ||
          numel(arena->values[v].sizes) != numel(out.sizes)) {
        continue;
      }
      // Read once: no other operand of the step is it or a view of it.
      int32_t reads = 0;
      for (Ref other : instr.in) {
        if (other >= 0) reads += std::count(owners[other].begin(), owners[other].end(), v) > 0;
      }
      if (reads == 1) return v;
    }
    return -1;
  };
  std::vector<bool> taken(arena->values.size(), false);
  for (size_t s = 0; s < p.instrs.size(); ++s) {
    if (p.instrs[s].kind != InstrKind::kFusion) continue;
    for (size_t k = 0; k < p.instrs[s].out.size(); ++k) {
      const Ref r = p.instrs[s].out[k];
      const auto& type = nodes[s]->outputs()[k]->tensor_type();
      if (r == kUnused || !type) continue;
      const int32_t out = arena->value_of[r];
      const int32_t v = dying_input(s, *type, taken);
      if (v < 0) continue;
      taken[v] = true;
      if (out >= 0 && !dropped[out]) {
        arena->values[out].reuses = v;
      } else {
        // An output kept out of the arena (the caller gets it) takes the input's buffer only
        // if that buffer is its own (FusedKernel::reusable_input): leave the input out too.
        dropped[v] = true;
      }
    }
  }

  // Keep the planned values; renumber.
  std::vector<int32_t> renumber(arena->values.size(), -1);
  std::vector<ArenaValue> kept;
  for (size_t i = 0; i < arena->values.size(); ++i) {
    if (dropped[i]) continue;
    renumber[i] = static_cast<int32_t>(kept.size());
    kept.push_back(arena->values[i]);
  }
  for (ArenaValue& v : kept) v.reuses = v.reuses >= 0 ? renumber[v.reuses] : -1;
  arena->value_of.assign(p.num_registers, -1);
  for (size_t i = 0; i < kept.size(); ++i) arena->value_of[kept[i].reg] = static_cast<int32_t>(i);
  arena->values = std::move(kept);

  // The tensors a run allocates outside the arena, and the last step reading each (or a view
  // of it); one the caller gets is never freed by the run.
  std::vector<std::vector<int32_t>> others_of(p.num_registers);
  for (size_t s = 0; s < p.instrs.size(); ++s) {
    const Instr& instr = p.instrs[s];
    if (instr.once || instr.kind == InstrKind::kSym) continue;
    std::vector<int32_t> read;
    for (Ref r : instr.in) {
      if (r < 0) continue;
      for (int32_t o : others_of[r]) {
        arena->others[o].last = std::max(arena->others[o].last, s);
        read.push_back(o);
      }
    }
    for (size_t k = 0; k < instr.out.size(); ++k) {
      const Ref r = instr.out[k];
      if (instr.may_alias) {
        if (r != kUnused) others_of[r] = read;
        continue;
      }
      if (r != kUnused && arena->value_of[r] >= 0) continue;
      const ir::Value* value = nodes[s]->outputs()[k];
      if (value->kind() != ir::ValueKind::kTensor && value->kind() != ir::ValueKind::kTensorList &&
          value->kind() != ir::ValueKind::kOther) {
        continue;
      }
      ArenaOther other{s, s, c10::ScalarType::Float, {}, false};
      if (value->kind() == ir::ValueKind::kTensor && value->tensor_type()) {
        other.dtype = value->tensor_type()->dtype;
        other.sizes = value->tensor_type()->sizes;
        other.sized = true;
      }
      if (r != kUnused) others_of[r] = {static_cast<int32_t>(arena->others.size())};
      arena->others.push_back(std::move(other));
    }
  }
  for (Ref r : p.output_refs) {
    if (r < 0) continue;
    for (int32_t o : others_of[r]) arena->others[o].last = ArenaOther::kNeverFreed;
  }
  for (Instr& instr : p.instrs) {  // out= only where the output is planned
    if (instr.out_op && (instr.out[0] == kUnused || arena->value_of[instr.out[0]] < 0)) {
      instr.out_op.reset();
    }
  }
  if (arena->values.empty()) return;

  // The symbols the sizes use, each bound by an input's size or an integer input.
  std::set<std::string> needed;
  for (const ArenaValue& v : arena->values) {
    for (const ir::SymExpr& e : v.sizes) e.collect_symbols(needed);
  }
  for (size_t i = 0; i < inputs.size() && !needed.empty(); ++i) {
    const ir::Value* in = inputs[i];
    if (in->tensor_type()) {
      const auto& sizes = in->tensor_type()->sizes;
      for (size_t d = 0; d < sizes.size(); ++d) {
        if (sizes[d].op() != ir::SymExpr::Op::kSymbol || !needed.count(sizes[d].symbol_name())) {
          continue;
        }
        arena->symbols.push_back({i, static_cast<int64_t>(d), sizes[d].symbol_name()});
        needed.erase(sizes[d].symbol_name());
      }
    } else if (in->sym() && in->sym()->op() == ir::SymExpr::Op::kSymbol &&
               needed.count(in->sym()->symbol_name())) {
      arena->symbols.push_back({i, -1, in->sym()->symbol_name()});
      needed.erase(in->sym()->symbol_name());
    }
  }
  // A value sized by a symbol no input binds is allocated as usual (its size evaluates to
  // nothing in layout_for).
  MAGI_LOG_DEBUG("memory arena: ", arena->values.size(), " values planned on ", arena->device);
  arena->num_steps = p.instrs.size();
  p.arena = std::move(arena);
}

}  // namespace magi::runtime
