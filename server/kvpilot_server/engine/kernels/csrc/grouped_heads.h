// Decode attention's two products for up to four query heads that share one kv head, in one pass
// over that head's keys and one over its values (head_dim a multiple of 16; AVX-512, or AVX2
// with FMA). Where either is there, KVPILOT_GROUPED_HEADS is defined.
//
// Scoring head by head reads every key once per query head; with the group in one pass each key
// row is loaded once and serves all of them. The pass is bound by memory, not by its
// multiply-adds: a sequence's rows sit in 16-token blocks scattered over the cache, too short a
// run for the hardware prefetcher, so the scoring pass asks for the keys and the values kFar
// rows ahead into L2 (the value pass then finds them there) and the value pass asks for its rows
// kNear ahead into L1. Both distances were measured on SmolLM2's decode shapes (3 query heads per
// kv head; benchmarks/engine_throughput.py times the whole).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "product.h"

#if (defined(__AVX512F__) && defined(__AVX512DQ__)) || (defined(__AVX2__) && defined(__FMA__))
#define KVPILOT_GROUPED_HEADS 1

namespace kvpilot::grouped {

constexpr int kMaxGroup = 4;  // query heads per pass
constexpr int64_t kFar = 32;  // rows ahead requested into L2 while scoring
constexpr int64_t kNear = 8;  // rows ahead requested into L1 while summing values

// Both passes ask for rows ahead the same way whatever the vector width.
inline void fetch_far(const float* const* keys, const float* const* values, int64_t from,
                      int64_t to, int64_t hd) {
  for (int64_t j = from; j < to; ++j) {
    kvpilot::prefetch_l2(keys[j], 4 * hd);
    kvpilot::prefetch_l2(values[j], 4 * hd);
  }
}

}  // namespace kvpilot::grouped
#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__)
namespace kvpilot::grouped {
// 16-lane vectors: G x 4 accumulators of 4 keys at a time, 4 key vectors.

// s[h * n + t] = scale * q[h] . keys[t] for G heads (q's rows hd apart) and n rows; values[t]
// is only requested ahead. HD is the head size when known at compile time (0: read hd): the
// queries then stay in registers across every key, and the prefetches unroll into bare
// instructions (looped, their bookkeeping was as many instructions as the multiply-adds).
template <int G, int64_t HD>
void scores(const float* q, const float* const* keys, const float* const* values, int64_t n,
            int64_t hd, float scale, float* s) {
  if constexpr (HD > 0) hd = HD;
  const int64_t chunks = hd / 16;
  __m512 qv[G][HD > 0 ? HD / 16 : 1];
  if constexpr (HD > 0)
    for (int h = 0; h < G; ++h)
      for (int64_t c = 0; c < HD / 16; ++c) qv[h][c] = _mm512_loadu_ps(q + h * HD + 16 * c);
  auto query = [&](int h, int64_t c) {
    if constexpr (HD > 0) return qv[h][c];
    else return _mm512_loadu_ps(q + h * hd + 16 * c);
  };
  const __m128 scale4 = _mm_set1_ps(scale);
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    fetch_far(keys, values, t + kFar, std::min(n, t + kFar + 4), hd);
    __m512 acc[G][4];
    for (int h = 0; h < G; ++h)
      for (int j = 0; j < 4; ++j) acc[h][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      __m512 key[4];
      for (int j = 0; j < 4; ++j) key[j] = _mm512_loadu_ps(keys[t + j] + 16 * c);
      for (int h = 0; h < G; ++h) {
        const __m512 qh = query(h, c);
        for (int j = 0; j < 4; ++j) acc[h][j] = _mm512_fmadd_ps(qh, key[j], acc[h][j]);
      }
    }
    for (int h = 0; h < G; ++h) {
      const __m128 sums = kvpilot::totals4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
      _mm_storeu_ps(s + h * n + t, _mm_mul_ps(sums, scale4));
    }
  }
  for (; t < n; ++t) {
    __m512 acc[G];
    for (int h = 0; h < G; ++h) acc[h] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512 key = _mm512_loadu_ps(keys[t] + 16 * c);
      for (int h = 0; h < G; ++h) acc[h] = _mm512_fmadd_ps(query(h, c), key, acc[h]);
    }
    for (int h = 0; h < G; ++h) s[h * n + t] = _mm512_reduce_add_ps(acc[h]) * scale;
  }
}

