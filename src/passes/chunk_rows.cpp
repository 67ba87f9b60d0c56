// chunk_rows: stretches of row-wise work whose intermediates are wider than what they read and
// return (a transformer's MLP: 2048 columns in, two of 8192 inside, 2048 out) run over long
// sequences in chunks of rows, so that only one chunk's intermediates are live at a time.
//
// A row of a tensor is one token: for a region's row count R (the rows of the matmul that
// seeds it), a tensor is a row tensor when its leading dims multiply to R and the rest (its
// tail) are constant sizes. What the region computes is dense; what it reads from outside is
// reshaped to [rows, tail] (a copy only if it is not dense). Row-wise ops compute each row from the
// same row of their row operands and from operands that do not vary by row: matmuls of a row tensor
// with a weight (mm, addmm), pointwise ops and casts whose other operands broadcast over the tail
// only, reductions, softmax and layer norm over the last dim, slices, pads and concatenations of
// the last dim, and reshapes that keep the rows. Starting from each matmul, the pass grows a region
// of such ops in program order, keeping it convex (no op outside reads a region value and feeds
// the region again), and outlines it into a piece that works on [rows, tail] views; the call
// runs the piece over chunks of at most `chunk_rows` rows (ir::Node::chunk_rows, executed by
// run_in_row_chunks in runtime/executor.cpp). A region is outlined only when its
// materialised intermediates (matmul results and what matmuls read) need more bytes per row at
// their peak than its inputs and outputs together, and it is long: a constant row count at
// least twice `chunk_rows`, or a symbolic one whose size hint (the compiling call's) is more
// than `chunk_rows` (decided per call then). Short symbolic calls are left whole: a piece has
// a memory arena of its own, which the caller's cannot share.
// Inference graphs only (the pipeline passes 0 otherwise): a training forward saves the
// intermediates for its backward anyway.
#include <algorithm>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "magi/common/log.h"
#include "magi/ir/graph.h"
#include "magi/ir/op_info.h"
#include "magi/ir/structural_hash.h"
#include "magi/passes/passes.h"

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::SymExpr;
using ir::TensorType;
using ir::Value;
using ir::ValueKind;

const TensorType* type_of(const Value* v) {
  return v->kind() == ValueKind::kTensor && v->tensor_type() ? &*v->tensor_type() : nullptr;
}

// How a tensor splits into rows: the number of leading dims that multiply to the region's rows,
// and the constant sizes after them.
struct Rows {
  int64_t prefix = -1;  // -1: not a row tensor
  std::vector<int64_t> tail;
};

Rows rows_of(const Value* v, const SymExpr& rows) {
  const TensorType* t = type_of(v);
  if (t == nullptr) return {};
  SymExpr product(1);
  for (int64_t k = 0; k < t->rank(); ++k) {
    product = product * t->sizes[k];
    if (!(product == rows)) continue;
    Rows r;
    r.prefix = k + 1;
    for (int64_t d = k + 1; d < t->rank(); ++d) {
      if (!t->sizes[d].is_constant()) return {};
      r.tail.push_back(t->sizes[d].constant_value());
    }
    return r;
  }
  return {};
}

int64_t element_size(const Value* v) {
  return static_cast<int64_t>(c10::elementSize(type_of(v)->dtype));
}

int64_t row_bytes(const Value* v, const Rows& r) {
  int64_t n = element_size(v);
  for (int64_t s : r.tail) n *= s;
  return n;
}

// Ops that only reshape (a view of a dense input): rebuilt as a view of the [rows, tail] form.
bool is_reshape(const Node* n) {
  if (!n->is_operator()) return false;
  static const std::unordered_set<std::string> names = {
      "aten::view",          "aten::_unsafe_view",
      "aten::reshape",       "aten::unsqueeze",
      "aten::squeeze",       "aten::squeeze.dim",
      "aten::squeeze.dims",  "aten::flatten.using_ints",
      "aten::unflatten.int", "aten::_reshape_alias"};
  return names.count(n->op_name()) > 0;
}

bool is_matmul(const Node* n) {
  return n->is_operator() && (n->op_name() == "aten::mm" || n->op_name() == "aten::addmm");
}

// Grows and outlines the regions of one graph.
class Chunker {
 public:
  Chunker(Graph& graph, int64_t chunk_rows, const ir::SymbolBindings& hints)
      : graph_(graph), chunk_rows_(chunk_rows), hints_(hints) {}

