// Weight-only reduced-precision linears for the CPU: y = x W^T (+ b), x and y float32,
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

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
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

template <typename RowFn>
torch::Tensor run_rows(const torch::Tensor& x, int64_t N, const c10::optional<torch::Tensor>& bias,
                       RowFn row) {
  const int64_t M = x.size(0);
  auto out = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->numel() == N && bias->is_contiguous(),
                "bias must be a contiguous float32 [N] tensor");
    bp = bias->data_ptr<float>();
  }
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

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor w, torch::Tensor scales, torch::Tensor offsets,
                          c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kInt8 && w.is_contiguous(),
              "w must be a contiguous int8 [N, K] tensor");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % kGroup == 0, "int8 weights need K divisible by ", kGroup, ", got ", K);
  check_groups(scales, N, K, "scales");
  check_groups(offsets, N, K, "offsets");
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
  m.def("bf16_linear", &bf16_linear, "x [M,K] f32 @ (bf16 [N,K])^T (+ bias), f32 compute",
        py::call_guard<py::gil_scoped_release>());
  m.def("int8_dequantize", &int8_dequantize, "int8 [N,K] * scales + offsets -> f32 [N,K] into out",
        py::call_guard<py::gil_scoped_release>());
}
