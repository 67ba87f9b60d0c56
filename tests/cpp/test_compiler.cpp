// The compile drivers and kernel caches: NVRTC to cubin (no GPU needed), the host compiler
// to a loaded shared object, the disk cache across a cleared memory cache, and the errors.
// Each test gets its own cache directory and a clean memory cache.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "magi/codegen/compiler.h"
#include "magi/common/error.h"

namespace magi::codegen {
namespace {

// POSIX rather than std::filesystem: the torch wheel's libraries export std::filesystem
// functions of their own that the dynamic linker binds to instead of libstdc++'s.
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* entry = ::readdir(d)) {
      std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  return names;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

constexpr const char* kScaleKernel = R"(
extern "C" __global__ void magi_test_scale(float* out, const float* in, float alpha, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = alpha * in[i];
}
)";

constexpr const char* kCpuAdd = R"(
#include <cstdint>
extern "C" void magi_test_add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
extern "C" int magi_test_answer() { return 42; }
)";

class CompilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_dir_ = cache_dir();
    std::string pattern = "/tmp/magi_compiler_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    set_cache_dir(dir_);
    clear_memory_cache();
    reset_compiler_stats();
  }
  void TearDown() override {
    set_cache_dir(previous_dir_);
    clear_memory_cache();
    for (const std::string& name : files_in(dir_)) ::unlink((dir_ + "/" + name).c_str());
    ::rmdir(dir_.c_str());
  }
  size_t files_with_extension(const std::string& extension) const {
    size_t count = 0;
    for (const std::string& name : files_in(dir_)) count += ends_with(name, extension);
    return count;
  }
  void require_nvrtc() {
    if (!nvrtc_available()) GTEST_SKIP() << "NVRTC is not installed on this machine";
  }

  std::string previous_dir_;
  std::string dir_;
};

bool is_elf(const std::vector<char>& data) {
  return data.size() > 4 && data[0] == 0x7f && data[1] == 'E' && data[2] == 'L' && data[3] == 'F';
}

TEST_F(CompilerTest, NvrtcCompilesCubinsForSm80AndSm90) {
  require_nvrtc();
  std::vector<char> sm80 = compile_cuda_to_cubin(kScaleKernel, "magi_test_scale", 80);
  std::vector<char> sm90 = compile_cuda_to_cubin(kScaleKernel, "magi_test_scale", 90);
  std::vector<char> sm90a = compile_cuda_to_cubin(kScaleKernel, "magi_test_scale", 90, "a");
  EXPECT_TRUE(is_elf(sm80));
  EXPECT_TRUE(is_elf(sm90));
  EXPECT_TRUE(is_elf(sm90a));
  EXPECT_NE(sm80, sm90);
  EXPECT_EQ(compiler_stats().cuda_compiles, 3u);
  EXPECT_EQ(files_with_extension(".cubin"), 3u);

  // The same request again is served from memory.
  EXPECT_EQ(compile_cuda_to_cubin(kScaleKernel, "magi_test_scale", 80), sm80);
  EXPECT_EQ(compiler_stats().cuda_compiles, 3u);
  EXPECT_EQ(compiler_stats().memory_hits, 1u);
}

TEST_F(CompilerTest, NvrtcSyntaxErrorNamesKernelAndCarriesLog) {
  require_nvrtc();
  const std::string bad = "extern \"C\" __global__ void magi_broken(float* x) { x[0] = y; }\n";
  try {
    compile_cuda_to_cubin(bad, "magi_broken", 80);
    FAIL() << "expected an InternalError";
  } catch (const InternalError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("magi_broken"), std::string::npos) << message;
    EXPECT_NE(message.find("identifier \"y\" is undefined"), std::string::npos) << message;
    EXPECT_NE(message.find("x[0] = y;"), std::string::npos) << message;  // source excerpt
  }
  EXPECT_EQ(files_with_extension(".cubin"), 0u);
}

