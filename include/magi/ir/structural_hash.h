// Structural identity of graphs: two graphs with the same key compute the same function of
// their inputs, whatever their value names and provenance. The split pass uses it to store
// identical pieces (the same layer repeated around attention calls) once; compile caches key
// on it too.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "magi/ir/graph.h"

namespace magi::ir {

/// A canonical text of the graph: per node its kind, operator, constant, operands (values are
/// numbered by position) and result kinds and types. Size symbols are renamed by order of first
/// appearance, so `f32[s0, 64]` and `f32[s3, 64]` in the same position match. Small CPU tensor
/// constants (literals) match by value, others only when they are the same tensor. Called
/// pieces contribute their own keys.
std::string structural_key(const Graph& graph);

/// The part of structural_key naming a tensor constant: small contiguous CPU tensors (literals
/// such as the eps in `x + 1e-6`, the True of `mask[pos] = True`) by dtype, sizes, wrapped-number
/// flag and bytes, others (conjugated, negated, quantized or Python-backed ones too) by identity.
/// Equal keys: the constants are interchangeable.
std::string tensor_key(const at::Tensor& t);

/// The part of structural_key naming a literal (a Constant node's value): numbers exactly (a
/// double by its bits: 0.0 and -0.0 differ), strings, devices, lists of those, and tensors by
/// tensor_key. Empty for any other value, which matches only its own node. Equal keys: the
/// literals are interchangeable.
std::string literal_key(const c10::IValue& v);

/// A hash of structural_key(graph).
uint64_t structural_hash(const Graph& graph);

}  // namespace magi::ir
