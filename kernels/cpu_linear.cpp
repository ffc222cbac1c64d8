// Linears for the CPU of few rows in float32 (f32_linear, the default format's decode
// steps: below), and weight-only reduced-precision ones: y = x W^T (+ b), x and y float32,
// W stored as int8 with a float32 scale and offset per group of 32 weights along K
// (w = q * scale + offset), or as bfloat16. Weights are widened to float32 in registers and every product and sum is
// float32 ("fp32 compute"); what shrinks is the bytes read per weight (1.125 or 2
// instead of 4), which is what bounds a small-batch decode step.
//
// Two entry points per format:
//   *_linear:     few rows (a decode step): each weight row is read once and applied
//                 to all M input rows, threads split the output features (N).
//   *_dequantize: the float32 matrix, for many rows (prefill), where a float32 GEMM
//                 (MKL / oneDNN) on a dequantized copy is faster than this loop.
//
// Built at first use by kernels/cpu_linear.py (torch.utils.cpp_extension, -O3
// -march=native -ffp-contract=off). int8_linear applies each group's scale and offset
// once per group (s * (x . q) + z * sum(x)), not per weight: the same sum regrouped,
// within ~2e-7 relative of x . (q * s + z); int8_dequantize's q * scale + offset is a
// multiply then an add, the same two roundings as torch's dequantization. AVX-512F paths, with a portable
// scalar fallback for other CPUs.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) || defined(__x86_64__)
#include <immintrin.h>  // also for the VNNI kernel's target attribute
#endif

#include "cpu_bf16.h"  // Vec: the float vector ops of this build (AVX-512 or AVX2), if any

#ifdef KVSCOPE_VEC
using kvscope_bf16::Vec;
#endif

namespace {

constexpr int64_t kGroup = 32;  // int8 weights per scale
constexpr int64_t kRowBlock = 8;  // input rows that share one pass over a weight row

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// ---- int8, grouped scales ------------------------------------------------------------

// out[m, n] for rows m0..m0+mb-1 and one weight row n, as
//   sum over groups g of  s[g] * (x_g . q_g)  +  z[g] * (sum of x_g)
// (the same sum as x . (q * s + z), regrouped): the int8 weights are widened to float
// (exact) and multiplied by x, and the scale and the offset are applied once per group
// of 32 rather than once per weight. ``xs`` holds each row's group sums of x [mb, K / 32].
inline void int8_row(const float* x, int64_t ldx, int64_t mb, const int8_t* w, const float* s,
                     const float* z, int64_t K, const float* xs, float* acc) {
  const int64_t groups = K / kGroup;
#if defined(__AVX512F__)
  __m512 a[kRowBlock];
  for (int64_t m = 0; m < mb; ++m) a[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* wg = w + g * kGroup;
    const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)wg)));
    const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(wg + 16))));
    const __m512 sg = _mm512_set1_ps(s[g]);
    for (int64_t m = 0; m < mb; ++m) {
      const float* xg = x + m * ldx + g * kGroup;
      const __m512 p = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), q1, _mm512_mul_ps(_mm512_loadu_ps(xg), q0));
      a[m] = _mm512_fmadd_ps(p, sg, a[m]);
    }
  }
  for (int64_t m = 0; m < mb; ++m) {
    __m512 o = _mm512_setzero_ps();  // the offsets' part: z . xs, 16 groups at a time
    const float* xr = xs + m * groups;
    for (int64_t g = 0; g < groups; g += 16) {
      const __mmask16 k = groups - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (groups - g)) - 1);
      o = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, z + g), _mm512_maskz_loadu_ps(k, xr + g), o);
    }
    acc[m] = _mm512_reduce_add_ps(a[m]) + _mm512_reduce_add_ps(o);
  }
#else
  for (int64_t m = 0; m < mb; ++m) {
    const float* xr = x + m * ldx;
    float total = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      float dot = 0.f;
      for (int64_t k = g * kGroup; k < (g + 1) * kGroup; ++k) dot += xr[k] * static_cast<float>(w[k]);
      total += s[g] * dot + z[g] * xs[m * groups + g];
    }
    acc[m] = total;
  }
#endif
}

// ---- bfloat16 --------------------------------------------------------------------------

