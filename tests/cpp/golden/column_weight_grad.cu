// fused_column_weight_grad_ccl_v8: column kernel fusing aten::mul.Tensor aten::_to_copy aten::sum.dim_IntList aten::mul.Tensor aten::_to_copy
//   from model.py:40 in forward
//   from model.py:41 in forward
//   from model.py:42 in forward
// input access: in0=c in1=c in2=l, vector width 8
extern "C" __global__ void __launch_bounds__(256) fused_column_weight_grad_ccl_v8(const MagiArgs a) {
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
  const long long col0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * V;
  const bool active = col0 < cols;
  __shared__ A red[256 * V];
  A* const ws = static_cast<A*>(a.workspace);
  A t2[V];
  if (active) {
    const long long row = 0;
    (void)row;
    magi_load<A, float, 8, true>(in2 + col0, t2);
  }
  A acc8[V];
  if (a.phase == 0) {
    _Pragma("unroll") for (int j = 0; j < V; ++j) acc8[j] = A(0);
    if (active) {
#pragma unroll 4
      for (long long row = blockIdx.y * (long long)blockDim.y + threadIdx.y; row < rows;
           row += (long long)gridDim.y * blockDim.y) {
        A t0[V];
        magi_load<A, magi_bf16, 8>(in0 + row * cols + col0, t0);
        A t1[V];
        magi_load<A, magi_bf16, 8>(in1 + row * cols + col0, t1);
        A o1[V];
        _Pragma("unroll") for (int j = 0; j < V; ++j) {
          const A r2 = t2[j];
          const A e0 = t0[j];
          const A e1 = t1[j];
          const A e3 = (e0 * e1);  // aten::mul.Tensor @ model.py:40 in forward
          const A e4 = magi_round_bf16(e3);  // aten::mul.Tensor @ model.py:40 in forward
          acc8[j] = acc8[j] + e4;
          o1[j] = e3;
        }
        magi_store<A, magi_bf16, V>(out1 + row * cols + col0, o1);
      }
    }
    const int slot = (threadIdx.y * blockDim.x + threadIdx.x) * V;
    _Pragma("unroll") for (int j = 0; j < V; ++j) red[slot + j] = acc8[j];
    __syncthreads();
    if (threadIdx.y == 0) {
      _Pragma("unroll") for (int j = 0; j < V; ++j) {
        A t = red[threadIdx.x * V + j];
        for (int y = 1; y < blockDim.y; ++y) t = t + red[(y * blockDim.x + threadIdx.x) * V + j];
        acc8[j] = t;
      }
    }
    __syncthreads();
    if (threadIdx.y != 0 || !active) return;
    if (a.splits > 1) {
      _Pragma("unroll") for (int j = 0; j < V; ++j) ws[(0LL * a.splits + blockIdx.y) * cols + col0 + j] = acc8[j];
      return;
    }
  } else {
    if (threadIdx.y != 0 || !active) return;
    _Pragma("unroll") for (int j = 0; j < V; ++j) {
      const A* part = ws + 0LL * a.splits * cols + col0 + j;
      A t = part[0];
      for (long long split = 1; split < a.splits; ++split) t = t + part[split * cols];
      acc8[j] = t;
    }
  }
  A o0[V];
  _Pragma("unroll") for (int j = 0; j < V; ++j) {
    const A r2 = t2[j];
    const A r8 = acc8[j];  // aten::sum.dim_IntList @ model.py:41 in forward
    const A r9 = (r8 * r2);  // aten::mul.Tensor @ model.py:42 in forward
    const A r12 = magi_round_bf16(r9);  // aten::_to_copy @ model.py:42 in forward
    o0[j] = r12;
  }
  magi_store<A, magi_bf16, V>(out0 + col0, o0);
}
