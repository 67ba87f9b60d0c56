// The operator flag registry and the ATen compute-sensitivity defaults.
#include "magi/ir/op_registry.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "magi/common/error.h"
#include "magi/ir/node.h"

namespace magi::ir {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// ATen names (without "aten::") that count as compute-sensitive: matmuls exactly; the
// convolution and attention families (forward and backward variants) by prefix.
constexpr std::array<std::string_view, 9> kComputeSensitiveNames = {
    "mm",        "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation",
    "_scaled_mm"};
constexpr std::array<std::string_view, 19> kComputeSensitivePrefixes = {
    // convolution, convolution_backward, _convolution, conv2d, conv_transpose2d, ...
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose", "conv_tbc",
    "conv_depthwise", "cudnn_convolution", "miopen_convolution", "mkldnn_convolution", "slow_conv",
    "_slow_conv", "thnn_conv",
    // scaled_dot_product_attention, _scaled_dot_product_{flash,efficient,cudnn}_attention*,
    // _flash_attention_forward, _efficient_attention_backward, _cudnn_attention_forward, ...
    "scaled_dot_product_", "_scaled_dot_product_", "_flash_attention_", "_efficient_attention_",
    "_cudnn_attention_"};

}  // namespace

std::string canonical_op_name(const std::string& raw) {
  std::string name = raw;
  if (starts_with(name, "torch.ops.")) name = name.substr(10);
  std::string ns, op, overload;
  auto colons = name.find("::");
  if (colons != std::string::npos) {
    ns = name.substr(0, colons);
    std::string rest = name.substr(colons + 2);
    auto dot = rest.find('.');
    op = rest.substr(0, dot);
    if (dot != std::string::npos) overload = rest.substr(dot + 1);
  } else {
    auto first = name.find('.');
    if (first != std::string::npos) {
      ns = name.substr(0, first);
      std::string rest = name.substr(first + 1);
      auto dot = rest.find('.');
      op = rest.substr(0, dot);
      if (dot != std::string::npos) overload = rest.substr(dot + 1);
    }
  }
  MAGI_CHECK(!ns.empty() && !op.empty() && overload.find('.') == std::string::npos,
             "operator name '", raw,
             "' is not of the form 'namespace::name' or 'namespace::name.overload' "
             "(e.g. 'athena::flash_attn' or 'aten::mm')");
  if (overload == "default") overload.clear();
  return overload.empty() ? ns + "::" + op : ns + "::" + op + "." + overload;
}

OpRegistry& OpRegistry::global() {
  static OpRegistry* registry = new OpRegistry();  // never destroyed: usable at exit
  return *registry;
}

void OpRegistry::set_flags(const std::string& name, OpFlags flags) {
  std::string key = canonical_op_name(name);
  std::lock_guard<std::mutex> lock(mutex_);
  flags_[key] = flags;
}

bool OpRegistry::erase(const std::string& name) {
  std::string key = canonical_op_name(name);
  std::lock_guard<std::mutex> lock(mutex_);
  return flags_.erase(key) > 0;
}

std::optional<OpFlags> OpRegistry::registered(const std::string& name) const {
  std::string key = canonical_op_name(name);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = flags_.find(key);
  if (it == flags_.end()) return std::nullopt;
  return it->second;
}

std::optional<OpFlags> OpRegistry::lookup(const std::string& name,
                                          const std::string& overload) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!overload.empty()) {
    auto it = flags_.find(name + "." + overload);
    if (it != flags_.end()) return it->second;
  }
  auto it = flags_.find(name);
  if (it == flags_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<std::string, OpFlags>> OpRegistry::entries() const {
  std::vector<std::pair<std::string, OpFlags>> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out.assign(flags_.begin(), flags_.end());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

bool is_default_compute_sensitive(const std::string& name) {
  std::string_view n = name;
  if (!starts_with(n, "aten::")) return false;
  n.remove_prefix(6);
  n = n.substr(0, n.find('.'));
  for (std::string_view exact : kComputeSensitiveNames) {
    if (n == exact) return true;
  }
  for (std::string_view prefix : kComputeSensitivePrefixes) {
    if (starts_with(n, prefix)) return true;
  }
  return false;
}

bool is_compute_sensitive(const Node& node, const OpRegistry& registry) {
  if (!node.is_operator()) return false;
  const auto& name = node.op().operator_name();
  if (auto flags = registry.lookup(name.name, name.overload_name)) return flags->compute_sensitive;
  return is_default_compute_sensitive(name.name);
}

bool is_subgraph_boundary(const Node& node, const OpRegistry& registry) {
  if (!node.is_operator()) return false;
  const auto& name = node.op().operator_name();
  auto flags = registry.lookup(name.name, name.overload_name);
  return flags && flags->subgraph_boundary;
}

}  // namespace magi::ir