inline void bf16_row(const float* x, int64_t ldx, int64_t mb, const uint16_t* w, int64_t K, float* acc) {
#if defined(__AVX512F__)
  __m512 a[kRowBlock], b[kRowBlock];  // two independent FMA chains per row
  for (int64_t m = 0; m < mb; ++m) a[m] = b[m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512 w0 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + k))), 16));
    __m512 w1 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + k + 16))), 16));
    for (int64_t m = 0; m < mb; ++m) {
      a[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + k), w0, a[m]);
      b[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + k + 16), w1, b[m]);
    }
  }
  for (; k + 16 <= K; k += 16) {
    __m512 wf = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + k))), 16));
    for (int64_t m = 0; m < mb; ++m) a[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + k), wf, a[m]);
  }
  for (int64_t m = 0; m < mb; ++m) {
    float total = _mm512_reduce_add_ps(_mm512_add_ps(a[m], b[m]));
    for (int64_t j = k; j < K; ++j) total += x[m * ldx + j] * bf16_to_float(w[j]);
    acc[m] = total;
  }
#else
  for (int64_t m = 0; m < mb; ++m) {
    float total = 0.f;
    for (int64_t j = 0; j < K; ++j) total += x[m * ldx + j] * bf16_to_float(w[j]);
    acc[m] = total;
  }
#endif
}

void check_x(const torch::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "x must be a contiguous float32 [M, K] tensor");
  TORCH_CHECK(x.size(1) == K, "x has ", x.size(1), " features, the weight ", K);
}

// the bias's floats, or nullptr without one
const float* bias_data(const c10::optional<torch::Tensor>& bias, int64_t N) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->numel() == N && bias->is_contiguous(),
              "bias must be a contiguous float32 [N] tensor");
  return bias->data_ptr<float>();
}

template <typename RowFn>
torch::Tensor run_rows(const torch::Tensor& x, int64_t N, const c10::optional<torch::Tensor>& bias,
                       RowFn row) {
  const int64_t M = x.size(0);
  auto out = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* bp = bias_data(bias, N);
  const int64_t K = x.size(1);
  // grain: enough output features per task that a task streams ~64 KiB of weights
  const int64_t grain = std::max<int64_t>(16, 65536 / std::max<int64_t>(K, 1));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    float acc[kRowBlock];
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
        const int64_t mb = std::min(kRowBlock, M - m0);
        row(xp + m0 * K, K, mb, n, acc);
        for (int64_t m = 0; m < mb; ++m) op[(m0 + m) * N + n] = acc[m] + (bp ? bp[n] : 0.f);
      }
    }
  });
  return out;
}

}  // namespace

void check_groups(const torch::Tensor& t, int64_t N, int64_t K, const char* name) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.numel() == N * (K / kGroup),
              name, " must be a contiguous float32 [N, K / 32] tensor");
}

// w [N, K] of ``type`` (what: its name in messages) with float32 scales and offsets [N, K / 32]
void check_grouped(const torch::Tensor& w, const torch::Tensor& scales, const torch::Tensor& offsets,
                   c10::ScalarType type, const char* what) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == type && w.is_contiguous(),
              "w must be a contiguous ", what, " [N, K] tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % kGroup == 0, what, " weights need K divisible by ", kGroup, ", got ", K);
  check_groups(scales, N, K, "scales");
  check_groups(offsets, N, K, "offsets");
}

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor w, torch::Tensor scales, torch::Tensor offsets,
                          c10::optional<torch::Tensor> bias) {
  check_grouped(w, scales, offsets, torch::kInt8, "int8");
  const int64_t N = w.size(0), K = w.size(1);
  check_x(x, K);
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* zp = offsets.data_ptr<float>();
  const int64_t groups = K / kGroup, M = x.size(0);
  std::vector<float> xsum(M * groups);  // each row's sum of x per group, for the offsets
  const float* xp = x.data_ptr<float>();
  for (int64_t i = 0; i < M * groups; ++i) {
    float t = 0.f;
    for (int64_t k = 0; k < kGroup; ++k) t += xp[i * kGroup + k];
    xsum[i] = t;
  }
  const float* xs = xsum.data();
  return run_rows(x, N, bias, [&](const float* xr, int64_t ldx, int64_t mb, int64_t n, float* acc) {
    const int64_t m0 = (xr - xp) / K;  // the first row of this block
    int8_row(xr, ldx, mb, wp + n * K, sp + n * groups, zp + n * groups, K, xs + m0 * groups, acc);
  });
}

