// Guard signature capture and matching. The match loop is written for the hot path: no
// allocation unless there is a mismatch to describe.
#include "magi/runtime/guard.h"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <sstream>

#include "magi/common/error.h"

namespace magi::runtime {
namespace {

LayoutClass layout_class(const at::Tensor& t) {
  if (t.is_contiguous()) return LayoutClass::kContiguous;
  if (t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return LayoutClass::kChannelsLast;
  }
  return LayoutClass::kOther;
}

const char* layout_name(LayoutClass c) {
  switch (c) {
    case LayoutClass::kContiguous:
      return "contiguous";
    case LayoutClass::kChannelsLast:
      return "channels_last";
    case LayoutClass::kOther:
      return "strided (non-contiguous)";
  }
  return "?";
}

GlobalGuard current_global(bool training) {
  GlobalGuard g;
  g.grad_enabled = c10::GradMode::is_enabled();
  g.autocast_cuda = at::autocast::is_autocast_enabled(at::kCUDA);
  g.autocast_cpu = at::autocast::is_autocast_enabled(at::kCPU);
  if (g.autocast_cuda) g.autocast_cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  if (g.autocast_cpu) g.autocast_cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  g.training = training;
  return g;
}

bool is_tensor(const GuardInput& v) {
  return v.has_value() && v->isTensor() && v->toTensor().defined();
}

// Scalars compare by kind and value (1 and 1.0 and True differ: the trace saw one of them).
bool same_scalar(const c10::IValue& a, const c10::IValue& b) {
  if (a.tagKind() != b.tagKind()) return false;
  if (a.isInt()) return a.toInt() == b.toInt();
  if (a.isDouble()) {
    return a.toDouble() == b.toDouble() || (std::isnan(a.toDouble()) && std::isnan(b.toDouble()));
  }
  if (a.isBool()) return a.toBool() == b.toBool();
  if (a.isString()) return a.toStringRef() == b.toStringRef();
  return a.isNone();
}

std::string scalar_text(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isString()) return "'" + v.toStringRef() + "'";
  if (v.isBool()) return v.toBool() ? "True" : "False";
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

GuardSignature::GuardSignature(const std::vector<GuardInput>& inputs,
                               const std::vector<std::vector<int64_t>>& dynamic_dims, bool training)
    : global_(current_global(training)) {
  MAGI_ASSERT(dynamic_dims.empty() || dynamic_dims.size() == inputs.size(), "dynamic dims for ",
              dynamic_dims.size(), " of ", inputs.size(), " inputs");
  tensors_.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    TensorGuard g;
    if (inputs[i].has_value() && !inputs[i]->isTensor()) g.scalar = *inputs[i];
    if (is_tensor(inputs[i])) {
      const at::Tensor& t = inputs[i]->toTensor();
      g.present = true;
      g.dtype = t.scalar_type();
      g.device = t.device();
      g.sizes = t.sizes().vec();
      g.requires_grad = t.requires_grad();
      g.layout = layout_class(t);
      if (!dynamic_dims.empty()) {
        for (int64_t d : dynamic_dims[i]) {
          int64_t dim = d < 0 ? d + t.dim() : d;
          MAGI_CHECK(dim >= 0 && dim < t.dim(), "dynamic dim ", d, " of input ", i,
                     " is out of range for a tensor of rank ", t.dim());
          g.sizes[dim] = -1;
        }
      }
    }
    tensors_.push_back(std::move(g));
  }
}

std::optional<std::string> GuardSignature::mismatch(const std::vector<GuardInput>& inputs,
                                                    bool training) const {
  using detail::str_cat;
  if (inputs.size() != tensors_.size()) {
    return str_cat("called with ", inputs.size(), " inputs instead of ", tensors_.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorGuard& g = tensors_[i];
    bool present = is_tensor(inputs[i]);
    if (present != g.present) {
      return str_cat("input ", i, (present ? " is now a tensor" : " is no longer a tensor"));
    }
    if (g.scalar.has_value()) {
      const bool scalar_now = inputs[i].has_value() && !inputs[i]->isTensor();
      if (!scalar_now || !same_scalar(*g.scalar, *inputs[i])) {
        return str_cat("input ", i, ": value changed from ", scalar_text(*g.scalar), " to ",
                       scalar_now ? scalar_text(*inputs[i]) : std::string("another object"));
      }
    }
    if (!present) continue;
    const at::Tensor& t = inputs[i]->toTensor();
    if (t.scalar_type() != g.dtype) {
      return str_cat("input ", i, ": dtype changed from ", g.dtype, " to ", t.scalar_type());
    }
    if (t.device() != g.device) {
      return str_cat("input ", i, ": device changed from ", g.device, " to ", t.device());
    }
    if (t.dim() != static_cast<int64_t>(g.sizes.size())) {
      return str_cat("input ", i, ": rank changed from ", g.sizes.size(), " to ", t.dim());
    }
    for (size_t d = 0; d < g.sizes.size(); ++d) {
      int64_t size = t.size(static_cast<int64_t>(d));
      if (g.sizes[d] == -1) {
        if (size < 2) return str_cat("input ", i, ": dynamic dim ", d, " has size ", size, " < 2");
      } else if (size != g.sizes[d]) {
        return str_cat("input ", i, ": static dim ", d, " changed from ", g.sizes[d], " to ", size);
      }
    }
    if (t.requires_grad() != g.requires_grad) {
      return str_cat("input ", i, ": requires_grad changed to ",
                     t.requires_grad() ? "True" : "False");
    }
    LayoutClass layout = layout_class(t);
    if (layout != g.layout) {
      return str_cat("input ", i, ": layout changed from ", layout_name(g.layout), " to ",
                     layout_name(layout));
    }
  }
  GlobalGuard now = current_global(training);
  if (now.grad_enabled != global_.grad_enabled) {
    return str_cat("grad mode changed to ", now.grad_enabled ? "enabled" : "disabled");
  }
  if (now.autocast_cuda != global_.autocast_cuda || now.autocast_cpu != global_.autocast_cpu ||
      now.autocast_cuda_dtype != global_.autocast_cuda_dtype ||
      now.autocast_cpu_dtype != global_.autocast_cpu_dtype) {
    return str_cat("autocast state changed");
  }
  if (now.training != global_.training) {
    return str_cat("module.training changed to ", now.training ? "True" : "False");
  }
  return std::nullopt;
}

std::string GuardSignature::str() const {
  std::string s = "(";
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorGuard& g = tensors_[i];
    s += i ? ", " : "";
    if (!g.present) {
      s += g.scalar ? scalar_text(*g.scalar) : "-";
      continue;
    }
    s += detail::str_cat(g.dtype, "[");
    for (size_t d = 0; d < g.sizes.size(); ++d) {
      s += (d ? ", " : "") + (g.sizes[d] == -1 ? std::string("*") : std::to_string(g.sizes[d]));
    }
    s += "]";
    if (g.device.type() != c10::DeviceType::CPU) s += "@" + g.device.str();
    if (g.requires_grad) s += " grad";
    if (g.layout != LayoutClass::kContiguous) s += std::string(" ") + layout_name(g.layout);
  }
  s += detail::str_cat(") grad_mode=", global_.grad_enabled, " training=", global_.training);
  return s;
}

}  // namespace magi::runtime
