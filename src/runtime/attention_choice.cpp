// AttentionCall: see attention_choice.h for the policies.
#include "magi/runtime/attention_choice.h"

#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "magi/common/error.h"
#include "magi/common/log.h"

#ifdef MAGI_HAVE_CUDA_GRAPHS
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace magi::runtime {
namespace {

constexpr AttentionBackend kCandidates[] = {AttentionBackend::kFlash, AttentionBackend::kCudnn,
                                            AttentionBackend::kEfficient};
constexpr int kTimedRuns = 5;

struct Args {
  at::Tensor q, k, v;
  std::optional<at::Tensor> bias;
  double dropout = 0.0;
  bool causal = false;
  std::optional<double> scale;
};

std::optional<AttentionBackend> backend_of(const std::string& op_name) {
  if (op_name == "aten::_scaled_dot_product_flash_attention") return AttentionBackend::kFlash;
  if (op_name == "aten::_scaled_dot_product_cudnn_attention") return AttentionBackend::kCudnn;
  if (op_name == "aten::_scaled_dot_product_efficient_attention") {
    return AttentionBackend::kEfficient;
  }
  return std::nullopt;
}

at::Tensor call_backend(AttentionBackend backend, const Args& a) {
  switch (backend) {
    case AttentionBackend::kFlash:
      MAGI_CHECK(!a.bias.has_value(), "flash attention takes no attention mask");
      return std::get<0>(at::_scaled_dot_product_flash_attention(a.q, a.k, a.v, a.dropout, a.causal,
                                                                 false, a.scale));
    case AttentionBackend::kCudnn:
      return std::get<0>(at::_scaled_dot_product_cudnn_attention(
          a.q, a.k, a.v, a.bias, false, a.dropout, a.causal, false, a.scale));
    case AttentionBackend::kEfficient:
      // passes::group_query_attention hands flash and cuDNN calls grouped key/value heads.
      MAGI_CHECK(a.k.size(1) == a.q.size(1),
                 "memory-efficient attention takes no grouped key/value heads (query ", a.q.size(1),
                 " heads, key ", a.k.size(1), ")");
      return std::get<0>(at::_scaled_dot_product_efficient_attention(a.q, a.k, a.v, a.bias, false,
                                                                     a.dropout, a.causal, a.scale));
    default:
      MAGI_ASSERT(false, "no attention kernel for policy ", attention_backend_name(backend));
  }
  return {};
}

void describe_tensor(std::ostringstream& os, const char* name, const at::Tensor& t) {
  os << name << " ";
  for (size_t i = 0; i < t.sizes().size(); ++i) os << (i ? "x" : "") << t.sizes()[i];
  os << " (strides";
  for (int64_t s : t.strides()) os << " " << s;
  os << ") ";
}

// Everything a backend's eligibility and speed depend on.
std::string shape_of(const Args& a) {
  std::ostringstream os;
  describe_tensor(os, "q", a.q);
  describe_tensor(os, "k", a.k);
  describe_tensor(os, "v", a.v);
  if (a.bias) describe_tensor(os, "mask", *a.bias);
  os << c10::toString(a.q.scalar_type()) << " " << a.q.device();
  if (a.causal) os << " causal";
  if (a.scale) os << " scale " << *a.scale;
  return os.str();
}

struct Decisions {
  std::mutex mutex;
  std::map<std::string, AttentionBackend> by_key;  // policy + shape -> backend to run
  std::vector<AttentionChoice> log;
};

Decisions& decisions() {
  static Decisions d;
  return d;
}

std::atomic<void (*)()> failure_cleanup{nullptr};

void after_failure() {
  if (auto cleanup = failure_cleanup.load()) cleanup();
}

#ifdef MAGI_HAVE_CUDA_GRAPHS
bool capturing(const at::Tensor& t) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(
      cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(t.device().index()), &status));
  return status != cudaStreamCaptureStatusNone;
}

