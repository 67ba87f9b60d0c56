// The printed kernels of a pointwise, a row-reduction (three GPU layouts) and a
// column-reduction group against golden files in tests/cpp/golden (MAGI_UPDATE_GOLDEN=1
// rewrites them from the current output). The golden CUDA kernels are NVRTC-compiled for
// sm_90, the C++ ones host-compiled, and the groups run as FusedKernels against ATen. Also the
// division constants of the generated index arithmetic.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "magi/codegen/compiler.h"
#include "magi/codegen/lower_group.h"
#include "magi/codegen/printers.h"
#include "magi/common/error.h"
#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "magi/runtime/executor.h"
#include "magi/runtime/fused_kernel.h"

#include "../../src/runtime/kernel_variant.h"  // threads_per_row, private to the runtime
#include "fusion_builder.h"
#include "test_helpers.h"

namespace magi::test {
namespace {

using passes::fuse_groups;

std::string golden_path(const std::string& name) {
  return std::string(MAGI_GOLDEN_DIR) + "/" + name;
}

// Compares `text` with golden file `name`, or rewrites the file when MAGI_UPDATE_GOLDEN=1.
void expect_golden(const std::string& text, const std::string& name) {
  const char* update = std::getenv("MAGI_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(golden_path(name)) << text;
    return;
  }
  std::ifstream in(golden_path(name));
  ASSERT_TRUE(in.good()) << golden_path(name) << " is missing; run with MAGI_UPDATE_GOLDEN=1";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(text, expected.str()) << "printed kernel differs from " << golden_path(name)
                                  << " (MAGI_UPDATE_GOLDEN=1 rewrites it after review)";
}

// silu(x + bias) * u in bfloat16; u is read through general strides.
std::unique_ptr<Graph> silu_mul_group() {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  SymExpr rows = sym("s0"), cols = sym("s1");
  Value* x = b.input("x", {rows, cols}, kBF16);
  Value* bias = b.input("bias", {cols}, kBF16);
  Value* u = b.input("u", {rows, cols}, kBF16);
  Value* h = b.unary("aten::silu", b.add(x, bias, "add", 20), "silu", 20);
  g->set_outputs({b.mul(h, u, "mul", 21)});
  return g;
}

// h = x + residual; out = rmsnorm(h) * w, in bfloat16 with float32 math; returns (out, h).
std::unique_ptr<Graph> add_rmsnorm_group_of(int64_t cols) {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  SymExpr rows = sym("s0");
  Value* x = b.input("x", {rows, cols}, kBF16);
  Value* residual = b.input("residual", {rows, cols}, kBF16);
  Value* w = b.input("w", {cols});
  Value* h = b.add(x, residual, "add", 30);
  Value* hf = b.cast(h, kF32, "float", 31);
  Value* sq = b.op("aten::pow", "Tensor_Scalar", {hf, b.scalar(2)}, *hf->tensor_type(), "pow", 32);
  Value* var = b.row_reduce("aten::mean", "dim", sq, true, "mean", 32);
  Value* r = b.unary("aten::rsqrt", b.add(var, b.number(1e-6), "add_eps", 33), "rsqrt", 33);
  Value* y = b.mul(b.mul(hf, r, "mul", 33), w, "mul_w", 34);
  g->set_outputs({b.cast(y, kBF16, "out", 34), h});
  return g;
}

std::unique_ptr<Graph> add_rmsnorm_group() { return add_rmsnorm_group_of(64); }

// A weight gradient in bfloat16: p = g * xn (also an output), dw = sum(p, 0) * w cast to
// bfloat16, w one value per column.
std::unique_ptr<Graph> column_weight_grad_group() {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  SymExpr rows = sym("s0");
  Value* grad = b.input("grad", {rows, 64}, kBF16);
  Value* xn = b.input("xn", {rows, 64}, kBF16);
  Value* w = b.input("w", {64});
  Value* p = b.mul(grad, xn, "mul", 40);
  Value* pf = b.cast(p, kF32, "float", 41);
  Value* dw = b.column_reduce("aten::sum", "dim_IntList", pf, 1, false, "sum", 41);
  Value* scaled = b.binary("aten::mul", dw, w, *dw->tensor_type(), "mul_w", 42);
  g->set_outputs({b.cast(scaled, kBF16, "dw", 42), p});
  return g;
}

using codegen::AccessClass;

codegen::KernelVariant variant(const codegen::KernelSpec& spec, std::vector<AccessClass> access,
                               int width, int index_rank) {
  codegen::KernelVariant v;
  v.spec = &spec;
  v.access = std::move(access);
  v.vector_width = width;
  v.index_rank = index_rank;
  v.narrow_index = index_rank > 0;
  return v;
}

struct Case {
  const char* name;
  std::unique_ptr<Graph> (*build)();
  std::vector<AccessClass> access;
  int cuda_width;
  bool rows_in_warps = false;  // the GPU form for rows of at most 32 threads
  bool streamed_rows = false;  // the GPU form for rows too long for registers
  int index_rank = 0;          // with strided inputs: the index space's rank (32-bit offsets)
};

const Case kCases[] = {
    {"pointwise_silu_mul",
     &silu_mul_group,
     {AccessClass::kContiguous, AccessClass::kColumn, AccessClass::kStrided},
     8,
     false,
     false,
     2},
    {"row_add_rmsnorm",
     &add_rmsnorm_group,
     {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn},
     8},
    {"column_weight_grad",
     &column_weight_grad_group,
     {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn},
     8},
    {"row_add_rmsnorm_warps",
     &add_rmsnorm_group,
     {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn},
     8,
     true},
    {"row_add_rmsnorm_streamed",
     &add_rmsnorm_group,
     {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn},
     8,
     false,
     true},
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class PrintedKernel : public ::testing::TestWithParam<Case> {};

TEST_P(PrintedKernel, CudaMatchesGoldenAndCompiles) {
  const Case& c = GetParam();
  std::unique_ptr<Graph> group = c.build();
  ir::verify(*group);
  codegen::KernelSpec spec = codegen::lower_group(*group, std::string("fused_") + c.name);
  codegen::KernelVariant v = variant(spec, c.access, c.cuda_width, c.index_rank);
  v.rows_in_warps = c.rows_in_warps;
  v.streamed_rows = c.streamed_rows;
  std::string source = codegen::print_cuda(v);
  expect_golden(source, std::string(c.name) + ".cu");
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "NVRTC is not installed on this machine";
  std::vector<char> cubin = codegen::compile_cuda_to_cubin(
      std::string(codegen::kCudaPreamble) + "\n" + source, v.symbol(), 90);
  EXPECT_FALSE(cubin.empty());
}

TEST_P(PrintedKernel, CppMatchesGoldenAndCompiles) {
  const Case& c = GetParam();
  if (c.rows_in_warps || c.streamed_rows) {
    GTEST_SKIP() << "a GPU layout: the C++ printer has one row form";
  }
  std::unique_ptr<Graph> group = c.build();
  codegen::KernelSpec spec = codegen::lower_group(*group, std::string("fused_") + c.name);
  codegen::KernelVariant v = variant(spec, c.access, 1, c.index_rank);
  std::string source = codegen::print_cpp(v);
  expect_golden(source, std::string(c.name) + ".cpp");
  EXPECT_NE(
      codegen::get_cpu_function(std::string(codegen::kCpuPreamble) + "\n" + source, v.symbol()),
      nullptr);
}

// The schedule's defaults, and MAGI_KERNEL_SCHEDULE's overrides: counts of threads that are
// powers of two in [32, 1024], chunks in [1, 16], anything else a UserError naming the variable.
TEST(PrintedKernel, KernelScheduleOverrides) {
  const codegen::KernelSchedule defaults = codegen::parse_kernel_schedule("");
  EXPECT_EQ(defaults.block_threads, 256);
  EXPECT_EQ(defaults.row_chunks, 4);
  EXPECT_EQ(defaults.held_row_threads, 512);
  EXPECT_EQ(defaults.stream_threads, 512);
  EXPECT_EQ(defaults.stream_chunks, 2);
  const codegen::KernelSchedule s =
      codegen::parse_kernel_schedule("row_chunks=8,block_threads=512,stream_chunks=1");
  EXPECT_EQ(s.row_chunks, 8);
  EXPECT_EQ(s.block_threads, 512);
  EXPECT_EQ(s.stream_chunks, 1);
  EXPECT_EQ(s.held_row_threads, 512);
  for (const char* bad : {"row_chunks=0", "row_chunks=17", "block_threads=384",
                          "block_threads=2048", "stream_threads=", "grid=wave", "row_chunks"}) {
    SCOPED_TRACE(bad);
    try {
      codegen::parse_kernel_schedule(bad);
      ADD_FAILURE() << "accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("MAGI_KERNEL_SCHEDULE"), std::string::npos);
    }
  }
}

// A row kernel whose launch grid covers every row (KernelVariant::row_loop false) takes its
// block's row(s) with no loop over rows, in each of the three GPU layouts, names itself with _g,
// and still compiles; with row_loop the loop is printed.
TEST(PrintedKernel, RowKernelsWithoutTheGridLoop) {
  std::unique_ptr<Graph> group = add_rmsnorm_group();
  codegen::KernelSpec spec = codegen::lower_group(*group, "fused_rows");
  const std::vector<AccessClass> access = {AccessClass::kContiguous, AccessClass::kContiguous,
                                           AccessClass::kColumn};
  for (int layout = 0; layout < 3; ++layout) {
    codegen::KernelVariant v = variant(spec, access, 8, 0);
    v.rows_in_warps = layout == 1;
    v.streamed_rows = layout == 2;
    const std::string looped = codegen::print_cuda(v);
    EXPECT_NE(looped.find("gridDim.x"), std::string::npos) << layout;
    v.row_loop = false;
    const std::string source = codegen::print_cuda(v);
    SCOPED_TRACE(source);
    EXPECT_EQ(source.find("gridDim"), std::string::npos);
    EXPECT_NE(source.find("// the grid covers every row"), std::string::npos);
    EXPECT_EQ(v.symbol().substr(v.symbol().size() - 2), "_g");
    if (!codegen::nvrtc_available()) continue;
    EXPECT_FALSE(codegen::compile_cuda_to_cubin(std::string(codegen::kCudaPreamble) + "\n" + source,
                                                v.symbol(), 90)
                     .empty());
  }
}

// The group as a FusedKernel (the golden variants: a transposed u, a [cols] bias or weight)
// against the same group run op by op through ATen.
TEST_P(PrintedKernel, RunsLikeAten) {
  const Case& c = GetParam();
  std::unique_ptr<Graph> group = c.build();
  runtime::FusedKernel kernel(*group, std::string("fused_") + c.name);
  runtime::Executable reference(*group);
  const int64_t rows = 7, cols = 64;
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < c.access.size(); ++i) {
    const auto& type = *group->inputs()[i]->tensor_type();
    auto options = at::TensorOptions().dtype(type.dtype);
    switch (c.access[i]) {
      case AccessClass::kColumn:
        inputs.push_back(at::randn({cols}, options));
        break;
      case AccessClass::kStrided:
        inputs.push_back(at::randn({cols, rows}, options).t());
        break;
      default:
        inputs.push_back(at::randn({rows, cols}, options));
    }
  }
  std::vector<at::Tensor> got = kernel.run(inputs);
  std::vector<c10::IValue> want = reference.run({inputs.begin(), inputs.end()});
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    at::Tensor e = want[k].toTensor().to(at::kDouble), a = got[k].to(at::kDouble);
    ASSERT_EQ(a.sizes(), e.sizes());
    double rel = (a - e).abs().max().item<double>() / e.abs().max().item<double>();
    EXPECT_LE(rel, 1e-2) << "output " << k;
  }
  std::string access;
  for (AccessClass a : c.access) access += static_cast<char>(a);
  ASSERT_EQ(kernel.generated().size(), 1u);
  const std::string rank = c.index_rank > 0 ? "_r" + std::to_string(c.index_rank) + "n" : "";
  EXPECT_EQ(kernel.generated()[0].symbol,
            std::string("fused_") + c.name + "_" + access + "_v1" + rank);
}

// Moves every tensor of `g` to `device`, keeping sizes and dtypes; `strides` (when given)
// replaces the first input's strides.
void place_on(Graph& g, c10::Device device, std::vector<SymExpr> strides = {}) {
  auto move = [&](Value* v, bool first_input) {
    if (!v->tensor_type()) return;
    TensorType t = *v->tensor_type();
    t.device = device;
    if (first_input && !strides.empty()) t.strides = strides;
    v->set_tensor_type(std::move(t));
  };
  for (size_t i = 0; i < g.inputs().size(); ++i) move(g.inputs()[i], i == 0);
  for (Node* n : g.nodes()) {
    if (n->kind() == NodeKind::kInput) continue;
    for (Value* out : n->outputs()) move(out, false);
  }
}

// Before the first call, the variant it will need is predicted from the traced layouts and its
// source printed exactly as the call prints it, so compiling it ahead makes the call a cache
// hit: contiguous activations and a per-column weight give 16-byte vectors; rows of 64 values
// take 8 lanes each, several rows to a block; a transposed activation is read through strides;
// a graph on the CPU has nothing to precompile.
TEST(FusedKernel, ExpectedCudaSourceFollowsTheTracedLayouts) {
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  auto g = add_rmsnorm_group();
  place_on(*g, cuda);
  runtime::FusedKernel kernel(*g, "fused_add_rmsnorm");
  auto expected = kernel.expected_cuda_source();
  ASSERT_TRUE(expected.has_value());
  auto call =
      variant(kernel.spec(),
              {AccessClass::kContiguous, AccessClass::kContiguous, AccessClass::kColumn}, 8, 0);
  call.rows_in_warps = true;
  EXPECT_EQ(expected->name, call.symbol());
  EXPECT_EQ(expected->source, codegen::cuda_preamble(call) + codegen::print_cuda(call));
  if (codegen::nvrtc_available()) {
    EXPECT_FALSE(codegen::compile_cuda_batch({*expected}, 90).front().empty());
  }

  auto transposed = add_rmsnorm_group();
  place_on(*transposed, cuda, {SymExpr(1), sym("s0")});
  runtime::FusedKernel strided(*transposed, "fused_add_rmsnorm_t");
  auto expected_strided = strided.expected_cuda_source();
  ASSERT_TRUE(expected_strided.has_value());
  auto strided_call = variant(
      strided.spec(), {AccessClass::kStrided, AccessClass::kContiguous, AccessClass::kColumn}, 8,
      2);  // a rank-2 index space with small sizes: 32-bit offsets
  strided_call.rows_in_warps = true;
  EXPECT_EQ(expected_strided->name, strided_call.symbol());

  auto on_cpu = add_rmsnorm_group();
  EXPECT_FALSE(runtime::FusedKernel(*on_cpu, "fused_cpu").expected_cuda_source().has_value());
}

// At the default schedule (256 threads of 4 chunks of 16 bytes, wide blocks of 512) rows of up to
// 8192 bf16 values are held in registers by a block of 256 threads, with the loop over rows; rows
// of up to 16384 by a wide block of 512 (_h), without it; longer rows are streamed (_s), without
// the loop up to 64 KiB of the widest input read along the row. A row length not a multiple of 8
// takes narrower vectors, hence a wider block or streaming sooner. The variant the first call of
// each row length will launch says so in its name. The block of a row kernel holding rows in
// registers: a power of two up to a warp (rows share a block and reduce by shuffles), whole warps
// beyond it (no chunk left idle but in the last warp), up to 256 threads, or 512 for a wide block;
// a row that needs more is streamed (threads_per_row then answers the block the test for it uses).
TEST(FusedKernel, HeldRowsTakeBlocksOfWholeWarps) {
  if (std::getenv("MAGI_KERNEL_SCHEDULE") != nullptr) GTEST_SKIP() << "a schedule override";
  using runtime::detail::threads_per_row;
  // bf16 rows in 16-byte vectors: 32 values per thread (4 chunks of 8)
  const std::vector<std::pair<int64_t, int64_t>> cases = {
      {128, 4},    {1000, 32},  {1100, 64},   {2080, 96},   {5120, 160},  {6144, 192},
      {8192, 256}, {8200, 288}, {12288, 384}, {16384, 512}, {16392, 256}, {65536, 256}};
  for (const auto& [cols, threads] : cases) {
    EXPECT_EQ(threads_per_row(cols, 8), threads) << cols << " columns";
  }
  EXPECT_EQ(threads_per_row(1001, 1), 256);  // odd: one value per access, 4 per thread
  EXPECT_EQ(threads_per_row(4100, 4), 288);
}

TEST(FusedKernel, RowLengthsPickHeldWideAndStreamedLayouts) {
  if (std::getenv("MAGI_KERNEL_SCHEDULE") != nullptr) GTEST_SKIP() << "a schedule override";
  codegen::KernelVariant held, wide, streamed;
  wide.wide_rows = true;
  streamed.streamed_rows = true;
  EXPECT_TRUE(codegen::row_grid_loop(held, 1024));
  EXPECT_FALSE(codegen::row_grid_loop(wide, 32768));
  EXPECT_FALSE(codegen::row_grid_loop(streamed, codegen::kStreamedRowsWithoutLoop));
  EXPECT_TRUE(codegen::row_grid_loop(streamed, codegen::kStreamedRowsWithoutLoop + 2));
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  const std::vector<std::pair<int64_t, std::string>> cases = {
      {8192, "_ccl_v8"},      {8200, "_ccl_v8_h_g"}, {16384, "_ccl_v8_h_g"},
      {4100, "_ccl_v4_h_g"},  {8194, "_ccl_v2_s_g"}, {16392, "_ccl_v8_s_g"},
      {32768, "_ccl_v8_s_g"}, {32770, "_ccl_v2_s"},  {65536, "_ccl_v8_s"}};
  for (const auto& [cols, suffix] : cases) {
    auto g = add_rmsnorm_group_of(cols);
    place_on(*g, cuda);
    runtime::FusedKernel kernel(*g, "fused_add_rmsnorm");
    auto expected = kernel.expected_cuda_source();
    ASSERT_TRUE(expected.has_value());
    const std::string& name = expected->name;
    EXPECT_EQ(name.substr(name.size() - suffix.size()), suffix) << cols << ": " << name;
  }
}

// A pointwise kernel that reads an input through general strides is predicted (and run) with
// four vectors per thread when its one-vector grid is at least 16 waves of the device (of an
// H100 here: 132 SMs), else with one, as are contiguous ones: the name says so, and the source
// has the grid-stride loop over U = 4 vectors only in the first.
TEST(FusedKernel, LargeStridedPointwiseKernelsTakeFourVectorsPerThread) {
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  const int64_t rows = codegen::cuda_driver_available()
                           ? codegen::device_info(0).sm_count * int64_t{2048} * 16 * 8 / 2048
                           : 132 * 16 * 8;
  auto sized = [&](std::vector<SymExpr> strides) {
    auto g = silu_mul_group();
    ir::SymbolBindings at{{"s0", rows}, {"s1", 2048}};
    for (Value* v : g->inputs()) {
      TensorType t = *v->tensor_type();
      for (SymExpr& e : t.sizes) e = SymExpr(e.evaluate(at));
      v->set_tensor_type(std::move(t));
    }
    place_on(*g, cuda, std::move(strides));
    return g;
  };
  auto contiguous = sized({});
  auto plain = runtime::FusedKernel(*contiguous, "fused_silu_mul_c").expected_cuda_source();
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->name.find("_u"), std::string::npos) << plain->name;
  EXPECT_EQ(plain->source.find("constexpr int U ="), std::string::npos);

