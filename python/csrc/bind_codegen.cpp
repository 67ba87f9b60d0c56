// Binds the compile drivers and kernel caches: availability probes, NVRTC to cubin (so the
// CPU test run can compile every generated CUDA kernel), the cache directory and counters.
// `_test_launch_axpy` launches a raw kernel on torch tensors through the driver API on torch's
// current stream; it exists only to prove the load-and-launch path on a GPU machine.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>

#include "bindings.h"

#include "magi/codegen/compiler.h"
#include "magi/common/error.h"

namespace magi::bindings {
namespace {

constexpr const char* kAxpySource = R"(
extern "C" __global__ void magi_test_axpy(float* out, const float* x, const float* y,
                                          float alpha, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    out[i] = alpha * x[i] + y[i];
  }
}
)";

void launch_axpy(double alpha, const at::Tensor& x, const at::Tensor& y, const at::Tensor& out) {
  for (const at::Tensor* t : {&x, &y, &out}) {
    MAGI_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                   t->numel() == x.numel() && t->device() == x.device(),
               "_test_launch_axpy takes contiguous float32 CUDA tensors of one size on one device");
  }
  const int device = x.get_device();
  const codegen::CudaKernel& kernel =
      codegen::get_cuda_kernel(kAxpySource, "magi_test_axpy", device);
  void* stream =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(x.device()).native_handle();
  void* out_ptr = out.data_ptr();
  const void* x_ptr = x.data_ptr();
  const void* y_ptr = y.data_ptr();
  float alpha_f = static_cast<float>(alpha);
  long long n = x.numel();
  void* args[] = {&out_ptr, &x_ptr, &y_ptr, &alpha_f, &n};
  const unsigned blocks = static_cast<unsigned>(std::min<long long>((n + 255) / 256, 65535));
  codegen::launch_cuda_kernel(kernel, std::max(blocks, 1u), 1, 1, 256, 1, 1, 0, stream, args);
}

}  // namespace

void bind_codegen(py::module_& m) {
  m.def("nvrtc_available", &codegen::nvrtc_available,
        "True when NVRTC (CUDA toolkit) can be loaded to compile CUDA kernels.");
  m.def("cuda_driver_available", &codegen::cuda_driver_available,
        "True when a CUDA driver and at least one GPU are present.");
  m.def(
      "compile_cuda_to_cubin",
      [](const std::string& source, const std::string& name, int arch,
         const std::string& arch_suffix) {
        std::vector<char> cubin;
        {
          py::gil_scoped_release no_gil;
          cubin = codegen::compile_cuda_to_cubin(source, name, arch, arch_suffix);
        }
        return py::bytes(cubin.data(), cubin.size());
      },
      py::arg("source"), py::arg("name"), py::arg("arch"), py::arg("arch_suffix") = "",
      "Compiles CUDA C++ to a cubin for sm_<arch><arch_suffix>; raises InternalError with "
      "NVRTC's log on failure.");
  m.def(
      "compiler_stats",
      [] {
        codegen::CompilerStats s = codegen::compiler_stats();
        py::dict d;
        d["cuda_compiles"] = s.cuda_compiles;
        d["cpu_compiles"] = s.cpu_compiles;
        d["memory_hits"] = s.memory_hits;
        d["disk_hits"] = s.disk_hits;
        d["dependent_launches"] = s.dependent_launches;
        d["plain_launches"] = s.plain_launches;
        return d;
      },
      "Counters of compiler runs, kernel cache hits and CUDA launches (as programmatic "
      "dependents or plain) since the last reset.");
  m.def("dependent_launch_available", &codegen::dependent_launch_available, py::arg("device"),
        "Whether kernels on CUDA device `device` launch as programmatic dependents "
        "(sm_90+, a 12.3+ driver).");
  m.def("reset_compiler_stats", &codegen::reset_compiler_stats);
  m.def("set_cache_dir", &codegen::set_cache_dir, py::arg("path"),
        "Directory of the kernel disk cache; an empty string disables it.");
  m.def("cache_dir", &codegen::cache_dir);
  m.def("_clear_kernel_memory_cache", &codegen::clear_memory_cache);
  m.def("_test_launch_axpy", &launch_axpy, py::arg("alpha"), py::arg("x"), py::arg("y"),
        py::arg("out"), "out = alpha * x + y through NVRTC and the driver API (tests only).");
}

}  // namespace magi::bindings
