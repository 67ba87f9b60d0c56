// DOT printer. A fusion group's own Input and Output nodes are not drawn: edges go straight
// from the producers outside the group to the fused ops that read them, and from the fused
// ops that produce the group's results to their users outside.
#include "magi/ir/dot_printer.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "magi/common/error.h"
#include "magi/ir/op_registry.h"

namespace magi::ir {
namespace {

// Pastel fills for pieces, stronger ones (fill, border) for fusion groups.
constexpr const char* kPieceColors[] = {"#dbe9f6", "#e2f0d9", "#fde9d9",
                                        "#ede2f6", "#fff2cc", "#d9f2f2"};
constexpr const char* kFusionColors[][2] = {{"#ffe0b2", "#e65100"}, {"#c8e6c9", "#2e7d32"},
                                            {"#bbdefb", "#1565c0"}, {"#f8bbd0", "#ad1457"},
                                            {"#d1c4e9", "#4527a0"}, {"#b2dfdb", "#00695c"}};
constexpr size_t kNumPieceColors = sizeof(kPieceColors) / sizeof(kPieceColors[0]);
constexpr size_t kNumFusionColors = sizeof(kFusionColors) / sizeof(kFusionColors[0]);

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

class DotWriter {
 public:
  DotWriter(const Graph& root, const DotOptions& options) : root_(root), options_(options) {
    if (!options_.is_boundary) {
      options_.is_boundary = [](const Node& n) { return is_subgraph_boundary(n); };
    }
  }

  std::string run() {
    os_ << "digraph magi {\n"
        << "  rankdir=TB;\n"
        << "  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\", "
           "fontsize=11];\n"
        << "  edge [color=\"#555555\", arrowsize=0.6];\n";
    write_body(root_, "", "  ");
    // Each distinct piece once, as a cluster in the colour of its calls.
    std::vector<Graph*> pieces = root_.pieces();
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (!calls_.count(pieces[i])) continue;
      std::string name = "piece_" + std::to_string(i);
      os_ << "  subgraph " << quote("cluster_" + name) << " {\n"
          << "    label="
          << quote(name + " (" + std::to_string(calls_[pieces[i]]) + " call" +
                   (calls_[pieces[i]] == 1 ? "" : "s") + ")")
          << "; style=\"filled,rounded\"; fillcolor=" << quote(piece_color(i))
          << "; color=\"#888888\"; fontname=\"Helvetica-Bold\";\n";
      write_body(*pieces[i], name + "/", "    ");
      os_ << "  }\n";
    }
    os_ << edges_.str() << "}\n";
    return os_.str();
  }

 private:
  static const char* piece_color(size_t i) { return kPieceColors[i % kNumPieceColors]; }

  static std::string type_of(const Value* v) {
    if (v->kind() == ValueKind::kInt && v->sym() && !v->sym()->is_constant()) {
      return "int(" + v->sym()->str() + ")";
    }
    return v->type_str();
  }

  std::string label(const Node& node, const std::string& head) const {
    std::string text = head;
    if (options_.detail != DotDetail::kOp) {
      for (const Value* out : node.outputs()) text += "\n%" + out->name() + ": " + type_of(out);
    }
    if (options_.detail == DotDetail::kSource && !node.provenance().source.empty()) {
      text += "\n" + node.provenance().source;
    }
    return text;
  }

  std::string tooltip(const Node& node) const {
    std::string text;
    for (size_t i = 0; i < node.outputs().size(); ++i) {
      text += (i ? ", %" : "%") + node.output(i)->name();
    }
    text += (text.empty() ? "" : " = ") + node.op_name();
    if (!node.provenance().fx_name.empty()) text += "  (FX node " + node.provenance().fx_name + ")";
    if (!node.provenance().source.empty()) text += "  " + node.provenance().source;
    return text;
  }

  // Where edges for `value` start: the drawn nodes producing it (none for a literal).
  std::vector<std::string> sources(const Value* value) const {
    auto it = source_of_.find(value);
    if (it != source_of_.end()) return it->second;
    const Node* p = value->producer();
    if (p->kind() == NodeKind::kMakeList) {
      std::vector<std::string> all;
      for (const Value* item : p->inputs()) {
        for (auto& s : sources(item)) all.push_back(s);
      }
      return all;
    }
    return {};
  }

  // Edges are written after all nodes, outside every cluster: Graphviz puts a node into each
  // cluster that mentions it, so an edge written inside a fusion cluster would pull its
  // producer in.
  void edges_into(const Node& node, const std::string& id) {
    for (const Value* in : node.inputs()) {
      for (const auto& s : sources(in)) edges_ << "  " << quote(s) << " -> " << quote(id) << ";\n";
    }
  }

  std::string id_of(const Node& node, const std::string& prefix) {
    std::string base = node.kind() == NodeKind::kOutput ? "output"
                       : node.outputs().empty()         ? "node"
                                                        : node.output(0)->name();
    std::string id = prefix + base;
    // Value names are unique per graph; a group drawn twice gets a counter.
    if (!used_ids_.insert(id).second) id += "#" + std::to_string(++id_counter_);
    return id;
  }

