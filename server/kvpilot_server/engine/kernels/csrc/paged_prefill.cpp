// Prompt attention straight from the paged KV cache, for CPUs: every query token of a step's
// prompt chunks attends to its sequence's keys up to its own position (within the sliding
// window, where the layer has one). paged_attention writes the chunk's own keys and values into
// the cache first, so a chunk that continues a cached context and a fresh prompt are the same
// case: rows are read in place through the block table, nothing is gathered, padded or masked
// in memory (the reference path copies a continued chunk's whole context per layer).
//
// A task is one kv head of a block of kLanes consecutive tokens of one chunk. Its query heads'
// rows are transposed once, so that a vector holds one head's dimension for kLanes tokens: a
// score is then a key's element broadcast against a vector of queries (no horizontal sums), the
// causal and window limits are a range of lanes, and the softmax's running max and sum are
// lane-wise. Keys run in blocks under an online softmax (a block raises the running max: the
// output so far is rescaled), so the scratch stays in L1 and L2 at any context length; the
// values' product broadcasts a value's element against a vector of weights the same way.
#include "kernels.h"
#include "product.h"
#include "softmax.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

namespace {

#if defined(__AVX512F__) && defined(__AVX512DQ__)
using Vec = __m512;
// 32 registers: kQ x kK score accumulators (or kQ x kD output ones), kQ query or weight vectors,
// one broadcast.
constexpr int kLanes = 16, kQ = 3, kK = 8, kD = 8;
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
// Lanes [first, end) of v, -inf elsewhere.
inline Vec lanes_only(Vec v, int64_t first, int64_t end) {
  const unsigned keep = ((1u << end) - 1) & ~((1u << first) - 1);
  return _mm512_mask_blend_ps(static_cast<__mmask16>(keep), splat(-INFINITY), v);
}
// e^x, 0 where x is below e's float range (-inf: a masked score).
inline Vec exp(Vec x) {
  const __m256 lo = kvpilot::softmax_ops::exp8(_mm512_castps512_ps256(x));
  const __m256 hi = kvpilot::softmax_ops::exp8(_mm512_extractf32x8_ps(x, 1));
  const Vec e = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, splat(-87.0f), _CMP_GE_OQ), e);
}
#else
using Vec = __m256;
// 16 registers: kQ x kK (or kQ x kD) accumulators, kQ query or weight vectors, one broadcast.
constexpr int kLanes = 8, kQ = 2, kK = 6, kD = 4;
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec lanes_only(Vec v, int64_t first, int64_t end) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i in = _mm256_andnot_si256(
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(first)), lane),
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(end)), lane));
  return _mm256_blendv_ps(splat(-INFINITY), v, _mm256_castsi256_ps(in));
}
inline Vec exp(Vec x) {
  const Vec e = kvpilot::softmax_ops::exp8(x);
  return _mm256_and_ps(e, _mm256_cmp_ps(x, splat(-87.0f), _CMP_GE_OQ));
}
#endif

constexpr int64_t kKeyBlock = 128;  // keys per online-softmax step: their scores stay in L1/L2

// One chunk of a step: its rows of q and out, its keys' block table, where it starts.
struct Chunk {
  int64_t row;      // first row of q and out
  int64_t len;      // query tokens
  int64_t context;  // keys visible to its last token: the cached context plus the chunk
  const int64_t* table;
};

struct Shape {
  int64_t heads, kv_heads, group, hd, block_size, q_stride, window;
  float scale;
};

// Where a sequence's rows of one kv head are (keys or values), position by position.
struct Rows {
  const float* cache;
  const int64_t* table;
  int64_t block_size, kv_heads, kv, hd;
  const float* at(int64_t pos) const {
    const int64_t slot = table[pos / block_size] * block_size + pos % block_size;
    return cache + (slot * kv_heads + kv) * hd;
  }
};

// Scores of NK keys from key `t` against NQ head vectors from `h`: s[(t + j) * G + h + q].
template <int NQ, int NK>
void score_tile(const float* qt, const float* const* keys, int64_t t, int64_t h, int64_t hd,
                int64_t group, float* s) {
  Vec acc[NQ][NK];
  for (int q = 0; q < NQ; ++q)
    for (int j = 0; j < NK; ++j) acc[q][j] = zero();
  const float* key[NK];
  for (int j = 0; j < NK; ++j) key[j] = keys[t + j];
  for (int64_t d = 0; d < hd; ++d) {
    Vec qv[NQ];
    for (int q = 0; q < NQ; ++q) qv[q] = load(qt + ((h + q) * hd + d) * kLanes);
    for (int j = 0; j < NK; ++j) {
      const Vec k = splat(key[j][d]);
      for (int q = 0; q < NQ; ++q) acc[q][j] = fma(qv[q], k, acc[q][j]);
    }
  }
  for (int j = 0; j < NK; ++j)
    for (int q = 0; q < NQ; ++q) store(s + ((t + j) * group + h + q) * kLanes, acc[q][j]);
}

