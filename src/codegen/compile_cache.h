// Internal to src/codegen: what the NVRTC driver, the CUDA driver and the host compiler share.
// Stable content hashes (disk cache file names must not change between builds, so no
// std::hash), the disk cache's atomic file writes, the statistics counters, and dlopen over
// a list of candidate library paths.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace magi::codegen::internal {

/// 64-bit FNV-1a, stable across builds and machines. Chain calls through `seed` to hash
/// several pieces (each piece's length is mixed in, so ("ab","c") and ("a","bc") differ).
uint64_t stable_hash(std::string_view data, uint64_t seed = 0xcbf29ce484222325ull);
/// 16 lowercase hex digits.
std::string hex(uint64_t value);

struct Counters {
  std::atomic<size_t> cuda_compiles{0};
  std::atomic<size_t> cpu_compiles{0};
  std::atomic<size_t> memory_hits{0};
  std::atomic<size_t> disk_hits{0};
  std::atomic<size_t> dependent_launches{0};
  std::atomic<size_t> plain_launches{0};
};
Counters& counters();

/// `<cache dir>/<hex(key)><extension>`, creating the directory; "" when the disk cache is
/// disabled or the directory cannot be created (logged once, then the cache runs in memory).
std::string disk_cache_path(uint64_t key, std::string_view extension);
/// The whole file, or nullopt when it does not exist or cannot be read.
std::optional<std::vector<char>> read_file(const std::string& path);
/// Writes `path` through a temporary file and rename(2), so a concurrent reader (another
/// process sharing the cache) sees either nothing or the whole file. Returns false (and logs)
/// on failure; a cache that cannot be written is not an error.
bool write_file_atomically(const std::string& path, std::string_view data);
/// A suffix unique within this machine: ".tmp.<pid>.<counter>".
std::string temporary_suffix();

// POSIX file helpers. std::filesystem is avoided on purpose: the torch wheel's libtorch.so
// and libtorch_cpu.so export their own std::filesystem functions, built against another
// libstdc++, and the dynamic linker binds our calls to them (remove_all crashes).

/// mkdir -p; true when `path` is a directory afterwards.
bool make_directories(const std::string& path);
bool file_exists(const std::string& path);
/// $TMPDIR, else /tmp.
std::string temporary_directory();

/// dlopen (RTLD_NOW | RTLD_LOCAL) of the first candidate that loads; nullptr when none does.
/// `tried` (optional) receives the candidates and dlerror() lines, for error messages.
void* open_first_library(const std::vector<std::string>& candidates, std::string* tried);

/// The first `max_lines` lines of `source`, numbered, for error messages.
std::string numbered_head(const std::string& source, int max_lines = 20);

inline double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Each driver's in-memory tables, cleared by clear_memory_cache().
void clear_cubin_memory_cache();
void clear_cpu_memory_cache();

}  // namespace magi::codegen::internal
