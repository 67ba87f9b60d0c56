// Node kinds and symbolic-integer operations, each listed once. Printers, verifiers and the
// executor switch over these lists, so adding a kind is one line here plus the cases the
// compiler then asks for.
#pragma once

#include <cstdint>

namespace magi::ir {

// _(Name, printed name)
#define MAGI_NODE_KINDS(_)                                                                     \
  _(Input, "input")       /* a graph input; no inputs, one output */                           \
  _(Output, "output")     /* the graph's results; last node, no outputs */                     \
  _(Constant, "constant") /* a literal (int, float, bool, None, str, dtype, device, ...) */    \
  _(AtenOp, "aten")       /* an ATen operator bound to its c10::OperatorHandle */              \
  _(CustomOp, "custom")   /* any other dispatcher operator (torch.library, prims, ...) */      \
  _(SymArith, "sym")      /* integer arithmetic on sizes: see MAGI_SYM_OPS */                  \
  _(GetItem, "getitem")   /* element i of a list-valued output (e.g. of aten::split) */        \
  _(MakeList, "list")     /* a list built from values, e.g. [s0, 4096] for aten::view */       \
  _(CallPiece, "piece")   /* runs a piece (Graph::pieces) on its inputs, yields its outputs */ \
  _(Fusion, "fusion")     /* a fusion group (a piece of fusible ops) run as one generated kernel */

enum class NodeKind : uint8_t {
#define MAGI_DECLARE_NODE_KIND(name, text) k##name,
  MAGI_NODE_KINDS(MAGI_DECLARE_NODE_KIND)
#undef MAGI_DECLARE_NODE_KIND
};

// _(Name, printed name, number of inputs)
#define MAGI_SYM_OPS(_)      \
  _(Size, "size", 2)         \
  _(Stride, "stride", 2)     \
  _(Numel, "numel", 1)       \
  _(Add, "add", 2)           \
  _(Sub, "sub", 2)           \
  _(Mul, "mul", 2)           \
  _(FloorDiv, "floordiv", 2) \
  _(Mod, "mod", 2)           \
  _(TrueDiv, "truediv", 2)   \
  _(Neg, "neg", 1)           \
  _(Max, "max", 2)           \
  _(Min, "min", 2)           \
  _(Eq, "eq", 2)             \
  _(Ne, "ne", 2)             \
  _(Lt, "lt", 2)             \
  _(Le, "le", 2)             \
  _(Gt, "gt", 2)             \
  _(Ge, "ge", 2)

enum class SymOp : uint8_t {
#define MAGI_DECLARE_SYM_OP(name, text, arity) k##name,
  MAGI_SYM_OPS(MAGI_DECLARE_SYM_OP)
#undef MAGI_DECLARE_SYM_OP
};

const char* node_kind_name(NodeKind kind);
const char* sym_op_name(SymOp op);
int sym_op_arity(SymOp op);

}  // namespace magi::ir
