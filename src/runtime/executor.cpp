// Executable: the interpreter loop that runs a lowered program (lower_program.cpp builds it),
// and what an Executable reports about itself.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <c10/core/CachingDeviceAllocator.h>

#include "magi/codegen/compiler.h"
#include "magi/common/error.h"
#include "magi/common/log.h"
#include "program.h"

namespace magi::runtime {
namespace {

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

// MAGI_MEMORY_TRACE=1: each run logs the most tensor memory its registers held at once (distinct
// storages), the step where that happened and the largest values alive there. For comparing a
// graph's real liveness with the recompute planner's prediction; costs a scan of the registers
// after every instruction, so it is off by default.
bool memory_trace_on() {
  static const bool on = [] {
    const char* v = std::getenv("MAGI_MEMORY_TRACE");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return on;
}

class MemoryTrace {
 public:
  explicit MemoryTrace(const std::vector<c10::IValue>& regs) {
    for (const c10::IValue& v : regs) {
      const c10::StorageImpl* s = storage_of(v);
      if (s != nullptr && input_index_.emplace(s, inputs_.size()).second) {
        inputs_.push_back({c10::weak_intrusive_ptr<c10::StorageImpl>(
                               c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(
                                   const_cast<c10::StorageImpl*>(s))),
                           static_cast<int64_t>(s->nbytes())});
      }
      if (device_ < 0 && v.isTensor() && v.toTensor().is_cuda())
        device_ = v.toTensor().get_device();
    }
    if (device_ >= 0) {
      const auto stats = allocator_stats();
      start_allocated_ = stats.current;
      allocator_peak_ = stats.peak;
    }
    record(regs, -1);
  }

  // Records the distinct storages the registers hold after instruction `step` (-1: the inputs
  // alone): their bytes, and which of them are inputs.
  void record(const std::vector<c10::IValue>& regs, int64_t step) {
    if (device_ >= 0) {
      // The allocator's peak only rises during the instruction that set it: this is the one
      // (inside it: its outputs beside its inputs, and whatever it allocates for itself).
      const int64_t peak = allocator_stats().peak;
      if (peak > allocator_peak_) allocator_peak_ = peak, allocator_peak_step_ = step;
    }
    std::unordered_map<const c10::StorageImpl*, size_t> seen;  // storage -> first register
    Step rec{step, 0, {}, {}};
    for (size_t r = 0; r < regs.size(); ++r) {
      const c10::StorageImpl* s = storage_of(regs[r]);
      if (s == nullptr || !seen.emplace(s, r).second) continue;
      rec.bytes += static_cast<int64_t>(s->nbytes());
      auto in = input_index_.find(s);
      const bool is_input = in != input_index_.end();
      if (is_input) rec.inputs.push_back(in->second);
      rec.storages.push_back({static_cast<int64_t>(s->nbytes()), r, is_input ? in->second : kNone});
    }
    steps_.push_back(std::move(rec));
  }

  // Call once the registers are gone: an input whose storage is still alive then is the
  // caller's (a parameter, a tensor it keeps) and is not counted as the run's memory.
  void report(const std::vector<Instr>& instrs, size_t num_registers) const {
    std::vector<char> resident(inputs_.size());
    int64_t resident_bytes = 0;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      resident[i] = !inputs_[i].storage.expired();
      if (resident[i]) resident_bytes += inputs_[i].bytes;
    }
    const Step* peak = nullptr;
    int64_t peak_bytes = -1;
    for (const Step& st : steps_) {
      int64_t own = st.bytes;
      for (size_t i : st.inputs) own -= resident[i] ? inputs_[i].bytes : 0;
      if (own > peak_bytes) peak_bytes = own, peak = &st;
    }
    std::vector<std::string> made_by(num_registers, "an input");
    for (const Instr& instr : instrs) {
      for (Ref r : instr.out) {
        if (r != kUnused) made_by[r] = instr.where;
      }
    }
    std::vector<std::pair<int64_t, size_t>> largest;
    for (const Held& h : peak->storages) {
      if (h.input == kNone || !resident[h.input]) largest.emplace_back(h.bytes, h.reg);
    }
    std::sort(largest.begin(), largest.end(), std::greater<>());
    std::string lines;
    for (size_t i = 0; i < largest.size() && i < 12; ++i) {
      lines += detail::str_cat("\n  ", mib(largest[i].first), " from ", made_by[largest[i].second]);
    }
    const std::string where =
        peak->step < 0 ? std::string("with the inputs alone") : "after " + instrs[peak->step].where;
    log::write(
        log::Level::kInfo,
        detail::str_cat("memory trace: ", instrs.size(), " instructions, peak ", mib(peak_bytes),
                        " of tensors ", where, " (step ", peak->step, "), not counting the ",
                        mib(resident_bytes),
                        " of inputs the caller keeps (parameters...); largest there:", lines));
    if (device_ >= 0) {
      log::write(
          log::Level::kInfo,
          allocator_peak_step_ < 0
              ? detail::str_cat("memory trace: the CUDA allocator's peak (", mib(allocator_peak_),
                                ") was not raised by this run")
              : detail::str_cat("memory trace: the CUDA allocator's peak rose to ",
                                mib(allocator_peak_), ", ", mib(allocator_peak_ - start_allocated_),
                                " above what was allocated when the run began, during ",
                                instrs[allocator_peak_step_].where, " (step ", allocator_peak_step_,
                                ")"));
    }
  }

 private:
  struct Input {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t bytes;
  };
  static constexpr size_t kNone = static_cast<size_t>(-1);
  struct Held {
    int64_t bytes;
    size_t reg;    // the first register holding the storage
    size_t input;  // index into inputs_, or kNone
  };
  struct Step {
    int64_t step;
    int64_t bytes;
    std::vector<size_t> inputs;  // indices into inputs_
    std::vector<Held> storages;
  };
  static const c10::StorageImpl* storage_of(const c10::IValue& v) {
    if (!v.isTensor()) return nullptr;
    const at::Tensor& t = v.toTensor();
    return t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
  }
  static std::string mib(int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
    return buf;
  }
  struct AllocatorStats {
    int64_t current, peak;
  };
  AllocatorStats allocator_stats() const {
    const auto s = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(device_);
    const auto& all =
        s.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    return {all.current, all.peak};
  }
  int device_ = -1;  // a CUDA run's device: the allocator's peak is traced too
  int64_t start_allocated_ = 0;
  int64_t allocator_peak_ = 0;
  int64_t allocator_peak_step_ = -1;
  std::vector<Input> inputs_;
  std::unordered_map<const c10::StorageImpl*, size_t> input_index_;
  std::vector<Step> steps_;
};

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

void Executable::enable_piece_cuda_graphs(size_t max_graphs, std::vector<int64_t> ladder) {
  Program& p = *program_;
  p.piece_graphs.clear();
  for (const auto& piece : p.pieces) {
    p.piece_graphs.push_back(piece ? std::make_unique<CudaGraphRunner>(*piece, max_graphs, ladder)
                                   : nullptr);
  }
}

const PaddingPlan& Executable::padding() const { return program_->padding; }
bool Executable::draws_random_numbers() const { return program_->draws_random; }

size_t Executable::num_piece_graph_captures() const {
  size_t n = 0;
  for (const auto& r : program_->piece_graphs) n += r ? r->num_captures() : 0;
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

size_t Executable::precompile_kernels() const {
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
  size_t count = 0;
  for (auto& [device, sources] : by_device) {
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
        try {
          instr.op->callBoxed(stack);
        } catch (const std::exception& e) {
          throw std::runtime_error("magi-compiler: " + instr.where + " failed: " + e.what());
        }
        if (estimate) {
          OffloadEngine::add_estimate(
              estimate_operator_us(instr.op->operator_name().name, operands, stack));
        }
        MAGI_ASSERT(stack.size() == instr.out.size(), instr.where, " returned ", stack.size(),
                    " values, expected ", instr.out.size());
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
        std::vector<at::Tensor> results = p.fused[instr.piece]->run(args);
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
        } catch (const std::exception& e) {
          throw std::runtime_error("magi-compiler: " + instr.where + " failed: " + e.what());
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
            (instr.piece < p.piece_graphs.size() && p.piece_graphs[instr.piece])
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
