// Executable: the interpreter loop that runs a lowered program (lower_program.cpp builds it),
// and what an Executable reports about itself.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/clone.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "magi/codegen/compiler.h"
#include "magi/common/error.h"
#include "magi/common/log.h"
#include "memory_trace.h"
#include "program.h"

namespace magi::runtime {
namespace {

// Rethrows the exception being handled with `context` (the step that failed) added and its
// type kept: magi's errors as the same class with the context ahead of the message, c10's
// (out of memory, index, value and type errors among them) with the context added as PyTorch
// adds its own, anything else unchanged (a custom op's Python exception, a bad_alloc).
[[noreturn]] void rethrow_with_context(const std::string& context) {
  try {
    throw;
  } catch (c10::Error& e) {
    e.add_context(context);
    throw;
  } catch (const UserError& e) {
    throw UserError(context + ": " + e.what());
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(context + ": " + e.what());
  } catch (const InternalError& e) {
    throw InternalError(context + ": " + e.what());
  } catch (const DeviceError& e) {
    throw DeviceError(context + ": " + e.what());
  }
}

int64_t to_int(const c10::IValue& v) {
  if (v.isInt()) return v.toInt();
  if (v.isBool()) return v.toBool() ? 1 : 0;
  if (v.isSymInt()) return v.toSymInt().guard_int(__FILE__, __LINE__);
  MAGI_ASSERT(false, "symbolic integer operand is a ", v.tagKind());
  return 0;
}

double to_double(const c10::IValue& v) { return v.isDouble() ? v.toDouble() : double(to_int(v)); }

// Arithmetic and comparisons shared by int and float operands, in the operands' type T;
// nullopt for ops that are int-only or need special care.
template <typename T>
std::optional<c10::IValue> eval_common(ir::SymOp op, T x, T y) {
  using ir::SymOp;
  switch (op) {
    case SymOp::kAdd:
      return c10::IValue(x + y);
    case SymOp::kSub:
      return c10::IValue(x - y);
    case SymOp::kMul:
      return c10::IValue(x * y);
    case SymOp::kTrueDiv:
      return c10::IValue(double(x) / double(y));
    case SymOp::kMax:
      return c10::IValue(std::max(x, y));
    case SymOp::kMin:
      return c10::IValue(std::min(x, y));
    case SymOp::kEq:
      return c10::IValue(x == y);
    case SymOp::kNe:
      return c10::IValue(x != y);
    case SymOp::kLt:
      return c10::IValue(x < y);
    case SymOp::kLe:
      return c10::IValue(x <= y);
    case SymOp::kGt:
      return c10::IValue(x > y);
    case SymOp::kGe:
      return c10::IValue(x >= y);
    default:
      return std::nullopt;
  }
}

c10::IValue eval_sym(ir::SymOp op, const c10::IValue& a, const c10::IValue* b) {
  using ir::SymOp;
  switch (op) {
    case SymOp::kSize:
      return a.toTensor().size(to_int(*b));
    case SymOp::kStride:
      return a.toTensor().stride(to_int(*b));
    case SymOp::kNumel:
      return a.toTensor().numel();
    case SymOp::kNeg:
      return -to_int(a);
    default:
      break;
  }
  if (a.isDouble() || b->isDouble()) {
    if (auto v = eval_common(op, to_double(a), to_double(*b))) return *v;
  } else {
    const int64_t x = to_int(a), y = to_int(*b);
    if (op == SymOp::kFloorDiv) return ir::py_floor_div(x, y);
    if (op == SymOp::kMod) return ir::py_mod(x, y);
    if (auto v = eval_common(op, x, y)) return *v;
  }
  MAGI_ASSERT(false, "unhandled symbolic op ", ir::sym_op_name(op));
  return {};
}

// Whether autograd would record a call on this stack: an out= overload refuses that.
bool records_grad(const torch::jit::Stack& stack) {
  if (!at::GradMode::is_enabled()) return false;
  for (const c10::IValue& v : stack) {
    if (v.isTensor() && v.toTensor().requires_grad()) return true;
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (t.requires_grad()) return true;
      }
    }
  }
  return false;
}

