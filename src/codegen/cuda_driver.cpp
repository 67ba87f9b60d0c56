// Loading and launching generated kernels through the CUDA driver API, loaded with
// dlopen("libcuda.so.1") on first use (no link-time dependency, no CUDA headers).
//
// PyTorch's runtime works in each device's primary context, so modules are loaded there and
// launches happen there. A launch from a thread whose current context is another one (or
// none) switches to the primary context for the call and restores the previous one, so the
// device PyTorch sees as current never changes under it.
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "compile_cache.h"
#include "magi/codegen/compiler.h"
#include "magi/codegen/printers.h"
#include "magi/common/log.h"

namespace magi::codegen {
namespace {

// ---- The driver API, declared by hand (values from cuda.h) ------------------------------------

using CUresult = int;  // 0 is CUDA_SUCCESS
using CUdevice = int;
struct CUctxOpaque;
struct CUmodOpaque;
struct CUfuncOpaque;
struct CUstreamOpaque;
using CUcontext = CUctxOpaque*;
using CUmodule = CUmodOpaque*;
using CUfunction = CUfuncOpaque*;
using CUstream = CUstreamOpaque*;

constexpr int kAttrMaxThreadsPerBlock = 1;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;
constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;
constexpr unsigned kDefaultSharedLimit = 48 * 1024;
constexpr int kMaxDevices = 64;

// cuLaunchKernelEx's configuration with the one attribute we set.
constexpr int kLaunchAttrProgrammaticStreamSerialization = 6;
struct alignas(8) CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int programmatic_stream_serialization_allowed;
  } value;
};
struct CUlaunchConfig {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
  CUstreamOpaque* stream;
  CUlaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(CUlaunchAttribute) == 72 && offsetof(CUlaunchAttribute, value) == 8,
              "CUlaunchAttribute as in cuda.h");
static_assert(sizeof(CUlaunchConfig) == 56 && offsetof(CUlaunchConfig, stream) == 32 &&
                  offsetof(CUlaunchConfig, attrs) == 40 &&
                  offsetof(CUlaunchConfig, num_attrs) == 48,
              "CUlaunchConfig as in cuda.h");
// Programmatic dependencies inside captured CUDA graphs need a CUDA 12.3 driver or later.
constexpr int kDependentLaunchDriverVersion = 12030;

struct Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_get_count)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_attribute)(int*, int, CUdevice) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*func_set_attribute)(CUfunction, int, int) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*launch_kernel_ex)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  int driver_version = 0;  ///< cuDriverGetVersion's answer, e.g. 13000
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;

  bool loaded = false;
  int device_count = 0;
  std::string why_not;
};

const Driver& driver() {
  static const Driver instance = [] {
    Driver d;
    std::string tried;
    void* lib = internal::open_first_library({"libcuda.so.1"}, &tried);
    if (lib == nullptr) {
      d.why_not = "the CUDA driver (libcuda.so.1) could not be loaded:" + tried;
      return d;
    }
    std::string missing;
    auto resolve = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, symbol));
      if (fn == nullptr) missing += std::string(" ") + symbol;
    };
    resolve(d.init, "cuInit");
    resolve(d.device_get_count, "cuDeviceGetCount");
    resolve(d.device_get, "cuDeviceGet");
    resolve(d.device_get_attribute, "cuDeviceGetAttribute");
    resolve(d.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    resolve(d.ctx_get_current, "cuCtxGetCurrent");
    resolve(d.ctx_set_current, "cuCtxSetCurrent");
    resolve(d.module_load_data, "cuModuleLoadData");
    resolve(d.module_get_function, "cuModuleGetFunction");
    resolve(d.func_set_attribute, "cuFuncSetAttribute");
    resolve(d.launch_kernel, "cuLaunchKernel");
    // Optional: without it (or a driver older than 12.3) every launch is a plain cuLaunchKernel.
    d.launch_kernel_ex =
        reinterpret_cast<decltype(d.launch_kernel_ex)>(::dlsym(lib, "cuLaunchKernelEx"));
    if (auto get_version =
            reinterpret_cast<CUresult (*)(int*)>(::dlsym(lib, "cuDriverGetVersion"))) {
      if (get_version(&d.driver_version) != 0) d.driver_version = 0;
    }
    resolve(d.get_error_name, "cuGetErrorName");
    resolve(d.get_error_string, "cuGetErrorString");
    if (!missing.empty()) {
      d.why_not = "libcuda.so.1 lacks" + missing;
      return d;
    }
    if (CUresult r = d.init(0); r != 0) {
      d.why_not = "cuInit failed with CUresult " + std::to_string(r);
      return d;
    }
    d.device_get_count(&d.device_count);
    d.loaded = true;
    return d;
  }();
  return instance;
}

