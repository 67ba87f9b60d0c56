// Executable: lowering a graph to instructions, and the interpreter loop that runs them.
#include "magi/runtime/executor.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_set>

#include "magi/codegen/compiler.h"
#include "magi/ir/structural_hash.h"
#include "magi/runtime/attention_choice.h"
#include "magi/runtime/cuda_graph.h"
#include "magi/runtime/fused_kernel.h"

#include <limits>
#include <unordered_map>

#include "magi/common/error.h"
#include "magi/common/log.h"
#include "magi/ir/verifier.h"

namespace magi::runtime {
namespace {

// Operand reference: >= 0 is a register, < 0 is constant number -(ref + 1).
using Ref = int32_t;
constexpr Ref kUnused = std::numeric_limits<Ref>::min();

enum class InstrKind : uint8_t {
  kCall,
  kSym,
  kGetItem,
  kMakeList,
  kCallPiece,
  kFusion,
  kAttention,  // an SDPA call whose kernel an AttentionCall picks (attention_choice.h)
};

struct Instr {
  InstrKind kind;
  std::optional<c10::OperatorHandle> op;            // kCall
  ir::SymOp sym = ir::SymOp::kAdd;                  // kSym
  ir::ValueKind list_kind = ir::ValueKind::kOther;  // kMakeList
  int64_t item_index = 0;                           // kGetItem
  size_t piece = 0;                                 // kCallPiece, kFusion: Program::pieces
  size_t attention = 0;                             // kAttention: Program::attention
  std::vector<Ref> in;
  std::vector<uint8_t> move_in;  // kCall, kCallPiece: move the register in (its last use)
  std::vector<Ref> out;          // kUnused for outputs nobody reads
  std::vector<Ref> release_after;
  std::string where;  // for error messages: "aten::mm (FX node mm, model.py:12)"
  bool pure = false;  // same operands, same results, nothing else touched (may run once)
  bool once = false;  // reads only constants: runs on the first call only (see Program)
};

// Operators whose results depend on their operands alone: not mutating, not random.
bool is_pure_operator(const ir::Node& node) {
  if (node.kind() != ir::NodeKind::kAtenOp) return false;
  const c10::FunctionSchema& schema = node.schema();
  if (schema.returns().empty() || schema.is_mutable()) return false;
  if (node.op().hasTag(at::Tag::nondeterministic_seeded)) return false;
  const std::string name = node.op().operator_name().name;
  for (const char* random : {"rand", "dropout", "bernoulli", "normal", "uniform", "poisson",
                             "multinomial", "exponential", "empty"}) {
    if (name.find(random) != std::string::npos) return false;
  }
  return true;
}

// Whether the call of `instr` (a kCall of `node`) may draw random numbers that its results
// depend on. Custom operators are opaque: they may. Attention whose dropout_p is the constant 0
// takes a Philox offset but uses no numbers.
bool may_draw_random(const ir::Node& node, const Instr& instr,
                     const std::vector<c10::IValue>& constants) {
  if (node.kind() == ir::NodeKind::kCustomOp) return true;
  if (node.kind() != ir::NodeKind::kAtenOp) return false;
  const std::string name = node.op().operator_name().name;
  bool random = node.op().hasTag(at::Tag::nondeterministic_seeded);
  for (const char* word : {"rand", "dropout", "bernoulli", "normal", "uniform", "poisson",
                           "multinomial", "exponential"}) {
    random |= name.find(word) != std::string::npos;
  }
  if (!random || name.find("scaled_dot_product") == std::string::npos) return random;
  const auto& arguments = node.schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() != "dropout_p") continue;
    std::optional<c10::IValue> p = arguments[i].default_value();  // when the call leaves it out
    if (i < instr.in.size()) {
      const Ref r = instr.in[i];
      if (r >= 0) return true;  // a dropout probability known only at run time
      p = constants[-r - 1];
    }
    return !p || !((p->isDouble() && p->toDouble() == 0.0) || (p->isInt() && p->toInt() == 0));
  }
  return true;
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

std::string describe(const ir::Node* node) {
  std::string s = node->op_name();
  const auto& p = node->provenance();
  if (!p.fx_name.empty() || !p.source.empty()) {
    s += " (";
    if (!p.fx_name.empty()) s += "FX node " + p.fx_name;
    if (!p.source.empty()) s += (p.fx_name.empty() ? "" : ", ") + p.source;
    s += ")";
  }
  return s;
}

// "fused_pow_mean_add_rsqrt_mul_3f2a": the ops it fuses and a hash of what it computes, so
// identical groups (one per layer) print identical sources and compile once.
std::string kernel_name(const ir::Graph& group) {
  std::string name = "fused";
  for (const ir::Node* n : group.nodes()) {
    if (!n->is_operator()) continue;
    std::string op = n->op_name();
    op = op.substr(op.find("::") == std::string::npos ? 0 : op.find("::") + 2);
    op = op.substr(0, op.find('.'));
    while (!op.empty() && op.front() == '_') op.erase(0, 1);
    if (name.size() + op.size() > 48) break;
    name += "_" + op;
  }
  uint32_t h = 2166136261u;
  for (char c : ir::structural_key(group)) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", h);
  return name + "_" + buf;
}

}  // namespace