c10::IValue make_list(ir::ValueKind kind, std::vector<const c10::IValue*> items) {
  using ir::ValueKind;
  switch (kind) {
    case ValueKind::kIntList: {
      c10::List<int64_t> list;
      list.reserve(items.size());
      for (auto* v : items) list.push_back(to_int(*v));
      return list;
    }
    case ValueKind::kFloatList: {
      c10::List<double> list;
      for (auto* v : items) list.push_back(to_double(*v));
      return list;
    }
    case ValueKind::kBoolList: {
      c10::List<bool> list;
      for (auto* v : items) list.push_back(v->toBool());
      return list;
    }
    case ValueKind::kTensorList: {
      c10::List<at::Tensor> list;
      list.reserve(items.size());
      for (auto* v : items) list.push_back(v->toTensor());
      return list;
    }
    case ValueKind::kOptionalTensorList: {
      c10::List<std::optional<at::Tensor>> list;
      for (auto* v : items) {
        list.push_back(v->isNone() ? std::optional<at::Tensor>() : v->toTensor());
      }
      return list;
    }
    default:
      break;
  }
  MAGI_ASSERT(false, "cannot build a list of kind ", ir::value_kind_name(kind));
  return {};
}

// A piece call in row chunks (ir::Node::chunk_rows): the piece runs on slices of at most
// `rows` rows of the chunked inputs, in chunks of equal size but the last, and each output's
// slices are copied into one tensor of all the rows. No more rows than that: one plain call.
std::vector<c10::IValue> run_in_row_chunks(const Executable& piece, std::vector<c10::IValue> args,
                                           int64_t rows, const std::vector<bool>& chunked) {
  int64_t total = -1;
  for (size_t j = 0; j < args.size(); ++j) {
    if (!chunked[j]) continue;
    const int64_t n = args[j].toTensor().size(0);
    MAGI_CHECK(total < 0 || n == total, "a piece call in row chunks got inputs of ", total, " and ",
               n, " rows");
    total = n;
  }
  if (total <= rows) return piece.run(std::move(args));
  const int64_t chunks = (total + rows - 1) / rows;
  const int64_t step = (total + chunks - 1) / chunks;
  std::vector<at::Tensor> whole;
  for (int64_t begin = 0; begin < total; begin += step) {
    const int64_t length = std::min(step, total - begin);
    std::vector<c10::IValue> part;
    part.reserve(args.size());
    for (size_t j = 0; j < args.size(); ++j) {
      part.push_back(chunked[j] ? c10::IValue(args[j].toTensor().narrow(0, begin, length))
                                : args[j]);
    }
    std::vector<c10::IValue> results = piece.run(std::move(part));
    for (size_t k = 0; k < results.size(); ++k) {
      const at::Tensor& t = results[k].toTensor();
      if (begin == 0) {
        std::vector<int64_t> sizes = t.sizes().vec();
        sizes[0] = total;
        whole.push_back(at::empty(sizes, t.options()));
      }
      whole[k].narrow(0, begin, length).copy_(t);
    }
  }
  return {whole.begin(), whole.end()};
}

}  // namespace

void Executable::keep_folded_values(Program& p,
                                    std::vector<std::pair<int32_t, c10::IValue>> values) {
  int64_t bytes = 0;
  for (const auto& [r, v] : values) {
    if (v.isTensor()) bytes += static_cast<int64_t>(v.toTensor().nbytes());
  }
  std::lock_guard<std::mutex> lock(p.folded_mutex);
  if (p.folded_ready.load(std::memory_order_relaxed) || p.folding_off.load()) return;
  if (bytes > kMaxFoldedBytes) {
    MAGI_LOG_DEBUG("executor: ", bytes, " bytes of constant results exceed ", kMaxFoldedBytes,
                   "; they are recomputed on every call");
    p.folding_off.store(true);
    return;
  }
  p.folded = std::move(values);
  p.folded_ready.store(true, std::memory_order_release);
}

size_t Executable::num_inputs() const { return program_->input_regs.size(); }
size_t Executable::num_outputs() const { return program_->output_refs.size(); }
size_t Executable::num_instructions() const { return program_->instrs.size(); }
size_t Executable::num_operator_calls() const { return program_->num_calls; }
size_t Executable::num_piece_calls() const { return program_->num_piece_calls; }
size_t Executable::num_constant_instructions() const {
  size_t n = 0;
  for (const Instr& instr : program_->instrs) n += instr.once;
  return n;
}
size_t Executable::num_folded_values() const {
  std::lock_guard<std::mutex> lock(program_->folded_mutex);
  return program_->folded_ready.load() ? program_->folded.size() : 0;
}
size_t Executable::num_chunked_pieces() const {
  size_t n = 0;
  for (bool c : program_->chunked_pieces) n += c;
  return n;
}