  auto small = silu_mul_group();  // sizes bound to 64 for the prediction: one wave at most
  place_on(*small, cuda, {SymExpr(1), sym("s0")});
  auto few = runtime::FusedKernel(*small, "fused_silu_mul_small").expected_cuda_source();
  ASSERT_TRUE(few.has_value());
  EXPECT_EQ(few->name.find("_u"), std::string::npos) << few->name;

  auto transposed = sized({SymExpr(1), SymExpr(rows)});
  auto strided = runtime::FusedKernel(*transposed, "fused_silu_mul_t").expected_cuda_source();
  ASSERT_TRUE(strided.has_value());
  EXPECT_EQ(strided->name.substr(strided->name.size() - 3), "_u4") << strided->name;
  EXPECT_NE(strided->source.find("constexpr int U = 4;"), std::string::npos);
  if (codegen::nvrtc_available()) {
    EXPECT_FALSE(codegen::compile_cuda_batch({*strided}, 90).front().empty());
  }
}

// A strided input that steps by 1 along its rows, each row starting at a multiple of the
// vector width (a slice of wider rows), loads whole vectors with no check at run time
// (KernelVariant::strided_vectors): the name ends in _sv and the source has no checked
// strided load. A transposed input keeps the checked load.
TEST(FusedKernel, UnitStridedInputsLoadWholeVectors) {
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  auto sliced = silu_mul_group();
  place_on(*sliced, cuda, {SymExpr(2) * sym("s1"), SymExpr(1)});
  auto wide = runtime::FusedKernel(*sliced, "fused_silu_mul_sliced").expected_cuda_source();
  ASSERT_TRUE(wide.has_value());
  EXPECT_EQ(wide->name.substr(wide->name.size() - 3), "_sv") << wide->name;
  EXPECT_EQ(wide->source.find("magi_load_strided<A"), std::string::npos);
  EXPECT_NE(wide->source.find("magi_load<A, magi_bf16, V, true>(in0 + ro0 + (col_base), t0);"),
            std::string::npos)
      << wide->source;
  if (codegen::nvrtc_available()) {
    EXPECT_FALSE(codegen::compile_cuda_batch({*wide}, 90).front().empty());
  }

  auto transposed = silu_mul_group();
  place_on(*transposed, cuda, {SymExpr(1), sym("s0")});
  auto checked = runtime::FusedKernel(*transposed, "fused_silu_mul_t").expected_cuda_source();
  ASSERT_TRUE(checked.has_value());
  EXPECT_EQ(checked->name.find("_sv"), std::string::npos) << checked->name;
  EXPECT_NE(checked->source.find("magi_load_strided<A"), std::string::npos);

  // Rows 2 x 64 + 1 elements apart: unit stride, but rows that start off the vector grid.
  auto odd = silu_mul_group();
  place_on(*odd, cuda, {SymExpr(2) * sym("s1") + SymExpr(1), SymExpr(1)});
  auto unaligned = runtime::FusedKernel(*odd, "fused_silu_mul_odd").expected_cuda_source();
  ASSERT_TRUE(unaligned.has_value());
  EXPECT_EQ(unaligned->name.find("_sv"), std::string::npos) << unaligned->name;
  EXPECT_NE(unaligned->source.find("magi_load_strided<A"), std::string::npos);
}

