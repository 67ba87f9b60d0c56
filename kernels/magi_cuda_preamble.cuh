// Device helpers included at the top of every generated CUDA kernel (embedded as a string,
// compiled by NVRTC). Deliberately self-contained: our own bf16/fp16 conversions instead of
// cuda_bf16.h/cuda_fp16.h keep each compile small and fast.
#pragma once

#include "magi_kernel_abi.h"  // MagiArgs, the one argument of every kernel

struct magi_bf16 {
  unsigned short x;
};
struct magi_f16 {
  unsigned short x;
};

__device__ __forceinline__ float magi_bf16_to_float(unsigned short h) {
  return __uint_as_float(static_cast<unsigned>(h) << 16);
}
__device__ __forceinline__ unsigned short magi_float_to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));  // one instruction on sm_80+
  return h;
#else
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return static_cast<unsigned short>(u >> 16);
#endif
}
__device__ __forceinline__ float magi_f16_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short magi_float_to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// A column index clamped to [0, cols): loads of a cat's pieces at their column offsets.
__device__ __forceinline__ long long magi_col(long long c, long long cols) {
  return c < 0 ? 0 : (c >= cols ? cols - 1 : c);
}

// Loads convert to the accumulation type, stores convert back.
template <typename A>
__device__ __forceinline__ A magi_to_acc(float v) {
  return static_cast<A>(v);
}
template <typename A>
__device__ __forceinline__ A magi_to_acc(double v) {
  return static_cast<A>(v);
}
template <typename A>
__device__ __forceinline__ A magi_to_acc(bool v) {
  return v ? A(1) : A(0);
}
template <typename A>
__device__ __forceinline__ A magi_to_acc(magi_bf16 v) {
  return static_cast<A>(magi_bf16_to_float(v.x));
}
template <typename A>
__device__ __forceinline__ A magi_to_acc(magi_f16 v) {
  return static_cast<A>(magi_f16_to_float(v.x));
}

// The bf16 value in half `j & 1` of word `w` (half 0 the low one), as a float: one instruction
// (a shift or a mask), where extracting the 16-bit value first and then shifting it took two.
// Row kernels read each held element once per pass, and on GPUs with many bytes per SM cycle
// they are bound by instruction issue: reading bf16 from words takes a tenth of the LayerNorm
// kernel's instructions off.
__device__ __forceinline__ float magi_bf16_half(unsigned w, int j) {
  return __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
}

template <typename X, typename Y>
struct MagiSame {
  static constexpr bool value = false;
};
template <typename X>
struct MagiSame<X, X> {
  static constexpr bool value = true;
};

template <typename T>
struct MagiStore;
template <>
struct MagiStore<float> {
  template <typename A>
  __device__ static float from(A v) {
    return static_cast<float>(v);
  }
};
template <>
struct MagiStore<double> {
  template <typename A>
  __device__ static double from(A v) {
    return static_cast<double>(v);
  }
};
template <>
struct MagiStore<magi_bf16> {
  template <typename A>
  __device__ static magi_bf16 from(A v) {
    return {magi_float_to_bf16(static_cast<float>(v))};
  }
};
template <>
struct MagiStore<magi_f16> {
  template <typename A>
  __device__ static magi_f16 from(A v) {
    return {magi_float_to_f16(static_cast<float>(v))};
  }
};

// v rounded to bf16, as a float. With v in the upper half of cvt.rn.bf16x2.f32 (and 0 in the
// lower), the word is exactly the rounded float's bits: one ALU instruction (F2FP), where the
// single conversion runs on the quarter-rate conversion pipe (F2F) and needs a shift after.
// Rotary embedding rounds three times per element, so this form matters to its speed.
__device__ __forceinline__ float magi_round_bf16_float(float v) {
#if __CUDA_ARCH__ >= 800
  unsigned w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(v), "f"(0.0f));
  return __uint_as_float(w);
#else
  return magi_bf16_to_float(magi_float_to_bf16(v));
#endif
}
template <typename A>
__device__ __forceinline__ A magi_round_bf16(A v) {
  return static_cast<A>(magi_round_bf16_float(static_cast<float>(v)));
}
template <typename A>
__device__ __forceinline__ A magi_round_f16(A v) {
  return static_cast<A>(magi_f16_to_float(magi_float_to_f16(static_cast<float>(v))));
}

