// Lowering a graph to an Executable's program: one instruction per node, registers freed
// after their last use, attention calls routed through AttentionCall, the facts a call needs
// decided once (constant instructions, input aliasing, random numbers, padding).
#include <chrono>
#include <unordered_map>
#include <unordered_set>

#include "magi/common/error.h"
#include "magi/common/log.h"
#include "magi/ir/op_info.h"
#include "magi/ir/structural_hash.h"
#include "magi/ir/verifier.h"
#include "magi/passes/pipeline.h"
#include "program.h"

namespace magi::runtime {
namespace {

// Whether the call of `instr` (a kCall of `node`) may draw random numbers that its results
// depend on. Custom operators are opaque: they may. Attention whose dropout_p is the constant 0
// takes a Philox offset but uses no numbers.
bool may_draw_random(const ir::Node& node, const Instr& instr,
                     const std::vector<c10::IValue>& constants) {
  if (node.kind() == ir::NodeKind::kCustomOp) return true;
  if (!ir::is_random_operator(node)) return false;
  const std::string name = node.op().operator_name().name;
  if (name.find("scaled_dot_product") == std::string::npos) return true;
  const auto& arguments = node.schema().arguments();
  for (size_t i = 0; i < arguments.size() && i < instr.in.size(); ++i) {
    if (arguments[i].name() != "dropout_p") continue;
    const Ref r = instr.in[i];
    if (r >= 0) return true;  // a dropout probability known only at run time
    const c10::IValue& p = constants[-r - 1];
    return !((p.isDouble() && p.toDouble() == 0.0) || (p.isInt() && p.toInt() == 0));
  }
  return true;
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

// Whether `v` is read, directly or through views, by an operator that is not one of our
// generated kernels (a matmul, attention, a custom op): a fused kernel then stores it without
// the streaming hint, so that its reader finds it in L2. Values only our kernels or the
// caller read keep the hint: in a model they are read much later, if at all (a residual).
// `outer`: for a piece, which of its outputs such an operator reads where it is called.
bool read_by_library_kernel(const ir::Value& v, const std::vector<bool>& outer) {
  for (const ir::Node* user : v.users()) {
    switch (user->kind()) {
      case ir::NodeKind::kFusion:
      case ir::NodeKind::kSymArith:  // a size or a stride: no data read
        continue;
      case ir::NodeKind::kOutput:
        for (size_t k = 0; k < user->inputs().size() && k < outer.size(); ++k) {
          if (user->inputs()[k] == &v && outer[k]) return true;
        }
        continue;
      case ir::NodeKind::kAtenOp:
        if (ir::op_info(*user).op_class == ir::OpClass::kView) {
          if (read_by_library_kernel(*user->output(), outer)) return true;
          continue;
        }
        return true;
      default:
        return true;
    }
  }
  return false;
}

// For each output of `piece`, whether some node of `graph` that runs it (a fusion or a piece
// call) has that output read by a library kernel.
std::vector<bool> outputs_read_by_library(const ir::Graph& graph, const ir::Graph& piece,
                                          const std::vector<bool>& outer) {
  std::vector<bool> read(piece.outputs().size(), false);
  for (const ir::Node* node : graph.nodes()) {
    const bool runs =
        node->kind() == ir::NodeKind::kFusion || node->kind() == ir::NodeKind::kCallPiece;
    if (!runs || node->piece() != &piece) continue;
    for (size_t k = 0; k < read.size() && k < node->outputs().size(); ++k) {
      if (read_by_library_kernel(*node->outputs()[k], outer)) read[k] = true;
    }
  }
  return read;
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
        aliasing = returns_may_alias(schema);
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
        // The inputs the piece writes, through the registers passed as those.
        for (size_t j = 0; j < instr.in.size(); ++j) {
          if (instr.in[j] < 0 || !piece.input_written(j)) continue;
          for (int32_t i : roots[instr.in[j]]) written[i] = true;
        }
        // Each output shares memory with the inputs the piece says it may (mapped here), not
        // with everything the piece reads.
        for (size_t k = 0; k < instr.out.size(); ++k) {
          if (instr.out[k] == kUnused) continue;
          std::vector<int32_t> shared;
          for (int32_t j : piece.inputs_output_may_alias(k)) {
            const Ref r = static_cast<size_t>(j) < instr.in.size() ? instr.in[j] : -1;
            if (r >= 0) shared.insert(shared.end(), roots[r].begin(), roots[r].end());
          }
          std::sort(shared.begin(), shared.end());
          shared.erase(std::unique(shared.begin(), shared.end()), shared.end());
          roots[instr.out[k]] = std::move(shared);
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
  p.written_inputs = written;
  p.output_input_roots.assign(p.output_refs.size(), {});
  for (size_t k = 0; k < p.output_refs.size(); ++k) {
    if (p.output_refs[k] >= 0) p.output_input_roots[k] = roots[p.output_refs[k]];
  }
  if (!options.offload) return;
  std::vector<OffloadInputUse> uses;
  for (size_t i = 0; i < n; ++i) {
    if (first[i] == kNever) continue;
    uses.push_back({i, first[i], last[i], escapes[i], written[i]});
  }
  p.offload = std::make_unique<OffloadEngine>(*options.offload, std::move(uses), p.instrs.size());
}

Executable::Executable(const ir::Graph& graph, const ExecutorOptions& options)
    : program_(std::make_unique<Program>()) {
  ir::verify(graph);
  Program& p = *program_;
  p.private_outputs_from = options.private_outputs_from;
  // The lowering steps (passes::pipeline_pass_names after the passes), timed for the dumps.
  auto step = [&p, &options](const char* name, bool applies, const auto& run) {
    LoweringStep record{name};
    if (applies && passes::pass_enabled(name, options.disabled)) {
      const auto start = std::chrono::steady_clock::now();
      run();
      record.ran = true;
      record.milliseconds =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
    }
    p.steps.push_back(std::move(record));
  };
  step("plan_padding", true, [&] { p.padding = plan_padding(graph); });
  if (!p.steps.back().ran) p.padding.reason = "plan_padding is disabled";
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
      p.fused.back()->keep_outputs_in_l2(
          outputs_read_by_library(graph, *piece, options.outputs_read_by_library));
    } else {
      piece_options.outputs_read_by_library =
          outputs_read_by_library(graph, *piece, options.outputs_read_by_library);
      p.pieces.push_back(std::make_unique<Executable>(*piece, piece_options));
      p.fused.push_back(nullptr);
    }
  }

  auto new_register = [&](const ir::Value* v) {
    Ref r = static_cast<Ref>(p.num_registers++);
    ref_of[v] = r;
    return r;
  };

  std::vector<const ir::Node*> instr_nodes;  // the node each instruction runs
  std::vector<const ir::Value*> input_values;
  for (const ir::Node* node : graph.nodes()) {
    switch (node->kind()) {
      case ir::NodeKind::kInput:
        p.input_regs.push_back(new_register(node->output()));
        input_values.push_back(node->output());
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
        instr.pure = ir::is_pure_operator(*node);
        p.calls_custom_ops |= node->kind() == ir::NodeKind::kCustomOp;
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
        instr.chunk_rows = node->chunk_rows();
        instr.chunked = node->chunked_inputs();
        if (instr.chunk_rows > 0) {
          if (p.chunked_pieces.size() <= instr.piece) p.chunked_pieces.resize(instr.piece + 1);
          p.chunked_pieces[instr.piece] = true;
        }
        p.num_piece_calls++;
        p.num_calls += p.pieces[instr.piece]->num_operator_calls();
        p.draws_random |= p.pieces[instr.piece]->draws_random_numbers();
        p.calls_custom_ops |= p.pieces[instr.piece]->calls_custom_ops();
        break;
      default:
        MAGI_ASSERT(false, "unexpected node kind ", ir::node_kind_name(node->kind()));
    }
    p.instrs.push_back(std::move(instr));
    instr_nodes.push_back(node);
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
  step("fold_constants", true, [&] {
    p.folding =
        mark_constant_instructions(p.instrs, p.num_registers, p.output_refs, &p.keep_folded);
  });
  step("plan_memory_arena", options.memory_arena,
       [&] { plan_arena(p, instr_nodes, input_values); });
  MAGI_LOG_DEBUG("executor: ", p.instrs.size(), " instructions, ", p.num_calls,
                 " dispatcher calls, ", p.num_piece_calls, " piece calls of ", p.pieces.size(),
                 " pieces, ", p.num_registers, " registers, ", p.constants.size(), " constants");
}

Executable::~Executable() = default;
Executable::Executable(Executable&&) noexcept = default;

}  // namespace magi::runtime
