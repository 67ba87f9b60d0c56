// SymExpr: an integer expression over named input symbols (s0, s1, ...), the sizes and
// strides of tensors whose shapes are dynamic.
//
// Semantics: values are int64 with Python's rounding (floor division and a modulo that takes
// the divisor's sign), because the expressions come from PyTorch's symbolic shapes, which
// follow Python. Expressions are immutable values; building one normalises it (constants
// folded, sums collected into coefficient * term, products flattened and ordered), so two
// expressions that differ only by such rewrites compare equal and print the same.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace magi::ir {

using SymbolBindings = std::unordered_map<std::string, int64_t>;

class SymExpr {
 public:
  enum class Op : uint8_t { kConst, kSymbol, kAdd, kMul, kFloorDiv, kMod, kMax, kMin };

  SymExpr();               // the constant 0
  SymExpr(int64_t value);  // NOLINT(google-explicit-constructor): constants read naturally
  static SymExpr symbol(const std::string& name);

  Op op() const;
  bool is_constant() const { return op() == Op::kConst; }
  int64_t constant_value() const;          ///< requires is_constant()
  const std::string& symbol_name() const;  ///< requires op() == kSymbol
  const std::vector<SymExpr>& operands() const;

  /// Evaluates against concrete symbol values; an unbound symbol is a UserError naming it.
  int64_t evaluate(const SymbolBindings& bindings) const;
  /// Like evaluate, but nullopt when a symbol is unbound.
  std::optional<int64_t> try_evaluate(const SymbolBindings& bindings) const;
  void collect_symbols(std::set<std::string>& out) const;

  std::string str() const;
  bool operator==(const SymExpr& other) const { return str() == other.str(); }
  bool operator!=(const SymExpr& other) const { return !(*this == other); }

  friend SymExpr operator+(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator-(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator*(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator-(const SymExpr& a);
  friend SymExpr floor_div(const SymExpr& a, const SymExpr& b);
  friend SymExpr mod(const SymExpr& a, const SymExpr& b);
  friend SymExpr max(const SymExpr& a, const SymExpr& b);
  friend SymExpr min(const SymExpr& a, const SymExpr& b);

  struct Rep;

 private:
  explicit SymExpr(std::shared_ptr<const Rep> rep);
  static SymExpr make(Op op, std::vector<SymExpr> operands);
  std::shared_ptr<const Rep> rep_;  // immutable, so sharing is safe
};

/// Python semantics for integer division and modulo (rounding toward negative infinity).
int64_t py_floor_div(int64_t a, int64_t b);
int64_t py_mod(int64_t a, int64_t b);

}  // namespace magi::ir