// rotate_half over rows of `width` (x * cos + cat(-x[..., h:], x[..., :h]) * sin, h = width / 2),
// fused: the graph whose one fusion node runs it.
std::unique_ptr<Graph> rotate_half_graph(int64_t width, c10::ScalarType dtype = kF32) {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  Value* x = b.input("x", {sym("s0"), width}, dtype);
  Value* cos = b.input("cos", {width}, dtype);
  Value* sin = b.input("sin", {width}, dtype);
  Value* lo = b.slice(x, 0, width / 2, "slice");
  Value* hi = b.slice(x, width / 2, INT64_MAX, "slice_1");
  Value* rot = b.cat_last({b.unary("aten::neg", hi, "neg"), lo}, "cat");
  g->set_outputs({b.add(b.mul(x, cos, "mul"), b.mul(rot, sin, "mul_1"), "add")});
  EXPECT_TRUE(passes::fuse_groups(*g));
  EXPECT_EQ(nodes_of_kind(*g, NodeKind::kFusion).size(), 1u);
  return g;
}

// A cat whose bound and shifts are multiples of the vector width picks one piece per vector: the
// select tests the vector's first column (col = col_base) once. With halves of 6 and vectors of
// 4, a vector straddles the bound, and each lane tests its own column (col_base + j).
TEST(PrintedKernel, CatSelectsTestEachVectorOnceWhenItsBoundIsAMultipleOfTheWidth) {
  const std::vector<AccessClass> access = {AccessClass::kContiguous, AccessClass::kColumn,
                                           AccessClass::kColumn};
  auto aligned = rotate_half_graph(16);
  const codegen::KernelSpec spec = codegen::lower_group(
      *nodes_of_kind(*aligned, NodeKind::kFusion).at(0)->piece(), "fused_rotate_half");
  const std::string uniform = codegen::print_cuda(variant(spec, access, 8, 0));
  EXPECT_NE(uniform.find("const long long col = col_base;"), std::string::npos) << uniform;
  EXPECT_EQ(uniform.find("col_base + j"), std::string::npos) << uniform;
  EXPECT_NE(uniform.find("(col < 8 ?"), std::string::npos) << uniform;

  auto straddling = rotate_half_graph(12);
  const codegen::KernelSpec spec12 = codegen::lower_group(
      *nodes_of_kind(*straddling, NodeKind::kFusion).at(0)->piece(), "fused_rotate_half_12");
  const std::string per_lane = codegen::print_cuda(variant(spec12, access, 4, 0));
  EXPECT_NE(per_lane.find("const long long col = col_base + j;"), std::string::npos) << per_lane;
  if (codegen::nvrtc_available()) {
    for (const auto& [source, v] : {std::pair{uniform, variant(spec, access, 8, 0)},
                                    std::pair{per_lane, variant(spec12, access, 4, 0)}}) {
      EXPECT_FALSE(
          codegen::compile_cuda_to_cubin(codegen::cuda_preamble(v) + source, v.symbol(), 90)
              .empty());
    }
  }
}