template <int NQ>
void score_keys(const float* qt, const float* const* keys, int64_t n, int64_t h, int64_t hd,
                int64_t group, float* s) {
  int64_t t = 0;
  for (; t + kK <= n; t += kK) score_tile<NQ, kK>(qt, keys, t, h, hd, group, s);
  for (; t < n; ++t) score_tile<NQ, 1>(qt, keys, t, h, hd, group, s);
}

// ot[(h + q) * hd + d0 + j] += sum_t p[t * G + h + q] values[t][d0 + j], kD dimensions at once.
template <int NQ>
void weigh_values(const float* p, const float* const* values, int64_t n, int64_t h, int64_t hd,
                  int64_t group, float* ot) {
  for (int64_t d0 = 0; d0 < hd; d0 += kD) {
    Vec acc[NQ][kD];
    for (int q = 0; q < NQ; ++q)
      for (int j = 0; j < kD; ++j) acc[q][j] = load(ot + ((h + q) * hd + d0 + j) * kLanes);
    for (int64_t t = 0; t < n; ++t) {
      Vec w[NQ];
      for (int q = 0; q < NQ; ++q) w[q] = load(p + (t * group + h + q) * kLanes);
      const float* v = values[t] + d0;
      for (int j = 0; j < kD; ++j) {
        const Vec x = splat(v[j]);
        for (int q = 0; q < NQ; ++q) acc[q][j] = fma(w[q], x, acc[q][j]);
      }
    }
    for (int q = 0; q < NQ; ++q)
      for (int j = 0; j < kD; ++j) store(ot + ((h + q) * hd + d0 + j) * kLanes, acc[q][j]);
  }
}

// Every head vector of the group, kQ at a time (the last pass takes the rest).
template <typename F>
void by_heads(int64_t group, F&& pass) {
  int64_t h = 0;
  for (; h + kQ <= group; h += kQ) pass(std::integral_constant<int, kQ>{}, h);
  switch (group - h) {
    case 0: break;
    case 1: pass(std::integral_constant<int, 1>{}, h); break;
    default: pass(std::integral_constant<int, 2>{}, h); break;  // kQ is 3 or 2
  }
}

struct Scratch {
  std::vector<float> qt, s, ot, top, total;
  std::vector<const float*> keys, values;
};

// Tokens [t0, t0 + kLanes) of a chunk (those below its length), kv head kv: their G query heads.
void attend(const float* qp, const float* kc, const float* vc, float* op, const Chunk& c,
            int64_t t0, int64_t kv, const Shape& sh, Scratch& w) {
  const int64_t G = sh.group, hd = sh.hd, valid = std::min<int64_t>(kLanes, c.len - t0);
  const int64_t p0 = c.context - c.len + t0;  // position of the task's first token
  const int64_t end = std::min(c.context, p0 + kLanes);
  const int64_t start = sh.window > 0 ? std::max<int64_t>(0, p0 - sh.window + 1) : 0;
  w.qt.assign(G * hd * kLanes, 0.0f);
  for (int64_t i = 0; i < valid; ++i)
    for (int64_t h = 0; h < G; ++h) {
      const float* q = qp + (c.row + t0 + i) * sh.q_stride + (kv * G + h) * hd;
      for (int64_t d = 0; d < hd; ++d) w.qt[(h * hd + d) * kLanes + i] = q[d];
    }
  w.ot.assign(G * hd * kLanes, 0.0f);
  w.top.assign(G * kLanes, -INFINITY);
  w.total.assign(G * kLanes, 0.0f);
  w.s.resize(kKeyBlock * G * kLanes);
  const Rows keys{kc, c.table, sh.block_size, sh.kv_heads, kv, hd};
  const Rows values{vc, c.table, sh.block_size, sh.kv_heads, kv, hd};
  for (int64_t k0 = start; k0 < end; k0 += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, end - k0);
    w.keys.resize(n);
    w.values.resize(n);
    for (int64_t t = 0; t < n; ++t) {
      w.keys[t] = keys.at(k0 + t);
      w.values[t] = values.at(k0 + t);
    }
    float* s = w.s.data();
    by_heads(G, [&](auto nq, int64_t h) {
      score_keys<decltype(nq)::value>(w.qt.data(), w.keys.data(), n, h, hd, G, s);
    });
    // Scale, limit to the lanes that see each key, and take each lane's running max.
    const Vec scale = splat(sh.scale);
    for (int64_t h = 0; h < G; ++h) {
      Vec top = load(&w.top[h * kLanes]);
      const Vec before = top;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t key = k0 + t;  // lane i sees it where key <= p0 + i < key + window
        const int64_t first = std::max<int64_t>(0, key - p0);
        const int64_t last = sh.window > 0 ? std::min<int64_t>(kLanes, key - p0 + sh.window)
                                           : kLanes;
        float* row = s + (t * G + h) * kLanes;
        Vec v = mul(load(row), scale);
        if (first > 0 || last < kLanes) v = lanes_only(v, first, last);
        store(row, v);
        top = max(top, v);
      }
      // Weights e^(score - max); what was summed under the old max is rescaled to the new.
      Vec sum = zero();
      for (int64_t t = 0; t < n; ++t) {
        float* row = s + (t * G + h) * kLanes;
        const Vec e = exp(sub(load(row), top));
        store(row, e);
        sum = add(sum, e);
      }
      const Vec rescale = exp(sub(before, top));
      store(&w.total[h * kLanes], add(mul(load(&w.total[h * kLanes]), rescale), sum));
      store(&w.top[h * kLanes], top);
      float* ot = w.ot.data() + h * hd * kLanes;
      for (int64_t d = 0; d < hd; ++d) store(ot + d * kLanes, mul(load(ot + d * kLanes), rescale));
    }
    by_heads(G, [&](auto nq, int64_t h) {
      weigh_values<decltype(nq)::value>(s, w.values.data(), n, h, hd, G, w.ot.data());
    });
  }
  for (int64_t h = 0; h < G; ++h)
    for (int64_t i = 0; i < valid; ++i) {
      const float inverse = 1.0f / w.total[h * kLanes + i];
      float* o = op + ((c.row + t0 + i) * sh.heads + kv * G + h) * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = w.ot[(h * hd + d) * kLanes + i] * inverse;
    }
}

}  // namespace