  bool run() {
    bool changed = false;
    std::unordered_set<const Node*> tried;
    for (bool found = true; found;) {
      found = false;
      for (Node* seed : graph_.nodes()) {
        if (!is_matmul(seed) || tried.count(seed)) continue;
        tried.insert(seed);
        if (try_region(seed)) {
          changed = found = true;
          break;  // the node list changed: start over
        }
      }
    }
    return changed;
  }

 private:
  // The row count a matmul seeds: its row operand's rows.
  static std::optional<SymExpr> seed_rows(const Node* mm) {
    const Value* a = mm->input(mm->op_name() == "aten::addmm" ? 1 : 0);
    const TensorType* t = type_of(a);
    if (t == nullptr || t->rank() != 2) return std::nullopt;
    return t->sizes[0];
  }

  bool produced_inside(const Value* v) const { return region_set_.count(v->producer()) > 0; }

  // Whether `n` computes each row from the same rows of its row operands; records the row shape
  // of its tensor inputs and outputs.
  bool row_wise(const Node* n) {
    if (n->kind() != NodeKind::kAtenOp || n->outputs().empty()) return false;
    for (const Value* out : n->outputs()) {
      if (rows_of(out, rows_).prefix < 0) return false;
    }
    const std::string name = n->op_name();
    if (name == "aten::mm" || name == "aten::addmm") {
      const bool add = name == "aten::addmm";
      const Value* a = n->input(add ? 1 : 0);
      const Value* b = n->input(add ? 2 : 1);
      const Rows ra = rows_of(a, rows_);
      const TensorType* tb = type_of(b);
      if (ra.prefix != 1 || tb == nullptr || tb->rank() != 2 || produced_inside(b)) return false;
      if (add) {
        const TensorType* bias = type_of(n->input(0));
        if (bias == nullptr || bias->rank() > 1 || produced_inside(n->input(0))) return false;
      }
      return true;
    }
    if (is_reshape(n)) return rows_of(n->input(0), rows_).prefix > 0;
    const ir::OpInfo info = ir::op_info(*n);
    const Rows out = rows_of(n->output(0), rows_);
    switch (info.op_class) {
      case ir::OpClass::kUnary:
      case ir::OpClass::kBinary:
      case ir::OpClass::kWhere:
      case ir::OpClass::kCast:
        // Row operands whose tail broadcasts to the output's (a norm's [rows, 1] scale); the
        // others broadcast over the tail only.
        for (const Value* in : n->inputs()) {
          const TensorType* t = type_of(in);
          if (t == nullptr) continue;
          if (!produced_inside(in) && t->rank() <= static_cast<int64_t>(out.tail.size())) continue;
          const Rows r = rows_of(in, rows_);
          if (r.prefix < 0 || r.tail.size() != out.tail.size()) return false;
          for (size_t d = 0; d < r.tail.size(); ++d) {
            if (r.tail[d] != out.tail[d] && r.tail[d] != 1) return false;
          }
        }
        return n->outputs().size() == 1;
      case ir::OpClass::kReduction:
      case ir::OpClass::kSoftmax:
      case ir::OpClass::kLayerNorm:
      case ir::OpClass::kSlice:
      case ir::OpClass::kPad: {
        // Over the last dim, which must be in the tail; weights broadcast over it.
        const Rows r = rows_of(n->input(0), rows_);
        if (r.prefix < 0 || r.tail.empty()) return false;
        for (size_t i = 1; i < n->inputs().size(); ++i) {
          const TensorType* t = type_of(n->input(i));
          if (t == nullptr) continue;
          if (produced_inside(n->input(i)) || t->rank() > static_cast<int64_t>(r.tail.size())) {
            return false;
          }
        }
        return true;
      }
      case ir::OpClass::kCat:
        for (const Value* piece : ir::cat_pieces(*n)) {
          const Rows r = rows_of(piece, rows_);
          if (r.prefix < 0 || r.tail.empty()) return false;
        }
        return true;
      default:
        return false;
    }
  }

  static bool writes_memory(const Node* n) {
    if (!n->is_operator()) return n->kind() == NodeKind::kCallPiece;
    for (const auto& arg : n->schema().arguments()) {
      if (arg.alias_info() != nullptr && arg.alias_info()->isWrite()) return true;
    }
    return false;
  }

