// bfloat16 <-> float32 for the CPU kernels (kernels/cpu_fused.cpp, kernels/cpu_attention.cpp),
// which keep their arithmetic in float32 and read or write bf16 where a tensor is bf16; and
// the float vector ops the kernels' vector paths share (Vec, below).
// A bf16 value is a float's high 16 bits: widening is exact; narrowing rounds to nearest
// even as torch's .to(torch.bfloat16) does (c10's round_to_nearest_even), NaN kept NaN.
// Part of each including kernel's build fingerprint (kernels/cpu_build.py: HEADERS).
#pragma once

#include <c10/util/BFloat16.h>

#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// SLEEF's 1-ulp float exp, as ATen's own vectorized exp (and so SDPA's flash kernel)
// uses on AVX-512 (AVX2); exported by libtorch_cpu, which every extension links.
#if defined(__AVX512F__)
extern "C" __m512 Sleef_expf16_u10(__m512);
#elif defined(__AVX2__)
extern "C" __m256 Sleef_expf8_u10(__m256);
#endif

namespace kvscope_bf16 {

using bf16 = c10::BFloat16;

inline float widen(float v) { return v; }
inline float widen(bf16 v) { return static_cast<float>(v); }

template <typename T>
inline T narrow(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return bf16(v);
}

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(bf16* p, __m512 v) {  // round_to_nearest_even, 16 at a time
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));  // NaN
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
#elif defined(__AVX2__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(bf16* p, __m256 v) {  // round_to_nearest_even, 8 at a time
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));  // NaN
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
#endif

// The float vector ops of the kernels' vector paths (kernels/cpu_attention.cpp,
// kernels/cpu_linear.cpp), one lane count per build: 16 floats (AVX-512, 32 registers) or
// 8 (AVX2 with FMA, 16 registers); KVSCOPE_VEC is defined where there is one.
#if defined(__AVX512F__)
#define KVSCOPE_VEC 16
struct Vec {
  using T = __m512;
  static constexpr int W = 16, kAccumulators = 16;  // what stays in registers
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static T load(const bf16* p) { return load16(p); }
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float v) { return _mm512_set1_ps(v); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T neg(T a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.f)); }  // the sign bit flipped, as ATen's
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T exp(T a) { return Sleef_expf16_u10(a); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static float sum(T a) { return _mm512_reduce_add_ps(a); }
  static float reduce_max(T a) { return _mm512_reduce_max_ps(a); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static void store(bf16* p, T v) { store16(p, v); }
  // p[0..n), n < W: loaded with zeros after; stored; v with its lanes from n on zeroed
  static __mmask16 first(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }
  static T load_first(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store_first(float* p, int64_t n, T v) { _mm512_mask_storeu_ps(p, first(n), v); }
  static T keep_first(T v, int64_t n) { return _mm512_maskz_mov_ps(first(n), v); }
};
#elif defined(__AVX2__) && defined(__FMA__)
#define KVSCOPE_VEC 8
struct Vec {
  using T = __m256;
  static constexpr int W = 8, kAccumulators = 8;
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static T load(const bf16* p) { return load8(p); }
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float v) { return _mm256_set1_ps(v); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T neg(T a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.f)); }  // the sign bit flipped, as ATen's
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T exp(T a) { return Sleef_expf8_u10(a); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static float reduce_max(T a) {
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)));
  }
  static float sum(T a) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
  }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static void store(bf16* p, T v) { store8(p, v); }
  static __m256i first(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static T load_first(const float* p, int64_t n) { return _mm256_maskload_ps(p, first(n)); }
  static void store_first(float* p, int64_t n, T v) { _mm256_maskstore_ps(p, first(n), v); }
  static T keep_first(T v, int64_t n) { return _mm256_and_ps(v, _mm256_castsi256_ps(first(n))); }
};
#endif

}  // namespace kvscope_bf16
