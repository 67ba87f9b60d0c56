// The tuning variables of the printed kernels (MAGI_ROW_CHUNKS and friends, docs/config.md):
// each read once per process (MAGI_ROW_MIN_BLOCKS at every print); part of the printed source,
// hence of the kernel cache key.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "magi/codegen/printers.h"
#include "magi/common/error.h"

namespace magi::codegen {

namespace {
int env_int(const char* name, int fallback, int lo, int hi) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  MAGI_CHECK(*end == '\0' && v >= lo && v <= hi, name, "=", text, " is not an integer in [", lo,
             ", ", hi, "]");
  return static_cast<int>(v);
}

// `name`'s value, one of `choices`; the first when unset or empty.
std::string env_choice(const char* name, std::initializer_list<const char*> choices) {
  const char* text = std::getenv(name);
  const std::string m = text == nullptr || *text == '\0' ? *choices.begin() : text;
  std::string known;
  for (const char* c : choices) {
    if (m == c) return m;
    known += (known.empty() ? "" : ", ") + std::string(c);
  }
  MAGI_CHECK(false, name, "=", m, " is not one of ", known);
  return m;
}

// `name`'s value, a power of two in [32, 1024]; `fallback` when unset or empty.
int env_block_threads(const char* name, int fallback) {
  const int t = env_int(name, fallback, 32, 1024);
  MAGI_CHECK((t & (t - 1)) == 0, name, "=", t, " is not a power of two");
  return t;
}
}  // namespace

char kernel_grid_mode() {
  static const char mode = env_choice("MAGI_KERNEL_GRID", {"all", "wave"})[0];
  return mode;
}

int row_chunks_per_thread() {
  static const int chunks = env_int("MAGI_ROW_CHUNKS", 4, 1, 16);
  return chunks;
}

bool dependent_launch() {
  static const bool on = env_int("MAGI_DEPENDENT_LAUNCH", 1, 0, 1) == 1;
  return on;
}

bool strided_vectors_enabled() {
  static const bool on = env_int("MAGI_STRIDED_VECTORS", 1, 0, 1) == 1;
  return on;
}

bool packed_bf16_enabled() {
  static const bool on = env_int("MAGI_PACKED_BF16", 1, 0, 1) == 1;
  return on;
}

int pointwise_unroll() {
  static const int unroll = env_int("MAGI_POINTWISE_UNROLL", 0, 1, 8);
  return unroll;
}

char row_column_loads() {
  static const char mode = env_choice("MAGI_ROW_COLUMN_LOADS", {"auto", "block", "row", "late"})[0];
  return mode;
}

int max_threads_per_block() {
  static const int threads = env_block_threads("MAGI_MAX_BLOCK_THREADS", 256);
  return threads;
}

int row_min_blocks() {  // read at every print (kernels are printed once each)
  return env_int("MAGI_ROW_MIN_BLOCKS", 0, 0, 32);
}

bool row_grid_loop(const KernelVariant& v, int64_t row_bytes) {
  static const char mode = env_choice("MAGI_ROW_GRID_LOOP", {"auto", "0", "1"})[0];
  const bool without = v.wide_rows || (v.streamed_rows && row_bytes <= kStreamedRowsWithoutLoop);
  return mode == '1' || (mode == 'a' && !without);
}

char row_block_rounding() {  // read by the runtime's launch, not printed
  static const char mode = env_choice("MAGI_ROW_BLOCK_ROUNDING", {"warp", "pow2"})[0];
  return mode;
}

int held_row_threads() {
  static const int threads = env_block_threads("MAGI_ROW_HELD_THREADS", 512);
  return threads;
}

int stream_threads_per_block() {
  static const int threads = env_block_threads("MAGI_ROW_STREAM_THREADS", 512);
  return threads;
}

int stream_chunks_per_thread() {
  static const int chunks = env_int("MAGI_ROW_STREAM_CHUNKS", 2, 1, 16);
  return chunks;
}

bool row_stream_hints() {
  static const bool on = env_int("MAGI_ROW_STREAM_HINTS", 1, 0, 1) == 1;
  return on;
}

int stream_min_blocks() {  // read at every print, as row_min_blocks
  return env_int("MAGI_ROW_STREAM_MIN_BLOCKS", 0, 0, 32);
}

int row_stream_l1() {
  static const int mode = env_int("MAGI_ROW_STREAM_L1", 0, 0, 2);
  return mode;
}

const std::string& vector_io_mode() {
  static const std::string mode = env_choice(
      "MAGI_VECTOR_IO",
      {"auto", "cs", "ldcs", "ldg", "asm", "plain", "stcs", "l2last", "l2last_l1", "l2last_cs"});
  return mode;
}

const std::string& keep_loads_mode() {
  static const std::string mode = env_choice("MAGI_KEEP_LOADS", {"ldg", "l1last"});
  return mode;
}

void read_tuning_variables() {
  (void)kernel_grid_mode();
  (void)row_chunks_per_thread();
  (void)dependent_launch();
  (void)strided_vectors_enabled();
  (void)packed_bf16_enabled();
  (void)pointwise_unroll();
  (void)row_column_loads();
  (void)max_threads_per_block();
  (void)row_min_blocks();
  (void)row_grid_loop(KernelVariant{}, 0);
  (void)row_block_rounding();
  (void)held_row_threads();
  (void)stream_threads_per_block();
  (void)stream_chunks_per_thread();
  (void)row_stream_hints();
  (void)stream_min_blocks();
  (void)row_stream_l1();
  (void)vector_io_mode();
  (void)keep_loads_mode();
}

std::string vector_io_for(const KernelVariant& variant) {
  const std::string& mode = vector_io_mode();
  if (mode != "auto") return mode;
  // Rows held in registers, reduced once and written out whole (RMSNorm, add+RMSNorm):
  // torch.compile's policy, rows read under L2 evict_last and written with plain stores, which
  // measured at or above streaming for RMSNorm and add+RMSNorm. Kernels that reduce a row twice
  // (LayerNorm lost with it), row kernels whose outputs are one value per row (a sum, a mean),
  // streamed rows, rows in warps, pointwise and column kernels stay with streaming loads and
  // stores. RMSNorm's backward takes the forward's choice. The CPU test runs compile every CUDA
  // form of a kernel with the held form's choice.
  MAGI_ASSERT(variant.spec != nullptr, "vector_io_for: a kernel variant without its spec");
  const KernelSpec& spec = *variant.spec;
  if (spec.schedule != Schedule::kRow || variant.streamed_rows || variant.rows_in_warps) {
    return "cs";
  }
  int reductions = 0;
  for (const KOp& op : spec.ops) reductions += op.kind == KOpKind::kReduce;
  const bool element_output = std::any_of(spec.outputs.begin(), spec.outputs.end(),
                                          [](const KOutput& o) { return !o.per_row; });
  return reductions == 1 && element_output ? "l2last" : "cs";
}

std::string cuda_preamble(const KernelVariant& variant) {
  std::string defines;
  const std::string mode = vector_io_for(variant);
  if (mode != "ldg") {  // ldg needs no define: the preamble's plain path
    std::string upper = mode;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    defines = "#define MAGI_VECTOR_IO_" + upper + " 1\n";
  }
  if (keep_loads_mode() == "l1last") defines += "#define MAGI_KEEP_L1LAST 1\n";
  if (row_stream_l1() != 0)
    defines += "#define MAGI_STREAM_L1 " + std::to_string(row_stream_l1()) + "\n";
  return defines + kCudaPreamble + "\n";
}

}  // namespace magi::codegen