std::string error_text(const Driver& d, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  d.get_error_name(result, &name);
  d.get_error_string(result, &text);
  return detail::str_cat(name != nullptr ? name : "CUDA error", " (", result,
                         "): ", text != nullptr ? text : "unknown");
}

const Driver& require_device(int device) {
  const Driver& d = driver();
  MAGI_CHECK(d.loaded,
             "running generated CUDA kernels needs an NVIDIA driver and GPU: ", d.why_not);
  MAGI_CHECK(device >= 0 && device < d.device_count && device < kMaxDevices, "CUDA device ", device,
             " does not exist; this machine has ", d.device_count, " device(s)");
  return d;
}

#define MAGI_CU_CALL(d, call, ...)                                                    \
  do {                                                                                \
    CUresult magi_cu_result_ = (call);                                                \
    if (magi_cu_result_ != 0)                                                         \
      ::magi::codegen::throw_driver_error(__FILE__, __LINE__, #call, magi_cu_result_, \
                                          error_text(d, magi_cu_result_),             \
                                          ::magi::detail::str_cat(__VA_ARGS__));      \
  } while (0)

/// The primary context of each device, retained once and never released (PyTorch holds it
/// for the life of the process too). Read lock-free on the launch path.
std::array<std::atomic<CUcontext>, kMaxDevices> g_primary_contexts{};
std::mutex g_primary_mutex;

CUcontext primary_context(const Driver& d, int device) {
  if (CUcontext ctx = g_primary_contexts[device].load(std::memory_order_acquire)) return ctx;
  std::lock_guard<std::mutex> lock(g_primary_mutex);
  if (CUcontext ctx = g_primary_contexts[device].load()) return ctx;
  CUdevice handle = 0;
  MAGI_CU_CALL(d, d.device_get(&handle, device), "cuDeviceGet(", device, ")");
  CUcontext ctx = nullptr;
  MAGI_CU_CALL(d, d.primary_ctx_retain(&ctx, handle), "cuDevicePrimaryCtxRetain(", device, ")");
  g_primary_contexts[device].store(ctx, std::memory_order_release);
  return ctx;
}

/// Makes `device`'s primary context current for a scope; restores the previous one.
class PrimaryContextScope {
 public:
  PrimaryContextScope(const Driver& d, int device) : d_(d) {
    CUcontext target = primary_context(d, device);
    MAGI_CU_CALL(d, d.ctx_get_current(&previous_), "cuCtxGetCurrent");
    if (previous_ != target) {
      MAGI_CU_CALL(d, d.ctx_set_current(target), "cuCtxSetCurrent(device ", device, ")");
      switched_ = true;
    }
  }
  ~PrimaryContextScope() {
    if (switched_) d_.ctx_set_current(previous_);
  }
  PrimaryContextScope(const PrimaryContextScope&) = delete;
  PrimaryContextScope& operator=(const PrimaryContextScope&) = delete;