// L2 eviction policies (sm_80+) for loads that say how long their lines should stay.
__device__ __forceinline__ unsigned long long magi_l2_evict_last() {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ unsigned long long magi_l2_evict_first() {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// One 16-byte load. The variant's vector I/O (codegen::vector_io_for, a define ahead of this
// preamble) picks how: with the streaming hint (MAGI_VECTOR_IO_CS: evict first, since each
// byte is read once) or under an L2 evict_last policy without L1 allocation
// (MAGI_VECTOR_IO_L2LAST: rows held in registers and reduced once, as torch.compile's norm
// kernels read them). kKeep loads go through the read-only path instead: data every row reads
// again (a norm's weight and bias), and every load of a pointwise kernel: the hint slowed
// pointwise kernels whose inputs were not the tensors another kernel had just read, while row
// kernels gain from it.
template <bool kKeep = false>
__device__ __forceinline__ uint4 magi_load16(const void* p) {
  if constexpr (kKeep) return __ldg(reinterpret_cast<const uint4*>(p));
#if defined(MAGI_VECTOR_IO_L2LAST)
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "l"(magi_l2_evict_last()));
  return r;
#else
  return __ldcs(reinterpret_cast<const uint4*>(p));
#endif
}

// Vector loads/stores of V elements: 16-byte transactions when the bytes allow it.
template <typename A, typename T, int V, bool kKeep = false>
__device__ __forceinline__ void magi_load(const T* __restrict__ p, A* out) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * V;
  if constexpr (kBytes % 16 == 0) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < kBytes / 16; ++c) {
      const uint4 raw = magi_load16<kKeep>(reinterpret_cast<const uint4*>(p) + c);
      if constexpr (MagiSame<T, magi_bf16>::value) {
        const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < kPer; ++j)
          out[c * kPer + j] = static_cast<A>(magi_bf16_half(w[j >> 1], j));
      } else {
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int j = 0; j < kPer; ++j) out[c * kPer + j] = magi_to_acc<A>(e[j]);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = magi_to_acc<A>(p[j]);
  }
}

// A plain (write-back, weak) 16-byte store, written out in PTX as __stcs is: assigned through a
// uint4*, the compiler (sm_90, CUDA 13) split half the stores of the RMSNorm kernel into four
// 4-byte stores, and __stwb compiles to a strong store (STG.E.128.STRONG.SM), where this gives
// the STG.E.128 torch.compile's kernels use.
__device__ __forceinline__ void magi_store16_plain(void* p, uint4 v) {
  asm("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
      : "memory");
}

// One 16-byte store of four words. Built from words rather than from converted elements:
// given a uint4 filled element by element, the compiler sometimes split the store into four
// 4-byte stores. Streaming (evict-first) under MAGI_VECTOR_IO_CS, except kKeep stores: outputs
// that a matmul or attention kernel reads next, which then finds them in L2. Plain under
// MAGI_VECTOR_IO_L2LAST.
template <bool kKeep = false>
__device__ __forceinline__ void magi_store16(void* p, unsigned a, unsigned b, unsigned c,
                                             unsigned d) {
  uint4 v;
  v.x = a;
  v.y = b;
  v.z = c;
  v.w = d;
#if defined(MAGI_VECTOR_IO_L2LAST)
  magi_store16_plain(p, v);
#else
  if constexpr (kKeep) {
    magi_store16_plain(p, v);
  } else {
    __stcs(reinterpret_cast<uint4*>(p), v);  // streaming: evict first
  }
#endif
}

// Two 16-bit values packed in a word, `lo` in its low half: one conversion instruction for both
// on sm_80+ (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32, rounding as the single conversions do).
template <typename T>
__device__ __forceinline__ unsigned magi_pack2(float lo, float hi) {
  return static_cast<unsigned>(MagiStore<T>::from(lo).x) |
         (static_cast<unsigned>(MagiStore<T>::from(hi).x) << 16);
}
#if __CUDA_ARCH__ >= 800
template <>
__device__ __forceinline__ unsigned magi_pack2<magi_bf16>(float lo, float hi) {
  unsigned w;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
}
template <>
__device__ __forceinline__ unsigned magi_pack2<magi_f16>(float lo, float hi) {
  unsigned w;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
}
#endif