  bool try_region(Node* seed) {
    const auto rows = seed_rows(seed);
    if (!rows) return false;
    rows_ = *rows;
    if (rows_.is_constant() && rows_.constant_value() < 2 * chunk_rows_) return false;
    region_.clear();
    region_set_.clear();
    if (!row_wise(seed)) return false;  // a row operand with a symbolic width, a full bias
    if (!rows_.is_constant()) {
      const auto hint = rows_.try_evaluate(hints_);
      if (!hint || *hint <= chunk_rows_) return false;
    }
    std::unordered_set<const Node*> after;  // outside nodes that read the region, directly or not
    std::vector<Node*> moved;               // those between the seed and the region's last node
    bool started = false;
    for (Node* n : graph_.nodes()) {
      if (n == seed) started = true;
      if (!started || n->kind() == NodeKind::kOutput) continue;
      bool reads_region = false, reads_after = false;
      for (const Value* in : n->inputs()) {
        reads_region |= produced_inside(in);
        reads_after |= after.count(in->producer()) > 0;
      }
      if (!reads_after && row_wise(n) && !writes_memory(n)) {
        region_.push_back(n);
        region_set_.insert(n);
        continue;
      }
      if (reads_region || reads_after) {
        if (after.empty()) {
          MAGI_LOG_DEBUG("chunk_rows: the region from ", seed->provenance().fx_name, " stops at ",
                         n->op_name(), " (", n->provenance().fx_name, ")");
        }
        after.insert(n);
        moved.push_back(n);
      }
    }
    // Only nodes before the region's last one need moving after the call.
    std::vector<Node*> to_move;
    const auto position = index_of_nodes();
    const size_t last = position.at(region_.back());
    for (Node* n : moved) {
      if (position.at(n) < last) to_move.push_back(n);
    }
    for (const Node* n : to_move) {
      if (writes_memory(n) || n->is_operator() && ir::is_random_operator(*n)) return false;
    }
    // The region's ops run at its last node: no write between the seed and there may move
    // across them (nodes that stay where they are included).
    const size_t first = position.at(seed);
    for (const Node* n : graph_.nodes()) {
      const size_t at = position.at(n);
      if (at > first && at < last && !region_set_.count(n) && writes_memory(n)) return false;
    }
    if (!worth_chunking()) return false;
    outline(to_move);
    return true;
  }

  std::unordered_map<const Node*, size_t> index_of_nodes() const {
    std::unordered_map<const Node*, size_t> at;
    size_t i = 0;
    for (const Node* n : graph_.nodes()) at[n] = i++;
    return at;
  }

  bool is_output(const Value* v) const {
    for (const Node* user : v->users()) {
      if (!region_set_.count(user)) return true;
    }
    return false;
  }

  // Row inputs and outputs, and whether the materialised intermediates outweigh them per row.
  bool worth_chunking() {
    inputs_.clear();
    outputs_.clear();
    // Each outside tensor is read either by rows (cut into chunks) or whole, never both.
    std::unordered_map<const Value*, bool> by_rows;
    int64_t boundary = 0;
    for (const Node* n : region_) {
      std::vector<const Value*> operands(n->inputs().begin(), n->inputs().end());
      if (ir::op_info(*n).op_class == ir::OpClass::kCat) {
        for (const Value* piece : ir::cat_pieces(*n)) operands.push_back(piece);
      }
      for (const Value* in : operands) {
        if (produced_inside(in) || type_of(in) == nullptr) continue;
        const Rows r = rows_of(in, rows_);
        const bool weight = is_matmul(n) && in != n->input(n->op_name() == "aten::addmm" ? 1 : 0);
        const bool rows = r.prefix > 0 && !weight && !broadcast_operand(n, in);
        auto [it, first] = by_rows.insert({in, rows});
        if (!first) {
          if (it->second != rows) return false;
          continue;
        }
        if (rows) {
          inputs_.push_back(in);
          boundary += row_bytes(in, r);
        }
      }
      for (const Value* out : n->outputs()) {
        if (!is_output(out)) continue;
        outputs_.push_back(out);
        boundary += row_bytes(out, rows_of(out, rows_));
      }
    }
    if (inputs_.empty() || outputs_.empty()) return false;
    for (const Value* out : outputs_) {
      if (!has_at_most_one_symbolic_dim(out) && shape_source(out) == nullptr) return false;
    }
    // Peak bytes per row of the values that stay materialised after fusion: matmul results and
    // matmul operands made in the region, live from their producer to their last region reader.
    // A view keeps its base alive: liveness is tracked on the base.
    std::unordered_map<const Value*, const Value*> base;
    const auto base_of = [&](const Value* v) {
      auto it = base.find(v);
      return it == base.end() ? v : it->second;
    };
    for (const Node* n : region_) {
      if (is_reshape(n) && produced_inside(n->input(0))) {
        base[n->output()] = base_of(n->input(0));
      }
    }
    std::unordered_map<const Value*, size_t> last_use;
    for (size_t i = 0; i < region_.size(); ++i) {
      for (const Value* in : region_[i]->inputs()) {
        if (produced_inside(in)) last_use[base_of(in)] = i;
      }
    }
    std::unordered_set<const Value*> materialised;
    for (const Node* n : region_) {
      if (!is_matmul(n)) continue;
      materialised.insert(n->output());
      const Value* a = n->input(n->op_name() == "aten::addmm" ? 1 : 0);
      if (produced_inside(a)) materialised.insert(base_of(a));
    }
    const auto read_outside = [&](const Value* b) {
      for (const auto& [view, root] : base) {
        if (root == b && is_output(view)) return true;
      }
      return is_output(b);
    };
    int64_t live = 0, peak = 0;
    std::vector<std::pair<size_t, int64_t>> dying;  // (last use, bytes)
    for (size_t i = 0; i < region_.size(); ++i) {
      for (const Value* out : region_[i]->outputs()) {
        if (!materialised.count(out) || read_outside(out) || !last_use.count(out)) continue;
        const int64_t bytes = row_bytes(out, rows_of(out, rows_));
        live += bytes;
        dying.push_back({last_use[out], bytes});
      }
      peak = std::max(peak, live);
      for (auto it = dying.begin(); it != dying.end();) {
        if (it->first == i) {
          live -= it->second;
          it = dying.erase(it);
        } else {
          ++it;
        }
      }
    }
    MAGI_LOG_DEBUG("chunk_rows: region of ", region_.size(), " nodes over ", rows_.str(),
                   " rows from ", region_.front()->provenance().fx_name, ": ", peak,
                   " bytes per row inside at the peak, ", boundary, " in and out");
    return peak > boundary;
  }