struct Executable::Program {
  std::vector<Instr> instrs;
  std::vector<std::unique_ptr<Executable>> pieces;  // one per called piece of the graph
  std::vector<std::unique_ptr<FusedKernel>> fused;  // one per fusion group (same indexing)
  // PIECEWISE CUDA graphs: one runner per called piece (same indexing), when enabled.
  std::vector<std::unique_ptr<CudaGraphRunner>> piece_graphs;
  std::vector<std::unique_ptr<AttentionCall>> attention;
  std::vector<c10::IValue> constants;
  std::vector<Ref> input_regs;  // kUnused for inputs nobody reads
  std::vector<Ref> output_refs;
  size_t num_registers = 0;
  size_t num_calls = 0;
  size_t num_piece_calls = 0;
  size_t num_fusions = 0;
  size_t max_stack = 0;
  bool draws_random = false;  // see Executable::draws_random_numbers
  // Instructions marked `once` compute the same values on every call (rotary tables of a
  // static sequence length, masks from arange): the first call runs them and keeps the values
  // later instructions read; later calls start from those. Filled once, under the mutex.
  std::mutex folded_mutex;
  std::atomic<bool> folded_ready{false};
  std::atomic<bool> folding_off{false};  // the kept values would exceed kMaxFoldedBytes
  bool folding = false;                  // any `once` instruction
  std::vector<bool> keep_folded;         // per register: a `once` result read by other instructions
  std::vector<std::pair<Ref, c10::IValue>> folded;
  size_t private_outputs_from = std::numeric_limits<size_t>::max();  // ExecutorOptions
  bool outputs_alias_inputs = false;       // some output may be a view of some input
  bool writes_inputs = false;              // some operator writes an input in place
  std::unique_ptr<OffloadEngine> offload;  // ExecutorOptions::offload, top level only
  PaddingPlan padding;                     // plan_padding() of the graph
};

// Folded values kept per executable at most; past it every call recomputes them.
constexpr int64_t kMaxFoldedBytes = 64ll << 20;

