// fused_pointwise_silu_mul_clg_v1_r2n: pointwise kernel fusing aten::add.Tensor aten::silu aten::mul.Tensor
//   from model.py:20 in forward
//   from model.py:21 in forward
// input access: in0=c in1=l in2=g, vector width 1
extern "C" void fused_pointwise_silu_mul_clg_v1_r2n(const MagiArgs* a) {
  typedef float A;
  constexpr int V = 1;
  constexpr int R = 2;
  constexpr bool kNarrow = true;
  const magi_bf16* __restrict__ in0 = static_cast<const magi_bf16*>(a->ptr[0]);
  const magi_bf16* __restrict__ in1 = static_cast<const magi_bf16*>(a->ptr[1]);
  const magi_bf16* __restrict__ in2 = static_cast<const magi_bf16*>(a->ptr[2]);
  magi_bf16* __restrict__ out0 = static_cast<magi_bf16*>(a->ptr[3]);
  const long long cols = a->cols;
  const long long rows = a->rows;
  (void)cols;
  (void)rows;
#pragma omp parallel for schedule(static) if (a->numel > 32768)
  for (long long row_index = 0; row_index < rows; ++row_index) {
    const long long row_start = row_index * cols;
    const MagiRowAt<R, kNarrow> ri((*a), row_index);
    const int ro2 = ri.offset((*a), 2);
    (void)ro2;
    for (long long col_base = 0; col_base < cols; col_base += V) {
      const long long base = row_start + col_base;
      A t0[V];
      for (int j = 0; j < V; ++j) t0[j] = magi_to_acc<A>(in0[base + j]);
      A t1[V];
      for (int j = 0; j < V; ++j) t1[j] = magi_to_acc<A>(in1[col_base + j]);
      A t2[V];
      { const long long off = ro2 + (col_base) * static_cast<int>((*a).strides[2][R - 1]); const long long step = (*a).strides[2][R - 1]; for (int j = 0; j < V; ++j) t2[j] = magi_to_acc<A>(in2[off + j * step]); }
      A o0[V];
      for (int j = 0; j < V; ++j) {
        const A e0 = t0[j];
        const A e1 = t1[j];
        const A e2 = t2[j];
        const A e4 = (e0 + e1);  // aten::add.Tensor @ model.py:20 in forward
        const A e5 = magi_round_bf16(e4);  // aten::add.Tensor @ model.py:20 in forward
        const A e6 = magi_silu(e5);  // aten::silu @ model.py:20 in forward
        const A e7 = magi_round_bf16(e6);  // aten::silu @ model.py:20 in forward
        const A e8 = (e7 * e2);  // aten::mul.Tensor @ model.py:21 in forward
        o0[j] = e8;
      }
      for (int j = 0; j < V; ++j) out0[base + j] = MagiStore<magi_bf16>::from(o0[j]);
    }
  }
}