// Packed bf16 pairs (KernelVariant::packed_bf16): 16 bytes as four words, and products, sums
// and differences of two pairs rounded once to bf16 (fma.rn.bf16x2, sm_80+), which is what
// rounding the float result of two bf16 values gives.
template <bool kKeep = false, typename T>
__device__ __forceinline__ void magi_load_words(const T* __restrict__ p, unsigned* w) {
  const uint4 r = magi_load16<kKeep>(p);
  w[0] = r.x;
  w[1] = r.y;
  w[2] = r.z;
  w[3] = r.w;
}
__device__ __forceinline__ unsigned magi_bf16x2_fma(unsigned a, unsigned b, unsigned c) {
#if __CUDA_ARCH__ >= 800
  unsigned d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else  // in float, rounded once more to bf16: the float body's results for the uses below
  return magi_pack2<magi_bf16>(magi_bf16_half(a, 0) * magi_bf16_half(b, 0) + magi_bf16_half(c, 0),
                               magi_bf16_half(a, 1) * magi_bf16_half(b, 1) + magi_bf16_half(c, 1));
#endif
}
__device__ __forceinline__ unsigned magi_bf16x2_mul(unsigned a, unsigned b) {
  return magi_bf16x2_fma(a, b, 0x80008000u);  // + (-0): a product of -0 stays -0
}
__device__ __forceinline__ unsigned magi_bf16x2_add(unsigned a, unsigned b) {
  return magi_bf16x2_fma(a, 0x3f803f80u, b);  // a * 1 + b
}
__device__ __forceinline__ unsigned magi_bf16x2_sub(unsigned a, unsigned b) {
  return magi_bf16x2_fma(b, 0xbf80bf80u, a);  // b * -1 + a
}

template <typename A, typename T, int V, bool kKeep = false>
__device__ __forceinline__ void magi_store(T* __restrict__ p, const A* in) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * V;
  if constexpr (kBytes % 16 == 0 && sizeof(T) == 2) {  // 16-bit values, two to a word
#pragma unroll
    for (int c = 0; c < kBytes / 16; ++c) {
      unsigned w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        w[q] = magi_pack2<T>(static_cast<float>(in[c * 8 + 2 * q]),
                             static_cast<float>(in[c * 8 + 2 * q + 1]));
      }
      magi_store16<kKeep>(p + c * 8, w[0], w[1], w[2], w[3]);
    }
  } else if constexpr (kBytes % 16 == 0) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < kBytes / 16; ++c) {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int j = 0; j < kPer; ++j) e[j] = MagiStore<T>::from(in[c * kPer + j]);
      magi_store16<kKeep>(p + c * kPer, raw.x, raw.y, raw.z, raw.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = MagiStore<T>::from(in[j]);
  }
}

// V elements kept in their storage type (a row cached in registers costs half the registers
// in bf16/fp16 than converted to float); converted to the accumulation type where read.
template <typename T, int V>
struct alignas(sizeof(T) * V >= 16 ? 16 : alignof(T)) MagiVec {
  T v[V];
};
// Element j (a constant once the caller's lane loop unrolls) of `c` in the accumulation type.
template <typename A, typename T, int V>
__device__ __forceinline__ A magi_vec_get(const MagiVec<T, V>& c, int j) {
  if constexpr (MagiSame<T, magi_bf16>::value && V % 8 == 0) {  // 16-byte aligned words
    unsigned w;  // copied, not read through a cast: the elements may have been written one by one
    memcpy(&w, c.v + (j & ~1), sizeof(w));
    return static_cast<A>(magi_bf16_half(w, j));
  } else {
    return magi_to_acc<A>(c.v[j]);
  }
}

template <bool kKeep = false, typename T, int V>
__device__ __forceinline__ void magi_load_raw(const T* __restrict__ p, MagiVec<T, V>& out) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * V;
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int c = 0; c < kBytes / 16; ++c) {
      reinterpret_cast<uint4*>(out.v)[c] =
          magi_load16<kKeep>(reinterpret_cast<const uint4*>(p) + c);
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = p[j];
  }
}

// magi_load_raw under an L2 eviction policy (16-byte vectors; other widths load plainly).
// kLast marks the row's last read (the output pass, whose policy is evict_first); the load
// itself is the same.
template <bool kLast = false, typename T, int V>
__device__ __forceinline__ void magi_load_raw_hint(const T* __restrict__ p, MagiVec<T, V>& out,
                                                   unsigned long long policy) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * V;
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int c = 0; c < kBytes / 16; ++c) {
      uint4& raw = reinterpret_cast<uint4*>(out.v)[c];
      asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
          : "l"(reinterpret_cast<const uint4*>(p) + c), "l"(policy));
    }
  } else {
    magi_load_raw(p, out);
  }
}