// A failed driver call is reported by what its code says about the cause: a broken stream
// capture is the user's to fix (which op, what to do), a device fault or exhausted memory
// names no culprit and says how to find one, anything else is ours.
TEST(DriverErrors, AreReportedByTheirCause) {
  auto fail = [](int code, const char* name) {
    throw_driver_error("f.cpp", 1, "cuLaunchKernel(...)", code, name, "launch of `k`");
  };
  try {
    fail(901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901): operation failed");
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("launch of `k`: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)", 0), 0u) << m;
    EXPECT_NE(m.find(capture_advice()), std::string::npos) << m;
    EXPECT_NE(m.find("is_subgraph_boundary=True"), std::string::npos) << m;
    EXPECT_EQ(m.find("bug in magi-compiler"), std::string::npos) << m;
  }
  EXPECT_THROW(fail(908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"), UserError);
  for (int code : {700, 710, 719, 226, 911}) {
    try {
      fail(code, "CUDA_ERROR_ASSERT");
      FAIL() << "expected a DeviceError for " << code;
    } catch (const DeviceError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("CUDA_LAUNCH_BLOCKING=1"), std::string::npos) << m;
      EXPECT_EQ(m.find("bug in magi-compiler"), std::string::npos) << m;
    }
  }
  try {
    fail(2, "CUDA_ERROR_OUT_OF_MEMORY (2)");
    FAIL() << "expected a DeviceError";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("no memory left"), std::string::npos) << e.what();
  }
  try {
    fail(1, "CUDA_ERROR_INVALID_VALUE (1)");
    FAIL() << "expected an InternalError";
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("internal error at f.cpp:1: `cuLaunchKernel(...)` failed: launch of `k`: "
                     "CUDA_ERROR_INVALID_VALUE (1)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("bug in magi-compiler"), std::string::npos) << m;
  }
}

TEST_F(CompilerTest, NvrtcDiskCacheServesAFreshMemoryCache) {
  require_nvrtc();
  std::vector<char> first = compile_cuda_to_cubin(kScaleKernel, "magi_test_scale", 80);
  ASSERT_EQ(compiler_stats().cuda_compiles, 1u);
  clear_memory_cache();
  std::vector<char> second = compile_cuda_to_cubin(kScaleKernel, "magi_test_scale", 80);
  EXPECT_EQ(second, first);
  EXPECT_EQ(compiler_stats().cuda_compiles, 1u);
  EXPECT_EQ(compiler_stats().disk_hits, 1u);

  // A truncated or foreign file in the cache is ignored and replaced.
  for (const std::string& name : files_in(dir_)) {
    ASSERT_EQ(::truncate((dir_ + "/" + name).c_str(), 3), 0);
  }
  clear_memory_cache();
  EXPECT_EQ(compile_cuda_to_cubin(kScaleKernel, "magi_test_scale", 80), first);
  EXPECT_EQ(compiler_stats().cuda_compiles, 2u);
}

TEST_F(CompilerTest, EmptyCacheDirDisablesTheDiskCache) {
  require_nvrtc();
  set_cache_dir("");
  EXPECT_EQ(cache_dir(), "");
  compile_cuda_to_cubin(kScaleKernel, "magi_test_scale", 80);
  clear_memory_cache();
  compile_cuda_to_cubin(kScaleKernel, "magi_test_scale", 80);
  EXPECT_EQ(compiler_stats().cuda_compiles, 2u);
  EXPECT_EQ(compiler_stats().disk_hits, 0u);
  EXPECT_EQ(files_with_extension(".cubin"), 0u);
}

