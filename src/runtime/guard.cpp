// Guard signature capture and matching. The match loop is written for the hot path: no
// allocation unless there is a mismatch to describe.
#include "magi/runtime/guard.h"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>

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

}  // namespace

GuardSignature::GuardSignature(const std::vector<std::optional<at::Tensor>>& inputs,
                               const std::vector<std::vector<int64_t>>& dynamic_dims, bool training)
    : global_(current_global(training)) {
  MAGI_ASSERT(dynamic_dims.empty() || dynamic_dims.size() == inputs.size(), "dynamic dims for ",
              dynamic_dims.size(), " of ", inputs.size(), " inputs");
  tensors_.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    TensorGuard g;
    if (inputs[i].has_value() && inputs[i]->defined()) {
      const at::Tensor& t = *inputs[i];
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

std::optional<std::string> GuardSignature::mismatch(
    const std::vector<std::optional<at::Tensor>>& inputs, bool training) const {
  using detail::str_cat;
  if (inputs.size() != tensors_.size()) {
    return str_cat("called with ", inputs.size(), " inputs instead of ", tensors_.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorGuard& g = tensors_[i];
    bool present = inputs[i].has_value() && inputs[i]->defined();
    if (present != g.present) {
      return str_cat("input ", i, (present ? " is now a tensor" : " is no longer a tensor"));
    }
    if (!present) continue;
    const at::Tensor& t = *inputs[i];
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
      s += "-";
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
