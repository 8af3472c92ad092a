// The small per-layer ops of a decode step, one call each. At batch 1 a decoder layer's
// norms and rotation are a dozen PyTorch ops of a few microseconds each, as long as its
// matrix products together; here each is one call.
//
// Built with -ffp-contract=off: the rotation is then the same float operations in the same
// order as PyTorch's reference (x * cos + rotate_half(x) * sin), bit for bit. The norm's sum of
// squares is accumulated in double, as close to exact as float32 inputs allow.
#include "kernels.h"
#include "softmax.h"

#include <immintrin.h>

#include <cmath>

namespace {

void check_rows(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x: contiguous 2-D float32");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1), "weight: [x.size(1)]");
}

// out = weight * (x * 1 / sqrt(mean(x^2) + eps)), in the reference's order of multiplies.
void normalize(const float* x, const float* weight, int64_t dim, double eps, float* out) {
  double squares = 0.0;
  for (int64_t i = 0; i < dim; ++i) squares += static_cast<double>(x[i]) * x[i];
  const float variance = static_cast<float>(squares / dim);
  const float inverse = 1.0f / std::sqrt(variance + static_cast<float>(eps));
  for (int64_t i = 0; i < dim; ++i) out[i] = weight[i] * (x[i] * inverse);
}

}  // namespace

at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  check_rows(x, weight);
  auto out = at::empty_like(x);
  const int64_t rows = x.size(0), dim = x.size(1);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) normalize(xp + r * dim, wp, dim, eps, op + r * dim);
  return out;
}

// residual += x in place, then the norm of the sum: a layer's residual add and the next norm.
at::Tensor add_rms_norm(at::Tensor x, at::Tensor residual, at::Tensor weight, double eps) {
  check_rows(x, weight);
  check_rows(residual, weight);
  TORCH_CHECK(x.sizes() == residual.sizes(), "x and residual: the same shape");
  auto out = at::empty_like(x);
  const int64_t rows = x.size(0), dim = x.size(1);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float *rp = residual.data_ptr<float>(), *op = out.data_ptr<float>();
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = rp + r * dim;
    for (int64_t i = 0; i < dim; ++i) row[i] += xp[r * dim + i];
    normalize(row, wp, dim, eps, op + r * dim);
  }
  return out;
}

// Rotary embedding, neox layout: x [rows, heads, head_dim] with any strides (a split of the
// fused qkv output, itself sometimes transposed), cos and sin [rows, 1, head_dim] contiguous.
// A new contiguous tensor.
at::Tensor rotate(at::Tensor x, at::Tensor cos, at::Tensor sin) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat, "x: [rows, heads, head_dim]");
  const int64_t rows = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == rows * dim &&
                  sin.numel() == rows * dim, "cos, sin: [rows, 1, head_dim] contiguous");
  auto out = at::empty({rows, heads, dim}, x.options());
  const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t row_stride = x.stride(0), head_stride = x.stride(1), step = x.stride(2);
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    const float *c = cp + r * dim, *s = sp + r * dim;
    for (int64_t h = 0; h < heads; ++h) {
      const float* in = xp + r * row_stride + h * head_stride;
      float* o = op + (r * heads + h) * dim;
      for (int64_t i = 0; i < half; ++i)
        o[i] = in[i * step] * c[i] + (-in[(i + half) * step]) * s[i];
      for (int64_t i = half; i < dim; ++i)
        o[i] = in[i * step] * c[i] + in[(i - half) * step] * s[i];
    }
  }
  return out;
}

// silu(gate) * up for the fused gate_up output [rows, 2 * width] (any row stride, the last
// dimension contiguous): a split, a silu and a multiply in one pass over the rows, vectorised
// (PyTorch's silu and multiply are two passes over a prefill chunk's tens of MB). silu is
// x / (1 + e^-x), as PyTorch defines it; e^-x is taken where it is at most 1 (x >= 0) and
// through e^x = 1 / e^-x elsewhere, so that no exponential overflows. The exp may differ from
// PyTorch's in the last bit.
at::Tensor silu_mul(at::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat &&
                  gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "gate_up: [rows, 2 * width] float32, the last dimension contiguous");
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2, stride = gate_up.stride(0);
  auto out = at::empty({rows, width}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int64_t r = 0; r < rows; ++r) {
    const float *gate = gp + r * stride, *up = gate + width;
    float* o = op + r * width;
    int64_t i = 0;
    for (; i + 8 <= width; i += 8) {
      const __m256 x = _mm256_loadu_ps(gate + i);
      const __m256 e = kvpilot::softmax_ops::exp8(_mm256_or_ps(x, sign));  // e^-|x|
      const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
      // x >= 0: x / (1 + e^-x); x < 0: x e^x / (e^x + 1), the same quotient times e^x / e^x.
      const __m256 top = _mm256_blendv_ps(x, _mm256_mul_ps(x, e), negative);
      const __m256 silu = _mm256_div_ps(top, _mm256_add_ps(one, e));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (; i < width; ++i) o[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
  return out;
}