// The vector I/O reads rows under L2 evict_last with plain
// stores only in row kernels that hold their rows in registers (wide blocks too), reduce them
// once and write an output per element; a softmax and a LayerNorm (two reductions), a row sum
// (one value per row out), rows in warps, streamed rows, pointwise and column kernels stream.
TEST(PrintedKernel, AutoVectorIoHintsOnlyHeldRowsReducedOnce) {
  auto norm = add_rmsnorm_group();
  const codegen::KernelSpec norm_spec = codegen::lower_group(*norm, "fused_add_rmsnorm");
  const std::vector<AccessClass> norm_access = {AccessClass::kContiguous, AccessClass::kContiguous,
                                                AccessClass::kColumn};
  codegen::KernelVariant held = variant(norm_spec, norm_access, 8, 0);
  EXPECT_EQ(codegen::vector_io_for(held), codegen::VectorIo::kL2Last);
  EXPECT_EQ(codegen::cuda_preamble(held).rfind("#define MAGI_VECTOR_IO_L2LAST 1\n", 0), 0u);
  codegen::KernelVariant wide = held;
  wide.wide_rows = true;
  EXPECT_EQ(codegen::vector_io_for(wide), codegen::VectorIo::kL2Last);
  codegen::KernelVariant warps = held;
  warps.rows_in_warps = true;
  EXPECT_EQ(codegen::vector_io_for(warps), codegen::VectorIo::kStreaming);
  codegen::KernelVariant streamed = held;
  streamed.streamed_rows = true;
  EXPECT_EQ(codegen::vector_io_for(streamed), codegen::VectorIo::kStreaming);
  EXPECT_EQ(codegen::cuda_preamble(streamed).rfind("#define MAGI_VECTOR_IO_CS 1\n", 0), 0u);

  auto g = std::make_unique<Graph>();
  Builder b(*g);
  Value* x = b.input("x", {sym("s0"), 64});
  Value* m = b.row_reduce("aten::amax", "", x, true, "amax", 50);
  Value* e =
      b.unary("aten::exp", b.binary("aten::sub", x, m, *x->tensor_type(), "sub", 50), "exp", 50);
  Value* sum = b.row_reduce("aten::sum", "dim_IntList", e, true, "sum", 51);
  g->set_outputs({b.binary("aten::div", e, sum, *e->tensor_type(), "div", 51)});
  const codegen::KernelSpec softmax = codegen::lower_group(*g, "fused_softmax");
  EXPECT_EQ(codegen::vector_io_for(variant(softmax, {AccessClass::kContiguous}, 4, 0)),
            codegen::VectorIo::kStreaming);

  auto ln = std::make_unique<Graph>();
  Builder l(*ln);
  Value* y = l.input("y", {sym("s0"), 64});
  Value* mean = l.row_reduce("aten::mean", "dim", y, true, "mean", 60);
  Value* d = l.binary("aten::sub", y, mean, *y->tensor_type(), "centered", 60);
  Value* var = l.row_reduce("aten::mean", "dim", l.mul(d, d, "square", 61), true, "var", 61);
  Value* inv = l.unary("aten::rsqrt", l.add(var, l.number(1e-5), "add_eps", 62), "rsqrt", 62);
  ln->set_outputs({l.mul(d, inv, "normed", 62)});
  const codegen::KernelSpec layer_norm = codegen::lower_group(*ln, "fused_layer_norm");
  EXPECT_EQ(codegen::vector_io_for(variant(layer_norm, {AccessClass::kContiguous}, 4, 0)),
            codegen::VectorIo::kStreaming);

  auto rs = std::make_unique<Graph>();
  Builder q(*rs);
  Value* z = q.input("z", {sym("s0"), 64});
  rs->set_outputs(
      {q.row_reduce("aten::sum", "dim_IntList", q.mul(z, z, "square", 70), true, "sum", 70)});
  const codegen::KernelSpec row_sum = codegen::lower_group(*rs, "fused_row_sum");
  EXPECT_EQ(codegen::vector_io_for(variant(row_sum, {AccessClass::kContiguous}, 4, 0)),
            codegen::VectorIo::kStreaming);

  auto pointwise = silu_mul_group();
  const codegen::KernelSpec pw = codegen::lower_group(*pointwise, "fused_silu_mul");
  EXPECT_EQ(codegen::vector_io_for(variant(pw, norm_access, 8, 0)), codegen::VectorIo::kStreaming);
  auto column = column_weight_grad_group();
  const codegen::KernelSpec col = codegen::lower_group(*column, "fused_weight_grad");
  EXPECT_EQ(codegen::vector_io_for(variant(col, norm_access, 8, 0)), codegen::VectorIo::kStreaming);
}

