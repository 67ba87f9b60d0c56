// The two printers of the kernel IR: CUDA C++ for NVRTC and C++ with OpenMP for the host
// compiler. Both print readable code: each statement carries the ATen op and user source
// line it came from.
#pragma once

#include <cstdint>
#include <string>

#include "magi/codegen/kernel_ir.h"

namespace magi::codegen {

// Schedule settings of generated CUDA kernels. The defaults are the fastest settings measured
// on bf16 rows of 2048 to 8192 values; each can be overridden by an environment variable for
// tuning experiments (docs/config.md, tools/sweep.sh). Each is read once per process and is part
// of the printed source, hence of the kernel cache key.

/// How many blocks a launch gets: 'a' (default) one block per row or per 256 vectors, the
/// hardware scheduling them as slots free (pointwise kernels then print no stride loop: one
/// vector per thread); 'w' about one wave of resident blocks, each walking a stride of rows or
/// vectors. 'a' measured faster for both pointwise and row kernels. MAGI_KERNEL_GRID=all|wave.
char kernel_grid_mode();
/// Chunks of vector_width columns each thread of a row kernel holds in registers when its row
/// fits: 4 by default, MAGI_ROW_CHUNKS (1-16).
int row_chunks_per_thread();
/// MAGI_POINTWISE_UNROLL (1-8): vectors each thread of every GPU pointwise kernel handles per
/// step of its grid-stride loop; 0 when unset (each kernel's own choice, KernelVariant::unroll).
int pointwise_unroll();
/// MAGI_DEPENDENT_LAUNCH (default 1): generated kernels launch on sm_90+ (12.3+ drivers) as
/// programmatic dependents of the stream's previous kernel (they wait for it before their first
/// memory access), so that they may launch as its blocks exit instead of after it has drained.
/// 0: plain launches. Read by cuda_driver.cpp; kept here with the other kernel variables.
bool dependent_launch();
/// MAGI_STRIDED_VECTORS (default 1): strided inputs that step by 1 along their rows, at
/// vector-aligned row starts, load whole vectors with no check (KernelVariant::strided_vectors);
/// 0: every strided input is checked at run time. Read by the runtime's variant choice.
bool strided_vectors_enabled();
/// MAGI_PACKED_BF16 (default 1): GPU pointwise kernels that qualify compute on packed bf16 pairs
/// (KernelVariant::packed_bf16); 0: on floats.
bool packed_bf16_enabled();
/// Whether variant `v` (its vector width and access classes set) qualifies for packed_bf16.
bool packed_bf16_possible(const KernelVariant& v);
/// When a row kernel whose rows fit in registers reads its per-column inputs (a norm's weight):
/// 'a' (default) 'r' for a kernel with one such input and 'l' for more; 'l' in the output pass
/// where used (no registers held across the reductions), 'r' with each row's loads, 'b' once
/// per block before its first row. MAGI_ROW_COLUMN_LOADS=auto|late|row|block.
char row_column_loads();
/// Threads per block of generated CUDA kernels, at most: 256 by default, so the compiler may
/// give each thread up to 255 registers (a row kernel holds its row chunks in registers);
/// MAGI_MAX_BLOCK_THREADS (a power of two, 32-1024). Row kernels over rows longer than that
/// many threads hold take held_row_threads() (wide rows) or stream_threads_per_block().
int max_threads_per_block();
/// Blocks per SM a GPU row kernel whose rows fit in registers asks the compiler to make room for
/// (the second bound of __launch_bounds__, capping registers per thread at 64K / (threads x
/// blocks)): 0 (default) leaves registers to the compiler. MAGI_ROW_MIN_BLOCKS (0-32), read at
/// every print.
int row_min_blocks();
/// Whether GPU row kernels of `v`'s layout (its rows_in_warps, streamed_rows and wide_rows) loop
/// over rows by the grid's stride or, when the launch's grid covers every row
/// (MAGI_KERNEL_GRID=all), take their block's row(s) with no loop. `row_bytes`: a row of the
/// kernel's widest row-wide input. MAGI_ROW_GRID_LOOP: `auto` (default) drops the loop from wide
/// rows and from streamed rows of at most kStreamedRowsWithoutLoop bytes only, `1` keeps it
/// everywhere, `0` drops it everywhere. Read once per process; each variant records its choice
/// (KernelVariant::row_loop).
bool row_grid_loop(const KernelVariant& v, int64_t row_bytes);
/// The longest streamed row (bytes of the widest row-wide input) that MAGI_ROW_GRID_LOOP=auto
/// prints without the loop over rows. Without it the kernels take fewer registers, so more
/// blocks per SM, each keeping its row in L2 between the passes over it. That gains on rows of
/// up to 64 KiB and loses on longer ones, whose blocks' rows no longer fit in L2 together.
constexpr int64_t kStreamedRowsWithoutLoop = int64_t{64} << 10;
/// The most threads per block a GPU row kernel takes to hold its rows in registers: rows that do
/// not fit in max_threads_per_block() threads but fit in this many are held by a wider block
/// (KernelVariant::wide_rows) instead of streamed. 512 by default, MAGI_ROW_HELD_THREADS (a power
/// of two, 32-1024; at most max_threads_per_block() turns wide rows off). Rows of 16384 bf16
/// values held by 512 threads beat streamed rows, most for the kernels that reduce a row twice
/// (LayerNorm, softmax); rows of 32768 held by 1024 threads lost to streamed ones.
int held_row_threads();
/// How a GPU row kernel holding rows of more than 32 threads' worth rounds its block up: 'w'
/// (default) to whole warps (a row of 12288 bf16 values: 384 threads of 4 chunks), 'p' to a
/// power of two (512 threads, 3 of whose 4 chunks are used). MAGI_ROW_BLOCK_ROUNDING=warp|pow2.
/// Read once per process; the printed kernels are the same either way.
char row_block_rounding();
/// Threads per block of a GPU row kernel whose rows do not fit in registers (streamed rows):
/// 512 by default, MAGI_ROW_STREAM_THREADS (a power of two, 32-1024).
int stream_threads_per_block();
/// Vectors of each input a thread of a streamed-row kernel loads ahead of each step's
/// arithmetic: 2 by default, MAGI_ROW_STREAM_CHUNKS (1-16).
int stream_chunks_per_thread();
/// Whether a GPU row kernel whose rows do not fit in registers asks L2 to keep a row between its
/// passes (evict_last loads, evict_first in the last pass): on by default,
/// MAGI_ROW_STREAM_HINTS=0 turns it off.
bool row_stream_hints();
/// Blocks per SM a streamed-row kernel asks the compiler to make room for (the second bound of
/// its __launch_bounds__): 0 (default) leaves registers to the compiler.
/// MAGI_ROW_STREAM_MIN_BLOCKS (0-32), read at every print.
int stream_min_blocks();
/// L1 eviction hints on the hinted loads of streamed rows (MAGI_ROW_STREAM_L1): 0 (default) none;
/// 1 evict_last in the passes before the last and evict_first in the last, on the read-only path
/// (ld.global.nc); 2 the same hints on plain ld.global, the form torch.compile's kernels use.
int row_stream_l1();
/// How generated CUDA kernels move 16-byte vectors (MAGI_VECTOR_IO): "auto" (default) resolves
/// per kernel (vector_io_for); "cs" streaming (evict-first) loads and stores, except loads of
/// per-column inputs every row reads again, all loads of pointwise kernels (__ldg) and stores
/// of outputs a library operator reads (KOutput::keep, plain); "ldg" __ldg loads and plain
/// stores; "asm" written-out PTX (ld.global.nc / st.global.v4, volatile); "plain" loads left to
/// the compiler, plain stores; "stcs" / "ldcs" streaming stores or loads only; "l2last" /
/// "l2last_l1" row loads under an L2 evict_last policy (L1 not allocated / evict_last) with
/// plain stores, "l2last_cs" the same loads as l2last with streaming stores. Plain stores are
/// whole 16-byte st.global.v4.b32 (magi_store16_plain). The modes besides auto are kept for
/// measuring one against another.
const std::string& vector_io_mode();
/// How the loads vector_io_mode() exempts from its hint are made (MAGI_KEEP_LOADS): "ldg"
/// (default) __ldg; "l1last" ld.global.nc under L1 evict_last. A measuring mode.
const std::string& keep_loads_mode();
/// Reads every tuning variable above: a value one does not take is a UserError naming it. The
/// runtime calls this before it compiles a kernel, outside the fallback to ATen that a kernel
/// failing to compile takes, so that a mistyped setting stops the compile instead.
void read_tuning_variables();
/// The vector I/O mode `variant` is printed with: vector_io_mode(), with "auto" resolved to
/// "l2last" for row kernels that hold their rows in registers, reduce them once and write an
/// output per element (RMSNorm, add+RMSNorm, RMSNorm's backward), "cs" for every other.
std::string vector_io_for(const KernelVariant& variant);
/// The preamble `variant`'s translation unit starts with: kCudaPreamble, preceded by the
/// defines the tuning variables above ask of it for that kernel.
std::string cuda_preamble(const KernelVariant& variant);

std::string print_cuda(const KernelVariant& variant);
std::string print_cpp(const KernelVariant& variant);

/// The embedded helper sources (kernels/*.cuh, *.h).
extern const char* const kCudaPreamble;
extern const char* const kCpuPreamble;

}  // namespace magi::codegen
