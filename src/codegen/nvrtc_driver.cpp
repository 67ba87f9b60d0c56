// CUDA C++ → cubin through NVRTC, loaded with dlopen on first use so that the library has no
// link-time dependency on the toolkit. NVRTC's API is declared here (opaque handle, int
// results), so this file needs no CUDA headers either.
//
// Compiles go straight to SASS (--gpu-architecture=sm_XY), never through PTX JIT, and never
// with --use_fast_math: generated kernels must give eager PyTorch's numbers.
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "compile_cache.h"
#include "magi/codegen/compiler.h"
#include "magi/common/log.h"

namespace magi::codegen {
namespace {

// ---- NVRTC's C API, declared by hand ----------------------------------------------------------

using nvrtcResult = int;  // enum nvrtcResult; 0 is NVRTC_SUCCESS
struct NvrtcProgramOpaque;
using nvrtcProgram = NvrtcProgramOpaque*;

struct Nvrtc {
  nvrtcResult (*version)(int*, int*) = nullptr;
  const char* (*get_error_string)(nvrtcResult) = nullptr;
  nvrtcResult (*create_program)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                const char* const*) = nullptr;
  nvrtcResult (*compile_program)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*get_cubin_size)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*get_cubin)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*get_log_size)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*get_log)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*destroy_program)(nvrtcProgram*) = nullptr;

  bool loaded = false;
  std::string version_string;  ///< "nvrtc 13.0", part of every cache key
  std::string why_not;         ///< what was tried, when not loaded
};

/// Directories of NVRTC shipped in pip wheels next to a torch that this process has loaded
/// (torch/lib/... → site-packages/nvidia/...), so we use the NVRTC torch was built with.
std::vector<std::string> wheel_candidates() {
  std::vector<std::string> site_packages;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        const char* name = info->dlpi_name;
        const char* torch_lib = name != nullptr ? std::strstr(name, "/torch/lib/") : nullptr;
        if (torch_lib != nullptr) {
          auto* out = static_cast<std::vector<std::string>*>(data);
          std::string prefix(name, torch_lib);
          if (std::find(out->begin(), out->end(), prefix) == out->end()) out->push_back(prefix);
        }
        return 0;
      },
      &site_packages);
  std::vector<std::string> candidates;
  for (const std::string& prefix : site_packages) {
    candidates.push_back(prefix + "/nvidia/cu13/lib/libnvrtc.so.13");
    candidates.push_back(prefix + "/nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
  }
  return candidates;
}

void* open_nvrtc(std::string* tried) {
  // One already in the process (torch's, typically): never load a second NVRTC.
  for (const char* soname : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
    if (void* handle = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) return handle;
  }
  std::vector<std::string> candidates = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"};
  for (std::string& c : wheel_candidates()) candidates.push_back(std::move(c));
  if (const char* cuda_home = std::getenv("CUDA_HOME"); cuda_home != nullptr && *cuda_home) {
    candidates.push_back(std::string(cuda_home) + "/lib64/libnvrtc.so");
  }
  candidates.push_back("/usr/local/cuda/lib64/libnvrtc.so");
  return internal::open_first_library(candidates, tried);
}

const Nvrtc& nvrtc() {
  static const Nvrtc instance = [] {
    Nvrtc n;
    std::string tried;
    void* lib = open_nvrtc(&tried);
    if (lib == nullptr) {
      n.why_not = "libnvrtc could not be loaded; tried:" + tried;
      return n;
    }
    std::string missing;
    auto resolve = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, symbol));
      if (fn == nullptr) missing += std::string(" ") + symbol;
    };
    resolve(n.version, "nvrtcVersion");
    resolve(n.get_error_string, "nvrtcGetErrorString");
    resolve(n.create_program, "nvrtcCreateProgram");
    resolve(n.compile_program, "nvrtcCompileProgram");
    resolve(n.get_cubin_size, "nvrtcGetCUBINSize");
    resolve(n.get_cubin, "nvrtcGetCUBIN");
    resolve(n.get_log_size, "nvrtcGetProgramLogSize");
    resolve(n.get_log, "nvrtcGetProgramLog");
    resolve(n.destroy_program, "nvrtcDestroyProgram");
    if (!missing.empty()) {
      n.why_not = "the loaded libnvrtc lacks" + missing + " (NVRTC 11.1 or newer is needed)";
      return n;
    }
    int major = 0, minor = 0;
    n.version(&major, &minor);
    n.version_string = "nvrtc " + std::to_string(major) + "." + std::to_string(minor);
    n.loaded = true;
    MAGI_LOG_DEBUG("loaded ", n.version_string);
    return n;
  }();
  return instance;
}

const Nvrtc& require_nvrtc() {
  const Nvrtc& n = nvrtc();
  MAGI_CHECK(n.loaded, "compiling CUDA kernels needs NVRTC from the CUDA toolkit (11.1 or newer): ",
             n.why_not,
             "\nInstall the toolkit, or set CUDA_HOME to it, or put its lib64 on "
             "LD_LIBRARY_PATH.");
  return n;
}

std::string program_log(const Nvrtc& n, nvrtcProgram program) {
  size_t size = 0;
  if (n.get_log_size(program, &size) != 0 || size <= 1) return "";
  std::string log(size, '\0');
  if (n.get_log(program, log.data()) != 0) return "";
  log.resize(size - 1);  // drop the terminating NUL
  return log;
}