torch::Tensor bf16_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kBFloat16 && w.is_contiguous(),
              "w must be a contiguous bfloat16 [N, K] tensor");
  const int64_t N = w.size(0), K = w.size(1);
  check_x(x, K);
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  return run_rows(x, N, bias, [&](const float* xr, int64_t ldx, int64_t mb, int64_t n, float* acc) {
    bf16_row(xr, ldx, mb, wp + n * K, K, acc);
  });
}

// ---- float32, few rows (the default format's decode steps) ------------------------------
//
// y = x W^T for M <= ~64 rows, straight from the [N, K] float32 weight (no packed copy):
// a task takes runs of kNr = 4 consecutive weight rows (4 K floats, contiguous) and
// multiplies each run by the input rows 4 at a time: 16 accumulators of 16 lanes over K,
// summed across their lanes together at the end (sums_of; AVX-512's hsum16: 15
// shuffle-adds for 16 sums).
// The weights stream from memory once per call, and the task's next run is prefetched
// into L2 while this one is multiplied, spread over the passes of 4 input rows, so the
// stream and the FMAs overlap. oneDNN's GEMM on its packed weight did the two one after
// the other at these row counts. Every linear of SmolLM2 and its lm_head once, 2 threads,
// wall ms (bench/RESULTS.md, session 23), oneDNN / this: 1 row 32-34 / 23-24, 4 rows 34 /
// 27, 16 rows 47 / 32-33, 64 rows 91-96 / 84-85; from ~96 rows oneDNN is ahead. Every
// product and sum is float32 (FMA); only the order of the sum differs from oneDNN's.
//
// The same code for AVX2 (8 lanes, 16 registers: runs of 3 weight rows by 4 input rows,
// 12 accumulators); there, on a 2-core AMD EPYC (Zen 3, session 24), oneDNN / this: 1 row
// 46-52 / 31-34, 8 rows ~54 / 40, 16 rows 80-99 / 56-58, 32 rows 119-128 / 107-109, 64 rows
// 182-200 / 197-209 (even). A build with neither has only the scalar loop, ~10x slower than
// oneDNN, and kernels/cpu_linear.py leaves every row count to oneDNN (f32_linear_lanes).

#ifdef KVSCOPE_VEC
constexpr int kLanes = Vec::W;
using VecF = Vec::T;
#if defined(__AVX512F__)
constexpr int kNr = 4;  // weight rows a task multiplies at once
constexpr int kMr = 4;  // input rows per pass over them: 16 accumulators of 32 registers

// lane i of the result = the sum of v[i]'s 16 lanes
inline __m512 hsum16(const __m512* v) {
  __m512 w[8], x[4];
  for (int i = 0; i < 8; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  // w[i]: 256-bit half 0 = v[2i] partials (8), half 1 = v[2i+1] partials
  for (int i = 0; i < 4; ++i)
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88), _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
  // x[i] quarters: v[4i], v[4i+1], v[4i+2], v[4i+3] (4 partials each)
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
  const __m512 r = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))));
  // r lane 4q + j = sum of x[j]'s quarter q = v[4j + q]
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(idx, r);
}
// sums[i] = the sum of v[i]'s lanes, for C accumulators
template <int C>
inline void sums_of(const VecF* v, float* sums) {
  if constexpr (C == 16) {
    _mm512_storeu_ps(sums, hsum16(v));
  } else {
    for (int i = 0; i < C; ++i) sums[i] = Vec::sum(v[i]);
  }
}
#else  // AVX2
constexpr int kNr = 3;  // weight rows a task multiplies at once
constexpr int kMr = 4;  // input rows per pass: 12 accumulators + 3 weight vectors + an input vector of 16 registers
// sums[i] = the sum of v[i]'s lanes, for C accumulators: 4 at a time by two rounds of hadd
// (lanes: v[0..3]'s low-half sums, then their high-half sums) and one add of the halves
template <int C>
inline void sums_of(const VecF* v, float* sums) {
  int i = 0;
  for (; i + 4 <= C; i += 4) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v[i], v[i + 1]), _mm256_hadd_ps(v[i + 2], v[i + 3]));
    _mm_storeu_ps(sums + i, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
  for (; i < C; ++i) sums[i] = Vec::sum(v[i]);
}
#endif
#else
constexpr int kNr = 4;  // weight rows a task multiplies at once (the scalar loop)
#endif