  // An operand of a pointwise op that broadcasts over the tail (a weight, a scalar).
  bool broadcast_operand(const Node* n, const Value* in) const {
    const ir::OpClass c = ir::op_info(*n).op_class;
    const bool pointwise = c == ir::OpClass::kUnary || c == ir::OpClass::kBinary ||
                           c == ir::OpClass::kWhere || c == ir::OpClass::kCast;
    const bool weight_like = c == ir::OpClass::kReduction || c == ir::OpClass::kSoftmax ||
                             c == ir::OpClass::kLayerNorm || c == ir::OpClass::kSlice ||
                             c == ir::OpClass::kPad;
    const TensorType* t = type_of(in);
    const int64_t tail = static_cast<int64_t>(rows_of(n->output(0), rows_).tail.size());
    if (pointwise) return t->rank() <= tail;
    if (weight_like) return in != n->input(0);
    if (n->op_name() == "aten::addmm") return in == n->input(0);
    return false;
  }

  // A row input whose leading sizes are those of `out`'s rows, to read them from at run time
  // when `out` has more than one symbolic size (batch and sequence both dynamic).
  const Value* shape_source(const Value* out) const {
    const Rows r = rows_of(out, rows_);
    const TensorType* t = type_of(out);
    for (const Value* in : inputs_) {
      const TensorType* s = type_of(in);
      if (s->rank() < r.prefix) continue;
      bool same = true;
      for (int64_t k = 0; k < r.prefix && same; ++k) same = s->sizes[k] == t->sizes[k];
      if (same) return in;
    }
    return nullptr;
  }

  // The sizes of `out` as a list value of the outer graph: constants, its one symbolic size as
  // -1, or sizes read from shape_source.
  Value* outer_sizes(const Value* out) {
    if (has_at_most_one_symbolic_dim(out)) return size_list(graph_, sizes_with_inferred(out));
    const Value* source = shape_source(out);
    const TensorType* t = type_of(out);
    std::vector<Value*> items;
    for (int64_t k = 0; k < t->rank(); ++k) {
      if (t->sizes[k].is_constant()) {
        items.push_back(graph_.add_constant(t->sizes[k].constant_value(), ValueKind::kInt));
        continue;
      }
      Node* size = graph_.add_sym(
          ir::SymOp::kSize, {const_cast<Value*>(source), graph_.add_constant(k, ValueKind::kInt)});
      size->output()->set_kind(ValueKind::kInt);
      size->output()->set_sym(t->sizes[k]);
      items.push_back(size->output());
    }
    return graph_.add_list(ValueKind::kIntList, std::move(items))->output();
  }

