// Helpers included at the top of every generated C++ (CPU) kernel, compiled by the host
// compiler with OpenMP. Mirrors kernels/magi_cuda_preamble.cuh.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "magi_kernel_abi.h"  // MagiArgs, the one argument of every kernel

struct magi_bf16 {
  uint16_t x;
};
struct magi_f16 {
  uint16_t x;
};

static inline float magi_bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t magi_float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
static inline float magi_f16_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      u = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t magi_float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in half: round to nearest even
    float a;
    std::memcpy(&a, &abs, 4);
    float scaled = a * 16777216.0f;  // 2^24: half subnormal unit
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = (abs >> 23) - 127 + 15, mant = abs & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

template <typename A>
static inline A magi_to_acc(float v) {
  return static_cast<A>(v);
}
template <typename A>
static inline A magi_to_acc(double v) {
  return static_cast<A>(v);
}
template <typename A>
static inline A magi_to_acc(bool v) {
  return v ? A(1) : A(0);
}
template <typename A>
static inline A magi_to_acc(magi_bf16 v) {
  return static_cast<A>(magi_bf16_to_float(v.x));
}
template <typename A>
static inline A magi_to_acc(magi_f16 v) {
  return static_cast<A>(magi_f16_to_float(v.x));
}

template <typename T>
struct MagiStore;
template <>
struct MagiStore<float> {
  template <typename A>
  static float from(A v) {
    return static_cast<float>(v);
  }
};
template <>
struct MagiStore<double> {
  template <typename A>
  static double from(A v) {
    return static_cast<double>(v);
  }
};
template <>
struct MagiStore<magi_bf16> {
  template <typename A>
  static magi_bf16 from(A v) {
    return {magi_float_to_bf16(static_cast<float>(v))};
  }
};
template <>
struct MagiStore<magi_f16> {
  template <typename A>
  static magi_f16 from(A v) {
    return {magi_float_to_f16(static_cast<float>(v))};
  }
};

template <typename A>
static inline A magi_round_bf16(A v) {
  return static_cast<A>(magi_bf16_to_float(magi_float_to_bf16(static_cast<float>(v))));
}
template <typename A>
static inline A magi_round_f16(A v) {
  return static_cast<A>(magi_f16_to_float(magi_float_to_f16(static_cast<float>(v))));
}

// A column index clamped to [0, cols) (see the CUDA preamble).
static inline long long magi_col(long long c, long long cols) {
  return c < 0 ? 0 : (c >= cols ? cols - 1 : c);
}

static inline long long magi_offset(const MagiArgs& a, int k, long long i) {
  long long off = 0;
  for (long long d = a.rank - 1; d >= 0; --d) {
    long long s = a.sizes[d];
    off += (i % s) * a.strides[k][d];
    i /= s;
  }
  return off;
}

// Row coordinates and the strided inputs' row offsets (see the CUDA preamble; kNarrow is
// unused here, the host divides in 64 bits).
template <int R, bool kNarrow>
struct MagiRowAt {
  long long c[R > 1 ? R - 1 : 1];
  MagiRowAt(const MagiArgs& a, long long row) {
    for (int d = R - 2; d > 0; --d) {
      c[d] = row % a.sizes[d];
      row /= a.sizes[d];
    }
    c[0] = row;
  }
  long long offset(const MagiArgs& a, int k) const {
    long long off = 0;
    for (int d = 0; d < R - 1; ++d) off += c[d] * a.strides[k][d];
    return off;
  }
};