  void write_body(const Graph& graph, const std::string& prefix, const std::string& indent) {
    for (const Node* node : graph.nodes()) {
      switch (node->kind()) {
        case NodeKind::kConstant:
        case NodeKind::kMakeList:
          continue;
        case NodeKind::kFusion:
          write_fusion(*node, prefix, indent);
          continue;
        default:
          break;
      }
      std::string id = id_of(*node, prefix);
      std::string attrs;
      switch (node->kind()) {
        case NodeKind::kInput:
          attrs = "shape=ellipse, fillcolor=\"#eeeeee\", label=" +
                  quote(options_.detail == DotDetail::kOp
                            ? "%" + node->output(0)->name()
                            : "%" + node->output(0)->name() + ": " + type_of(node->output(0)));
          break;
        case NodeKind::kOutput:
          attrs = "shape=ellipse, fillcolor=\"#eeeeee\", label=\"output\"";
          break;
        case NodeKind::kSymArith:
        case NodeKind::kGetItem:
          attrs = "fontsize=9, fillcolor=\"#f5f5f5\", color=\"#aaaaaa\", label=" +
                  quote(label(*node, node->kind() == NodeKind::kGetItem
                                         ? "getitem " + std::to_string(node->item_index())
                                         : node->op_name()));
          break;
        case NodeKind::kCallPiece: {
          int64_t index = graph.piece_index(node->piece());
          ++calls_[node->piece()];
          attrs = "shape=box3d, style=filled, fillcolor=" +
                  quote(piece_color(static_cast<size_t>(std::max<int64_t>(index, 0)))) +
                  ", label=" + quote(label(*node, "call " + node->op_name()));
          break;
        }
        default: {
          bool boundary = node->is_operator() && options_.is_boundary(*node);
          if (boundary) {
            attrs = "style=filled, fillcolor=\"#f4cccc\", color=\"#cc0000\", penwidth=2, label=" +
                    quote(label(*node, node->op_name() + "\n[boundary]"));
          } else if (node->kind() == NodeKind::kCustomOp) {
            attrs = "fillcolor=\"#fce5cd\", label=" + quote(label(*node, node->op_name()));
          } else {
            attrs = "label=" + quote(label(*node, node->op_name()));
          }
        }
      }
      os_ << indent << quote(id) << " [" << attrs << ", tooltip=" << quote(tooltip(*node))
          << "];\n";
      edges_into(*node, id);
      for (const Value* out : node->outputs()) source_of_[out] = {id};
    }
  }

  // A fusion group, drawn inline as a cluster of the ops it fuses.
  void write_fusion(const Node& fusion, const std::string& prefix, const std::string& indent) {
    const Graph& group = *fusion.piece();
    size_t colour = fusion_counter_++ % kNumFusionColors;
    std::string name = fusion.outputs().empty() ? "fusion" : fusion.output(0)->name();
    size_t num_ops = 0;
    for (const Node* n : group.nodes()) num_ops += n->is_operator();
    for (size_t i = 0; i < group.inputs().size() && i < fusion.inputs().size(); ++i) {
      source_of_[group.inputs()[i]] = sources(fusion.input(i));
    }
    os_ << indent << "subgraph " << quote("cluster_" + prefix + "fusion_" + name) << " {\n"
        << indent << "  label=" << quote("fused kernel: " + std::to_string(num_ops) + " ops")
        << "; style=\"filled,rounded\"; fillcolor=" << quote(kFusionColors[colour][0])
        << "; color=" << quote(kFusionColors[colour][1])
        << "; penwidth=2; fontname=\"Helvetica-Bold\";\n";
    std::string inner = prefix + "fused_" + name + "/";
    for (const Node* node : group.nodes()) {
      if (node->kind() == NodeKind::kInput || node->kind() == NodeKind::kOutput ||
          node->kind() == NodeKind::kConstant || node->kind() == NodeKind::kMakeList) {
        continue;
      }
      std::string id = id_of(*node, inner);
      os_ << indent << "  " << quote(id) << " [label=" << quote(label(*node, node->op_name()))
          << ", tooltip=" << quote(tooltip(*node)) << "];\n";
      edges_into(*node, id);
      for (const Value* out : node->outputs()) source_of_[out] = {id};
    }
    os_ << indent << "}\n";
    for (size_t i = 0; i < fusion.outputs().size() && i < group.outputs().size(); ++i) {
      source_of_[fusion.output(i)] = sources(group.outputs()[i]);
    }
  }

  const Graph& root_;
  DotOptions options_;
  std::ostringstream os_;
  std::ostringstream edges_;
  std::unordered_map<const Value*, std::vector<std::string>> source_of_;
  std::unordered_map<const Graph*, size_t> calls_;
  std::unordered_set<std::string> used_ids_;
  size_t id_counter_ = 0;
  size_t fusion_counter_ = 0;
};

}  // namespace

DotDetail parse_dot_detail(const std::string& text) {
  std::string t = lower(text);
  if (t == "op") return DotDetail::kOp;
  if (t == "shape") return DotDetail::kShape;
  if (t == "source") return DotDetail::kSource;
  MAGI_CHECK(false, "graph picture detail '", text,
             "' is not one of op, shape, source (MAGI_FX_GRAPH_VIZ_NODE_DESC)");
  return DotDetail::kShape;
}

std::string to_dot(const Graph& graph, const DotOptions& options) {
  return DotWriter(graph, options).run();
}

}  // namespace magi::ir