void paged_prefill(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
                   at::Tensor rows, at::Tensor lens, at::Tensor context_lens, double scale,
                   int64_t window, at::Tensor out) {
  TORCH_CHECK(
      q.dim() == 3 && q.scalar_type() == at::kFloat && q.stride(2) == 1 && q.stride(1) == q.size(2),
      "q: float32 [N, heads, head_dim], each row's heads contiguous");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes() && out.scalar_type() == at::kFloat,
              "out: contiguous float32, q's shape");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat,
              "the caches: contiguous float32");
  const auto tables = block_tables.contiguous();
  const auto rp = rows.contiguous(), lp = lens.contiguous(), cp = context_lens.contiguous();
  const int64_t heads = q.size(1), hd = q.size(2), kvh = k_cache.size(2);
  TORCH_CHECK(hd % kD == 0 && k_cache.size(3) == hd, "head_dim: a multiple of ", kD);
  TORCH_CHECK(heads % kvh == 0, "query heads: a multiple of the kv heads");
  const Shape sh{heads,           kvh, heads / kvh, hd, k_cache.size(1), q.stride(0),
                 window, static_cast<float>(scale)};
  std::vector<Chunk> chunks;
  for (int64_t c = 0; c < rp.size(0); ++c) {
    const Chunk chunk{rp.data_ptr<int64_t>()[c], lp.data_ptr<int64_t>()[c],
                      cp.data_ptr<int64_t>()[c],
                      tables.data_ptr<int64_t>() + c * tables.size(1)};
    TORCH_CHECK(chunk.len <= chunk.context && chunk.row + chunk.len <= q.size(0) &&
                    (chunk.context + sh.block_size - 1) / sh.block_size <= tables.size(1),
                "a chunk outside q or its block table");
    chunks.push_back(chunk);
  }
  // (chunk, first token, kv head), the latest tokens (the most keys) first: the threads take
  // the long tasks while there are many left, and finish on short ones.
  std::vector<std::array<int64_t, 3>> tasks;
  for (int64_t c = 0; c < static_cast<int64_t>(chunks.size()); ++c)
    for (int64_t t0 = 0; t0 < chunks[c].len; t0 += kLanes)
      for (int64_t kv = 0; kv < kvh; ++kv) tasks.push_back({c, t0, kv});
  std::stable_sort(tasks.begin(), tasks.end(), [&](const auto& a, const auto& b) {
    const auto keys = [&](const auto& t) { return chunks[t[0]].context - chunks[t[0]].len + t[1]; };
    return keys(a) > keys(b);
  });
  const float* qp = q.data_ptr<float>();
  const float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < static_cast<int64_t>(tasks.size()); ++i) {
    thread_local Scratch scratch;
    const auto& [c, t0, kv] = tasks[i];
    attend(qp, kc, vc, op, chunks[c], t0, kv, sh, scratch);
  }
}
