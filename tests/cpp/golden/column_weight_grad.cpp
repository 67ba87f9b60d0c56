// fused_column_weight_grad_ccl_v1: column kernel fusing aten::mul.Tensor aten::_to_copy aten::sum.dim_IntList aten::mul.Tensor aten::_to_copy
//   from model.py:40 in forward
//   from model.py:41 in forward
//   from model.py:42 in forward
// input access: in0=c in1=c in2=l, vector width 1
extern "C" void fused_column_weight_grad_ccl_v1(const MagiArgs* a) {
  typedef float A;
  constexpr int V = 1;
  const magi_bf16* __restrict__ in0 = static_cast<const magi_bf16*>(a->ptr[0]);
  const magi_bf16* __restrict__ in1 = static_cast<const magi_bf16*>(a->ptr[1]);
  const float* __restrict__ in2 = static_cast<const float*>(a->ptr[2]);
  magi_bf16* __restrict__ out0 = static_cast<magi_bf16*>(a->ptr[3]);
  magi_bf16* __restrict__ out1 = static_cast<magi_bf16*>(a->ptr[4]);
  const long long cols = a->cols;
  const long long rows = a->rows;
  (void)cols;
  (void)rows;
  constexpr long long TILE = 64;
  const long long tiles = (cols + TILE - 1) / TILE;
#pragma omp parallel for schedule(static) if (a->numel > 32768)
  for (long long tile = 0; tile < tiles; ++tile) {
    const long long c_begin = tile * TILE;
    const long long c_end = c_begin + TILE < cols ? c_begin + TILE : cols;
    A acc8[TILE];
    for (long long c = 0; c < TILE; ++c) acc8[c] = A(0);
    for (long long row = 0; row < rows; ++row) {
      for (long long col0 = c_begin; col0 < c_end; col0 += V) {
        A t2[V];
        {
          const long long row = 0;
          (void)row;
          for (int j = 0; j < V; ++j) t2[j] = magi_to_acc<A>(in2[col0 + j]);
        }
        A t0[V];
        for (int j = 0; j < V; ++j) t0[j] = magi_to_acc<A>(in0[row * cols + col0 + j]);
        A t1[V];
        for (int j = 0; j < V; ++j) t1[j] = magi_to_acc<A>(in1[row * cols + col0 + j]);
        A o1[V];
        for (int j = 0; j < V; ++j) {
          const A r2 = t2[j];
          const A e0 = t0[j];
          const A e1 = t1[j];
          const A e3 = (e0 * e1);  // aten::mul.Tensor @ model.py:40 in forward
          const A e4 = magi_round_bf16(e3);  // aten::mul.Tensor @ model.py:40 in forward
          acc8[col0 - c_begin + j] = acc8[col0 - c_begin + j] + e4;
          o1[j] = e3;
        }
        for (int j = 0; j < V; ++j) out1[row * cols + col0 + j] = MagiStore<magi_bf16>::from(o1[j]);
      }
    }
    for (long long col0 = c_begin; col0 < c_end; col0 += V) {
      A t2[V];
      {
        const long long row = 0;
        (void)row;
        for (int j = 0; j < V; ++j) t2[j] = magi_to_acc<A>(in2[col0 + j]);
      }
      A o0[V];
      for (int j = 0; j < V; ++j) {
        const A r2 = t2[j];
        const A r8 = acc8[col0 - c_begin + j];  // aten::sum.dim_IntList @ model.py:41 in forward
        const A r9 = (r8 * r2);  // aten::mul.Tensor @ model.py:42 in forward
        const A r12 = magi_round_bf16(r9);  // aten::_to_copy @ model.py:42 in forward
        o0[j] = r12;
      }
      for (int j = 0; j < V; ++j) out0[col0 + j] = MagiStore<magi_bf16>::from(o0[j]);
    }
  }
}
