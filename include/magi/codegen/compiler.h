// Compile drivers and kernel caches: CUDA C++ → cubin through NVRTC (loaded at run time, no
// GPU needed to compile), cubin → CUfunction through the driver API (loaded at run time), and
// C++ → shared object through the host compiler, loaded with dlopen. Nothing here links
// against CUDA: the library builds and runs on machines without the toolkit, and the CUDA
// entry points throw a UserError saying what is missing when called there.
//
// Caches: in memory by source hash; on disk under the cache directory by
// hash(source + options + arch + compiler version). A second process with a warm disk cache
// compiles nothing. Counters record compiles and cache hits for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace magi::codegen {

/// What one compile produced; `from_cache` says whether a compiler actually ran.
struct CompileRecord {
  std::string name;
  bool from_cache = false;
  double milliseconds = 0.0;
};

struct CompilerStats {
  size_t cuda_compiles = 0;  ///< NVRTC invocations
  size_t cpu_compiles = 0;   ///< host compiler invocations
  size_t memory_hits = 0;
  size_t disk_hits = 0;
  size_t dependent_launches = 0;  ///< CUDA launches as programmatic dependents (cuLaunchKernelEx)
  size_t plain_launches = 0;      ///< other CUDA launches (cuLaunchKernel)
};

/// Where compiled artifacts live on disk ("" disables the disk cache). Default:
/// $MAGI_CACHE_DIR, else ~/.cache/magi_compiler/kernels. Created on first write.
void set_cache_dir(const std::string& dir);
std::string cache_dir();
CompilerStats compiler_stats();
void reset_compiler_stats();
/// For tests: forgets the in-memory cubin and shared-object tables, so the next request goes
/// to the disk cache. Loaded modules and shared objects stay loaded (pointers stay valid).
void clear_memory_cache();

// ---- CUDA ---------------------------------------------------------------------------------
//
// Kernels are looked up by name, so entry points must be declared `extern "C" __global__`.

/// True when NVRTC can be loaded (the CUDA toolkit's libnvrtc is present).
bool nvrtc_available();
/// True when a CUDA driver and at least one device are present.
bool cuda_driver_available();
/// True when kernels loaded on `device` launch as programmatic dependents where the launch
/// allows it: compute capability 9.0 or higher, a 12.3+ driver.
/// False without a driver or for a device that does not exist.
bool dependent_launch_available(int device);

/// Compiles CUDA C++ source to a cubin for `arch` (e.g. 90 for sm_90; pass arch_suffix "a"
/// for sm_90a). Throws magi::InternalError with the kernel name, NVRTC's log and the start of
/// the source on failure. Uses both caches; thread-safe.
std::vector<char> compile_cuda_to_cubin(const std::string& source, const std::string& name,
                                        int arch, const std::string& arch_suffix = "");

/// One translation unit for compile_cuda_batch; `name` is used in logs and errors only.
struct CudaSource {
  std::string source;
  std::string name;
};

/// compile_cuda_to_cubin over many sources on a small thread pool (at most 8 threads); the
/// results land in the memory cache too, so later get_cuda_kernel calls for the same sources
/// compile nothing. Returns the cubins in input order; rethrows the first failure.
std::vector<std::vector<char>> compile_cuda_batch(const std::vector<CudaSource>& sources, int arch,
                                                  const std::string& arch_suffix = "");

/// A loaded kernel function on one device.
struct CudaKernel {
  void* function = nullptr;  ///< CUfunction
  int device = -1;
  std::string name;
  /// Launches that allow it run as programmatic dependents (sm_90+, a 12.3+ driver).
  bool dependent_launch = false;
};

/// Compiles (or fetches from cache) `source` for `device`'s architecture (sm_<major><minor>),
/// loads the module into the device's primary context (the one PyTorch uses) and returns
/// function `kernel_name`. One module per (source, device): several kernels of one source
/// share it. The reference stays valid for the life of the process. Thread-safe.
const CudaKernel& get_cuda_kernel(const std::string& source, const std::string& kernel_name,
                                  int device);

/// Launches on `stream` (a cudaStream_t / CUstream handle). `args` are pointers to argument
/// values, as for cuLaunchKernel. Makes the device's primary context current if it is not;
/// raises the function's dynamic shared memory limit when shared_bytes > 48 KiB. A failure
/// throws as throw_driver_error says, with the driver's message. `dependent`: the kernel calls
/// magi_wait_for_prior_grids() before its first memory access, so it may launch as a
/// programmatic dependent of the stream's previous kernel (where kernel.dependent_launch).
void launch_cuda_kernel(const CudaKernel& kernel, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                        unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
                        void* stream, void** args, bool dependent = false);

/// What to do when an operation a CUDA graph capture does not allow broke one (the one text
/// every place that reports it uses).
const char* capture_advice();

/// Reports a failed CUDA driver call (`call`, for the context `what`) that returned `code`,
/// named by `code_text`, by what its code says about the cause: a broken stream capture as a
/// UserError, a device fault or exhausted memory as a DeviceError, anything else as ours
/// (InternalError, with `file` and `line`).
[[noreturn]] void throw_driver_error(const char* file, int line, const char* call, int code,
                                     const std::string& code_text, const std::string& what);

/// Max dynamic shared memory per block (opt-in), number of SMs, compute capability of
/// `device`. Queried once per device.
struct DeviceInfo {
  int sm_count = 0;
  int major = 0;
  int minor = 0;
  int max_threads_per_block = 0;
  size_t shared_per_block = 0;
};
DeviceInfo device_info(int device);

// ---- CPU ----------------------------------------------------------------------------------

/// Compiles C++ source with the host compiler ($MAGI_CXX, else $CXX, else c++; flags
/// -O3 -march=native -fopenmp -shared -fPIC -std=c++17), loads it, and returns the address of
/// extern "C" symbol `symbol`. One shared object per source: several symbols of one source
/// share it. Throws InternalError with the command line and the compiler's output on failure.
/// Thread-safe; uses both caches.
void* get_cpu_function(const std::string& source, const std::string& symbol);

}  // namespace magi::codegen