// A bf16 rotary (products, a sum, a negation and a select of bf16 values, each rounded to bf16)
// runs on packed pairs: one fma.rn.bf16x2 per pair of elements and op, the words loaded and
// stored as they are, no rounding of floats. The float32 rotary, a bf16 one in vectors of 4,
// and a bf16 SiLU-product (a function besides those) keep the float body.
TEST(PrintedKernel, Bf16ProductsAndSumsRunOnPackedPairs) {
  const std::vector<AccessClass> access = {AccessClass::kContiguous, AccessClass::kColumn,
                                           AccessClass::kColumn};
  auto bf16 = rotate_half_graph(16, kBF16);
  const codegen::KernelSpec spec = codegen::lower_group(
      *nodes_of_kind(*bf16, NodeKind::kFusion).at(0)->piece(), "fused_rotate_half_bf16");
  auto v = variant(spec, access, 8, 0);
  ASSERT_TRUE(codegen::packed_bf16_possible(v));
  v.packed_bf16 = true;
  EXPECT_EQ(v.symbol().substr(v.symbol().size() - 3), "_p2") << v.symbol();
  const std::string packed = codegen::print_cuda(v);
  for (const char* piece : {"magi_bf16x2_mul(", "magi_bf16x2_add(", " ^ 0x80008000u)",
                            "magi_load_words<true>(in0 + base, u0);", "magi_store16(out0 + base"}) {
    EXPECT_NE(packed.find(piece), std::string::npos) << piece << "\n" << packed;
  }
  EXPECT_EQ(packed.find("magi_round_bf16"), std::string::npos) << packed;
  if (codegen::nvrtc_available()) {
    EXPECT_FALSE(
        codegen::compile_cuda_to_cubin(codegen::cuda_preamble(v) + packed, v.symbol(), 90).empty());
  }
  EXPECT_FALSE(codegen::packed_bf16_possible(variant(spec, access, 4, 0)));

  auto f32 = rotate_half_graph(16);
  const codegen::KernelSpec spec32 = codegen::lower_group(
      *nodes_of_kind(*f32, NodeKind::kFusion).at(0)->piece(), "fused_rotate_half_f32");
  EXPECT_FALSE(codegen::packed_bf16_possible(variant(spec32, access, 8, 0)));

  auto silu = silu_mul_group();
  ASSERT_TRUE(passes::fuse_groups(*silu));
  const codegen::KernelSpec spec_silu = codegen::lower_group(
      *nodes_of_kind(*silu, NodeKind::kFusion).at(0)->piece(), "fused_silu_mul_bf16");
  EXPECT_FALSE(codegen::packed_bf16_possible(
      variant(spec_silu, {AccessClass::kContiguous, AccessClass::kColumn, AccessClass::kContiguous},
              8, 0)));
}

