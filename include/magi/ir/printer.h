// Text form of a graph, read like torch.fx's: one line per node, results named, constants
// and literal lists inline, types after the colon, user source as a trailing comment.
//
//   graph(%x: f32[s0, 16], %w: f32[16, 16], %s0: int):
//     %mm: f32[s0, 16] = aten::mm(%x, %w)                  # model.py:12 in forward
//     %view: f32[s0, 4, 4] = aten::view(%mm, [%s0, 4, 4])
//     return (%view)
//
// A graph split into pieces prints its calls (`%a, %b = piece_0(%x, %w)`) and then each piece
// it owns, once, as `piece_0 = graph(...)`.
#pragma once

#include <ostream>
#include <string>

#include "magi/ir/graph.h"

namespace magi::ir {

struct PrintOptions {
  bool show_types = true;
  bool show_source = true;
};

void print(std::ostream& os, const Graph& graph, const PrintOptions& options = {});
std::string to_string(const Graph& graph, const PrintOptions& options = {});
/// A single value as it appears in an argument list: "%x", "4096", "[%s0, 16]".
std::string format_operand(const Value* value);

}  // namespace magi::ir