double median_ms(AttentionBackend backend, const Args& a) {
  auto stream = c10::cuda::getCurrentCUDAStream(a.q.device().index());
  std::vector<float> ms;
  for (int i = 0; i < kTimedRuns; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
    start.record(stream);
    call_backend(backend, a);
    end.record(stream);
    end.synchronize();
    ms.push_back(start.elapsed_time(end));
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

// Why `out` is not an acceptable stand-in for `ref`, or "" when it is.
std::string disagreement(const at::Tensor& out, const at::Tensor& ref) {
  if (out.sizes() != ref.sizes()) return "output shape differs";
  const double magnitude = std::max(1.0, ref.abs().max().item().toDouble());
  const double err = out.to(at::kFloat).sub(ref.to(at::kFloat)).abs().max().item().toDouble();
  const double tolerance = (ref.scalar_type() == at::kFloat ? 1e-3 : 2e-2) * magnitude;
  if (err <= tolerance) return "";
  std::ostringstream os;
  os << "output differs from the traced backend's by " << err << " (tolerance " << tolerance << ")";
  return os.str();
}

// The kAuto probe: every backend that accepts the call and agrees with `reference`, timed.
AttentionChoice probe(AttentionBackend traced, const Args& a, const at::Tensor& reference) {
  AttentionChoice choice;
  choice.shape = shape_of(a);
  choice.traced = attention_backend_name(traced);
  double best = 0.0;
  for (AttentionBackend b : kCandidates) {
    const std::string name = attention_backend_name(b);
    try {
      if (b != traced) {
        const at::Tensor out = call_backend(b, a);
        if (out.strides() != reference.strides()) {
          // Later ops (views) were traced against the traced backend's output layout.
          choice.rejected.push_back(name + ": output layout differs from the traced backend's");
          continue;
        }
        std::string why = disagreement(out, reference);
        if (!why.empty()) {
          choice.rejected.push_back(name + ": " + why);
          continue;
        }
      }
      const double ms = median_ms(b, a);
      choice.ms.emplace_back(name, ms);
      if (choice.chosen.empty() || ms < best) {
        best = ms;
        choice.chosen = name;
      }
    } catch (const DeviceError&) {
      throw;  // a device fault is no verdict on the backend
    } catch (const std::exception& e) {
      after_failure();
      std::string what = e.what();
      choice.rejected.push_back(name + ": " + what.substr(0, what.find('\n')));
    }
  }
  if (choice.chosen.empty()) choice.chosen = choice.traced;
  return choice;
}
#else
bool capturing(const at::Tensor&) { return false; }
#endif

// shape_of's content as integers, for the per-call-site cache.
std::vector<int64_t> shape_key(const Args& a) {
  std::vector<int64_t> key;
  key.reserve(32);
  for (const at::Tensor* t : {&a.q, &a.k, &a.v}) {
    key.push_back(t->dim());
    for (int64_t s : t->sizes()) key.push_back(s);
    for (int64_t s : t->strides()) key.push_back(s);
  }
  if (a.bias) {
    key.push_back(a.bias->dim());
    for (int64_t s : a.bias->sizes()) key.push_back(s);
    for (int64_t s : a.bias->strides()) key.push_back(s);
    key.push_back(static_cast<int64_t>(a.bias->scalar_type()));
  }
  key.push_back(static_cast<int64_t>(a.q.scalar_type()));
  key.push_back(a.q.device().index());
  key.push_back(a.causal);
  double scale = a.scale.value_or(-1.0);
  int64_t bits = 0;
  std::memcpy(&bits, &scale, sizeof bits);
  key.push_back(bits);
  return key;
}

std::string summary(const AttentionChoice& c) {
  std::ostringstream os;
  os << "attention " << c.shape << ":";
  for (const auto& [name, ms] : c.ms) os << " " << name << " " << ms << " ms";
  for (const auto& r : c.rejected) os << "; " << r;
  os << " -> " << c.chosen << " (traced: " << c.traced << ")";
  return os.str();
}

}  // namespace

void set_failure_cleanup(void (*cleanup)()) { failure_cleanup.store(cleanup); }

AttentionBackend parse_attention_backend(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  for (AttentionBackend b :
       {AttentionBackend::kAuto, AttentionBackend::kGraph, AttentionBackend::kFlash,
        AttentionBackend::kCudnn, AttentionBackend::kEfficient}) {
    if (n == attention_backend_name(b)) return b;
  }
  MAGI_CHECK(false, "attention_backend='", name,
             "' is not a backend; use one of auto, graph, flash, cudnn, efficient");
  return AttentionBackend::kAuto;
}

const char* attention_backend_name(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::kAuto:
      return "auto";
    case AttentionBackend::kGraph:
      return "graph";
    case AttentionBackend::kFlash:
      return "flash";
    case AttentionBackend::kCudnn:
      return "cudnn";
    case AttentionBackend::kEfficient:
      return "efficient";
  }
  return "?";
}

std::vector<AttentionChoice> attention_choices() {
  Decisions& d = decisions();
  std::lock_guard<std::mutex> lock(d.mutex);
  return d.log;
}

