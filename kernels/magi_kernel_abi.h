// The kernel ABI: MagiArgs, the single by-value argument of every generated kernel, and the
// limits that size it. One definition for the CUDA preamble (compiled by NVRTC), the C++
// preamble (compiled by the host compiler) and the runtime that fills it
// (src/runtime/fused_kernel.cpp); the fusion pass sizes its groups by MAGI_MAX_KERNEL_ARGS. The
// embedding of kernels/ into the compiler (cmake/EmbedFiles.cmake) puts this file's text where
// a preamble includes it. Plain C++ without headers, so that every compiler above takes it.
#ifndef MAGI_KERNEL_ABI_H
#define MAGI_KERNEL_ABI_H

// Tensors one generated kernel takes, inputs and outputs together: fuse_groups makes no larger
// group, the printers check it, and a call with more runs through ATen.
#define MAGI_MAX_KERNEL_ARGS 16
// Dims of the index space a kernel addresses through general strides.
#define MAGI_MAX_RANK 8

struct MagiArgs {
  void* ptr[MAGI_MAX_KERNEL_ARGS];  // inputs, then outputs
  long long numel, rows, cols;
  long long rank;
  long long sizes[MAGI_MAX_RANK];                          // index space
  long long strides[MAGI_MAX_KERNEL_ARGS][MAGI_MAX_RANK];  // per input, in elements, 0: broadcast
  void* workspace;          // column kernels: partial results [reduction][split][cols]
  long long splits, phase;  // column kernels: row splits; 0 = pass over the rows, 1 = combine
  // n / sizes[d] = (umulhi(n, div_magic[d]) + n) >> div_shift[d] for n < 2^31 (index spaces
  // under 2^31 elements); the same for cols (cols_magic, cols_shift). Unused on the CPU.
  unsigned div_magic[MAGI_MAX_RANK], div_shift[MAGI_MAX_RANK];
  unsigned cols_magic, cols_shift;
};

// The layout every compiler must agree on: 8-byte pointers and long longs, 4-byte unsigned, and
// a size that is the sum of the members', so no compiler padded anywhere and every member sits
// at the offset its order gives. A kernel parameter is at most 4 KiB.
static_assert(sizeof(void*) == 8 && sizeof(long long) == 8 && sizeof(unsigned) == 4,
              "MagiArgs: a 64-bit target");
static_assert(sizeof(MagiArgs) ==
                  8 * (MAGI_MAX_KERNEL_ARGS + 4 + MAGI_MAX_RANK * (1 + MAGI_MAX_KERNEL_ARGS) + 3) +
                      4 * (2 * MAGI_MAX_RANK + 2),
              "MagiArgs: padding between members");
static_assert(sizeof(MagiArgs) <= 4096, "MagiArgs: larger than a kernel parameter may be");
#if !defined(__CUDACC_RTC__)  // NVRTC has no offsetof; the size above implies these
static_assert(__builtin_offsetof(MagiArgs, workspace) ==
                  8 * (MAGI_MAX_KERNEL_ARGS + 4 + MAGI_MAX_RANK * (1 + MAGI_MAX_KERNEL_ARGS)),
              "MagiArgs layout");
static_assert(__builtin_offsetof(MagiArgs, cols_magic) + 8 == sizeof(MagiArgs), "MagiArgs layout");
#endif

#endif  // MAGI_KERNEL_ABI_H