namespace {

// Marks the pure instructions that read only constants and results of such instructions, and
// the registers among their results that the rest of the program reads.
bool mark_constant_instructions(std::vector<Instr>& instrs, size_t num_registers,
                                const std::vector<Ref>& output_refs, std::vector<bool>* keep) {
  std::vector<bool> constant(num_registers, false);
  for (Instr& instr : instrs) {
    bool all_constant = instr.pure;
    for (Ref r : instr.in) all_constant &= r < 0 || constant[r];
    if (!all_constant) continue;
    instr.once = true;
    for (Ref r : instr.out) {
      if (r != kUnused) constant[r] = true;
    }
  }
  keep->assign(num_registers, false);
  for (const Instr& instr : instrs) {
    if (instr.once) continue;
    const bool mutates = instr.kind == InstrKind::kCall && instr.op->schema().is_mutable();
    for (Ref r : instr.in) {
      if (r < 0 || !constant[r]) continue;
      // A value some operator writes in place must be fresh on every call: fold nothing.
      if (mutates) {
        for (Instr& i : instrs) i.once = false;
        return false;
      }
      (*keep)[r] = true;
    }
  }
  for (Ref r : output_refs) {
    if (r >= 0 && constant[r]) (*keep)[r] = true;
  }
  bool any = false;
  for (const Instr& instr : instrs) any |= instr.once;
  return any;
}

}  // namespace

