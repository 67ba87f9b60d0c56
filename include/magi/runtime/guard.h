// Guard signatures: a compact description of the inputs a compiled entry was captured for,
// checked on every call in C++ so a compiled artifact never runs on inputs it was not built
// for (a changed dtype, static size, device, rank, requires_grad, memory layout class, the
// value of a scalar argument, grad mode, autocast state or module.training).
//
// Dynamic dims are recorded as "any size >= 2": changing them never misses. A miss returns
// a sentence saying what changed, which the Python layer logs at DEBUG.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <vector>

namespace magi::runtime {

/// Layout classes that change which kernels a graph may use.
enum class LayoutClass : uint8_t { kContiguous, kChannelsLast, kOther };

/// One argument as the guard sees it: a tensor, a scalar (int, float, bool, str or None: the
/// traced code was specialised on its value), or nullopt for anything else (not compared).
using GuardInput = std::optional<c10::IValue>;

struct TensorGuard {
  bool present = false;               ///< false: the argument was not a tensor
  std::optional<c10::IValue> scalar;  ///< the value of a scalar argument
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  std::vector<int64_t> sizes;  ///< -1 for a dynamic dim
  bool requires_grad = false;
  LayoutClass layout = LayoutClass::kContiguous;
};

/// Process state that changes what a captured graph computes.
struct GlobalGuard {
  bool grad_enabled = true;
  bool autocast_cuda = false;
  bool autocast_cpu = false;
  c10::ScalarType autocast_cuda_dtype = c10::ScalarType::Undefined;
  c10::ScalarType autocast_cpu_dtype = c10::ScalarType::Undefined;
  bool training = false;
};

class GuardSignature {
 public:
  /// Records the signature of one call. `dynamic_dims[i]` lists the dynamic dims of input i.
  GuardSignature(const std::vector<GuardInput>& inputs,
                 const std::vector<std::vector<int64_t>>& dynamic_dims, bool training);

  /// nullopt when the call matches; otherwise what differs, e.g.
  /// "input 0: dtype changed from Float to BFloat16".
  std::optional<std::string> mismatch(const std::vector<GuardInput>& inputs, bool training) const;
  bool matches(const std::vector<GuardInput>& inputs, bool training) const {
    return !mismatch(inputs, training).has_value();
  }
  std::string str() const;

 private:
  std::vector<TensorGuard> tensors_;
  GlobalGuard global_;
};

}  // namespace magi::runtime
