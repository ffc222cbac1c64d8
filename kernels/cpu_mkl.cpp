// Small-batch float32 linears through MKL's packed GEMM (kernels/cpu_mkl.py).
//
// cblas_sgemm_pack lays a weight out once in MKL's internal blocked format, and
// cblas_sgemm_compute multiplies any number of rows by it. The packed layout is chosen
// for the m given at packing time, but a product with another m is still exact (it is
// the same product; tests/model_fast/test_cpu_mkl.py checks it against F.linear from 1
// to 128 rows).
//
// The symbols come from the MKL that torch's x86 wheels carry inside libtorch_cpu
// (which exports them). They are declared weak: where torch was built without MKL they
// resolve to null, available() says false and Python never calls pack or linear.

#include <torch/extension.h>

extern "C" {
// MKL's CBLAS enums and LP64 integers (MKL_INT = int), as in mkl_cblas.h
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest) __attribute__((weak));
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc)
    __attribute__((weak));
}

namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kBMatrix = 162, kPacked = 151;

bool available() {
  return cblas_sgemm_pack_get_size != nullptr && cblas_sgemm_pack != nullptr &&
         cblas_sgemm_compute != nullptr;
}

void check_weight(const torch::Tensor& w) {
  TORCH_CHECK(available(), "MKL's packed GEMM is not in this torch build");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32 && w.device().is_cpu() &&
                  w.is_contiguous(),
              "weight must be a contiguous 2-D float32 CPU tensor");
  TORCH_CHECK(w.size(0) < (1LL << 31) && w.size(1) < (1LL << 31), "weight too large for MKL_INT");
}

}  // namespace

// The weight [N, K] (y = x W^T), packed for products of about m rows: a byte buffer
// (float32 elements) that must stay where it is (MKL keeps addresses inside it).
torch::Tensor pack(const torch::Tensor& weight, int64_t m) {
  check_weight(weight);
  TORCH_CHECK(m >= 1 && m < (1LL << 31), "m must be a positive row count");
  const int n = static_cast<int>(weight.size(0)), k = static_cast<int>(weight.size(1));
  const size_t bytes = cblas_sgemm_pack_get_size(kBMatrix, static_cast<int>(m), n, k);
  auto out = torch::empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))},
                          weight.options());
  cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, static_cast<int>(m), n, k, 1.0f,
                   weight.data_ptr<float>(), k, out.data_ptr<float>());
  return out;
}

// y [M, N] = x [M, K] @ W^T (+ bias [N]) with W packed by pack(W, ...).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t n,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(available(), "MKL's packed GEMM is not in this torch build");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(),
              "x must be a 2-D float32 CPU tensor");
  TORCH_CHECK(packed.scalar_type() == torch::kFloat32 && packed.is_contiguous(), "bad packed weight");
  auto a = x.contiguous();
  const int m = static_cast<int>(a.size(0)), k = static_cast<int>(a.size(1));
  torch::Tensor c;
  float beta = 0.0f;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n && bias->scalar_type() == torch::kFloat32,
                "bias must be float32 [N]");
    c = torch::empty({m, n}, a.options());  // C := x W^T + 1 * bias, as addmm
    c.copy_(bias->unsqueeze(0).expand({m, n}));  // (a copy: at 1 row a view would be the bias)
    beta = 1.0f;
  } else {
    c = torch::empty({m, n}, a.options());
  }
  if (m == 0) return c;
  cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, static_cast<int>(n), k, a.data_ptr<float>(),
                      k, packed.data_ptr<float>(), k, beta, c.data_ptr<float>(),
                      static_cast<int>(n));
  return c;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("available", &available, "True when this torch carries MKL's packed GEMM");
  m.def("pack", &pack, "weight [N, K] packed for about m rows", py::arg("weight"), py::arg("m"),
        py::call_guard<py::gil_scoped_release>());
  m.def("linear", &linear, "x @ W^T (+ bias) with W packed by pack()", py::arg("x"),
        py::arg("packed"), py::arg("n"), py::arg("bias") = py::none(),
        py::call_guard<py::gil_scoped_release>());
}
