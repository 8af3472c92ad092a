// Weight-only int8 linear for decode-sized batches on x86 with AVX2/FMA:
//   y[r, o] = scale[o] * sum_i x[r, i] * w[o, i]  (+ bias[o])
// Decode is memory-bound, and int8 weights are a quarter of the bytes of float32 ones; the
// activations stay float32, so there is no activation quantization error (LLM activations have
// outliers that per-tensor int8 activations cannot represent). Output rows are split across
// OpenMP threads; each weight row is read once and reused for every input row.
#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>

static inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor w, torch::Tensor scale,
                          c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x: 2-D float32");
  TORCH_CHECK(w.scalar_type() == torch::kInt8 && w.is_contiguous(), "w: contiguous int8");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32, "scale: float32");
  x = x.contiguous();
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  TORCH_CHECK(w.size(1) == in, "w: [out, in]");
  auto y = torch::empty({rows, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const int8_t* wr = wp + o * in;
    // Four input rows at a time: each 16-weight chunk is widened once and used four times.
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int64_t n = std::min<int64_t>(4, rows - r0);
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      int64_t i = 0;
      for (; i + 16 <= in; i += 16) {
        __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + i));
        __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(packed));
        __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(packed, 8)));
        for (int64_t k = 0; k < n; ++k) {
          const float* xr = xp + (r0 + k) * in + i;
          acc[k] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xr), acc[k]);
          acc[k] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xr + 8), acc[k]);
        }
      }
      for (int64_t k = 0; k < n; ++k) {
        const float* xr = xp + (r0 + k) * in;
        float sum = hsum(acc[k]);
        for (int64_t j = i; j < in; ++j) sum += xr[j] * static_cast<float>(wr[j]);
        yp[(r0 + k) * out + o] = sum * sp[o] + (bp ? bp[o] : 0.0f);
      }
    }
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_linear", &int8_linear, "weight-only int8 linear (AVX2)");
}
