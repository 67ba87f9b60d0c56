// The two printers of the kernel IR: CUDA C++ for NVRTC and C++ with OpenMP for the host
// compiler. Both print readable code: each statement carries the ATen op and user source
// line it came from.
#pragma once

#include <string>

#include "magi/codegen/kernel_ir.h"

namespace magi::codegen {

/// Registers cached per thread per input in row kernels (chunks of vector_width elements).
constexpr int kRowChunksPerThread = 4;
/// Threads per block of every generated CUDA kernel, at most. Kept at 256 so the compiler may
/// give each thread up to 255 registers: a row kernel holds its row chunks in registers, and a
/// bound of 1024 threads (64 registers) made them spill to local memory.
constexpr int kMaxThreadsPerBlock = 256;

std::string print_cuda(const KernelVariant& variant);
std::string print_cpp(const KernelVariant& variant);

/// The embedded helper sources (kernels/*.cuh, *.h).
extern const char* const kCudaPreamble;
extern const char* const kCpuPreamble;

}  // namespace magi::codegen