size_t Executable::num_pieces() const {
  size_t n = 0;
  for (const auto& piece : program_->pieces) n += piece != nullptr;
  return n;
}

const Executable& Executable::piece(size_t i) const {
  size_t seen = 0;
  for (const auto& piece : program_->pieces) {
    if (piece != nullptr && seen++ == i) return *piece;
  }
  MAGI_CHECK(false, "piece ", i, " of an executable with ", num_pieces(), " pieces");
  return *this;
}

namespace {

// Per piece, per piece input: whether every call of the piece passes a keyed input of the
// graph there (the register still holding it, not yet written by an instruction).
std::vector<std::vector<bool>> keyed_piece_inputs(const std::vector<Instr>& instrs,
                                                  const std::vector<Ref>& input_regs,
                                                  const std::vector<bool>& keyed, size_t num_pieces,
                                                  size_t num_registers) {
  std::vector<std::vector<bool>> out(num_pieces);
  std::vector<bool> called(num_pieces, false);
  std::vector<bool> holds_keyed(num_registers, false);  // per register: a keyed input still
  for (size_t i = 0; i < input_regs.size() && i < keyed.size(); ++i) {
    if (keyed[i] && input_regs[i] >= 0) holds_keyed[input_regs[i]] = true;
  }
  auto is_keyed = [&](Ref r) {
    return r >= 0 && static_cast<size_t>(r) < holds_keyed.size() && holds_keyed[r];
  };
  for (const Instr& instr : instrs) {
    if (instr.kind == InstrKind::kCallPiece && instr.piece < num_pieces) {
      std::vector<bool>& k = out[instr.piece];
      if (!called[instr.piece]) {
        called[instr.piece] = true;
        k.assign(instr.in.size(), true);
      }
      for (size_t j = 0; j < instr.in.size() && j < k.size(); ++j) {
        k[j] = k[j] && is_keyed(instr.in[j]);
      }
    }
    for (Ref r : instr.out) {
      if (r >= 0 && static_cast<size_t>(r) < holds_keyed.size()) holds_keyed[r] = false;
    }
  }
  return out;
}

}  // namespace

void Executable::enable_piece_cuda_graphs(size_t max_graphs, std::vector<int64_t> ladder,
                                          const std::vector<bool>& keyed_inputs) {
  Program& p = *program_;
  p.piece_graphs.clear();
  const std::vector<std::vector<bool>> keyed =
      keyed_piece_inputs(p.instrs, p.input_regs, keyed_inputs, p.pieces.size(), p.num_registers);
  for (size_t i = 0; i < p.pieces.size(); ++i) {
    const bool chunked = i < p.chunked_pieces.size() && p.chunked_pieces[i];
    p.piece_graphs.push_back(
        p.pieces[i] && !chunked
            ? std::make_unique<CudaGraphRunner>(*p.pieces[i], max_graphs, ladder, keyed[i])
            : nullptr);
  }
}

const PaddingPlan& Executable::padding() const { return program_->padding; }

std::vector<LoweringStep> Executable::lowering_steps() const {
  std::vector<LoweringStep> steps = program_->steps;
  for (const auto& piece : program_->pieces) {
    if (!piece) continue;
    const std::vector<LoweringStep> own = piece->lowering_steps();
    for (size_t i = 0; i < steps.size() && i < own.size(); ++i) {
      steps[i].milliseconds += own[i].milliseconds;
      steps[i].ran = steps[i].ran || own[i].ran;
    }
  }
  return steps;
}

Executable::ArenaStats Executable::arena_stats() const {
  ArenaStats stats;
  if (const Arena* a = program_->arena.get()) {
    stats.planned_values = a->values.size();
    stats.runs = a->placed_calls.load(std::memory_order_relaxed);
    stats.last_bytes = a->last_bytes.load(std::memory_order_relaxed);
    stats.last_peak_live = a->last_peak_live.load(std::memory_order_relaxed);
    stats.unplanned_copies = a->unplanned_copies.load(std::memory_order_relaxed);
  }
  for (const auto& piece : program_->pieces) {
    if (!piece) continue;
    const ArenaStats s = piece->arena_stats();
    stats.planned_values += s.planned_values;
    stats.runs += s.runs;
    stats.unplanned_copies += s.unplanned_copies;
    if (s.last_bytes > stats.last_bytes) {
      stats.last_bytes = s.last_bytes;
      stats.last_peak_live = s.last_peak_live;
    }
  }
  return stats;
}
bool Executable::draws_random_numbers() const { return program_->draws_random; }
bool Executable::calls_custom_ops() const { return program_->calls_custom_ops; }

