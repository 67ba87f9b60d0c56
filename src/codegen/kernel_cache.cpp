// The kernel caches' shared half: where the disk cache lives, how its files are named and
// written, and the counters tests read. The drivers (nvrtc_driver.cpp, host_compiler.cpp)
// keep their own in-memory tables and call into this file for the disk.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>

#include "compile_cache.h"
#include "magi/codegen/compiler.h"
#include "magi/common/log.h"

namespace magi::codegen {
namespace internal {
namespace {

std::string default_cache_dir() {
  if (const char* env = std::getenv("MAGI_CACHE_DIR"); env != nullptr) return env;
  const char* home = std::getenv("HOME");
  std::string base = (home != nullptr && *home != '\0') ? home : temporary_directory();
  return base + "/.cache/magi_compiler/kernels";
}

struct CacheDir {
  std::mutex mutex;
  std::string path = default_cache_dir();
  bool created = false;  ///< `path` exists (checked once per setting)
  bool failed = false;   ///< creating `path` failed; warned once, disk cache off
};

CacheDir& cache_dir_state() {
  static CacheDir state;
  return state;
}

}  // namespace

uint64_t stable_hash(std::string_view data, uint64_t seed) {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t h = seed;
  auto mix = [&](unsigned char byte) { h = (h ^ byte) * kPrime; };
  for (char c : data) mix(static_cast<unsigned char>(c));
  for (size_t n = data.size(), i = 0; i < 8; ++i, n >>= 8) mix(static_cast<unsigned char>(n));
  return h;
}

std::string hex(uint64_t value) {
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016llx", static_cast<unsigned long long>(value));
  return buffer;
}

Counters& counters() {
  static Counters instance;
  return instance;
}

std::string disk_cache_path(uint64_t key, std::string_view extension) {
  CacheDir& state = cache_dir_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.path.empty() || state.failed) return "";
  if (!state.created) {
    if (!make_directories(state.path)) {
      MAGI_LOG_WARN("cannot create the kernel cache directory ", state.path, " (",
                    std::strerror(errno),
                    "); caching compiled kernels in memory only. Set MAGI_CACHE_DIR to a writable "
                    "directory to keep them across processes.");
      state.failed = true;
      return "";
    }
    state.created = true;
  }
  return state.path + "/" + hex(key) + std::string(extension);
}

bool make_directories(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
    if (slash == std::string::npos) break;
  }
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

bool file_exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

std::string temporary_directory() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

std::optional<std::vector<char>> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return std::nullopt;
  return data;
}

std::string temporary_suffix() {
  static std::atomic<uint64_t> counter{0};
  return ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

bool write_file_atomically(const std::string& path, std::string_view data) {
  const std::string temporary = path + temporary_suffix();
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.close();
    if (!out) {
      MAGI_LOG_WARN("cannot write ", temporary, "; not caching it on disk");
      std::remove(temporary.c_str());
      return false;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    MAGI_LOG_WARN("cannot rename ", temporary, " to ", path, "; not caching it on disk");
    std::remove(temporary.c_str());
    return false;
  }
  return true;
}

void* open_first_library(const std::vector<std::string>& candidates, std::string* tried) {
  for (const std::string& candidate : candidates) {
    if (void* handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    if (tried != nullptr) {
      const char* error = ::dlerror();
      *tried += "\n  " + candidate + ": " + (error != nullptr ? error : "not found");
    }
  }
  return nullptr;
}

std::string numbered_head(const std::string& source, int max_lines) {
  std::istringstream in(source);
  std::ostringstream out;
  std::string line;
  int number = 0;
  while (number < max_lines && std::getline(in, line)) out << ++number << "\t" << line << "\n";
  if (std::getline(in, line)) out << "\t...\n";
  return out.str();
}

}  // namespace internal

void set_cache_dir(const std::string& dir) {
  internal::CacheDir& state = internal::cache_dir_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.path = dir;
  state.created = false;
  state.failed = false;
}

std::string cache_dir() {
  internal::CacheDir& state = internal::cache_dir_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.path;
}

CompilerStats compiler_stats() {
  const internal::Counters& c = internal::counters();
  CompilerStats stats;
  stats.cuda_compiles = c.cuda_compiles.load();
  stats.cpu_compiles = c.cpu_compiles.load();
  stats.memory_hits = c.memory_hits.load();
  stats.disk_hits = c.disk_hits.load();
  stats.dependent_launches = c.dependent_launches.load();
  stats.plain_launches = c.plain_launches.load();
  return stats;
}

void reset_compiler_stats() {
  internal::Counters& c = internal::counters();
  c.cuda_compiles = 0;
  c.cpu_compiles = 0;
  c.memory_hits = 0;
  c.disk_hits = 0;
  c.dependent_launches = 0;
  c.plain_launches = 0;
}

void clear_memory_cache() {
  internal::clear_cubin_memory_cache();
  internal::clear_cpu_memory_cache();
}

}  // namespace magi::codegen
