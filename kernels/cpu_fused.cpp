// Fused elementwise ops of a Llama decoder layer for the CPU, float32: each replaces a
// chain of small torch ops (one dispatch, and on more than one thread one OpenMP
// region, per op) by one pass over the rows. At batch 1 a layer's ~25 small ops cost
// about a fifth of the decode step; at 64 sequences about a tenth (bench/RESULTS.md).
//
//   silu_mul:     silu(gate) * up, bitwise as torch's (x / (1 + exp(-x)), exp from
//                 SLEEF in 32-wide chunks (16-wide with AVX2) and std::exp for the tail,
//                 as ATen's loops).
//   rope:         x * cos + swap_halves(x) * signed_sin, bitwise as RopeTables.apply.
//   add_rms_norm: residual += x (optional), then residual * rsqrt(mean(residual^2) +
//                 eps) * weight: the same roundings as torch.rms_norm except the order
//                 of the sum of squares (so ~1 ulp in the scale factor).
//
// silu_mul's input and output, add_rms_norm's x and output may also be bfloat16 (the
// bf16 weights' oneDNN GEMMs read and write bf16: kernels/cpu_linear.py), so that no
// separate conversion pass runs between a GEMM and these ops. The arithmetic stays
// float32: a bf16 value widens exactly, a result rounds to nearest even as torch's.
//
// Built at first use by kernels/cpu_build.py (-O3 -march=native -ffp-contract=off: no
// multiply-add is fused behind our back, so the products round as torch's do).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#include "cpu_bf16.h"


namespace {

// Rows per task: at least this many elements each. These ops take microseconds on one
// thread for any decode batch (64 rows of SiLU x up: 197k elements), while an OpenMP
// region waits at its barrier for a partner thread that another process may have
// descheduled (a time slice, milliseconds, on a shared 2-core box); so only prefill
// chunks of hundreds of rows are split. Settable for A/B runs (bench.step_ab fused_grain).
int64_t grain_elems = 1 << 18;
inline int64_t row_grain(int64_t width) { return std::max<int64_t>(1, grain_elems / std::max<int64_t>(1, width)); }

void check_rows(const at::Tensor& t, const char* name, bool bf16_too = false) {
  const bool dtype_ok = t.scalar_type() == at::kFloat || (bf16_too && t.scalar_type() == at::kBFloat16);
  TORCH_CHECK(t.dim() == 2 && dtype_ok && t.stride(1) == 1 && t.device().is_cpu(), name, " must be a ",
              bf16_too ? "float32 or bfloat16" : "float32", " CPU matrix with contiguous rows");
}

using namespace kvscope_bf16;

// f(in_type{}, out_type{}) for the (float32 | bfloat16) pair of two tensors
template <typename F>
void dispatch2(const at::Tensor& a, const at::Tensor& b, F&& f) {
  const bool ab = a.scalar_type() == at::kBFloat16, bb = b.scalar_type() == at::kBFloat16;
  if (!ab && !bb) f(float{}, float{});
  else if (!ab) f(float{}, bf16{});
  else if (!bb) f(bf16{}, float{});
  else f(bf16{}, bf16{});
}

}  // namespace

// gate_up [T, 2I] (gate then up, as the fused projection writes them) -> out [T, I]
template <typename TI, typename TO>
void silu_mul_impl(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  const TI* src = reinterpret_cast<const TI*>(gate_up.data_ptr());
  TO* dst = reinterpret_cast<TO*>(out.data_ptr());
  const int64_t ls = gate_up.stride(0), ld = out.stride(0);
  at::parallel_for(0, T, row_grain(I), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const TI* g = src + t * ls;
      const TI* u = g + I;
      TO* o = dst + t * ld;
      int64_t i = 0;
#ifdef KVSCOPE_VEC
      constexpr int W = Vec::W;
      const Vec::T one = Vec::set1(1.f);
      for (; i + 2 * W <= I; i += 2 * W) {  // ATen's vectorized loop: two vectors per iteration
        for (int64_t j = i; j < i + 2 * W; j += W) {
          const Vec::T x = Vec::load(g + j);
          const Vec::T s = Vec::div(x, Vec::add(one, Vec::exp(Vec::neg(x))));
          Vec::store(o + j, Vec::mul(s, Vec::load(u + j)));
        }
      }
#endif
      for (; i < I; ++i) {
        const float x = widen(g[i]);
        o[i] = narrow<TO>((x / (1.f + std::exp(-x))) * widen(u[i]));
      }
    }
  });
}

void silu_mul(const at::Tensor& gate_up, at::Tensor& out) {
  check_rows(gate_up, "gate_up", true);
  check_rows(out, "out", true);
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  TORCH_CHECK(gate_up.size(1) == 2 * I && out.size(0) == T && out.size(1) == I, "out must be [T, I] for gate_up [T, 2I]");
  dispatch2(gate_up, out, [&](auto in, auto o) { silu_mul_impl<decltype(in), decltype(o)>(gate_up, out); });
}