#ifdef KVSCOPE_VEC

// out[m, n] for MR input rows and NR weight rows (w: NR rows of K floats, one after another); while at
// it, prefetch rows [p0, p1) of the next run ``pf`` at the same K offsets.
template <int MR, int NR>
inline void f32_block(const float* x, int64_t K, const float* w, float* out, int64_t ldo, const float* pf, int p0,
                      int p1) {
  VecF acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = Vec::zero();
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    VecF wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = Vec::load(w + n * K + k);
    if (pf)
      for (int n = p0; n < p1; ++n) _mm_prefetch(reinterpret_cast<const char*>(pf + n * K + k), _MM_HINT_T1);
    for (int m = 0; m < MR; ++m) {
      const VecF xv = Vec::load(x + m * K + k);
      for (int n = 0; n < NR; ++n) acc[m][n] = Vec::fma(xv, wv[n], acc[m][n]);
    }
  }
  if (k < K) {  // the last K % kLanes (masked loads cost a port the FMAs need: not in the loop above)
    VecF wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = Vec::load_first(w + n * K + k, K - k);
    for (int m = 0; m < MR; ++m) {
      const VecF xv = Vec::load_first(x + m * K + k, K - k);
      for (int n = 0; n < NR; ++n) acc[m][n] = Vec::fma(xv, wv[n], acc[m][n]);
    }
  }
  float sums[MR * NR];
  sums_of<MR * NR>(&acc[0][0], sums);
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) out[m * ldo + n] = sums[m * NR + n];
}

// All M rows against one run of NR weight rows, kMr rows a pass; the prefetch of the next
// run is split over the passes.
template <int NR>
void f32_run(const float* x, int64_t M, int64_t K, const float* w, float* out, int64_t N, const float* pf) {
  const int passes = static_cast<int>((M + kMr - 1) / kMr);
  const int per = (NR + passes - 1) / passes;
  for (int p = 0; p < passes; ++p) {
    const int64_t m = p * kMr;
    const int p0 = std::min(NR, p * per), p1 = std::min(NR, p0 + per);
    const float* pp = p0 < p1 ? pf : nullptr;
    const float* xm = x + m * K;
    float* om = out + m * N;
    switch (std::min<int64_t>(kMr, M - m)) {
      case 4: if constexpr (kMr >= 4) f32_block<4, NR>(xm, K, w, om, N, pp, p0, p1); break;
      case 3: if constexpr (kMr >= 3) f32_block<3, NR>(xm, K, w, om, N, pp, p0, p1); break;
      case 2: f32_block<2, NR>(xm, K, w, om, N, pp, p0, p1); break;
      default: f32_block<1, NR>(xm, K, w, om, N, pp, p0, p1); break;
    }
  }
}
#endif

int64_t f32_linear_lanes() {
#ifdef KVSCOPE_VEC
  return KVSCOPE_VEC;
#else
  return 0;  // the scalar loop: far slower than oneDNN, which the Python side then keeps
#endif
}

torch::Tensor f32_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.is_contiguous() && w.device().is_cpu(),
              "w must be a contiguous float32 CPU [N, K] tensor");
  const int64_t N = w.size(0), K = w.size(1), M = x.size(0);
  check_x(x, K);
  TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
  auto out = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* bp = bias_data(bias, N);
  float* op = out.data_ptr<float>();
  const int64_t runs = (N + kNr - 1) / kNr;
  // a task: runs of ~64 KiB of weights at least, so a small linear stays on one thread
  const int64_t grain = std::max<int64_t>(1, 65536 / (kNr * std::max<int64_t>(K, 1) * 4));
  at::parallel_for(0, runs, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r * kNr, nr = std::min<int64_t>(kNr, N - n);
      float* o = op + n;
#ifdef KVSCOPE_VEC
      const float* pf = r + 1 < r1 ? wp + (n + kNr) * K : nullptr;  // the next run of this task
      const float* wr = wp + n * K;
      switch (nr) {
        case 4: f32_run<4>(xp, M, K, wr, o, N, pf); break;
        case 3: f32_run<3>(xp, M, K, wr, o, N, pf); break;
        case 2: f32_run<2>(xp, M, K, wr, o, N, pf); break;
        default: f32_run<1>(xp, M, K, wr, o, N, pf); break;
      }
#else
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < nr; ++j) {
          float total = 0.f;
          for (int64_t k = 0; k < K; ++k) total += xp[m * K + k] * wp[(n + j) * K + k];
          o[m * N + j] = total;
        }