// exp(x) -> neg feeding an mm, and the mm's value through cos and sin to the graph's output:
// fused (after a split at the mm when `split`) and placed on a CUDA device, pieces included.
// For each generated kernel the caller expects, whether its store is a kept one (no streaming
// hint), by whether its name has `kept_name`.
void expect_kept_stores(bool split, const std::string& kept_name) {
  Graph g;
  Builder b(g);
  Value* x = b.input("x", {sym("s0"), 16});
  Value* e = b.unary("aten::neg", b.unary("aten::exp", x, "exp"), "neg");
  Value* m = b.op("aten::mm", "", {e, b.input("w", {16, 16})}, tensor_type({sym("s0"), 16}), "mm");
  g.set_outputs({b.unary("aten::sin", b.unary("aten::cos", m, "cos"), "sin")});
  if (split) ASSERT_TRUE(passes::split_at_boundaries(g, {"aten::mm"}));
  ASSERT_TRUE(passes::fuse_groups(g));
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  std::vector<Graph*> graphs = {&g};
  for (size_t i = 0; i < graphs.size(); ++i) {
    place_on(*graphs[i], cuda);
    for (Graph* piece : graphs[i]->pieces()) graphs.push_back(piece);
  }
  runtime::Executable exe(g);
  const auto by_device = exe.expected_cuda_sources();
  ASSERT_EQ(by_device.size(), 1u);
  ASSERT_EQ(by_device.begin()->second.size(), 2u);
  int kept = 0;
  for (const codegen::CudaSource& source : by_device.begin()->second) {
    const bool keeps =
        source.source.find("magi_store<A, float, V, true>(out0") != std::string::npos;
    const bool streams = source.source.find("magi_store<A, float, V>(out0") != std::string::npos;
    EXPECT_NE(keeps, streams) << source.name;
    EXPECT_EQ(keeps, source.name.find(kept_name) != std::string::npos) << source.name;
    kept += keeps;
  }
  EXPECT_EQ(kept, 1);
}