size_t Executable::num_piece_graph_captures() const {
  size_t n = 0;
  for (const auto& r : program_->piece_graphs) n += r ? r->num_captures() : 0;
  return n;
}

size_t Executable::num_piece_graphs() const {
  size_t n = 0;
  for (const auto& r : program_->piece_graphs) n += r ? r->num_graphs() : 0;
  return n;
}

size_t Executable::num_piece_padded_calls() const {
  size_t n = 0;
  for (const auto& r : program_->piece_graphs) n += r ? r->num_padded_calls() : 0;
  return n;
}

size_t Executable::num_fusions() const {
  size_t n = program_->num_fusions;
  for (const auto& piece : program_->pieces) {
    if (piece) n += piece->num_fusions();
  }
  return n;
}

size_t Executable::num_in_place_outputs() const {
  size_t n = 0;
  for (const auto& f : program_->fused) {
    if (f) n += f->num_in_place_outputs();
  }
  for (const auto& piece : program_->pieces) {
    if (piece) n += piece->num_in_place_outputs();
  }
  return n;
}

std::vector<GeneratedKernel> Executable::generated_kernels() const {
  std::vector<GeneratedKernel> out;
  for (const auto& f : program_->fused) {
    if (!f) continue;
    for (auto& k : f->generated()) out.push_back(std::move(k));
  }
  for (const auto& piece : program_->pieces) {
    if (!piece) continue;
    for (auto& k : piece->generated_kernels()) out.push_back(std::move(k));
  }
  return out;
}

std::map<int, std::vector<codegen::CudaSource>> Executable::expected_cuda_sources() const {
  std::map<int, std::vector<codegen::CudaSource>> by_device;
  std::vector<const Executable*> stack = {this};
  while (!stack.empty()) {
    const Executable* exe = stack.back();
    stack.pop_back();
    for (const auto& f : exe->program_->fused) {
      if (!f) continue;
      std::optional<codegen::CudaSource> source;
      try {
        source = f->expected_cuda_source();
      } catch (const std::exception& e) {  // the first call decides, and reports
        MAGI_LOG_DEBUG("no kernel to precompile for ", f->spec().name, ": ", e.what());
      }
      if (!source) continue;
      auto& list = by_device[f->device().index()];
      bool seen = false;  // identical groups in different pieces print the same source
      for (const auto& other : list) seen |= other.source == source->source;
      if (!seen) list.push_back(std::move(*source));
    }
    for (const auto& piece : exe->program_->pieces) {
      if (piece) stack.push_back(piece.get());
    }
  }
  return by_device;
}

size_t Executable::precompile_kernels() const {
  size_t count = 0;
  for (auto& [device, sources] : expected_cuda_sources()) {
    if (sources.empty() || !codegen::cuda_driver_available()) continue;
    try {
      const codegen::DeviceInfo info = codegen::device_info(device < 0 ? 0 : device);
      count += codegen::compile_cuda_batch(sources, info.major * 10 + info.minor).size();
    } catch (const std::exception& e) {
      MAGI_LOG_DEBUG("precompiling ", sources.size(),
                     " kernels failed; the first call compiles them: ", e.what());
    }
  }
  return count;
}

std::optional<OffloadReport> Executable::offload_report() const {
  return program_->offload ? program_->offload->report() : std::nullopt;
}
bool Executable::outputs_may_alias_inputs() const { return program_->outputs_alias_inputs; }
bool Executable::writes_inputs() const { return program_->writes_inputs; }
bool Executable::input_written(size_t i) const {
  return i < program_->written_inputs.size() && program_->written_inputs[i];
}
const std::vector<int32_t>& Executable::inputs_output_may_alias(size_t k) const {
  static const std::vector<int32_t> kNone;
  return k < program_->output_input_roots.size() ? program_->output_input_roots[k] : kNone;
}

