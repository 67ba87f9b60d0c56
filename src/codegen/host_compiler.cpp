// C++ → shared object through the host compiler, for the CPU kernels. The compiler runs as a
// child process (posix_spawn, output captured through a pipe); the result is loaded with
// dlopen and looked up with dlsym.
//
// The cache key holds the compiler's version line and the CPU's model and flags as well as
// the source and flags: -march=native code from one machine must not be loaded on another
// that shares the cache directory.
#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "compile_cache.h"
#include "magi/codegen/compiler.h"
#include "magi/common/log.h"

extern char** environ;

namespace magi::codegen {
namespace {

const std::vector<std::string>& compile_flags() {
  static const std::vector<std::string> flags = {"-O3",     "-march=native", "-fopenmp",
                                                 "-shared", "-fPIC",         "-std=c++17"};
  return flags;
}

/// $MAGI_CXX, else $CXX, else c++, split on spaces (so "ccache g++" works).
std::vector<std::string> compiler_command() {
  const char* env = std::getenv("MAGI_CXX");
  if (env == nullptr || *env == '\0') env = std::getenv("CXX");
  std::istringstream words(env != nullptr && *env != '\0' ? env : "c++");
  std::vector<std::string> command;
  for (std::string word; words >> word;) command.push_back(word);
  return command;
}

std::string join(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : " ") + word;
  return text;
}

struct ProcessResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr, interleaved
};

/// Runs `argv` (looked up on PATH) and waits for it. Throws InternalError when it cannot start.
ProcessResult run_process(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  MAGI_ASSERT(::pipe2(pipe_fds, O_CLOEXEC) == 0, "pipe2 failed: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);

  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawn_error = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (spawn_error != 0) {
    ::close(pipe_fds[0]);
    MAGI_ASSERT(false, "cannot run the host compiler `", join(argv),
                "`: ", std::strerror(spawn_error),
                ". Install a C++ compiler with OpenMP (g++), or point MAGI_CXX at one.");
  }

  ProcessResult result;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(pipe_fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      result.output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

/// First line of `<compiler> --version`, once per command.
std::string compiler_version(const std::vector<std::string>& command) {
  static std::mutex mutex;
  static std::map<std::vector<std::string>, std::string> versions;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = versions.find(command); it != versions.end()) return it->second;
  std::vector<std::string> argv = command;
  argv.push_back("--version");
  ProcessResult result = run_process(argv);
  MAGI_ASSERT(result.exit_code == 0, "`", join(argv), "` failed (exit code ", result.exit_code,
              "):\n", result.output,
              "\nInstall a C++ compiler with OpenMP (g++), or point MAGI_CXX at one.");
  std::string first_line = result.output.substr(0, result.output.find('\n'));
  return versions.emplace(command, first_line).first->second;
}

/// The CPU's model name and feature flags (what -march=native depends on), once.
const std::string& cpu_identity() {
  static const std::string identity = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(in, line) && (model.empty() || flags.empty())) {
      if (model.empty() && line.rfind("model name", 0) == 0) model = line;
      if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
    }
    return model + "\n" + flags;
  }();
  return identity;
}

struct SharedObjectTable {
  std::mutex mutex;
  std::unordered_map<uint64_t, void*> handles;  ///< by source key
  std::map<std::pair<uint64_t, std::string>, void*> symbols;
};

SharedObjectTable& shared_objects() {
  static SharedObjectTable table;
  return table;
}

/// Compiles `source` into `<directory>/<stem>.so` (written atomically) and returns its path.
std::string compile_shared_object(const std::string& source,
                                  const std::vector<std::string>& command,
                                  const std::string& directory, const std::string& stem) {
  const std::string source_path = directory + "/" + stem + ".cpp";
  const std::string library_path = directory + "/" + stem + ".so";
  MAGI_ASSERT(internal::write_file_atomically(source_path, source), "cannot write ", source_path);
  const std::string temporary = library_path + internal::temporary_suffix();
  std::vector<std::string> argv = command;
  argv.insert(argv.end(), compile_flags().begin(), compile_flags().end());
  argv.insert(argv.end(), {source_path, "-o", temporary});

  internal::counters().cpu_compiles++;
  ProcessResult result = run_process(argv);
  if (result.exit_code != 0) {
    std::remove(temporary.c_str());
    detail::throw_internal_error(
        __FILE__, __LINE__, "host compiler exit code == 0",
        detail::str_cat("the host compiler failed (exit code ", result.exit_code,
                        ") on generated CPU code:\n$ ", join(argv), "\n", result.output,
                        "\n--- source (start) ---\n", internal::numbered_head(source)));
  }
  if (!result.output.empty())
    MAGI_LOG_DEBUG("host compiler output for ", stem, ":\n", result.output);
  MAGI_ASSERT(std::rename(temporary.c_str(), library_path.c_str()) == 0, "cannot rename ",
              temporary, " to ", library_path, ": ", std::strerror(errno));
  return library_path;
}

