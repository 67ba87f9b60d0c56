// SymExpr construction with normalisation, evaluation and printing.
//
// Normal forms: an Add is a sum of terms `c * t` (c a non-zero integer, t a non-constant
// expression) plus one constant, terms ordered by their printed form; a Mul is a product of
// non-constant factors with one leading constant coefficient. Binary ops fold when both sides
// are constants. This is enough for the expressions shape inference produces (s0*4096,
// s0*s1 + 1, (s0 + 7)//8) to compare equal when they are equal in the obvious way.
#include "magi/ir/sym_expr.h"

#include <algorithm>
#include <map>

#include "magi/common/error.h"

namespace magi::ir {

struct SymExpr::Rep {
  Op op;
  int64_t value = 0;  // kConst
  std::string name;   // kSymbol
  std::vector<SymExpr> operands;
  std::string text;  // printed form, cached: equality and ordering use it
};

int64_t py_floor_div(int64_t a, int64_t b) {
  MAGI_CHECK(b != 0, "symbolic integer division by zero");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t py_mod(int64_t a, int64_t b) {
  MAGI_CHECK(b != 0, "symbolic integer modulo by zero");
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

namespace {

std::string print(SymExpr::Op op, const std::vector<SymExpr>& operands) {
  using Op = SymExpr::Op;
  auto wrap = [](const SymExpr& e) { return (e.op() == Op::kAdd) ? "(" + e.str() + ")" : e.str(); };
  switch (op) {
    case Op::kAdd: {
      std::string s;
      for (size_t i = 0; i < operands.size(); ++i) {
        const SymExpr& e = operands[i];
        std::string t = e.str();
        bool negative = !t.empty() && t[0] == '-';
        if (i == 0) {
          s = t;
        } else if (negative) {
          s += " - " + t.substr(1);
        } else {
          s += " + " + t;
        }
      }
      return s;
    }
    case Op::kMul: {
      std::string s;
      for (size_t i = 0; i < operands.size(); ++i) {
        if (i > 0) s += "*";
        const SymExpr& e = operands[i];
        if (i == 0 && e.is_constant() && e.constant_value() == -1) {
          s += "-";
          continue;
        }
        s += wrap(e);
      }
      // "-*s0" -> "-s0"
      std::string::size_type p = s.find("-*");
      if (p == 0) s.erase(1, 1);
      return s;
    }
    case Op::kFloorDiv:
      return "(" + wrap(operands[0]) + "//" + wrap(operands[1]) + ")";
    case Op::kMod:
      return "(" + wrap(operands[0]) + "%" + wrap(operands[1]) + ")";
    case Op::kMax:
      return "max(" + operands[0].str() + ", " + operands[1].str() + ")";
    case Op::kMin:
      return "min(" + operands[0].str() + ", " + operands[1].str() + ")";
    case Op::kConst:
    case Op::kSymbol:
      break;
  }
  MAGI_ASSERT(false, "print() called on a leaf");
  return {};
}

// Splits e into (coefficient, term) with term non-constant, or term empty for a constant.
std::pair<int64_t, std::optional<SymExpr>> split_coefficient(const SymExpr& e) {
  if (e.is_constant()) return {e.constant_value(), std::nullopt};
  if (e.op() == SymExpr::Op::kMul && e.operands().front().is_constant()) {
    const auto& ops = e.operands();
    std::vector<SymExpr> rest(ops.begin() + 1, ops.end());
    SymExpr term = rest.front();
    for (size_t i = 1; i < rest.size(); ++i) term = term * rest[i];
    return {ops.front().constant_value(), term};
  }
  return {1, e};
}

}  // namespace

SymExpr::SymExpr() : SymExpr(int64_t{0}) {}

SymExpr::SymExpr(int64_t value) {
  auto rep = std::make_shared<Rep>();
  rep->op = Op::kConst;
  rep->value = value;
  rep->text = std::to_string(value);
  rep_ = std::move(rep);
}

SymExpr::SymExpr(std::shared_ptr<const Rep> rep) : rep_(std::move(rep)) {}

SymExpr SymExpr::symbol(const std::string& name) {
  MAGI_CHECK(!name.empty(), "a symbol needs a name");
  auto rep = std::make_shared<Rep>();
  rep->op = Op::kSymbol;
  rep->name = name;
  rep->text = name;
  return SymExpr(std::move(rep));
}

SymExpr SymExpr::make(Op op, std::vector<SymExpr> operands) {
  auto rep = std::make_shared<Rep>();
  rep->op = op;
  rep->text = print(op, operands);
  rep->operands = std::move(operands);
  return SymExpr(std::move(rep));
}

SymExpr::Op SymExpr::op() const { return rep_->op; }

int64_t SymExpr::constant_value() const {
  MAGI_ASSERT(is_constant(), "constant_value() of non-constant ", str());
  return rep_->value;
}

const std::string& SymExpr::symbol_name() const {
  MAGI_ASSERT(op() == Op::kSymbol, "symbol_name() of ", str());
  return rep_->name;
}

const std::vector<SymExpr>& SymExpr::operands() const { return rep_->operands; }

std::string SymExpr::str() const { return rep_->text; }

SymExpr operator+(const SymExpr& a, const SymExpr& b) {
  using Op = SymExpr::Op;
  // Collect the terms of both sides, keyed by the printed term.
  std::map<std::string, std::pair<int64_t, SymExpr>> terms;
  int64_t constant = 0;
  auto add_one = [&](const SymExpr& e) {
    auto [c, term] = split_coefficient(e);
    if (!term) {
      constant += c;
      return;
    }
    auto it = terms.find(term->str());
    if (it == terms.end()) {
      terms.emplace(term->str(), std::make_pair(c, *term));
    } else {
      it->second.first += c;
    }
  };
  for (const SymExpr* side : {&a, &b}) {
    if (side->op() == Op::kAdd) {
      for (const auto& e : side->operands()) add_one(e);
    } else {
      add_one(*side);
    }
  }
  std::vector<SymExpr> operands;
  for (auto& [key, ct] : terms) {
    if (ct.first == 0) continue;
    operands.push_back(ct.first == 1 ? ct.second : SymExpr(ct.first) * ct.second);
  }
  if (constant != 0 || operands.empty()) operands.emplace_back(constant);
  if (operands.size() == 1) return operands.front();
  return SymExpr::make(Op::kAdd, std::move(operands));
}

SymExpr operator-(const SymExpr& a) { return SymExpr(-1) * a; }

SymExpr operator-(const SymExpr& a, const SymExpr& b) { return a + (-b); }

SymExpr operator*(const SymExpr& a, const SymExpr& b) {
  using Op = SymExpr::Op;
  int64_t coefficient = 1;
  std::vector<SymExpr> factors;
  for (const SymExpr* side : {&a, &b}) {
    if (side->is_constant()) {
      coefficient *= side->constant_value();
    } else if (side->op() == Op::kMul) {
      for (const auto& f : side->operands()) {
        if (f.is_constant()) {
          coefficient *= f.constant_value();
        } else {
          factors.push_back(f);
        }
      }
    } else {
      factors.push_back(*side);
    }
  }
  if (coefficient == 0 || factors.empty()) return SymExpr(coefficient);
  // c * (x + y) stays a product; distributing would blow up nested sizes for no gain,
  // except for a lone sum times a constant, which keeps sums flat.
  if (factors.size() == 1 && factors.front().op() == Op::kAdd) {
    SymExpr sum(0);
    for (const auto& t : factors.front().operands()) sum = sum + SymExpr(coefficient) * t;
    return sum;
  }
  std::sort(factors.begin(), factors.end(),
            [](const SymExpr& x, const SymExpr& y) { return x.str() < y.str(); });
  if (coefficient == 1 && factors.size() == 1) return factors.front();
  std::vector<SymExpr> operands;
  if (coefficient != 1) operands.emplace_back(coefficient);
  for (auto& f : factors) operands.push_back(std::move(f));
  return SymExpr::make(Op::kMul, std::move(operands));
}

SymExpr floor_div(const SymExpr& a, const SymExpr& b) {
  if (b.is_constant()) {
    MAGI_CHECK(b.constant_value() != 0, "symbolic division of ", a.str(), " by zero");
    if (b.constant_value() == 1) return a;
    if (a.is_constant()) return SymExpr(py_floor_div(a.constant_value(), b.constant_value()));
  }
  if (a == b) return SymExpr(1);
  return SymExpr::make(SymExpr::Op::kFloorDiv, {a, b});
}

SymExpr mod(const SymExpr& a, const SymExpr& b) {
  if (b.is_constant()) {
    MAGI_CHECK(b.constant_value() != 0, "symbolic modulo of ", a.str(), " by zero");
    if (b.constant_value() == 1) return SymExpr(0);
    if (a.is_constant()) return SymExpr(py_mod(a.constant_value(), b.constant_value()));
  }
  if (a == b) return SymExpr(0);
  return SymExpr::make(SymExpr::Op::kMod, {a, b});
}

SymExpr max(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant() && b.is_constant())
    return SymExpr(std::max(a.constant_value(), b.constant_value()));
  if (a == b) return a;
  bool swap = b.str() < a.str();
  return SymExpr::make(SymExpr::Op::kMax, swap ? std::vector<SymExpr>{b, a} : std::vector{a, b});
}

SymExpr min(const SymExpr& a, const SymExpr& b) {
  if (a.is_constant() && b.is_constant())
    return SymExpr(std::min(a.constant_value(), b.constant_value()));
  if (a == b) return a;
  bool swap = b.str() < a.str();
  return SymExpr::make(SymExpr::Op::kMin, swap ? std::vector<SymExpr>{b, a} : std::vector{a, b});
}

std::optional<int64_t> SymExpr::try_evaluate(const SymbolBindings& bindings) const {
  switch (op()) {
    case Op::kConst:
      return rep_->value;
    case Op::kSymbol: {
      auto it = bindings.find(rep_->name);
      if (it == bindings.end()) return std::nullopt;
      return it->second;
    }
    default:
      break;
  }
  std::vector<int64_t> v;
  v.reserve(operands().size());
  for (const auto& e : operands()) {
    auto x = e.try_evaluate(bindings);
    if (!x) return std::nullopt;
    v.push_back(*x);
  }
  switch (op()) {
    case Op::kAdd: {
      int64_t s = 0;
      for (int64_t x : v) s += x;
      return s;
    }
    case Op::kMul: {
      int64_t p = 1;
      for (int64_t x : v) p *= x;
      return p;
    }
    case Op::kFloorDiv:
      return py_floor_div(v[0], v[1]);
    case Op::kMod:
      return py_mod(v[0], v[1]);
    case Op::kMax:
      return std::max(v[0], v[1]);
    case Op::kMin:
      return std::min(v[0], v[1]);
    default:
      break;
  }
  MAGI_ASSERT(false, "unhandled SymExpr op");
  return std::nullopt;
}

int64_t SymExpr::evaluate(const SymbolBindings& bindings) const {
  auto value = try_evaluate(bindings);
  if (!value) {
    std::set<std::string> symbols;
    collect_symbols(symbols);
    std::string missing;
    for (const auto& s : symbols) {
      if (!bindings.count(s)) missing += (missing.empty() ? "" : ", ") + s;
    }
    MAGI_CHECK(false, "cannot evaluate ", str(), ": no value for symbol(s) ", missing);
  }
  return *value;
}

void SymExpr::collect_symbols(std::set<std::string>& out) const {
  if (op() == Op::kSymbol) out.insert(rep_->name);
  for (const auto& e : operands()) e.collect_symbols(out);
}

}  // namespace magi::ir
