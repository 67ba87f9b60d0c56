// Throw helpers behind the MAGI_CHECK / MAGI_UNSUPPORTED / MAGI_ASSERT macros. Kept out of
// line so the macros expand to one call on the cold path.
#include "magi/common/error.h"

#include "magi/common/log.h"

namespace magi::detail {

void throw_user_error(std::string message) { throw UserError(std::move(message)); }

void throw_unsupported(std::string message) {
  MAGI_LOG_DEBUG("unsupported: ", message);
  throw UnsupportedError(std::move(message));
}

void throw_internal_error(const char* file, int line, const char* condition, std::string message) {
  std::string text = str_cat("internal error at ", file, ":", line, ": `", condition, "` failed");
  if (!message.empty()) text += str_cat(": ", message);
  text +=
      ". This is a bug in magi-compiler; please report it with MAGI_ENABLE_FX_GRAPH_VIZ=1 "
      "output attached.";
  MAGI_LOG_ERROR(text);
  throw InternalError(std::move(text));
}

namespace {
// CUresult codes (cuda.h) whose cause is not ours to report as a bug.
constexpr int kOutOfMemory = 2;
constexpr int kEccUncorrectable = 214, kNvlinkUncorrectable = 220, kContained = 226;
constexpr int kTensorMemoryLeak = 721, kExternalDevice = 911;
constexpr int kCaptureFirst = 900, kCaptureLast = 908;  // CUDA_ERROR_STREAM_CAPTURE_*, 907 too
bool sticky_fault(int code) {                           // the context is unusable after these
  return code == 700 || code == 702 || code == 710 || (code >= 714 && code <= 719) ||
         code == kTensorMemoryLeak || code == kEccUncorrectable || code == kNvlinkUncorrectable ||
         code == kContained || code == kExternalDevice;
}
}  // namespace

const char* capture_advice() {
  return "An operation the capture does not allow ran in the captured code: a synchronisation "
         "(.item(), .cpu(), torch.cuda.synchronize()), an allocation outside PyTorch's "
         "allocator, or work on a stream the capture does not join, most often inside a custom "
         "op. Make that op a boundary (register it with is_subgraph_boundary=True, or name it in "
         "splitting_ops) and use cudagraph_mode PIECEWISE, so that it runs between graphs, or "
         "set cudagraph_mode to NONE.";
}

void throw_driver_error(const char* file, int line, const char* call, int code,
                        const std::string& code_text, const std::string& what) {
  const std::string head = str_cat(what, ": ", code_text);
  if (code >= kCaptureFirst && code <= kCaptureLast) {
    throw_user_error(
        str_cat(head, ". A CUDA graph was being captured on this stream. ", capture_advice()));
  }
  if (code == kOutOfMemory || sticky_fault(code)) {
    std::string text =
        code == kOutOfMemory
            ? str_cat(head, ". The device has no memory left for this call.")
            : str_cat(head,
                      ". The device reported a fault. CUDA reports one at the first call after "
                      "the kernel that caused it, which may be any earlier kernel on the "
                      "device, ours or not; a device-side assert (CUDA_ERROR_ASSERT) usually "
                      "means an index out of range, such as a token id beyond an embedding's "
                      "rows. Run with CUDA_LAUNCH_BLOCKING=1 to find the kernel. The process's "
                      "CUDA context cannot be used after this error.");
    MAGI_LOG_ERROR(text);
    throw DeviceError(std::move(text));
  }
  throw_internal_error(file, line, call, head);
}

}  // namespace magi::detail