// Which inputs each register may share memory with (views of them, lists holding them), and
// from that: the steps reading each input or a view of it, the inputs some operator writes in
// place, the inputs a view of which is an output. Sets the program's alias facts and, when
// offload is on, creates its engine.
void Executable::analyse_input_uses(Program& p, const ExecutorOptions& options) {
  const size_t n = p.input_regs.size();
  std::vector<std::vector<int32_t>> roots(p.num_registers);
  for (size_t i = 0; i < n; ++i) {
    if (p.input_regs[i] >= 0) roots[p.input_regs[i]] = {static_cast<int32_t>(i)};
  }
  constexpr size_t kNever = std::numeric_limits<size_t>::max();
  std::vector<size_t> first(n, kNever), last(n, 0);
  std::vector<bool> written(n, false), escapes(n, false), touched(n, false);
  for (size_t s = 0; s < p.instrs.size(); ++s) {
    const Instr& instr = p.instrs[s];
    std::vector<int32_t> read;
    for (Ref r : instr.in) {
      if (r >= 0) read.insert(read.end(), roots[r].begin(), roots[r].end());
    }
    std::sort(read.begin(), read.end());
    read.erase(std::unique(read.begin(), read.end()), read.end());
    bool aliasing = false;
    switch (instr.kind) {
      case InstrKind::kCall: {
        const c10::FunctionSchema& schema = instr.op->schema();
        for (const auto& ret : schema.returns()) aliasing |= ret.alias_info() != nullptr;
        const auto& args = schema.arguments();
        for (size_t j = 0; j < instr.in.size() && j < args.size(); ++j) {
          const auto* alias = args[j].alias_info();
          if (alias == nullptr || !alias->isWrite() || instr.in[j] < 0) continue;
          for (int32_t i : roots[instr.in[j]]) written[i] = true;
        }
        break;
      }
      case InstrKind::kGetItem:
      case InstrKind::kMakeList:
        aliasing = true;
        break;
      case InstrKind::kCallPiece: {
        const Executable& piece = *p.pieces[instr.piece];
        aliasing = piece.outputs_may_alias_inputs();
        if (piece.writes_inputs()) {
          for (int32_t i : read) written[i] = true;
        }
        break;
      }
      default:
        break;
    }
    // A step that only makes views of an input (t, view, a list of it) reads no data: the
    // input's first use is the first step that computes with it.
    bool only_views = aliasing && instr.kind != InstrKind::kCallPiece;
    if (instr.kind == InstrKind::kCall) {
      for (const auto& ret : instr.op->schema().returns()) {
        only_views &= ret.alias_info() != nullptr && !ret.alias_info()->isWrite();
      }
    }
    for (int32_t i : read) {
      if (!only_views) first[i] = std::min(first[i], s);
      last[i] = std::max(last[i], s);
      touched[i] = true;
    }
    if (aliasing) {
      for (Ref r : instr.out) {
        if (r != kUnused) roots[r] = read;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (first[i] != kNever || !touched[i]) continue;
    // Read only through views (say, returned as one): the first view counts.
    for (size_t s = 0; s < p.instrs.size() && first[i] == kNever; ++s) {
      for (Ref r : p.instrs[s].in) {
        if (r >= 0 && std::find(roots[r].begin(), roots[r].end(), int32_t(i)) != roots[r].end()) {
          first[i] = s;
        }
      }
    }
  }
  for (Ref r : p.output_refs) {
    if (r < 0) continue;
    for (int32_t i : roots[r]) escapes[i] = true;
  }
  for (size_t i = 0; i < n; ++i) {
    p.outputs_alias_inputs = p.outputs_alias_inputs || escapes[i];
    p.writes_inputs = p.writes_inputs || written[i];
  }
  if (!options.offload) return;
  std::vector<OffloadInputUse> uses;
  for (size_t i = 0; i < n; ++i) {
    if (first[i] == kNever) continue;
    uses.push_back({i, first[i], last[i], escapes[i], written[i]});
  }
  p.offload = std::make_unique<OffloadEngine>(*options.offload, std::move(uses), p.instrs.size());
}

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

Executable::Executable(const ir::Graph& graph, const ExecutorOptions& options)
    : program_(std::make_unique<Program>()) {
  ir::verify(graph);
  Program& p = *program_;
  p.private_outputs_from = options.private_outputs_from;
  p.padding = plan_padding(graph);
  std::unordered_map<const ir::Value*, Ref> ref_of;
  std::unordered_set<const ir::Graph*> fusion_groups;
  for (const ir::Node* node : graph.nodes()) {
    if (node->kind() == ir::NodeKind::kFusion) fusion_groups.insert(node->piece());
  }
  ExecutorOptions piece_options = options;
  piece_options.offload.reset();  // a piece gets weights the top level already placed
  for (const ir::Graph* piece : graph.pieces()) {
    if (fusion_groups.count(piece)) {
      p.pieces.push_back(nullptr);
      p.fused.push_back(std::make_unique<FusedKernel>(*piece, kernel_name(*piece)));
    } else {
      p.pieces.push_back(std::make_unique<Executable>(*piece, piece_options));
      p.fused.push_back(nullptr);
    }
  }

  auto new_register = [&](const ir::Value* v) {
    Ref r = static_cast<Ref>(p.num_registers++);
    ref_of[v] = r;
    return r;
  };

  for (const ir::Node* node : graph.nodes()) {
    switch (node->kind()) {
      case ir::NodeKind::kInput:
        p.input_regs.push_back(new_register(node->output()));
        continue;
      case ir::NodeKind::kConstant:
        p.constants.push_back(node->constant());
        ref_of[node->output()] = -static_cast<Ref>(p.constants.size());
        continue;
      case ir::NodeKind::kOutput:
        for (const ir::Value* v : node->inputs()) p.output_refs.push_back(ref_of.at(v));
        continue;
      default:
        break;
    }
    Instr instr;
    instr.where = describe(node);
    for (const ir::Value* v : node->inputs()) instr.in.push_back(ref_of.at(v));
    for (const ir::Value* v : node->outputs()) instr.out.push_back(new_register(v));
    switch (node->kind()) {
      case ir::NodeKind::kAtenOp:
      case ir::NodeKind::kCustomOp:
        instr.kind = InstrKind::kCall;
        instr.op = node->op();
        instr.pure = is_pure_operator(*node);
        if (may_draw_random(*node, instr, p.constants)) {
          if (!p.draws_random) {
            MAGI_LOG_DEBUG("executor: ", instr.where,
                           " may draw random numbers (CUDA graphs of this graph refresh the "
                           "generator on each replay)");
          }
          p.draws_random = true;
        }
        p.num_calls++;
        p.max_stack = std::max({p.max_stack, instr.in.size(), instr.out.size()});
        break;
      case ir::NodeKind::kSymArith:
        instr.kind = InstrKind::kSym;
        instr.sym = node->sym_op();
        instr.pure = true;
        break;
      case ir::NodeKind::kGetItem:
        instr.kind = InstrKind::kGetItem;
        instr.item_index = node->item_index();
        instr.pure = true;
        break;
      case ir::NodeKind::kMakeList:
        instr.kind = InstrKind::kMakeList;
        instr.list_kind = node->output()->kind();
        instr.pure = true;
        break;
      case ir::NodeKind::kFusion:
        instr.kind = InstrKind::kFusion;
        instr.pure = true;  // a generated kernel writes only its outputs
        instr.piece = static_cast<size_t>(graph.piece_index(node->piece()));
        p.num_fusions++;
        break;
      case ir::NodeKind::kCallPiece:
        instr.kind = InstrKind::kCallPiece;
        instr.piece = static_cast<size_t>(graph.piece_index(node->piece()));
        p.num_piece_calls++;
        p.num_calls += p.pieces[instr.piece]->num_operator_calls();
        p.draws_random |= p.pieces[instr.piece]->draws_random_numbers();
        break;
      default:
        MAGI_ASSERT(false, "unexpected node kind ", ir::node_kind_name(node->kind()));
    }
    p.instrs.push_back(std::move(instr));
  }

  // Liveness: the last instruction reading each register. Graph outputs live to the end.
  constexpr size_t kForever = std::numeric_limits<size_t>::max();
  std::vector<size_t> last_use(p.num_registers, kForever - 1);  // "never read"
  std::vector<bool> read(p.num_registers, false);
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    for (Ref r : p.instrs[i].in) {
      if (r >= 0) {
        last_use[r] = i;
        read[r] = true;
      }
    }
  }
  for (Ref r : p.output_refs) {
    if (r >= 0) {
      last_use[r] = kForever;
      read[r] = true;
    }
  }
  for (Ref& r : p.input_regs) {
    if (r >= 0 && !read[r]) r = kUnused;
  }
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    Instr& instr = p.instrs[i];
    instr.move_in.assign(instr.in.size(), 0);
    for (size_t j = instr.in.size(); j-- > 0;) {
      Ref r = instr.in[j];
      if (r < 0 || last_use[r] != i) continue;
      bool later_in_same = false;
      for (size_t k = j + 1; k < instr.in.size(); ++k) later_in_same |= (instr.in[k] == r);
      if (later_in_same) continue;
      if (instr.kind == InstrKind::kCall || instr.kind == InstrKind::kCallPiece ||
          instr.kind == InstrKind::kFusion) {
        instr.move_in[j] = 1;
      } else {
        instr.release_after.push_back(r);
      }
    }
    for (Ref& r : instr.out) {
      if (!read[r]) r = kUnused;
    }
  }
  // SDPA calls whose only used output is the attention output (inference: no backward needs
  // their logsumexp or RNG state) may run on another backend.
  if (options.attention != AttentionBackend::kGraph) {
    for (Instr& instr : p.instrs) {
      if (instr.kind != InstrKind::kCall || !AttentionCall::handles(*instr.op)) continue;
      bool only_output = instr.out[0] != kUnused;
      for (size_t k = 1; k < instr.out.size(); ++k) only_output &= instr.out[k] == kUnused;
      if (!only_output) continue;
      instr.kind = InstrKind::kAttention;
      instr.attention = p.attention.size();
      p.attention.push_back(std::make_unique<AttentionCall>(*instr.op, options.attention));
    }
  }
  analyse_input_uses(p, options);
  static const bool fold_constants = [] {
    const char* env = std::getenv("MAGI_FOLD_CONSTANTS");
    return env == nullptr || std::string(env) != "0";
  }();
  if (fold_constants) {
    p.folding =
        mark_constant_instructions(p.instrs, p.num_registers, p.output_refs, &p.keep_folded);
  }
  MAGI_LOG_DEBUG("executor: ", p.instrs.size(), " instructions, ", p.num_calls,
                 " dispatcher calls, ", p.num_piece_calls, " piece calls of ", p.pieces.size(),
                 " pieces, ", p.num_registers, " registers, ", p.constants.size(), " constants");
}

Executable::~Executable() = default;
Executable::Executable(Executable&&) noexcept = default;

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
  return outputs;
}

}  // namespace magi::runtime