// x [T, heads, hd] (heads contiguous, any row stride), cos / signed_sin [T, hd] -> out
// [T, heads, hd] contiguous: out = x * cos + cat(x[hd/2:], x[:hd/2]) * signed_sin
void rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& signed_sin, at::Tensor& out) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.stride(2) == 1 && x.stride(1) == x.size(2) &&
                  x.device().is_cpu(),
              "x must be float32 [T, heads, head_dim] with contiguous heads");
  const int64_t T = x.size(0), H = x.size(1), hd = x.size(2), half = hd / 2;
  TORCH_CHECK(hd % 2 == 0, "head_dim must be even");
  for (const at::Tensor* t : {&cos, &signed_sin})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == T && t->size(1) == hd && t->scalar_type() == at::kFloat &&
                    t->is_contiguous(),
                "cos and signed_sin must be contiguous float32 [T, head_dim]");
  TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous() && out.scalar_type() == at::kFloat,
              "out must be contiguous float32 shaped like x");
  const float* xs = x.data_ptr<float>();
  const float* cs = cos.data_ptr<float>();
  const float* ss = signed_sin.data_ptr<float>();
  float* os = out.data_ptr<float>();
  const int64_t lx = x.stride(0);
  at::parallel_for(0, T, row_grain(H * hd), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = cs + t * hd;
      const float* s = ss + t * hd;
      for (int64_t h = 0; h < H; ++h) {
        const float* xi = xs + t * lx + h * hd;
        float* o = os + (t * H + h) * hd;
        for (int64_t i = 0; i < half; ++i) o[i] = xi[i] * c[i] + xi[i + half] * s[i];
        for (int64_t i = half; i < hd; ++i) o[i] = xi[i] * c[i] + xi[i - half] * s[i];
      }
    }
  });
}

// residual [T, N] (updated in place to residual + x when x is given), weight [N] -> out
// [T, N] = residual * rsqrt(mean(residual^2) + eps) * weight
template <typename TX, typename TO>
void add_rms_norm_impl(const TX* xs, int64_t lx, at::Tensor& residual, const at::Tensor& weight, float e,
                       at::Tensor& out) {
  const int64_t T = residual.size(0), N = residual.size(1);
  float* rs = residual.data_ptr<float>();
  TO* os = reinterpret_cast<TO*>(out.data_ptr());
  const float* w = weight.data_ptr<float>();
  const int64_t lr = residual.stride(0), lo = out.stride(0);
  at::parallel_for(0, T, row_grain(N), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* r = rs + t * lr;
      TO* o = os + t * lo;
      if (xs != nullptr) {
        const TX* xi = xs + t * lx;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= N; i += 16) _mm512_storeu_ps(r + i, _mm512_add_ps(_mm512_loadu_ps(r + i), load16(xi + i)));
#endif
        for (; i < N; ++i) r[i] = r[i] + widen(xi[i]);
      }
      float acc[16] = {0.f};  // 16 independent partial sums: vectorizes without reassociation
      int64_t i = 0;
      for (; i + 16 <= N; i += 16)
        for (int j = 0; j < 16; ++j) {
          const float sq = r[i + j] * r[i + j];
          acc[j] = acc[j] + sq;
        }
      float total = 0.f;
      for (int j = 0; j < 16; ++j) total += acc[j];
      for (; i < N; ++i) total += r[i] * r[i];
      const float scale = 1.f / std::sqrt(total / static_cast<float>(N) + e);
      int64_t k = 0;
#if defined(__AVX512F__)
      const __m512 sv = _mm512_set1_ps(scale);
      for (; k + 16 <= N; k += 16)  // (r * scale) * w: the scalar loop's two roundings
        store16(o + k, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(r + k), sv), _mm512_loadu_ps(w + k)));
#endif
      for (; k < N; ++k) {
        const float normed = r[k] * scale;
        o[k] = narrow<TO>(normed * w[k]);
      }
    }
  });
}

void add_rms_norm(const c10::optional<at::Tensor>& x, at::Tensor& residual, const at::Tensor& weight, double eps,
                  at::Tensor& out) {
  check_rows(residual, "residual");
  check_rows(out, "out", true);
  const int64_t T = residual.size(0), N = residual.size(1);
  TORCH_CHECK(out.size(0) == T && out.size(1) == N, "out must be shaped like residual");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == N && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "weight must be contiguous float32 [N]");
  const float e = static_cast<float>(eps);
  if (!x.has_value()) {
    dispatch2(residual, out, [&](auto, auto o) {
      add_rms_norm_impl<float, decltype(o)>(nullptr, 0, residual, weight, e, out);
    });
    return;
  }
  check_rows(*x, "x", true);
  TORCH_CHECK(x->size(0) == T && x->size(1) == N, "x must be shaped like residual");
  dispatch2(*x, out, [&](auto in, auto o) {
    using TX = decltype(in);
    add_rms_norm_impl<TX, decltype(o)>(reinterpret_cast<const TX*>(x->data_ptr()), x->stride(0), residual, weight,
                                        e, out);
  });
}

// Every kernel runs without the GIL (the guard releases it once the arguments are
// converted): a server's event loop and recorder threads run while the engine
// thread is in here, as they do while it is inside any torch op.
void set_grain_elems(int64_t n) {
  TORCH_CHECK(n >= 1, "grain must be at least one element");
  grain_elems = n;
}

int64_t get_grain_elems() { return grain_elems; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_grain_elems", &set_grain_elems, "elements per parallel task of the ops below");
  m.def("get_grain_elems", &get_grain_elems, "elements per parallel task of the ops below");
  m.def("silu_mul", &silu_mul, "silu(gate) * up for gate_up [T, 2I], into out [T, I]",
        py::call_guard<py::gil_scoped_release>());
  m.def("rope", &rope, "x * cos + swap_halves(x) * signed_sin, into out",
        py::call_guard<py::gil_scoped_release>());
  m.def("add_rms_norm", &add_rms_norm, "residual += x (if given); out = rms_norm(residual) * weight",
        py::call_guard<py::gil_scoped_release>());
}
