// Padding a dynamic batch dim up to a CUDA-graph bucket.
//
// A CUDA graph replays fixed shapes, so each batch size needs a graph of its own unless a call
// can run at a larger size and drop the extra rows. That is only correct when every row of
// the results depends on the same row of the inputs and nothing else: no reduction, softmax or
// matmul contraction over the batch dim, no slicing or shifting along it, no random numbers
// drawn per row, no custom op (whose behaviour we cannot see), and the batch size never used
// as a value (x / s). plan_padding() proves this for one symbol of a lowered graph, op by op,
// or says which node stops it.
//
// The symbol is the one in dim 0 of the first tensor input whose dim 0 is dynamic; every
// value's size along it must be k * symbol for a constant k (k rows per sample: a [s, 32, H]
// activation viewed as [s * 32, H] has k = 32 in the view). Other dynamic symbols stay exact
// (they are part of the graph's signature).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace magi::ir {
class Graph;
}

namespace magi::runtime {

struct PaddingPlan {
  std::string symbol;  ///< the padded symbol ("s0"); empty when the graph cannot be padded
  std::string reason;  ///< why not, when `symbol` is empty
  /// Per graph input: k when it is a tensor whose dim 0 is k * symbol or an int equal to
  /// k * symbol, else 0.
  std::vector<int64_t> input_rows;
  /// Per graph output: k when it is a tensor whose dim `output_dims[i]` is k * symbol or an int
  /// equal to k * symbol, else 0.
  std::vector<int64_t> output_rows;
  std::vector<int64_t> output_dims;  ///< -1 for ints and outputs without the symbol

  bool possible() const { return !symbol.empty(); }
  /// "s0: inputs 0 (x32), 3; outputs 0 (dim 0, x32)" or "not padded: <reason>".
  std::string str() const;
};

/// Decides whether calls of `graph` may be padded along a dynamic batch dim (see above).
PaddingPlan plan_padding(const ir::Graph& graph);

/// The bucket a batch of `size` runs in: the smallest ladder entry >= size, or `size` itself
/// when none is (or the ladder is empty). `ladder` must be sorted ascending.
int64_t bucket_for(const std::vector<int64_t>& ladder, int64_t size);

/// The default ladder: 1, 2, 4, 8, then multiples of 8 up to 256.
std::vector<int64_t> default_bucket_ladder();

}  // namespace magi::runtime
