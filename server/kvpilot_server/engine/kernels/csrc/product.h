// What every decode-sized product in this directory shares: output rows split across OpenMP
// threads, up to kRows input rows against each weight row so the weights are read once.
#pragma once
#include "kernels.h"
#include <immintrin.h>

#include <algorithm>

namespace kvpilot {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

// The four totals of a, b, c and d (8 lanes each).
inline __m128 totals4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// The four totals of a, b, c and d: pairwise within 128-bit lanes, then across them.
inline __m128 totals4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 lanes =
      _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
  const __m256 half =
      _mm256_add_ps(_mm512_castps512_ps256(lanes), _mm512_extractf32x8_ps(lanes, 1));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}
#endif

// Pins a loaded vector in a register. Without it GCC folds the load into every multiply-add
// that uses the vector (one load per use), and in a register tile the loads, not the
// multiply-adds, then bound the loop (float32_gemm's tile; benchmarks/engine_throughput.py).
template <typename V>
inline void in_register(V& v) {
  asm("" : "+v"(v));
}

// A weight row this many output rows ahead is requested before the current one is read: one
// thread's stream of rows is too little for the hardware prefetcher to keep the memory bus busy
// (measured on SmolLM2's int4 decode matrices: 3.85 -> 2.93 ms per step's worth).
constexpr int64_t kAhead = 4;

inline void prefetch(const void* start, int64_t bytes) {
  const char* p = static_cast<const char*>(start);
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
}

// The same into L2 only: for rows wanted a few hundred cycles later, which in L1 would push out
// what is being read now.
inline void prefetch_l2(const void* start, int64_t bytes) {
  const char* p = static_cast<const char*>(start);
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T1);
}

// int4 scales and minimums are stored as float16 (as GGUF's Q4_1 stores them): raw bits here.
inline float half(const uint16_t* p, int64_t i) { return _cvtsh_ss(p[i]); }

inline const uint16_t* half_bits(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kHalf && t.is_contiguous(), "a contiguous float16 tensor");
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>());
}

constexpr int kRows = 8;  // input rows per pass: 8 accumulators + 2 weight registers of 16

// y = x W^T + bias for every output row, split across threads; `dot.template rows<R>(o, r0,
// sums)` gives R consecutive input rows' results for output row o (R a compile-time count so
// the accumulators stay in registers).
template <typename Dot>
at::Tensor product(const Dot& dot, int64_t rows, int64_t out, const at::Tensor& like,
                   const c10::optional<at::Tensor>& bias) {
  auto y = at::empty({rows, out}, like.options());
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    float sums[kRows];
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
      const int64_t n = std::min<int64_t>(kRows, rows - r0);
      switch (n) {
        case 1: dot.template rows<1>(o, r0, sums); break;
        case 2: dot.template rows<2>(o, r0, sums); break;
        case 3: dot.template rows<3>(o, r0, sums); break;
        case 4: dot.template rows<4>(o, r0, sums); break;
        case 5: dot.template rows<5>(o, r0, sums); break;
        case 6: dot.template rows<6>(o, r0, sums); break;
        case 7: dot.template rows<7>(o, r0, sums); break;
        default: dot.template rows<8>(o, r0, sums); break;
      }
      for (int64_t r = 0; r < n; ++r) yp[(r0 + r) * out + o] = sums[r] + (bp ? bp[o] : 0.0f);
    }
  }
  return y;
}

// A float32 product's bias as a contiguous [out] (kept alive by the caller), or none.
inline c10::optional<at::Tensor> checked_bias(const c10::optional<at::Tensor>& bias, int64_t out) {
  if (!bias.has_value()) return c10::nullopt;
  auto b = bias->contiguous();
  TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == out, "bias: float32 [out]");
  return b;
}

inline at::Tensor rows_of(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x: 2-D float32");
  return x.contiguous();
}

}  // namespace kvpilot