/// dlopen of a compiled shared object; nullptr (and the reason in `error`) on failure.
void* open_shared_object(const std::string& path, std::string* error) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = ::dlerror();
    *error = reason != nullptr ? reason : "unknown dlopen error";
  }
  return handle;
}

/// Removes what compile_shared_object wrote into a private directory, and the directory.
void remove_build_files(const std::string& directory, const std::string& stem) {
  for (const char* extension : {".cpp", ".so"}) {
    ::unlink((directory + "/" + stem + extension).c_str());
  }
  ::rmdir(directory.c_str());
}

/// The loaded shared object for `source`: from memory, from disk, or compiled now.
std::pair<uint64_t, void*> load_source(const std::string& source) {
  const std::vector<std::string> command = compiler_command();
  uint64_t key = internal::stable_hash(compiler_version(command));
  key = internal::stable_hash(cpu_identity(), key);
  for (const std::string& flag : compile_flags()) key = internal::stable_hash(flag, key);
  key = internal::stable_hash(source, key);

  const auto start = std::chrono::steady_clock::now();
  SharedObjectTable& table = shared_objects();
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    if (auto it = table.handles.find(key); it != table.handles.end()) {
      internal::counters().memory_hits++;
      return *it;
    }
  }

  const std::string stem = internal::hex(key);
  const std::string disk_path = internal::disk_cache_path(key, ".so");
  std::string error;
  void* handle = nullptr;
  if (!disk_path.empty() && internal::file_exists(disk_path)) {
    handle = open_shared_object(disk_path, &error);
    if (handle != nullptr) {
      internal::counters().disk_hits++;
      MAGI_LOG_DEBUG("CPU kernels ", stem, ": disk cache hit in ",
                     internal::milliseconds_since(start), " ms");
    } else {
      MAGI_LOG_DEBUG("ignoring the unloadable cached ", disk_path, ": ", error);
    }
  }
  if (handle == nullptr) {
    // Without a disk cache, build in a private temporary directory and delete it once loaded.
    std::string directory = disk_path.substr(0, disk_path.rfind('/'));
    const bool temporary = disk_path.empty();
    if (temporary) {
      directory = internal::temporary_directory() + "/magi_kernels_XXXXXX";
      MAGI_ASSERT(::mkdtemp(directory.data()) != nullptr, "cannot create a temporary directory ",
                  directory, ": ", std::strerror(errno));
    }
    std::string path;
    try {
      path = compile_shared_object(source, command, directory, stem);
      handle = open_shared_object(path, &error);
    } catch (...) {
      if (temporary) remove_build_files(directory, stem);
      throw;
    }
    if (temporary) remove_build_files(directory, stem);
    MAGI_ASSERT(handle != nullptr, "cannot load the compiled CPU kernels ", path, ": ", error);
    MAGI_LOG_DEBUG("CPU kernels ", stem, ": compiled in ", internal::milliseconds_since(start),
                   " ms", temporary ? " (disk cache off)" : "");
  }
  std::lock_guard<std::mutex> lock(table.mutex);
  return *table.handles.emplace(key, handle).first;
}

}  // namespace

namespace internal {
void clear_cpu_memory_cache() {
  SharedObjectTable& table = shared_objects();
  std::lock_guard<std::mutex> lock(table.mutex);
  table.handles.clear();
  table.symbols.clear();
}
}  // namespace internal

void* get_cpu_function(const std::string& source, const std::string& symbol) {
  const auto [key, handle] = load_source(source);
  SharedObjectTable& table = shared_objects();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto [it, inserted] = table.symbols.emplace(std::make_pair(key, symbol), nullptr);
  if (inserted) {
    it->second = ::dlsym(handle, symbol.c_str());
    if (it->second == nullptr) {
      table.symbols.erase(it);
      MAGI_ASSERT(false, "the compiled CPU source has no symbol `", symbol,
                  "` (entry points must be extern \"C\"):\n", internal::numbered_head(source));
    }
  }
  return it->second;
}

}  // namespace magi::codegen