// V elements from base + off, `step` apart: one vector load when they are adjacent and the
// address is aligned (a broadcast operand whose last dim is contiguous), else V loads.
template <typename A, typename T, int V, bool kKeep = false>
__device__ __forceinline__ void magi_load_strided(const T* __restrict__ base, long long off,
                                                  long long step, A* out) {
  const T* p = base + off;
  if (step == 1 && reinterpret_cast<unsigned long long>(p) % (sizeof(T) * V) == 0) {
    magi_load<A, T, V, kKeep>(p, out);
    return;
  }
#pragma unroll
  for (int j = 0; j < V; ++j) out[j] = magi_to_acc<A>(base[off + j * step]);
}

// First statement of every generated kernel. A kernel launched as a programmatic dependent of
// the stream's previous kernel (sm_90+) may start while that kernel's last
// blocks still run; this waits until it has finished and its writes are visible. Without
// that launch attribute it returns at once.
__device__ __forceinline__ void magi_wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// n / d for n < 2^31 by the host's multiply-and-shift constants of d (see MagiArgs).
__device__ __forceinline__ unsigned magi_udiv(unsigned n, unsigned magic, unsigned shift) {
  return (__umulhi(n, magic) + n) >> shift;
}

// Linear index `i` divided by, and modulo, the row length. Index spaces under 2^31 elements
// (nearly all) divide by multiply and shift: a 64-bit division is a long instruction sequence,
// and a pointwise kernel that divides per vector ran compute-bound.
__device__ __forceinline__ long long magi_div_cols(const MagiArgs& a, long long i) {
  if (a.numel <= 0x7fffffffLL)
    return magi_udiv(static_cast<unsigned>(i), a.cols_magic, a.cols_shift);
  return i / a.cols;
}
__device__ __forceinline__ long long magi_mod_cols(const MagiArgs& a, long long i) {
  return i - magi_div_cols(a, i) * a.cols;
}

// Element offset of linear index `i` of the index space in input `k` (general strides).
__device__ __forceinline__ long long magi_offset(const MagiArgs& a, int k, long long i) {
  long long off = 0;
  if (a.numel <= 0x7fffffffLL) {
    unsigned u = static_cast<unsigned>(i);
    for (long long d = a.rank - 1; d >= 0; --d) {
      const unsigned q = magi_udiv(u, a.div_magic[d], a.div_shift[d]);
      off += static_cast<long long>(u - q * static_cast<unsigned>(a.sizes[d])) * a.strides[k][d];
      u = q;
    }
    return off;
  }
  for (long long d = a.rank - 1; d >= 0; --d) {
    long long s = a.sizes[d];
    off += (i % s) * a.strides[k][d];
    i /= s;
  }
  return off;
}

// The coordinates of row `row` of a rank-R index space (dims 0..R-2; dim R-1 is the columns),
// and from them the offset of the row in each strided input. Row and pointwise kernels with
// strided inputs decompose a row once and every strided input adds its own strides: one
// division chain per row instead of one per input and load. R is a constant of the kernel
// (KernelVariant::index_rank), so the loops unroll; kNarrow (every row index and offset under
// 2^31) makes the arithmetic 32-bit, dividing by multiply and shift.
template <bool kNarrow>
struct MagiIndexType {
  typedef long long T;
};
template <>
struct MagiIndexType<true> {
  typedef unsigned T;
};
template <int R, bool kNarrow>
struct MagiRowAt {
  typedef typename MagiIndexType<kNarrow>::T T;
  T c[R > 1 ? R - 1 : 1];
  __device__ __forceinline__ MagiRowAt(const MagiArgs& a, long long row) {
    T u = static_cast<T>(row);
#pragma unroll
    for (int d = R - 2; d > 0; --d) {
      T q;
      if constexpr (kNarrow) {
        q = magi_udiv(u, a.div_magic[d], a.div_shift[d]);
      } else {
        q = u / a.sizes[d];
      }
      c[d] = u - q * static_cast<T>(a.sizes[d]);
      u = q;
    }
    c[0] = u;  // the outermost coordinate: the row index is below the product of the sizes
  }
  __device__ __forceinline__ long long offset(const MagiArgs& a, int k) const {
    T off = 0;
#pragma unroll
    for (int d = 0; d < R - 1; ++d) off += c[d] * static_cast<T>(a.strides[k][d]);
    return static_cast<long long>(off);
  }
};