#endif
      if (bp)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t j = 0; j < nr; ++j) o[m * N + j] += bp[n + j];
    }
  });
  return out;
}

// ---- w8a8: int8 weights x int8 activations, VNNI (opt-in: quantization="w8a8") -----------
//
// llama.cpp's batch-1 recipe. Each row of x is quantized per group of 32 to int8
// (symmetric: d = max |x_g| / 127, xq = round-half-even(x * (1 / d))), and each group's
// dot product q . xq is an exact int32 from vpdpbusd (u8 x s8 -> s32, 64 products per
// instruction). Then per group, in float32:
//   out = sum_g  (s[g] * d[g]) * (q_g . xq_g)  +  z[g] * (d[g] * sum(xq_g))
// which is x_hat . (q * s + z) with x_hat = d * xq: the int8 kernel's sum with x replaced
// by its int8 rounding (an accuracy change, measured in bench/RESULTS.md).
//
// The weights are stored for this kernel (kernels/cpu_linear.py: W8A8Weight): as u8 q + 128
// (vpdpbusd's unsigned operand; the accumulators start at -128 * sum(xq) to take it back
// out, so the int32 is q . xq exactly), and each run of 16 groups (512 bytes) interleaved
// in 4-byte chunks: byte 64 j + 4 l + b of a block is group l's byte 4 j + b. Then the 16
// int32 lanes of one accumulator are the 16 groups, 8 vpdpbusd sum them whole, and one
// convert and one FMA apply their 16 scales: ~1.3 vector ops per 32 weights, where int8_row
// spends 7 widening and multiplying. The groups after the last whole block (K / 32 mod 16)
// stay in order and go two at a time (a permute gives each half its group's scale).
//
// Compiled with a target attribute, so it builds whatever -march=native says; the Python
// side stores w8a8 weights only where cpu_has_vnni() (else the int8 format, int8_row).

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVSCOPE_VNNI 1
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#else
#define KVSCOPE_VNNI 0
#endif

bool cpu_has_vnni() {
#if KVSCOPE_VNNI
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

namespace {

constexpr int64_t kBlockGroups = 16;                  // groups per interleaved block
constexpr int64_t kBlockBytes = kBlockGroups * kGroup;  // 512
constexpr int64_t kPrefetchRows = 4;  // output features ahead that w8a8_rows asks the caches for

// where natural weight k of a row sits in the w8a8 layout
inline int64_t w8a8_position(int64_t k, int64_t K) {
  const int64_t blocked = K / kBlockBytes * kBlockBytes;
  if (k >= blocked) return k;
  const int64_t b = k / kBlockBytes, l = (k % kBlockBytes) / kGroup, c = k % kGroup;
  return b * kBlockBytes + (c / 4) * 64 + l * 4 + c % 4;
}

// x [M, K] quantized per group of 32, per row: xq [Kp] in the weights' layout (zero past K;
// Kp: K rounded up to 64), d and d * sum(xq) per group [Gp] (zero past K / 32; Gp: rounded
// up to 16), and the accumulators' starts [S]: -128 * sum(xq) of each block's 16 groups,
// then -128 * each 4 bytes' sum of xq after the blocks.
struct QuantizedRows {
  int64_t M, K, Kp, Gp, blocks, S;
  std::vector<int8_t> xq, natural;
  std::vector<int32_t> start;
  std::vector<float> d, dsum;
  QuantizedRows(int64_t M_, int64_t K_)
      : M(M_), K(K_), Kp((K_ + 63) / 64 * 64), Gp((K_ / kGroup + 15) / 16 * 16), blocks(K_ / kBlockBytes),
        S(blocks * 16 + (Kp - blocks * kBlockBytes) / 4), xq(M_ * Kp, 0), natural(M_ * Kp, 0),
        start(M_ * S, 0), d(M_ * Gp, 0.f), dsum(M_ * Gp, 0.f) {}
};

#if KVSCOPE_VNNI
VNNI_TARGET void quantize_rows(const float* x, QuantizedRows& r) {
  const int64_t groups = r.K / kGroup, tail0 = r.blocks * kBlockBytes;
  const __m512i u128 = _mm512_set1_epi8(static_cast<char>(0x80));  // 128 as u8
  for (int64_t m = 0; m < r.M; ++m) {
    int8_t* nat = r.natural.data() + m * r.Kp;
    int8_t* q = r.xq.data() + m * r.Kp;
    int32_t* st = r.start.data() + m * r.S;
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + m * r.K + g * kGroup;
      const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
      const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
      // cvtps_epi32 rounds half to even (the default MXCSR), as torch.round
      const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id)));
      const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(id)));
      _mm_storeu_si128((__m128i*)(nat + g * kGroup), _mm512_cvtsepi32_epi8(qa));
      _mm_storeu_si128((__m128i*)(nat + g * kGroup + 16), _mm512_cvtsepi32_epi8(qb));
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
      r.d[m * r.Gp + g] = d;
      r.dsum[m * r.Gp + g] = d * static_cast<float>(sum);
      if (g < r.blocks * kBlockGroups) st[g] = -128 * sum;
    }
    for (int64_t k = 0; k < tail0; k += 4) std::memcpy(q + w8a8_position(k, r.K), nat + k, 4);
    std::memcpy(q + tail0, nat + tail0, r.Kp - tail0);
    for (int64_t p = 0; tail0 + 64 * p < r.Kp; ++p) {  // 128 * (4-byte sums of xq), negated
      const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u128, _mm512_loadu_si512(q + tail0 + 64 * p));
      _mm512_storeu_si512(st + r.blocks * 16 + 16 * p, _mm512_sub_epi32(_mm512_setzero_si512(), s));
    }
  }
}

