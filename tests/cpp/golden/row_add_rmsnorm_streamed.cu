// fused_row_add_rmsnorm_streamed_ccl_v8_s: row kernel fusing aten::add.Tensor aten::_to_copy aten::pow.Tensor_Scalar aten::mean.dim aten::add.Tensor aten::rsqrt aten::mul.Tensor aten::mul.Tensor aten::_to_copy
//   from model.py:30 in forward
//   from model.py:31 in forward
//   from model.py:32 in forward
//   from model.py:33 in forward
//   from model.py:34 in forward
// input access: in0=c in1=c in2=l, vector width 8
extern "C" __global__ void __launch_bounds__(512) fused_row_add_rmsnorm_streamed_ccl_v8_s(const MagiArgs a) {
  magi_wait_for_prior_grids();
  typedef float A;
  constexpr int V = 8;
  const magi_bf16* __restrict__ in0 = static_cast<const magi_bf16*>(a.ptr[0]);
  const magi_bf16* __restrict__ in1 = static_cast<const magi_bf16*>(a.ptr[1]);
  const float* __restrict__ in2 = static_cast<const float*>(a.ptr[2]);
  magi_bf16* __restrict__ out0 = static_cast<magi_bf16*>(a.ptr[3]);
  magi_bf16* __restrict__ out1 = static_cast<magi_bf16*>(a.ptr[4]);
  const long long cols = a.cols;
  const long long rows = a.rows;
  (void)cols;
  (void)rows;
  constexpr int K = 2;
  __shared__ A scratch[32];
  // Rows longer than the block holds in registers: streamed once per pass.
  const unsigned long long keep = magi_l2_evict_last(), drop = magi_l2_evict_first();
  (void)keep;
  (void)drop;
  for (long long row = blockIdx.x; row < a.rows; row += gridDim.x) {
    A acc12 = A(0);  // aten::mean.dim @ model.py:32 in forward
    for (long long step = (long long)threadIdx.x * V; step < cols; step += (long long)blockDim.x * V * K) {
      MagiVec<magi_bf16, V> s0[K];
      MagiVec<magi_bf16, V> s1[K];
      #pragma unroll
      for (int k = 0; k < K; ++k) {
        const long long col0 = step + (long long)k * blockDim.x * V;
        if (col0 < cols) {
          magi_load_raw_hint(in0 + row * cols + col0, s0[k], keep);
          magi_load_raw_hint(in1 + row * cols + col0, s1[k], keep);
        }
      }
      #pragma unroll
      for (int k = 0; k < K; ++k) {
        const long long col0 = step + (long long)k * blockDim.x * V;
        if (col0 < cols) {
          _Pragma("unroll") for (int j = 0; j < V; ++j) {
            const A e0 = magi_vec_get<A>(s0[k], j);
            const A e1 = magi_vec_get<A>(s1[k], j);
            const A e4 = (e0 + e1);  // aten::add.Tensor @ model.py:30 in forward
            const A e5 = magi_round_bf16(e4);  // aten::add.Tensor @ model.py:30 in forward
            const A e10 = (e5 * e5);  // aten::pow.Tensor_Scalar @ model.py:32 in forward
            acc12 = acc12 + e10;
          }
        }
      }
    }
    const A r12 = magi_block_reduce<A>(acc12, [](A x, A y) { return x + y; }, scratch);
    const A r14 = magi_fdiv(r12, A(cols));  // aten::mean.dim @ model.py:32 in forward
    const A r17 = (r14 + A(9.9999999999999995e-07));  // aten::add.Tensor @ model.py:33 in forward
    const A r18 = magi_rsqrt(r17);  // aten::rsqrt @ model.py:33 in forward
    for (long long step = (long long)threadIdx.x * V; step < cols; step += (long long)blockDim.x * V * K) {
      MagiVec<magi_bf16, V> s0[K];
      MagiVec<magi_bf16, V> s1[K];
      MagiVec<float, V> s2[K];
      #pragma unroll
      for (int k = 0; k < K; ++k) {
        const long long col0 = step + (long long)k * blockDim.x * V;
        if (col0 < cols) {
          magi_load_raw_hint<true>(in0 + row * cols + col0, s0[k], drop);
          magi_load_raw_hint<true>(in1 + row * cols + col0, s1[k], drop);
          magi_load_raw_hint(in2 + col0, s2[k], keep);
        }
      }
      #pragma unroll
      for (int k = 0; k < K; ++k) {
        const long long col0 = step + (long long)k * blockDim.x * V;
        if (col0 < cols) {
          A o0[V];
          A o1[V];
          _Pragma("unroll") for (int j = 0; j < V; ++j) {
            const A e0 = magi_vec_get<A>(s0[k], j);
            const A e1 = magi_vec_get<A>(s1[k], j);
            const A e2 = magi_vec_get<A>(s2[k], j);
            const A e4 = (e0 + e1);  // aten::add.Tensor @ model.py:30 in forward
            const A e5 = magi_round_bf16(e4);  // aten::add.Tensor @ model.py:30 in forward
            const A e19 = (e5 * r18);  // aten::mul.Tensor @ model.py:33 in forward
            const A e20 = (e19 * e2);  // aten::mul.Tensor @ model.py:34 in forward
            o0[j] = e20;
            o1[j] = e4;
          }
          magi_store<A, magi_bf16, V>(out0 + row * cols + col0, o0);
          magi_store<A, magi_bf16, V>(out1 + row * cols + col0, o1);
        }
      }
    }
  }
}