// Scalar math, overloaded for float and double.
template <typename A>
__device__ __forceinline__ A magi_rsqrt(A x) {
  return rsqrt(x);
}
template <typename A>
__device__ __forceinline__ A magi_sigmoid(A x) {
  return A(1) / (A(1) + exp(-x));
}
template <typename A>
__device__ __forceinline__ A magi_silu(A x) {
  return x / (A(1) + exp(-x));
}
template <typename A>
__device__ __forceinline__ A magi_relu(A x) {
  return x > A(0) ? x : A(0);
}
template <typename A>
__device__ __forceinline__ A magi_gelu(A x) {
  return A(0.5) * x * (A(1) + erf(x * A(0.70710678118654752440)));
}
template <typename A>
__device__ __forceinline__ A magi_gelu_tanh(A x) {
  const A k = A(0.79788456080286535588);  // sqrt(2/pi)
  return A(0.5) * x * (A(1) + tanh(k * (x + A(0.044715) * x * x * x)));
}
// Fast forms, used when every output of a kernel is bf16/fp16: their error (a few float ulps)
// is far below the output's rounding step. Without --use_fast_math, __expf and __fdividef
// compile to their subnormal-safe sequences (about five instructions each around the one that
// computes); these take one. exp flushes results below 2^-126 to zero (ex2.approx.ftz; a bf16
// output would have kept a subnormal there, an f16 one has none so small). The reciprocal keeps
// subnormal results (rcp.approx.f32), so x * (1 / y) is right for divisors up to the largest
// float (__fdividef gave 0 above 2^126); a subnormal divisor, whose reciprocal overflows, is
// scaled by 2^64 first and the quotient by 2^64 after. A divisor shared by a row's elements is
// inverted once: the asm statements are pure, so the compiler computes one of them once per
// distinct operand.
constexpr float kMagiLog2e = 1.44269504088896340736f;
__device__ __forceinline__ float magi_ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float magi_frcp(float x) {
  float y;
  asm("rcp.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float magi_fexp(float x) { return magi_ex2_ftz(x * kMagiLog2e); }
__device__ __forceinline__ float magi_flog(float x) { return __logf(x); }
__device__ __forceinline__ float magi_fdiv(float x, float y) {
  const float s = fabsf(y) < 0x1p-126f ? 0x1p64f : 1.0f;
  return x * magi_frcp(y * s) * s;
}
// Their divisor, 1 + exp(-x), is at least 1: its reciprocal needs no scaling.
__device__ __forceinline__ float magi_fsigmoid(float x) { return magi_frcp(1.0f + magi_fexp(-x)); }
__device__ __forceinline__ float magi_fsilu(float x) { return x * magi_frcp(1.0f + magi_fexp(-x)); }
template <typename A>
__device__ __forceinline__ A magi_max(A a, A b) {
  return (a != a || a > b) ? a : b;
}  // NaN-propagating
template <typename A>
__device__ __forceinline__ A magi_min(A a, A b) {
  return (a != a || a < b) ? a : b;
}
#if __CUDA_ARCH__ >= 800
// One instruction that propagates NaN (max.NaN) instead of two comparisons and a select.
template <>
__device__ __forceinline__ float magi_max<float>(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
template <>
__device__ __forceinline__ float magi_min<float>(float a, float b) {
  float d;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
#endif

// Block-wide reductions; every thread gets the result. `scratch` holds 32 values.
template <typename A, typename F>
__device__ __forceinline__ A magi_block_reduce(A v, F combine, A* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < warps; ++w) v = combine(v, scratch[w]);
  return v;
}

// A reduction over one row held by blockDim.x (a power of two, at most 32) adjacent lanes of a
// warp, blockDim.y rows per block: shuffles within the row's lanes, no shared memory.
template <typename A, typename F>
__device__ __forceinline__ A magi_warp_row_reduce(A v, F combine) {
  for (int o = blockDim.x >> 1; o > 0; o >>= 1) {
    v = combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;
}

template <typename A>
__device__ __forceinline__ A magi_inf();
template <>
__device__ __forceinline__ float magi_inf<float>() {
  return __int_as_float(0x7f800000);
}
template <>
__device__ __forceinline__ double magi_inf<double>() {
  return __longlong_as_double(0x7ff0000000000000LL);
}