// An output that a matmul reads next is stored without the streaming hint (the matmul finds it
// in L2); one that only the caller reads keeps the hint. Also when the kernel that feeds the mm
// sits in a piece of its own (the graph split at the mm) and its output leaves the piece.
TEST(FusedKernel, OutputsReadByALibraryKernelAreStoredWithoutTheStreamingHint) {
  expect_kept_stores(false, "exp_neg");
}
TEST(FusedKernel, AnOutputLeavingAPieceForALibraryKernelIsKeptToo) {
  expect_kept_stores(true, "exp_neg");
}

// A pointwise call writes its output over an input whose only reference was moved in (the
// executor's last use), with the values it would have written elsewhere; an input the caller
// still holds keeps its values and the output gets its own buffer.
TEST(FusedKernel, AnOutputTakesTheBufferOfAnInputMovedIn) {
  auto g = silu_mul_group();
  runtime::FusedKernel kernel(*g, "fused_silu_mul_in_place");
  runtime::Executable reference(*g);
  auto make_inputs = [] {
    const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
    return std::vector<at::Tensor>{at::randn({7, 64}, bf16), at::randn({64}, bf16),
                                   at::randn({64, 7}, bf16).t()};
  };
  std::vector<at::Tensor> held = make_inputs();
  const at::Tensor before = held[0].clone();
  at::Tensor kept = kernel.run(held)[0];
  EXPECT_NE(kept.data_ptr(), held[0].data_ptr());
  EXPECT_TRUE(at::equal(held[0], before));
  EXPECT_EQ(kernel.num_in_place_outputs(), 0u);

  std::vector<at::Tensor> moved = make_inputs();
  const std::vector<c10::IValue> copies = {moved[0].clone(), moved[1], moved[2]};
  const void* first = moved[0].data_ptr();
  at::Tensor got = kernel.run(std::move(moved))[0];
  EXPECT_EQ(got.data_ptr(), first);
  EXPECT_EQ(kernel.num_in_place_outputs(), 1u);
  EXPECT_TRUE(at::equal(got, reference.run(copies)[0].toTensor()));
}