void clear_attention_choices() {
  Decisions& d = decisions();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.by_key.clear();
  d.log.clear();
}

bool AttentionCall::handles(const c10::OperatorHandle& op) {
  return backend_of(op.operator_name().name).has_value();
}

AttentionCall::AttentionCall(const c10::OperatorHandle& op, AttentionBackend policy)
    : op_(op), policy_(policy) {
  auto traced = backend_of(op.operator_name().name);
  MAGI_ASSERT(traced.has_value(), op.operator_name().name, " is not an attention operator");
  traced_ = *traced;
  const auto& arguments = op.schema().arguments();
  for (int i = 0; i < static_cast<int>(arguments.size()); ++i) {
    const std::string& name = arguments[i].name();
    if (name == "query") query_ = i;
    if (name == "key") key_ = i;
    if (name == "value") value_ = i;
    if (name == "attn_bias") bias_ = i;
    if (name == "dropout_p") dropout_ = i;
    if (name == "is_causal") causal_ = i;
    if (name == "scale") scale_ = i;
    if (name.find("descale") != std::string::npos) descales_.push_back(i);
  }
  MAGI_ASSERT(query_ >= 0 && key_ >= 0 && value_ >= 0, op.operator_name().name,
              ": no query/key/value arguments in its schema");
}

at::Tensor AttentionCall::run(const std::vector<c10::IValue>& args) const {
  auto traced_call = [&] {
    torch::jit::Stack stack(args.begin(), args.end());
    op_.callBoxed(stack);
    return stack[0].toTensor();
  };
  Args a;
  a.q = args[query_].toTensor();
  a.k = args[key_].toTensor();
  a.v = args[value_].toTensor();
  if (bias_ >= 0 && args[bias_].isTensor()) a.bias = args[bias_].toTensor();
  if (dropout_ >= 0) a.dropout = args[dropout_].toDouble();
  if (causal_ >= 0) a.causal = args[causal_].toBool();
  if (scale_ >= 0 && !args[scale_].isNone()) a.scale = args[scale_].toDouble();
  bool quantised = false;
  for (int i : descales_) quantised |= !args[i].isNone();
  if (policy_ == AttentionBackend::kGraph || quantised || a.dropout != 0.0 || !a.q.is_cuda()) {
    return traced_call();
  }

  const std::vector<int64_t> local_key = shape_key(a);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = known_.find(local_key);
    if (it != known_.end()) {
      return it->second == traced_ ? traced_call() : call_backend(it->second, a);
    }
  }
  const std::string key = std::string(attention_backend_name(policy_)) + " " + shape_of(a);
  Decisions& d = decisions();
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    auto it = d.by_key.find(key);
    if (it != d.by_key.end()) {
      const AttentionBackend backend = it->second;
      {
        std::lock_guard<std::mutex> mine(mutex_);
        known_.emplace(local_key, backend);
      }
      return backend == traced_ ? traced_call() : call_backend(backend, a);
    }
  }
  if (capturing(a.q)) return traced_call();  // decided by an uncaptured call of this shape

  AttentionBackend chosen = traced_;
  at::Tensor out;
  if (policy_ == AttentionBackend::kAuto) {
#ifdef MAGI_HAVE_CUDA_GRAPHS
    out = traced_call();
    AttentionChoice choice = probe(traced_, a, out);
    chosen = parse_attention_backend(choice.chosen);
    MAGI_LOG_INFO(summary(choice));
    std::lock_guard<std::mutex> lock(d.mutex);
    d.log.push_back(std::move(choice));
#else
    out = traced_call();
#endif
  } else if (policy_ != traced_) {
    try {
      at::Tensor named = call_backend(policy_, a);
      at::Tensor reference = traced_call();
      MAGI_CHECK(named.strides() == reference.strides(),
                 "its output layout differs from the traced backend's");
      out = std::move(named);
      chosen = policy_;
    } catch (const DeviceError&) {
      throw;  // a device fault is no verdict on the backend
    } catch (const std::exception& e) {
      after_failure();
      std::string what = e.what();
      MAGI_LOG_WARN("attention_backend=", attention_backend_name(policy_), " cannot run ",
                    shape_of(a), " (", what.substr(0, what.find('\n')), "); using ",
                    attention_backend_name(traced_), ", the backend the trace recorded");
    }
  }
  if (!out.defined()) out = traced_call();
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.by_key.emplace(key, chosen);
  }
  std::lock_guard<std::mutex> mine(mutex_);
  known_.emplace(local_key, chosen);
  return out;
}

}  // namespace magi::runtime
