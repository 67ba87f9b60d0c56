// The kinds of error the library raises, and the macros that raise them.
//
//   MAGI_CHECK(cond, ...)   bad input from the user          -> magi::UserError
//   MAGI_UNSUPPORTED(...)   a construct we cannot compile    -> magi::UnsupportedError
//   MAGI_ASSERT(cond, ...)  a broken invariant of our own    -> magi::InternalError
//   (a failed CUDA driver call, by its code: codegen::throw_driver_error)
//
// Message pieces are streamed (`MAGI_CHECK(n > 1, "dim ", d, " has size ", n)`), so this
// header needs neither fmt nor torch. python/csrc/bind_errors.cpp translates each class to
// the Python exception of the same name, in one place.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace magi {

/// Base of every error the library throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The user gave something wrong; the message says what and how to fix it.
class UserError : public Error {
 public:
  using Error::Error;
};

/// A valid program we cannot compile (yet); callers may fall back to eager.
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

/// Our bug. The message carries the file and line of the broken invariant.
class InternalError : public Error {
 public:
  using Error::Error;
};

/// The GPU failed in a way that does not say whose code caused it: a fault the driver reports
/// at the first call after the kernel that caused it (an illegal address, a device-side
/// assert), or no device memory left.
class DeviceError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void throw_user_error(std::string message);
[[noreturn]] void throw_unsupported(std::string message);
[[noreturn]] void throw_internal_error(const char* file, int line, const char* condition,
                                       std::string message);

}  // namespace detail
}  // namespace magi

#define MAGI_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) ::magi::detail::throw_user_error(::magi::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define MAGI_UNSUPPORTED(...) \
  ::magi::detail::throw_unsupported(::magi::detail::str_cat(__VA_ARGS__))

#define MAGI_ASSERT(cond, ...)                                                    \
  do {                                                                            \
    if (!(cond))                                                                  \
      ::magi::detail::throw_internal_error(__FILE__, __LINE__, #cond,             \
                                           ::magi::detail::str_cat(__VA_ARGS__)); \
  } while (0)