  static bool has_at_most_one_symbolic_dim(const Value* v) {
    int symbolic = 0;
    for (const SymExpr& s : type_of(v)->sizes) symbolic += !s.is_constant();
    return symbolic <= 1;
  }

  // A constant int list (reshape sizes), in `g`.
  Value* size_list(Graph& g, const std::vector<int64_t>& sizes) {
    return g.add_constant(c10::IValue(sizes), ValueKind::kIntList);
  }

  static std::vector<int64_t> sizes_with_inferred(const Value* v) {
    std::vector<int64_t> out;
    for (const SymExpr& s : type_of(v)->sizes)
      out.push_back(s.is_constant() ? s.constant_value() : -1);
    return out;
  }

  static TensorType row_type(const Value* v, const Rows& r, const SymExpr& rows) {
    TensorType t = *type_of(v);
    t.sizes = {rows};
    for (int64_t s : r.tail) t.sizes.push_back(s);
    t.strides = TensorType::contiguous_strides(t.sizes);
    return t;
  }

  // Dims the op names (its `dim` arguments) counted in the [rows, tail] form.
  Value* remapped_dim(Graph& piece, const Node& n, size_t i, int64_t prefix) {
    const c10::IValue* c = ir::constant_input(n, i);
    if (c == nullptr) return nullptr;
    const auto shift = [&](int64_t d) { return d < 0 ? d : d - prefix + 1; };
    if (c->isInt()) return piece.add_constant(shift(c->toInt()), n.input(i)->kind());
    if (c->isIntList()) {
      std::vector<int64_t> dims = c->toIntVector();
      for (int64_t& d : dims) d = shift(d);
      return piece.add_constant(c10::IValue(dims), ValueKind::kIntList);
    }
    return nullptr;
  }