// out[h] = sum_t p[h * n + t] values[t] for G heads (out's rows hd apart), 64 dimensions at a
// time so that G x 4 sums stay in registers (HD as for scores).
template <int G, int64_t HD>
void weighted_sum(const float* p, const float* const* values, int64_t n, int64_t hd, float* out) {
  if constexpr (HD > 0) hd = HD;
  for (int64_t d0 = 0; d0 < hd; d0 += 64) {
    const int64_t chunks = std::min<int64_t>(64, hd - d0) / 16;
    __m512 acc[G][4];
    for (int h = 0; h < G; ++h)
      for (int c = 0; c < 4; ++c) acc[h][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      if (t + kNear < n) kvpilot::prefetch(values[t + kNear] + d0, 64 * chunks);
      __m512 v[4];
      for (int64_t c = 0; c < chunks; ++c) v[c] = _mm512_loadu_ps(values[t] + d0 + 16 * c);
      for (int h = 0; h < G; ++h) {
        const __m512 w = _mm512_set1_ps(p[h * n + t]);
        for (int64_t c = 0; c < chunks; ++c) acc[h][c] = _mm512_fmadd_ps(w, v[c], acc[h][c]);
      }
    }
    for (int h = 0; h < G; ++h)
      for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(out + h * hd + d0 + 16 * c, acc[h][c]);
  }
}

}  // namespace kvpilot::grouped

#elif defined(KVPILOT_GROUPED_HEADS)
namespace kvpilot::grouped {
// 8-lane vectors and 16 registers: 4 keys at a time for up to 3 heads (12 accumulators), 2 for
// 4; the queries are read from L1 (they no longer fit in registers), the keys once a pass.
template <int G, int64_t HD>
void scores(const float* q, const float* const* keys, const float* const* values, int64_t n,
            int64_t hd, float scale, float* s) {
  if constexpr (HD > 0) hd = HD;
  constexpr int K = G <= 3 ? 4 : 2;
  const int64_t chunks = hd / 8;
  int64_t t = 0;
  for (; t + K <= n; t += K) {
    fetch_far(keys, values, t + kFar, std::min(n, t + kFar + K), hd);
    __m256 acc[G][K];
    for (int h = 0; h < G; ++h)
      for (int j = 0; j < K; ++j) acc[h][j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      __m256 key[K];
      for (int j = 0; j < K; ++j) key[j] = _mm256_loadu_ps(keys[t + j] + 8 * c);
      for (int h = 0; h < G; ++h) {
        const __m256 qh = _mm256_loadu_ps(q + h * hd + 8 * c);
        for (int j = 0; j < K; ++j) acc[h][j] = _mm256_fmadd_ps(qh, key[j], acc[h][j]);
      }
    }
    for (int h = 0; h < G; ++h) {
      if constexpr (K == 4) {  // the four keys' totals in one shuffle tree
        const __m128 sums = kvpilot::totals4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
        _mm_storeu_ps(s + h * n + t, _mm_mul_ps(sums, _mm_set1_ps(scale)));
      } else {
        for (int j = 0; j < K; ++j) s[h * n + t + j] = kvpilot::hsum(acc[h][j]) * scale;
      }
    }
  }
  for (; t < n; ++t) {
    __m256 acc[G];
    for (int h = 0; h < G; ++h) acc[h] = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      const __m256 key = _mm256_loadu_ps(keys[t] + 8 * c);
      for (int h = 0; h < G; ++h)
        acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * hd + 8 * c), key, acc[h]);
    }
    for (int h = 0; h < G; ++h) s[h * n + t] = kvpilot::hsum(acc[h]) * scale;
  }
}

// out[h] = sum_t p[h * n + t] values[t] for G heads, 32 dimensions at a time for up to 3 heads
// (12 sums in registers), 16 for 4; each value vector is read from L1 once per head.
template <int G, int64_t HD>
void weighted_sum(const float* p, const float* const* values, int64_t n, int64_t hd, float* out) {
  if constexpr (HD > 0) hd = HD;
  constexpr int64_t C = G <= 3 ? 4 : 2;  // 8-lane chunks a pass
  for (int64_t d0 = 0; d0 < hd; d0 += 8 * C) {
    const int64_t chunks = std::min<int64_t>(8 * C, hd - d0) / 8;
    __m256 acc[G][C];
    for (int h = 0; h < G; ++h)
      for (int64_t c = 0; c < C; ++c) acc[h][c] = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      if (t + kNear < n) kvpilot::prefetch(values[t + kNear] + d0, 32 * chunks);
      const float* v = values[t] + d0;
      for (int h = 0; h < G; ++h) {
        const __m256 w = _mm256_set1_ps(p[h * n + t]);
        for (int64_t c = 0; c < chunks; ++c)
          acc[h][c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * c), acc[h][c]);
      }
    }
    for (int h = 0; h < G; ++h)
      for (int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(out + h * hd + d0 + 8 * c, acc[h][c]);
  }
}

}  // namespace kvpilot::grouped
#endif