// out[m0 .. m0 + MB - 1] of output feature n (one weight row: u8 wr, scales sr, offsets zr)
template <int MB>
VNNI_TARGET void w8a8_row(const QuantizedRows& r, int64_t m0, const uint8_t* wr, const float* sr, const float* zr,
                          float* res) {
  const int64_t K = r.K, groups = K / kGroup, tail0 = r.blocks * kBlockBytes;
  __m512 tot[MB], off[MB];
  for (int m = 0; m < MB; ++m) tot[m] = off[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < r.blocks; ++b) {
    __m512i acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = _mm512_loadu_si512(r.start.data() + (m0 + m) * r.S + 16 * b);
    for (int64_t j = 0; j < 8; ++j) {
      const __m512i w = _mm512_loadu_si512(wr + b * kBlockBytes + 64 * j);
      for (int m = 0; m < MB; ++m)
        acc[m] = _mm512_dpbusd_epi32(acc[m], w, _mm512_loadu_si512(r.xq.data() + (m0 + m) * r.Kp + b * kBlockBytes + 64 * j));
    }
    const __m512 sw = _mm512_loadu_ps(sr + 16 * b), zw = _mm512_loadu_ps(zr + 16 * b);
    for (int m = 0; m < MB; ++m) {
      const int64_t row = (m0 + m) * r.Gp + 16 * b;
      tot[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[m]), _mm512_mul_ps(sw, _mm512_loadu_ps(r.d.data() + row)), tot[m]);
      off[m] = _mm512_fmadd_ps(zw, _mm512_loadu_ps(r.dsum.data() + row), off[m]);
    }
  }
  if (tail0 < K) {  // the last groups % 16 groups, two per 64 bytes
    const int64_t g0 = r.blocks * kBlockGroups;
    const __mmask16 gk = (__mmask16)((1u << (groups - g0)) - 1);
    const __m512 sw = _mm512_maskz_loadu_ps(gk, sr + g0), zw = _mm512_maskz_loadu_ps(gk, zr + g0);
    __m512 sc[MB];
    for (int m = 0; m < MB; ++m) {
      const int64_t row = (m0 + m) * r.Gp + g0;
      sc[m] = _mm512_mul_ps(sw, _mm512_loadu_ps(r.d.data() + row));
      off[m] = _mm512_fmadd_ps(zw, _mm512_loadu_ps(r.dsum.data() + row), off[m]);
    }
    for (int64_t p = 0; tail0 + 64 * p < K; ++p) {
      const int64_t k = tail0 + 64 * p;
      // a last pair with one group: its second half is not read (xq is 0 there)
      const __m512i w = K - k >= 64 ? _mm512_loadu_si512(wr + k) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, wr + k);
      // lanes 0-7 take group 2p's scale, lanes 8-15 group 2p + 1's
      const __m512i lanes = _mm512_add_epi32(_mm512_set1_epi32(2 * p),
                                             _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
      for (int m = 0; m < MB; ++m) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_loadu_si512(r.start.data() + (m0 + m) * r.S + r.blocks * 16 + 16 * p),
                                                w, _mm512_loadu_si512(r.xq.data() + (m0 + m) * r.Kp + k));
        tot[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(lanes, sc[m]), tot[m]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) res[m] = _mm512_reduce_add_ps(_mm512_add_ps(tot[m], off[m]));
}