INSTANTIATE_TEST_SUITE_P(Golden, PrintedKernel, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace magi::test

// The multiply-and-shift division of the generated kernels' index arithmetic against integer
// division: small divisors exhaustively at their edges, random ones anywhere up to 2^31, and
// the largest dividends.
TEST(DivisionConstants, MultiplyAndShiftDividesExactlyBelowTwoToThe31) {
  std::mt19937_64 rng(20261124);
  std::vector<int64_t> divisors = {1,
                                   2,
                                   3,
                                   7,
                                   64,
                                   127,
                                   128,
                                   129,
                                   4095,
                                   4096,
                                   8192,
                                   65535,
                                   (int64_t{1} << 30) + 1,
                                   (int64_t{1} << 31) - 1,
                                   int64_t{1} << 31};
  for (int64_t d = 1; d <= 2048; ++d) divisors.push_back(d);
  for (int i = 0; i < 2000; ++i) divisors.push_back(1 + static_cast<int64_t>(rng() % (1u << 31)));
  const uint64_t top = (uint64_t{1} << 31) - 1;
  for (int64_t d : divisors) {
    unsigned magic = 0, shift = 0;
    magi::runtime::division_constants(d, magic, shift);
    std::vector<uint64_t> dividends = {0, 1, top, top - 1};
    for (uint64_t k : {1, 2, 3, 1000}) {
      if (k * d - 1 <= top) dividends.insert(dividends.end(), {k * d - 1, k * d});
    }
    for (int i = 0; i < 64; ++i) dividends.push_back(rng() % (top + 1));
    for (uint64_t n : dividends) {
      if (n > top) continue;
      const uint64_t high = (n * magic) >> 32;
      const uint64_t q = ((high + n) & 0xffffffffu) >> shift;
      ASSERT_EQ(q, n / static_cast<uint64_t>(d)) << n << " / " << d;
    }
  }
}