TEST_F(CompilerTest, NvrtcBatchKeepsOrderAndFillsTheMemoryCache) {
  require_nvrtc();
  std::vector<CudaSource> sources;
  for (int i = 0; i < 4; ++i) {
    std::string name = "magi_test_k" + std::to_string(i);
    sources.push_back({"extern \"C\" __global__ void " + name +
                           "(float* x) { x[0] = " + std::to_string(i) + ".0f; }\n",
                       name});
  }
  std::vector<std::vector<char>> cubins = compile_cuda_batch(sources, 80);
  ASSERT_EQ(cubins.size(), 4u);
  EXPECT_EQ(compiler_stats().cuda_compiles, 4u);
  for (size_t i = 0; i < sources.size(); ++i) {
    EXPECT_TRUE(is_elf(cubins[i]));
    EXPECT_EQ(compile_cuda_to_cubin(sources[i].source, sources[i].name, 80), cubins[i]);
  }
  EXPECT_EQ(compiler_stats().cuda_compiles, 4u);
  EXPECT_EQ(compiler_stats().memory_hits, 4u);

  sources[2].source = "this is not CUDA";
  EXPECT_THROW(compile_cuda_batch(sources, 80), InternalError);
}

TEST_F(CompilerTest, CudaEntryPointsWithoutADriverAreUserErrors) {
  if (cuda_driver_available()) GTEST_SKIP() << "a GPU is present; tests/gpu covers launches";
  EXPECT_THROW(device_info(0), UserError);
  EXPECT_THROW(get_cuda_kernel(kScaleKernel, "magi_test_scale", 0), UserError);
}

TEST_F(CompilerTest, CpuCompilesAndRunsAnOpenMPLoop) {
  using AddFn = void (*)(float*, const float*, const float*, int64_t);
  auto add = reinterpret_cast<AddFn>(get_cpu_function(kCpuAdd, "magi_test_add"));
  ASSERT_NE(add, nullptr);
  const int64_t n = 10007;
  std::vector<float> a(n), b(n), out(n, -1.0f);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.5f * static_cast<float>(i);
    b[i] = 3.0f - static_cast<float>(i);
  }
  add(out.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << "at " << i;

  // A second symbol of the same source shares its shared object: no second compile.
  auto answer = reinterpret_cast<int (*)()>(get_cpu_function(kCpuAdd, "magi_test_answer"));
  EXPECT_EQ(answer(), 42);
  EXPECT_EQ(compiler_stats().cpu_compiles, 1u);
  EXPECT_EQ(compiler_stats().memory_hits, 1u);
  EXPECT_EQ(files_with_extension(".so"), 1u);
}

TEST_F(CompilerTest, CpuDiskCacheServesAFreshMemoryCache) {
  void* first = get_cpu_function(kCpuAdd, "magi_test_add");
  clear_memory_cache();
  void* second = get_cpu_function(kCpuAdd, "magi_test_add");
  EXPECT_EQ(second, first);  // the same file, so dlopen hands back the same mapping
  EXPECT_EQ(compiler_stats().cpu_compiles, 1u);
  EXPECT_EQ(compiler_stats().disk_hits, 1u);
}

TEST_F(CompilerTest, CpuWithoutDiskCacheLeavesNoFiles) {
  set_cache_dir("");
  auto answer = reinterpret_cast<int (*)()>(get_cpu_function(kCpuAdd, "magi_test_answer"));
  EXPECT_EQ(answer(), 42);
  EXPECT_EQ(compiler_stats().cpu_compiles, 1u);
  EXPECT_TRUE(files_in(dir_).empty());
}

TEST_F(CompilerTest, CpuCompileErrorCarriesCompilerOutputAndCommand) {
  const std::string bad = "extern \"C\" int magi_bad() { return undefined_name; }\n";
  try {
    get_cpu_function(bad, "magi_bad");
    FAIL() << "expected an InternalError";
  } catch (const InternalError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("undefined_name"), std::string::npos) << message;
    EXPECT_NE(message.find("error"), std::string::npos) << message;
    EXPECT_NE(message.find("-fopenmp"), std::string::npos) << message;  // the command line
  }
  EXPECT_EQ(files_with_extension(".so"), 0u);
}

TEST_F(CompilerTest, CpuMissingSymbolIsAnInternalError) {
  EXPECT_THROW(get_cpu_function(kCpuAdd, "not_there"), InternalError);
  // The shared object itself stays usable.
  EXPECT_NE(get_cpu_function(kCpuAdd, "magi_test_answer"), nullptr);
}

}  // namespace
}  // namespace magi::codegen