template <typename A>
static inline A magi_rsqrt(A x) {
  return A(1) / std::sqrt(x);
}
template <typename A>
static inline A magi_sigmoid(A x) {
  return A(1) / (A(1) + std::exp(-x));
}
template <typename A>
static inline A magi_silu(A x) {
  return x / (A(1) + std::exp(-x));
}
template <typename A>
static inline A magi_relu(A x) {
  return x > A(0) ? x : A(0);
}
template <typename A>
static inline A magi_gelu(A x) {
  return A(0.5) * x * (A(1) + std::erf(x * A(0.70710678118654752440)));
}
template <typename A>
static inline A magi_gelu_tanh(A x) {
  const A k = A(0.79788456080286535588);
  return A(0.5) * x * (A(1) + std::tanh(k * (x + A(0.044715) * x * x * x)));
}
// e^v for float without a libm call, so that the loops of the kernels using it vectorize (a
// call to expf keeps GCC's vectorizer out, and so do selects after the arithmetic: the special
// cases are blended in with bit masks). 2^k e^r with k = round(v / ln 2), r = v - k ln 2 (ln 2
// in a high part exact in k * ln2_hi and a low part, so r is near exact) and |r| <= ln2/2, e^r
// by its Taylor series to r^7 / 7! (truncation below 6e-9 relative); 2^k applied as
// 2^(k-1) * 2 so that k = 128 does not overflow the exponent field. Within 1e-7 of expf
// (relative) except below v = -86.6, where expf falls from 2.4e-38 to subnormals and this is
// zero. Infinities and NaN as expf.
static inline float magi_expf(float v) {
  const uint32_t above = 0u - static_cast<uint32_t>(v > 88.7228394f);
  const uint32_t below = 0u - static_cast<uint32_t>(v < -86.6f);
  const uint32_t nan = 0u - static_cast<uint32_t>(v != v);
  const uint32_t high = 0u - static_cast<uint32_t>(v > 88.7228394f);
  const uint32_t low = 0u - static_cast<uint32_t>(v < -86.6f);
  // v clamped to [-86.6, 88.7228394], NaN to 0: in range for the conversion to int (at the top,
  // where e^v passes the largest float, the last multiplication overflows to inf as expf does).
  const float c =
      __builtin_bit_cast(float, (__builtin_bit_cast(uint32_t, v) & ~(high | low | nan)) |
                                    (__builtin_bit_cast(uint32_t, 88.7228394f) & high) |
                                    (__builtin_bit_cast(uint32_t, -86.6f) & low));
  const float t = c * 1.44269504088896341f;
  const int32_t k = static_cast<int32_t>(t + std::copysign(0.5f, t));
  const float kf = static_cast<float>(k);
  const float r = (c - kf * 0.693145751953125f) - kf * 1.42860682030941723e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t scale = static_cast<uint32_t>(k + 126) << 23;  // 2^(k-1)
  uint32_t e = __builtin_bit_cast(uint32_t, p * __builtin_bit_cast(float, scale) * 2.0f);
  e = (e & ~above) | (0x7f800000u & above);  // +inf
  e &= ~below;                               // +0
  e = (e & ~nan) | (__builtin_bit_cast(uint32_t, v) & nan);
  return __builtin_bit_cast(float, e);
}
// The threads a row kernel's parallel loop may use, and the calling thread's number in it: the
// kernel allocates its kept values (a row of each per thread) before the loop.
static inline int magi_max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
static inline int magi_thread_num() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
// exp as kernels print it: magi_expf for float (bf16 and f16 compute in float), libm for double.
static inline float magi_exp(float v) { return magi_expf(v); }
static inline double magi_exp(double v) { return std::exp(v); }
// Float forms of the activations over magi_expf (the templates above serve double).
// tanh-GELU as x * sigmoid(2u): the same function as 0.5 x (1 + tanh(u)), without the
// cancellation of 1 + tanh(u) for negative u.
static inline float magi_sigmoid(float x) { return 1.0f / (1.0f + magi_expf(-x)); }
static inline float magi_silu(float x) { return x / (1.0f + magi_expf(-x)); }
// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)), with erfc(z) = t P(t) e^(-z^2), t = 1 / (1 + p z)
// for z = |x| / sqrt 2 (Abramowitz and Stegun 7.1.26, |error| <= 1.5e-7; ATen's vectorized erf
// is of this form too): 1 + erf is 2 - erfc(z) for x >= 0 and erfc(z) itself below, blended
// arithmetically (a select would keep the loop scalar), without cancellation in the tail.
static inline float magi_gelu(float x) {
  const float z = std::fabs(x) * 0.70710678118654752440f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  float q = 1.061405429f;
  q = q * t - 1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t - 0.284496736f;
  q = q * t + 0.254829592f;
  const float erfc_z = q * t * magi_expf(-z * z);
  const float positive = static_cast<float>(x >= 0.0f);
  return 0.5f * x * (erfc_z + positive * (2.0f - 2.0f * erfc_z));
}
static inline float magi_gelu_tanh(float x) {
  const float u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
  return x / (1.0f + magi_expf(-2.0f * u));
}
template <typename A>
static inline A magi_max(A a, A b) {
  return (a != a || a > b) ? a : b;
}
template <typename A>
static inline A magi_min(A a, A b) {
  return (a != a || a < b) ? a : b;
}
using std::abs;
using std::cos;
using std::erf;
using std::exp;
using std::expm1;
using std::log;
using std::log1p;
using std::sin;
using std::sqrt;
using std::tanh;
#include <limits>
template <typename A>
static inline A magi_inf() {
  return std::numeric_limits<A>::infinity();
}
// The reductions of host row kernels' `#pragma omp simd reduction(...)` for max and min: partial
// results combined by magi_max / magi_min, so that a NaN in any lane reaches the result.
#pragma omp declare reduction(magi_max:float                         \
                              : omp_out = magi_max(omp_out, omp_in)) \
    initializer(omp_priv = -magi_inf <float>())
#pragma omp declare reduction(magi_max:double                        \
                              : omp_out = magi_max(omp_out, omp_in)) \
    initializer(omp_priv = -magi_inf <double>())
#pragma omp declare reduction(magi_min:float                         \
                              : omp_out = magi_min(omp_out, omp_in)) \
    initializer(omp_priv = magi_inf <float>())
#pragma omp declare reduction(magi_min:double                        \
                              : omp_out = magi_min(omp_out, omp_in)) \
    initializer(omp_priv = magi_inf <double>())
using std::fabs;