VNNI_TARGET void w8a8_rows(int64_t n0, int64_t n1, const QuantizedRows& r, const uint8_t* w, const float* s,
                           const float* z, const float* bias, float* out, int64_t N) {
  const int64_t K = r.K, groups = K / kGroup;
  float res[kRowBlock];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = w + n * K;
    const float* sr = s + n * groups;
    const float* zr = z + n * groups;
    if (n + kPrefetchRows < n1) {  // the hardware prefetcher alone left ~25% of the bandwidth unused
      const char* ahead = reinterpret_cast<const char*>(wr + kPrefetchRows * K);
      for (int64_t b = 0; b < K; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
      for (int64_t b = 0; b < groups * 4; b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(sr + kPrefetchRows * groups) + b, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(zr + kPrefetchRows * groups) + b, _MM_HINT_T0);
      }
    }
    for (int64_t m0 = 0; m0 < r.M; m0 += kRowBlock) {
      const int64_t mb = std::min(kRowBlock, r.M - m0);
      switch (mb) {  // the rows' accumulators in registers
        case 1: w8a8_row<1>(r, m0, wr, sr, zr, res); break;
        case 2: w8a8_row<2>(r, m0, wr, sr, zr, res); break;
        case 3: w8a8_row<3>(r, m0, wr, sr, zr, res); break;
        case 4: w8a8_row<4>(r, m0, wr, sr, zr, res); break;
        case 5: w8a8_row<5>(r, m0, wr, sr, zr, res); break;
        case 6: w8a8_row<6>(r, m0, wr, sr, zr, res); break;
        case 7: w8a8_row<7>(r, m0, wr, sr, zr, res); break;
        default: w8a8_row<8>(r, m0, wr, sr, zr, res); break;
      }
      for (int64_t m = 0; m < mb; ++m) out[(m0 + m) * N + n] = res[m] + (bias ? bias[n] : 0.f);
    }
  }
}
#endif

void check_w8a8(const torch::Tensor& w, const torch::Tensor& scales, const torch::Tensor& offsets) {
  TORCH_CHECK(cpu_has_vnni(), "w8a8 weights need AVX512-VNNI (check cpu_has_vnni() first)");
  check_grouped(w, scales, offsets, torch::kUInt8, "uint8 (w8a8 layout)");
}

}  // namespace

torch::Tensor w8a8_linear(torch::Tensor x, torch::Tensor w, torch::Tensor scales, torch::Tensor offsets,
                          c10::optional<torch::Tensor> bias) {
  check_w8a8(w, scales, offsets);
  const int64_t N = w.size(0), K = w.size(1);
  check_x(x, K);
  const float* bp = bias_data(bias, N);
  const int64_t M = x.size(0);
  auto out = torch::empty({M, N}, x.options());
#if KVSCOPE_VNNI
  QuantizedRows r(M, K);
  quantize_rows(x.data_ptr<float>(), r);
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* zp = offsets.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(16, 65536 / std::max<int64_t>(K, 1));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { w8a8_rows(n0, n1, r, wp, sp, zp, bp, op, N); });
#endif
  return out;
}