/// Runs NVRTC once. Throws InternalError naming the kernel, with NVRTC's log and the start of
/// the source.
std::vector<char> run_nvrtc(const Nvrtc& n, const std::string& source, const std::string& name,
                            const std::vector<std::string>& options) {
  nvrtcProgram program = nullptr;
  nvrtcResult result =
      n.create_program(&program, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr);
  MAGI_ASSERT(result == 0, "nvrtcCreateProgram failed for kernel `", name,
              "`: ", n.get_error_string(result));
  struct Destroy {
    const Nvrtc& n;
    nvrtcProgram& program;
    ~Destroy() { n.destroy_program(&program); }
  } destroy{n, program};

  std::vector<const char*> argv;
  for (const std::string& option : options) argv.push_back(option.c_str());
  result = n.compile_program(program, static_cast<int>(argv.size()), argv.data());
  std::string log = program_log(n, program);
  if (result != 0) {
    std::string options_text;
    for (const std::string& option : options) options_text += " " + option;
    detail::throw_internal_error(
        __FILE__, __LINE__, "nvrtcCompileProgram(...) == NVRTC_SUCCESS",
        detail::str_cat("NVRTC (", n.version_string, ") failed to compile kernel `", name,
                        "` with options", options_text, ": ", n.get_error_string(result),
                        "\n--- NVRTC log ---\n", log, "\n--- source (start) ---\n",
                        internal::numbered_head(source)));
  }
  if (!log.empty()) MAGI_LOG_DEBUG("NVRTC log for kernel ", name, ":\n", log);

  size_t size = 0;
  result = n.get_cubin_size(program, &size);
  MAGI_ASSERT(result == 0 && size > 0, "nvrtcGetCUBINSize failed for kernel `", name,
              "`: ", n.get_error_string(result));
  std::vector<char> cubin(size);
  result = n.get_cubin(program, cubin.data());
  MAGI_ASSERT(result == 0, "nvrtcGetCUBIN failed for kernel `", name,
              "`: ", n.get_error_string(result));
  return cubin;
}

bool is_elf(const std::vector<char>& data) {
  return data.size() > 4 && std::memcmp(data.data(),
                                        "\x7f"
                                        "ELF",
                                        4) == 0;
}

struct CubinCache {
  std::mutex mutex;
  std::unordered_map<uint64_t, std::vector<char>> cubins;
};

CubinCache& cubin_cache() {
  static CubinCache cache;
  return cache;
}

}  // namespace

namespace internal {
void clear_cubin_memory_cache() {
  CubinCache& cache = cubin_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.cubins.clear();
}
}  // namespace internal

bool nvrtc_available() { return nvrtc().loaded; }

std::vector<char> compile_cuda_to_cubin(const std::string& source, const std::string& name,
                                        int arch, const std::string& arch_suffix) {
  const Nvrtc& n = require_nvrtc();
  MAGI_ASSERT(arch >= 50 && arch < 1000, "bad CUDA architecture ", arch, " for kernel `", name,
              "`; expected e.g. 80 for sm_80");
  const std::vector<std::string> options = {
      "--gpu-architecture=sm_" + std::to_string(arch) + arch_suffix, "-std=c++17",
      "-default-device"};

  uint64_t key = internal::stable_hash(n.version_string);
  for (const std::string& option : options) key = internal::stable_hash(option, key);
  key = internal::stable_hash(source, key);

  const auto start = std::chrono::steady_clock::now();
  CubinCache& cache = cubin_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (auto it = cache.cubins.find(key); it != cache.cubins.end()) {
      internal::counters().memory_hits++;
      return it->second;
    }
  }
  const std::string path = internal::disk_cache_path(key, ".cubin");
  if (!path.empty()) {
    if (std::optional<std::vector<char>> cubin = internal::read_file(path);
        cubin && is_elf(*cubin)) {
      internal::counters().disk_hits++;
      MAGI_LOG_DEBUG("CUDA kernel ", name, " (sm_", arch, arch_suffix, "): disk cache hit ", path,
                     " in ", internal::milliseconds_since(start), " ms");
      std::lock_guard<std::mutex> lock(cache.mutex);
      return cache.cubins.emplace(key, std::move(*cubin)).first->second;
    }
  }

  internal::counters().cuda_compiles++;
  std::vector<char> cubin = run_nvrtc(n, source, name, options);
  if (!path.empty())
    internal::write_file_atomically(path, std::string_view(cubin.data(), cubin.size()));
  MAGI_LOG_DEBUG("CUDA kernel ", name, " (sm_", arch, arch_suffix, "): compiled in ",
                 internal::milliseconds_since(start), " ms, ", cubin.size(), " bytes");
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.cubins.emplace(key, std::move(cubin)).first->second;
}

std::vector<std::vector<char>> compile_cuda_batch(const std::vector<CudaSource>& sources, int arch,
                                                  const std::string& arch_suffix) {
  std::vector<std::vector<char>> cubins(sources.size());
  std::vector<std::exception_ptr> errors(sources.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < sources.size(); i = next++) {
      try {
        cubins[i] = compile_cuda_to_cubin(sources[i].source, sources[i].name, arch, arch_suffix);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t threads = std::min<size_t>(
      {sources.size(), std::max<size_t>(1, std::thread::hardware_concurrency()), 8});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return cubins;
}

}  // namespace magi::codegen