std::vector<size_t> Executable::piece_call_sequence() const {
  std::vector<size_t> out;
  for (const Instr& instr : program_->instrs) {
    if (instr.kind == InstrKind::kCallPiece) out.push_back(instr.piece);
  }
  return out;
}

std::vector<c10::IValue> Executable::run(std::vector<c10::IValue> inputs) const {
  const Program& p = *program_;
  MAGI_CHECK(inputs.size() == p.input_regs.size(), "the compiled graph takes ", p.input_regs.size(),
             " inputs but was called with ", inputs.size());
  // Weight offload: the engine swaps offloaded weights for GPU buffers and orders the copies.
  OffloadEngine* engine = p.offload.get();
  std::unique_lock<std::mutex> offload_lock;
  if (engine != nullptr) {
    offload_lock = std::unique_lock<std::mutex>(engine->lock());
    if (!engine->begin(inputs)) {
      engine = nullptr;
      offload_lock.unlock();
    }
  }
  struct AbortOnThrow {
    OffloadEngine* engine;
    ~AbortOnThrow() {
      if (engine != nullptr) engine->abort();
    }
  } abort_on_throw{engine};

  // The memory arena: a segment's block is allocated when the first of its values is written
  // and dropped by the run after the last step reading one (views keep it until they die).
  std::shared_ptr<const ArenaLayoutForSizes> layout;
  if (p.arena && !ArenaOffScope::active()) {
    layout = p.arena->layout_for(inputs);
    if (layout->bytes == 0) layout.reset();
  }
  // Per segment: its block while the run holds it; the storages of those held, for the check
  // after each step.
  std::vector<at::Tensor> arenas;
  std::vector<std::pair<int32_t, const c10::StorageImpl*>> held;
  if (layout) arenas.resize(layout->segment_bytes.size());
  auto arena_slot = [&](Ref r) -> at::Tensor {
    const int32_t v = r == kUnused ? -1 : p.arena->value_of[r];
    if (v < 0 || layout->offsets[v] < 0) return {};
    const int32_t segment = layout->segment[v];
    at::Tensor& arena = arenas[segment];
    if (!arena.defined()) {
      arena = at::empty({layout->segment_bytes[segment]},
                        at::TensorOptions().dtype(at::kByte).device(p.arena->device));
      held.emplace_back(segment, arena.storage().unsafeGetStorageImpl());
    }
    return arena_tensor(arena, layout->offsets[v], p.arena->values[v].dtype, layout->sizes[v]);
  };
  if (layout) {
    p.arena->placed_calls.fetch_add(1, std::memory_order_relaxed);
    p.arena->last_bytes.store(layout->bytes, std::memory_order_relaxed);
    p.arena->last_peak_live.store(layout->peak_live, std::memory_order_relaxed);
  }

  std::vector<c10::IValue> regs(p.num_registers);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (p.input_regs[i] != kUnused) regs[p.input_regs[i]] = std::move(inputs[i]);
  }
  auto get = [&](Ref r) -> const c10::IValue& { return r >= 0 ? regs[r] : p.constants[-r - 1]; };
  std::optional<MemoryTrace> trace;
  if (memory_trace_on()) trace.emplace(regs);

  // Constant instructions: the first call runs them and collects what later ones read.
  Program& state = *program_;
  const bool fold = p.folding && !state.folding_off.load(std::memory_order_relaxed);
  const bool folded = fold && state.folded_ready.load(std::memory_order_acquire);
  std::vector<std::pair<Ref, c10::IValue>> collected;
  if (folded) {
    for (const auto& [r, v] : state.folded) regs[r] = v;
  }

  torch::jit::Stack stack;
  stack.reserve(p.max_stack);
  for (size_t step = 0; step < p.instrs.size(); ++step) {
    const Instr& instr = p.instrs[step];
    if (engine != nullptr) engine->before_step(step);
    if (instr.once && folded) {
      if (engine != nullptr) engine->after_step(step);  // its copy gates still open
      continue;
    }
    // Offload's first call estimates each operator's GPU time from its operands.
    const bool estimate = OffloadEngine::estimating();
    switch (instr.kind) {
      case InstrKind::kCall: {
        stack.clear();
        for (size_t j = 0; j < instr.in.size(); ++j) {
          Ref r = instr.in[j];
          if (instr.move_in[j]) {
            stack.push_back(std::move(regs[r]));
          } else {
            stack.push_back(get(r));
          }
        }
        std::vector<c10::IValue> operands;
        if (estimate) operands = stack;
        // Into the arena through the out= overload (not where autograd would record the call).
        const c10::OperatorHandle* op = &*instr.op;
        if (instr.out_op && layout && !records_grad(stack)) {
          at::Tensor slot = arena_slot(instr.out[0]);
          if (slot.defined()) {
            stack.push_back(std::move(slot));
            op = &*instr.out_op;
          }
        }
        try {
          op->callBoxed(stack);
        } catch (...) {
          rethrow_with_context("magi-compiler: " + instr.where + " failed");
        }
        if (estimate) {
          OffloadEngine::add_estimate(
              estimate_operator_us(instr.op->operator_name().name, operands, stack));
        }
        MAGI_ASSERT(stack.size() == instr.out.size(), instr.where, " returned ", stack.size(),
                    " values, expected ", instr.out.size());
        if (op != &*instr.op) {  // the arena's out= call: it must not have resized its block
          const int32_t v = p.arena->value_of[instr.out[0]];
          MAGI_ASSERT(
              stack[0].isTensor() &&
                  stack[0].toTensor().sizes() == c10::IntArrayRef(layout->sizes[v]),
              instr.where,
              " wrote a result of another size than its traced type into "
              "the memory arena; run with MAGI_DISABLE_PASSES=plan_memory_arena and report it");
        }
        for (size_t k = 0; k < instr.out.size(); ++k) {
          if (instr.out[k] != kUnused) regs[instr.out[k]] = std::move(stack[k]);
        }
        break;
      }
      case InstrKind::kSym: {
        const c10::IValue& a = get(instr.in[0]);
        const c10::IValue* b = instr.in.size() > 1 ? &get(instr.in[1]) : nullptr;
        c10::IValue result = eval_sym(instr.sym, a, b);
        if (instr.out[0] != kUnused) regs[instr.out[0]] = std::move(result);
        break;
      }
      case InstrKind::kGetItem: {
        auto items = get(instr.in[0]).toListRef();
        MAGI_ASSERT(instr.item_index >= 0 && size_t(instr.item_index) < items.size(), instr.where,
                    ": index ", instr.item_index, " of a list of ", items.size());
        if (instr.out[0] != kUnused) regs[instr.out[0]] = items[instr.item_index];
        break;
      }
      case InstrKind::kFusion: {
        std::vector<at::Tensor> args;
        args.reserve(instr.in.size());
        for (size_t j = 0; j < instr.in.size(); ++j) {
          Ref r = instr.in[j];
          args.push_back(instr.move_in[j] ? std::move(regs[r]).toTensor() : get(r).toTensor());
        }
        std::vector<c10::IValue> operands;
        if (estimate) operands.assign(args.begin(), args.end());
        std::vector<at::Tensor> presets;
        if (layout) {
          for (Ref r : instr.out) presets.push_back(arena_slot(r));
          bool any = false;
          for (const at::Tensor& t : presets) any |= t.defined();
          if (!any) presets.clear();
        }
        std::vector<at::Tensor> results =
            presets.empty() ? p.fused[instr.piece]->run(std::move(args))
                            : p.fused[instr.piece]->run(std::move(args), std::move(presets));
        if (estimate) {
          OffloadEngine::add_estimate(estimate_operator_us(
              "fusion", operands, std::vector<c10::IValue>(results.begin(), results.end())));
        }
        for (size_t k = 0; k < instr.out.size(); ++k) {
          if (instr.out[k] != kUnused) regs[instr.out[k]] = std::move(results[k]);
        }
        break;
      }
      case InstrKind::kAttention: {
        std::vector<c10::IValue> args;
        args.reserve(instr.in.size());
        for (size_t j = 0; j < instr.in.size(); ++j) {
          Ref r = instr.in[j];
          args.push_back(instr.move_in[j] ? std::move(regs[r]) : get(r));
        }
        std::vector<c10::IValue> operands;
        if (estimate) operands = args;
        at::Tensor out;
        try {
          out = p.attention[instr.attention]->run(args);
        } catch (...) {
          rethrow_with_context("magi-compiler: " + instr.where + " failed");
        }
        if (estimate) {
          OffloadEngine::add_estimate(
              estimate_operator_us(instr.op->operator_name().name, operands, {out}));
        }
        regs[instr.out[0]] = std::move(out);
        break;
      }
      case InstrKind::kCallPiece: {
        std::vector<c10::IValue> args;
        args.reserve(instr.in.size());
        for (size_t j = 0; j < instr.in.size(); ++j) {
          Ref r = instr.in[j];
          args.push_back(instr.move_in[j] ? std::move(regs[r]) : get(r));
        }
        std::vector<c10::IValue> results =
            instr.chunk_rows > 0 ? run_in_row_chunks(*p.pieces[instr.piece], std::move(args),
                                                     instr.chunk_rows, instr.chunked)
            : (instr.piece < p.piece_graphs.size() && p.piece_graphs[instr.piece])
                ? p.piece_graphs[instr.piece]->run(std::move(args))
                : p.pieces[instr.piece]->run(std::move(args));
        for (size_t k = 0; k < instr.out.size(); ++k) {
          if (instr.out[k] != kUnused) regs[instr.out[k]] = std::move(results[k]);
        }
        break;
      }
      case InstrKind::kMakeList: {
        std::vector<const c10::IValue*> items;
        items.reserve(instr.in.size());
        for (Ref r : instr.in) items.push_back(&get(r));
        c10::IValue list = make_list(instr.list_kind, std::move(items));
        if (instr.out[0] != kUnused) regs[instr.out[0]] = std::move(list);
        break;
      }
    }
    if (!held.empty()) {
      // A result on an arena that the plan did not put there (an operator returning an
      // operand it was not declared to alias): a copy, so the plan's reuse cannot reach it.
      for (Ref r : instr.out) {
        if (instr.may_alias || r == kUnused || !regs[r].isTensor()) continue;
        const at::Tensor& t = regs[r].toTensor();
        if (!t.has_storage()) continue;
        const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
        for (const auto& [segment, arena_storage] : held) {
          if (storage != arena_storage) continue;
          const int32_t v = p.arena->value_of[r];
          if (v >= 0 && layout->offsets[v] >= 0 && layout->segment[v] == segment &&
              t.data_ptr() == static_cast<char*>(arenas[segment].data_ptr()) + layout->offsets[v]) {
            break;
          }
          MAGI_LOG_DEBUG("memory arena: ", instr.where, " returned arena memory it was not given");
          p.arena->unplanned_copies.fetch_add(1, std::memory_order_relaxed);
          regs[r] = t.clone();
          break;
        }
      }
      for (size_t k = held.size(); k-- > 0;) {
        if (step < layout->segment_last[held[k].first]) continue;
        arenas[held[k].first] = at::Tensor();  // its views keep the memory until they die
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    if (instr.once && fold && !folded) {
      for (Ref r : instr.out) {
        if (r != kUnused && p.keep_folded[r]) collected.emplace_back(r, regs[r]);
      }
    }
    for (Ref r : instr.release_after) regs[r] = c10::IValue();
    if (trace) trace->record(regs, static_cast<int64_t>(step));
    if (engine != nullptr) engine->after_step(step);
  }
  if (engine != nullptr) {
    abort_on_throw.engine = nullptr;
    try {
      engine->finish();
    } catch (...) {
      engine->abort();
      throw;
    }
    offload_lock.unlock();
  }

  std::vector<c10::IValue> outputs;
  outputs.reserve(p.output_refs.size());
  for (Ref r : p.output_refs) outputs.push_back(get(r));
  if (fold) {
    // A kept value, or a view of one, handed to the caller would be shared by every call (and
    // changed for all of them by an in-place write): the caller gets its own copy.
    const auto& kept = folded ? state.folded : collected;
    for (size_t i = 0; i < outputs.size() && i < p.private_outputs_from; ++i) {
      c10::IValue& out = outputs[i];
      if (!out.isTensor() || !out.toTensor().has_storage()) continue;
      const c10::StorageImpl* storage = out.toTensor().storage().unsafeGetStorageImpl();
      for (const auto& [r, v] : kept) {
        if (v.isTensor() && v.toTensor().has_storage() &&
            v.toTensor().storage().unsafeGetStorageImpl() == storage) {
          out = out.toTensor().clone();
          break;
        }
      }
    }
  }
  if (fold && !folded) keep_folded_values(state, std::move(collected));
  if (trace) {
    regs.clear();
    trace->report(p.instrs, p.num_registers);
  }
  return outputs;
}

}  // namespace magi::runtime