 private:
  const Driver& d_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

/// Loaded modules per (source hash, device) and their functions per name. Entries are never
/// erased: get_cuda_kernel hands out references into `kernels`.
struct ModuleTable {
  std::mutex mutex;
  std::map<std::pair<uint64_t, int>, CUmodule> modules;
  std::map<std::tuple<uint64_t, int, std::string>, CudaKernel> kernels;
  std::unordered_map<int, DeviceInfo> device_infos;
};

ModuleTable& module_table() {
  static ModuleTable table;
  return table;
}

// CUresult codes (cuda.h) whose cause is not ours to report as a bug.
constexpr int kOutOfMemory = 2;
constexpr int kEccUncorrectable = 214, kNvlinkUncorrectable = 220, kContained = 226;
constexpr int kIllegalAddress = 700, kLaunchTimeout = 702, kAssert = 710;
// CUDA_ERROR_HARDWARE_STACK_ERROR (714) through CUDA_ERROR_LAUNCH_FAILED (719).
constexpr int kKernelFaultFirst = 714, kKernelFaultLast = 719;
constexpr int kTensorMemoryLeak = 721, kExternalDevice = 911;
constexpr int kCaptureFirst = 900, kCaptureLast = 908;  // CUDA_ERROR_STREAM_CAPTURE_*, 907 too
bool sticky_fault(int code) {                           // the context is unusable after these
  return code == kIllegalAddress || code == kLaunchTimeout || code == kAssert ||
         (code >= kKernelFaultFirst && code <= kKernelFaultLast) || code == kTensorMemoryLeak ||
         code == kEccUncorrectable || code == kNvlinkUncorrectable || code == kContained ||
         code == kExternalDevice;
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
  const std::string head = detail::str_cat(what, ": ", code_text);
  if (code >= kCaptureFirst && code <= kCaptureLast) {
    detail::throw_user_error(detail::str_cat(
        head, ". A CUDA graph was being captured on this stream. ", capture_advice()));
  }
  if (code == kOutOfMemory || sticky_fault(code)) {
    std::string text =
        code == kOutOfMemory
            ? detail::str_cat(head, ". The device has no memory left for this call.")
            : detail::str_cat(
                  head,
                  ". The device reported a fault. CUDA reports one at the first call after "
                  "the kernel that caused it, which may be any earlier kernel on the "
                  "device, ours or not; a device-side assert (CUDA_ERROR_ASSERT) usually "
                  "means an index out of range, such as a token id beyond an embedding's "
                  "rows. Run with CUDA_LAUNCH_BLOCKING=1 to find the kernel. The process's "
                  "CUDA context cannot be used after this error.");
    MAGI_LOG_ERROR(text);
    throw DeviceError(std::move(text));
  }
  detail::throw_internal_error(file, line, call, head);
}

bool cuda_driver_available() { return driver().loaded && driver().device_count > 0; }

bool dependent_launch_available(int device) {
  const Driver& d = driver();
  if (!cuda_driver_available() || device < 0 || device >= d.device_count) {
    return false;
  }
  return d.launch_kernel_ex != nullptr && d.driver_version >= kDependentLaunchDriverVersion &&
         device_info(device).major >= 9;
}

DeviceInfo device_info(int device) {
  const Driver& d = require_device(device);
  ModuleTable& table = module_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  if (auto it = table.device_infos.find(device); it != table.device_infos.end()) return it->second;
  CUdevice handle = 0;
  MAGI_CU_CALL(d, d.device_get(&handle, device), "cuDeviceGet(", device, ")");
  auto attribute = [&](int attribute) {
    int value = 0;
    MAGI_CU_CALL(d, d.device_get_attribute(&value, attribute, handle), "cuDeviceGetAttribute(",
                 attribute, ") of device ", device);
    return value;
  };
  DeviceInfo info;
  info.sm_count = attribute(kAttrMultiprocessorCount);
  info.major = attribute(kAttrComputeCapabilityMajor);
  info.minor = attribute(kAttrComputeCapabilityMinor);
  info.max_threads_per_block = attribute(kAttrMaxThreadsPerBlock);
  info.shared_per_block = static_cast<size_t>(attribute(kAttrMaxSharedMemoryPerBlockOptin));
  return table.device_infos.emplace(device, info).first->second;
}

const CudaKernel& get_cuda_kernel(const std::string& source, const std::string& kernel_name,
                                  int device) {
  const Driver& d = require_device(device);
  const uint64_t source_key = internal::stable_hash(source);
  const auto kernel_key = std::make_tuple(source_key, device, kernel_name);
  ModuleTable& table = module_table();
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    if (auto it = table.kernels.find(kernel_key); it != table.kernels.end()) {
      internal::counters().memory_hits++;
      return it->second;
    }
  }