  void outline(const std::vector<Node*>& to_move) {
    static const c10::OperatorHandle view =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::view", "");
    static const c10::OperatorHandle reshape =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::reshape", "");
    // Ops that may copy (reshape, flatten, unflatten) stay reshapes; views stay views.
    const auto copies = [](const Node* n) {
      const std::string name = n->op_name();
      return name == "aten::reshape" || name == "aten::flatten.using_ints" ||
             name == "aten::unflatten.int";
    };
    const SymExpr r = SymExpr::symbol("rows");
    auto piece = std::make_unique<Graph>();
    std::unordered_map<const Value*, Value*> inside;
    std::vector<Value*> call_inputs;
    std::vector<bool> chunked;
    std::unordered_set<const Value*> row_inputs(inputs_.begin(), inputs_.end());
    std::function<Value*(Value*)> map_operand = [&](Value* v) -> Value* {
      if (auto it = inside.find(v); it != inside.end()) return it->second;
      Value* mapped = nullptr;
      const Node* p = v->producer();
      if (p->kind() == NodeKind::kConstant) {
        mapped = piece->clone_node(*p, {})->output();
      } else if (p->kind() == NodeKind::kMakeList) {
        std::vector<Value*> items;
        for (Value* item : p->inputs()) items.push_back(map_operand(item));
        mapped = piece->clone_node(*p, std::move(items))->output();
      } else {
        mapped = piece->add_input(v->name(), v->kind());
        const bool rows = row_inputs.count(v) > 0;
        if (rows) {
          mapped->set_tensor_type(row_type(v, rows_of(v, rows_), r));
        } else if (v->tensor_type()) {
          mapped->set_tensor_type(*v->tensor_type());
        }
        if (v->sym()) mapped->set_sym(*v->sym());
        call_inputs.push_back(v);
        chunked.push_back(rows);
      }
      inside[v] = mapped;
      return mapped;
    };
    for (Node* n : region_) {
      const Value* first =
          ir::op_info(*n).op_class == ir::OpClass::kCat ? ir::cat_pieces(*n).front() : n->input(0);
      const Rows in_rows = type_of(first) ? rows_of(first, rows_) : Rows{};
      Node* copy = nullptr;
      if (is_reshape(n)) {
        const Rows out = rows_of(n->output(0), rows_);
        std::vector<int64_t> sizes = {-1};
        sizes.insert(sizes.end(), out.tail.begin(), out.tail.end());
        copy = piece->add_op(copies(n) ? reshape : view,
                             {map_operand(n->input(0)), size_list(*piece, sizes)});
        copy->provenance() = n->provenance();
        copy->output()->set_name(piece->unique_name(n->output()->name()));
      } else {
        std::vector<Value*> operands;
        const auto& args = n->schema().arguments();
        for (size_t i = 0; i < n->inputs().size(); ++i) {
          Value* dim = nullptr;
          if (i < args.size() && args[i].name() == "dim" && in_rows.prefix > 0) {
            dim = remapped_dim(*piece, *n, i, in_rows.prefix);
          }
          operands.push_back(dim != nullptr ? dim : map_operand(n->input(i)));
        }
        copy = piece->clone_node(*n, std::move(operands));
      }
      for (size_t k = 0; k < n->outputs().size(); ++k) {
        copy->output(k)->set_tensor_type(row_type(n->output(k), rows_of(n->output(k), rows_), r));
        inside[n->output(k)] = copy->output(k);
      }
    }
    std::vector<Value*> results;
    for (const Value* out : outputs_) results.push_back(inside.at(out));
    piece->set_outputs(std::move(results));

    // The call, where the region's last node was; the outside readers that came before that
    // node move after it.
    Node* last = region_.back();
    graph_.set_insert_point(last);
    std::vector<Value*> args;
    for (size_t j = 0; j < call_inputs.size(); ++j) {
      Value* v = call_inputs[j];
      if (chunked[j] && rows_of(v, rows_).prefix != 1) {
        const Rows rr = rows_of(v, rows_);
        std::vector<int64_t> sizes = {-1};
        sizes.insert(sizes.end(), rr.tail.begin(), rr.tail.end());
        Node* flat = graph_.add_op(reshape, {v, size_list(graph_, sizes)});
        flat->provenance() = region_.front()->provenance();
        flat->output()->set_name(graph_.unique_name(v->name() + "_rows"));
        flat->output()->set_tensor_type(row_type(v, rr, rows_));
        v = flat->output();
      }
      args.push_back(v);
    }
    // Identical regions (the layers of a stack) share one piece, lowered once.
    const std::string key = ir::structural_key(*piece);
    Graph*& owned = pieces_[key];
    if (owned == nullptr) owned = graph_.add_piece(std::move(piece));
    Node* call = graph_.add_call_piece(owned, args);
    call->set_row_chunks(chunk_rows_, chunked);
    call->provenance() = region_.front()->provenance();
    for (size_t k = 0; k < outputs_.size(); ++k) {
      Value* out = const_cast<Value*>(outputs_[k]);
      Value* result = call->output(k);
      result->set_name(graph_.unique_name(out->name() + "_rows"));
      result->set_tensor_type(row_type(out, rows_of(out, rows_), rows_));
      if (rows_of(out, rows_).prefix != 1) {
        Node* back = graph_.add_op(view, {result, outer_sizes(out)});
        back->provenance() = out->producer()->provenance();
        back->output()->set_name(graph_.unique_name(out->name()));
        back->output()->set_tensor_type(*type_of(out));
        result = back->output();
      }
      std::vector<Node*> users = out->users();
      for (Node* user : users) {
        if (!region_set_.count(user)) user->replace_input(out, result);
      }
    }
    graph_.set_insert_point(nullptr);
    for (Node* n : to_move) graph_.move_before(n, last);
    for (auto it = region_.rbegin(); it != region_.rend(); ++it) graph_.erase(*it);
    MAGI_LOG_DEBUG("chunk_rows: ", region_.size(), " nodes from ", call->provenance().fx_name,
                   " run in chunks of ", chunk_rows_, " rows");
  }

  Graph& graph_;
  int64_t chunk_rows_;
  const ir::SymbolBindings& hints_;
  SymExpr rows_;
  std::vector<Node*> region_;
  std::unordered_set<const Node*> region_set_;
  std::vector<const Value*> inputs_;                // row tensors read from outside
  std::vector<const Value*> outputs_;               // region values read outside it
  std::unordered_map<std::string, Graph*> pieces_;  // by structural key
};

}  // namespace

bool chunk_rows(ir::Graph& graph, int64_t rows, const ir::SymbolBindings& size_hints) {
  if (rows <= 0) return false;
  bool changed = false;
  std::unordered_set<ir::Graph*> pieces;  // identical pieces are shared: chunk each once
  for (ir::Node* node : graph.nodes()) {
    if (node->kind() == NodeKind::kCallPiece && node->chunk_rows() == 0 &&
        pieces.insert(node->piece()).second) {
      changed |= chunk_rows(*node->piece(), rows, size_hints);
    }
  }
  changed |= Chunker(graph, rows, size_hints).run();
  if (changed) eliminate_dead_code(graph);
  return changed;
}

}  // namespace magi::passes