// x quantized as w8a8_linear does: (xq [M, K] int8 in natural order, d [M, K / 32]); for tests
std::vector<torch::Tensor> quantize_activations(torch::Tensor x) {
  TORCH_CHECK(cpu_has_vnni(), "quantize_activations needs AVX512-VNNI");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % kGroup == 0, "x must be [M, K] with K divisible by ", kGroup);
  check_x(x, x.size(1));
  const int64_t M = x.size(0), K = x.size(1), G = K / kGroup;
  auto xq = torch::empty({M, K}, x.options().dtype(torch::kInt8));
  auto d = torch::empty({M, G}, x.options());
#if KVSCOPE_VNNI
  QuantizedRows r(M, K);
  quantize_rows(x.data_ptr<float>(), r);
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(xq.data_ptr<int8_t>() + m * K, r.natural.data() + m * r.Kp, K);
    std::memcpy(d.data_ptr<float>() + m * G, r.d.data() + m * r.Gp, G * sizeof(float));
  }
#endif
  return {xq, d};
}

// out = (w - 128) * scale + offset per group, in natural order, as float32 [N, K] (into
// ``out``, reused by the caller): the many-rows path of w8a8 weights
void w8a8_dequantize(torch::Tensor w, torch::Tensor scales, torch::Tensor offsets, torch::Tensor out) {
  check_w8a8(w, scales, offsets);
  const int64_t N = w.size(0), K = w.size(1), groups = K / kGroup;
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.size(0) == N &&
                  out.size(1) == K, "out must be a contiguous float32 [N, K] tensor");
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* zp = offsets.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = n * groups + k / kGroup;
        op[n * K + k] = static_cast<float>(static_cast<int32_t>(wp[n * K + w8a8_position(k, K)]) - 128) * sp[g] + zp[g];
      }
  });
}

// out = w * scale + offset per group, as float32 [N, K] (into ``out``, reused by the caller)
void int8_dequantize(torch::Tensor w, torch::Tensor scales, torch::Tensor offsets, torch::Tensor out) {
  const int64_t N = w.size(0), K = w.size(1), groups = K / kGroup;
  check_groups(scales, N, K, "scales");
  check_groups(offsets, N, K, "offsets");
  TORCH_CHECK(out.scalar_type() == torch::kFloat32 && out.is_contiguous() && out.size(0) == N &&
                  out.size(1) == K, "out must be a contiguous float32 [N, K] tensor");
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* zp = offsets.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N * groups, 256, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const float s = sp[g], z = zp[g];
      for (int64_t k = 0; k < kGroup; ++k) op[g * kGroup + k] = static_cast<float>(wp[g * kGroup + k]) * s + z;
    }
  });
}

// Every kernel runs without the GIL (the guard releases it once the arguments are
// converted): a server's event loop and recorder threads run while the engine
// thread is in here, as they do while it is inside any torch op.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_linear", &int8_linear, "x [M,K] f32 @ (int8 [N,K] * scales + offsets [N,K/32])^T (+ bias)",
        py::call_guard<py::gil_scoped_release>());
  m.def("f32_linear_lanes", &f32_linear_lanes, "f32_linear's vector width in floats (16 AVX-512, 8 AVX2), 0: scalar");
  m.def("f32_linear", &f32_linear, "x [M,K] f32 @ (f32 [N,K])^T (+ bias), few rows (M <= ~64)",
        py::call_guard<py::gil_scoped_release>());
  m.def("bf16_linear", &bf16_linear, "x [M,K] f32 @ (bf16 [N,K])^T (+ bias), f32 compute",
        py::call_guard<py::gil_scoped_release>());
  m.def("int8_dequantize", &int8_dequantize, "int8 [N,K] * scales + offsets -> f32 [N,K] into out",
        py::call_guard<py::gil_scoped_release>());
  m.def("w8a8_linear", &w8a8_linear,
        "x [M,K] f32, quantized to int8 per 32, @ (w8a8 u8 [N,K] - 128) * scales + offsets, VNNI",
        py::call_guard<py::gil_scoped_release>());
  m.def("w8a8_dequantize", &w8a8_dequantize, "w8a8 u8 [N,K] -> f32 [N,K] (natural order) into out",
        py::call_guard<py::gil_scoped_release>());
  m.def("quantize_activations", &quantize_activations, "x -> (int8 xq, scale per 32) as w8a8_linear does",
        py::call_guard<py::gil_scoped_release>());
  m.def("cpu_has_vnni", &cpu_has_vnni, "whether this CPU runs the w8a8 kernels (AVX512-VNNI, BW, VL)");
}
