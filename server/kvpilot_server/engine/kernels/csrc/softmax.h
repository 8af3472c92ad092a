// The softmax of decode attention's scores, vectorised (AVX2), for paged_decode.cpp.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "product.h"

namespace kvpilot::softmax_ops {

// e^x for 8 floats, x <= 0 (scores less their maximum): Cephes' expf, the argument reduced by
// ln 2 in two parts and a degree-5 polynomial, within a few ulp of std::exp. A scalar exp per
// score was most of a long context's decode attention.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // 2^n stays a normal float
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

// Lanes [0, n) of 8, for the tail of a row of scores. Only the tail is masked: AMD's cores run
// a masked store (vmaskmovps) as a long microcoded sequence, and masking every vector of the
// scores made the softmax cost as much as scoring the keys (decode attention, AMD Zen 4).
inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// s[0, n) = e^(s[0, n) - max), in place; returns {max, sum of the results}.
inline std::pair<float, float> exp_less_max(float* s, int64_t n) {
  __m256 top = _mm256_set1_ps(-INFINITY);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + t));
  float m = -INFINITY;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top);
  for (float lane : lanes) m = std::max(m, lane);
  for (int64_t i = t; i < n; ++i) m = std::max(m, s[i]);
  const __m256 shift = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (t = 0; t + 8 <= n; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), shift));
    _mm256_storeu_ps(s + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (t < n) {
    const __m256i mask = first_lanes(n - t);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(s + t, mask), shift));
    const __m256 kept = _mm256_and_ps(e, _mm256_castsi256_ps(mask));
    _mm256_maskstore_ps(s + t, mask, kept);
    sum = _mm256_add_ps(sum, kept);
  }
  return {m, kvpilot::hsum(sum)};
}

// s[0, n) = softmax(s[0, n)), in place.
inline void softmax(float* s, int64_t n) {
  const __m256 inverse = _mm256_set1_ps(1.0f / exp_less_max(s, n).second);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    _mm256_storeu_ps(s + t, _mm256_mul_ps(_mm256_loadu_ps(s + t), inverse));
  if (t < n) {
    const __m256i mask = first_lanes(n - t);
    _mm256_maskstore_ps(s + t, mask, _mm256_mul_ps(_mm256_maskload_ps(s + t, mask), inverse));
  }
}

}  // namespace kvpilot::softmax_ops
