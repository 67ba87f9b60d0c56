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

}  // namespace magi::detail
