// Which library kernel runs a captured attention call.
//
// When AOTAutograd traces F.scaled_dot_product_attention it records the backend PyTorch's
// selection picked at that moment (on CUDA usually flash attention). That choice ignores the
// shape: on Hopper, cuDNN's attention is often much faster for long causal prefills, and
// PyTorch's default order never tries it. The executor therefore routes each CUDA SDPA call of
// an inference graph (no dropout, only the attention output used) through an AttentionCall,
// which runs the backend the policy names:
//
//   kAuto   the first call of each shape times every backend that accepts it (a short probe:
//           one check run against the traced backend's output, then a few timed runs) and keeps
//           the fastest whose output agrees; later calls of that shape, in every graph of the
//           process, reuse the choice. No probe runs while a CUDA graph is being captured:
//           such a call runs the traced backend (the runner's warm-up call probes first);
//   kGraph  the backend the trace recorded (no probe);
//   kFlash, kCudnn, kEfficient: that backend; where it rejects a call, the traced one (one
//           warning per shape).
//
// A call whose key and value have fewer heads than the query (grouped-query attention, from
// passes::group_query_attention) runs on flash or cuDNN only: memory-efficient attention
// rejects it with its reason.
//
// Training graphs are left alone: their backward needs the forward's own logsumexp and RNG
// outputs, so the pair must come from one backend.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace magi::runtime {

enum class AttentionBackend : uint8_t { kAuto, kGraph, kFlash, kCudnn, kEfficient };

/// "auto", "graph", "flash", "cudnn" or "efficient" (case-insensitive); a UserError otherwise.
AttentionBackend parse_attention_backend(const std::string& name);
const char* attention_backend_name(AttentionBackend backend);

/// One decision of the kAuto policy, for logs, dumps and inspection.
struct AttentionChoice {
  std::string shape;   ///< e.g. "q 1x16x4096x128 k 1x16x4096x128 BFloat16 causal"
  std::string traced;  ///< the backend the trace recorded
  std::string chosen;
  std::vector<std::pair<std::string, double>> ms;  ///< per backend tried: median time, ms
  std::vector<std::string> rejected;               ///< "cudnn: <why>" for backends left out
};

/// Called after a backend's failure is caught and set aside. A kernel implemented in Python
/// that raises leaves its exception pending in the interpreter when the failure is not handed
/// back to Python; the bindings install a hook that discards it (the runtime sees no Python).
void set_failure_cleanup(void (*cleanup)());

/// Every kAuto decision made in this process, in the order made.
std::vector<AttentionChoice> attention_choices();
/// Forgets the decisions (tests): graphs compiled later probe again; call sites that already
/// ran keep the choice they made.
void clear_attention_choices();

class AttentionCall {
 public:
  /// True for the fused SDPA operators this class can re-route.
  static bool handles(const c10::OperatorHandle& op);

  AttentionCall(const c10::OperatorHandle& op, AttentionBackend policy);

  /// Runs the call with the operator's own arguments (schema order); returns the attention
  /// output (the operator's output 0).
  at::Tensor run(const std::vector<c10::IValue>& args) const;

 private:
  c10::OperatorHandle op_;
  AttentionBackend policy_;
  AttentionBackend traced_;
  // Argument positions in the traced operator's schema; -1 when it has no such argument.
  int query_ = -1, key_ = -1, value_ = -1, bias_ = -1, dropout_ = -1, causal_ = -1, scale_ = -1;
  std::vector<int> descales_;  // the quantised flash overload's scale tensors
  // Decisions this call site has used, by an integer key of the shape (the hot path: no
  // string, no process-wide lock).
  mutable std::mutex mutex_;
  mutable std::map<std::vector<int64_t>, AttentionBackend> known_;
};

}  // namespace magi::runtime
