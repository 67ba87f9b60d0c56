// Builders and assertions shared by the C++ tests: dispatcher handles by name, tensor types,
// and checks on thrown messages and verifier output.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "magi/ir/graph.h"

namespace magi::test {

/// The dispatcher handle of `name.overload`. libtorch registers ATen's operators during static
/// initialisation, so a plain C++ binary finds them without Python.
inline c10::OperatorHandle op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

inline ir::SymExpr sym(const std::string& name) { return ir::SymExpr::symbol(name); }

/// A contiguous CPU tensor type.
inline ir::TensorType tensor_type(std::vector<ir::SymExpr> sizes,
                                  c10::ScalarType dtype = c10::ScalarType::Float) {
  ir::TensorType t;
  t.dtype = dtype;
  t.sizes = std::move(sizes);
  return t;
}

/// Names a node's single output, as the FX importer does, and returns the value.
inline ir::Value* named(ir::Node* node, const std::string& name) {
  node->output()->set_name(node->owner()->unique_name(name));
  return node->output();
}

/// Runs `f`, which must throw an `E`; returns the exception's message.
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

inline ::testing::AssertionResult contains(const std::string& text, const std::string& needle) {
  if (text.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not found in:\n" << text;
}

/// Does one of the verifier's messages contain `needle`?
inline ::testing::AssertionResult has_error(const std::vector<std::string>& errors,
                                            const std::string& needle) {
  std::string all;
  for (const auto& e : errors) {
    if (e.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    all += "\n  " + e;
  }
  return ::testing::AssertionFailure() << "no verifier error contains '" << needle
                                       << "'; errors:" << (all.empty() ? " none" : all);
}

}  // namespace magi::test

namespace magi::ir {
/// Lets GoogleTest print a SymExpr in a failed EXPECT_EQ.
inline void PrintTo(const SymExpr& e, std::ostream* os) { *os << e.str(); }
}  // namespace magi::ir
