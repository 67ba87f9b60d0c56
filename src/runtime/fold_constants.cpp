// The lowering step fold_constants: instructions that read only constants (the rotary tables of
// a static sequence length, masks built from arange) and results of such instructions are
// marked to run on the first call only; the registers among their results that the rest of the
// program reads are the values that call keeps (Executable::keep_folded_values, at most
// kMaxFoldedBytes). Pure instructions only: random and in-place operators never qualify, and a
// constant some operator writes in place turns folding off for the graph.
#include "program.h"

namespace magi::runtime {

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
    const auto* args = instr.kind == InstrKind::kCall ? &instr.op->schema().arguments() : nullptr;
    for (size_t j = 0; j < instr.in.size(); ++j) {
      const Ref r = instr.in[j];
      if (r < 0 || !constant[r]) continue;
      // A value some operator writes in place must be fresh on every call: fold nothing. (A
      // constant it only reads, such as an index, is kept like any other.)
      const auto* alias = args != nullptr && j < args->size() ? (*args)[j].alias_info() : nullptr;
      if (alias != nullptr && alias->isWrite()) {
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

}  // namespace magi::runtime