  // Compile without holding the table lock: other threads keep launching meanwhile.
  const DeviceInfo info = device_info(device);
  const bool dependent = dependent_launch_available(device);  // before the lock: it takes it
  bool module_loaded = false;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    module_loaded = table.modules.count({source_key, device}) != 0;
  }
  std::vector<char> cubin;
  if (!module_loaded)
    cubin = compile_cuda_to_cubin(source, kernel_name, info.major * 10 + info.minor);

  std::lock_guard<std::mutex> lock(table.mutex);
  if (auto it = table.kernels.find(kernel_key); it != table.kernels.end()) return it->second;
  PrimaryContextScope scope(d, device);
  auto module_it = table.modules.find({source_key, device});
  if (module_it == table.modules.end()) {
    MAGI_ASSERT(!cubin.empty(), "no cubin for kernel `", kernel_name, "`");
    CUmodule module = nullptr;
    MAGI_CU_CALL(d, d.module_load_data(&module, cubin.data()), "cuModuleLoadData for kernel `",
                 kernel_name, "` on device ", device, " (sm_", info.major, info.minor, ")");
    module_it = table.modules.emplace(std::make_pair(source_key, device), module).first;
  }
  CUmodule module = module_it->second;
  CUfunction function = nullptr;
  MAGI_CU_CALL(d, d.module_get_function(&function, module, kernel_name.c_str()),
               "cuModuleGetFunction: no kernel `", kernel_name,
               "` in the compiled source (entry points must be extern \"C\" __global__)");
  CudaKernel kernel;
  kernel.function = function;
  kernel.device = device;
  kernel.name = kernel_name;
  kernel.dependent_launch = dependent;
  return table.kernels.emplace(kernel_key, std::move(kernel)).first->second;
}

void launch_cuda_kernel(const CudaKernel& kernel, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                        unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
                        void* stream, void** args, bool dependent) {
  const Driver& d = driver();
  MAGI_ASSERT(
      d.loaded && kernel.function != nullptr && kernel.device >= 0 && kernel.device < kMaxDevices,
      "launch of kernel `", kernel.name, "` that was never loaded");
  PrimaryContextScope scope(d, kernel.device);
  auto function = static_cast<CUfunction>(kernel.function);
  if (shared_bytes > kDefaultSharedLimit) {
    MAGI_CU_CALL(d,
                 d.func_set_attribute(function, kFuncAttrMaxDynamicSharedSizeBytes,
                                      static_cast<int>(shared_bytes)),
                 "raising the dynamic shared memory of kernel `", kernel.name, "` to ",
                 shared_bytes, " bytes");
  }
  if (dependent && kernel.dependent_launch && d.launch_kernel_ex != nullptr) {
    CUlaunchAttribute attr{};
    attr.id = kLaunchAttrProgrammaticStreamSerialization;
    attr.value.programmatic_stream_serialization_allowed = 1;
    const CUlaunchConfig config{grid_x,  grid_y,  grid_z,       block_x,
                                block_y, block_z, shared_bytes, static_cast<CUstream>(stream),
                                &attr,   1};
    MAGI_CU_CALL(d, d.launch_kernel_ex(&config, function, args, nullptr),
                 "cuLaunchKernelEx (dependent launch) of `", kernel.name, "` with grid (", grid_x,
                 ", ", grid_y, ", ", grid_z, "), block (", block_x, ", ", block_y, ", ", block_z,
                 ") on device ", kernel.device);
    internal::counters().dependent_launches.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  MAGI_CU_CALL(d,
               d.launch_kernel(function, grid_x, grid_y, grid_z, block_x, block_y, block_z,
                               shared_bytes, static_cast<CUstream>(stream), args, nullptr),
               "cuLaunchKernel of `", kernel.name, "` with grid (", grid_x, ", ", grid_y, ", ",
               grid_z, "), block (", block_x, ", ", block_y, ", ", block_z, "), ", shared_bytes,
               " bytes of shared memory on device ", kernel.device);
  internal::counters().plain_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace magi::codegen
