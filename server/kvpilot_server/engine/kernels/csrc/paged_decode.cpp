// Decode attention straight from the paged KV cache, for CPUs.
//
// One query token per sequence; each sequence and kv head is one OpenMP task (each part of its
// keys, where a batch has too few sequences for the threads: decode_split.h). It finds that kv
// head's keys and values through the block table once and serves every query head that shares
// it (grouped-query attention), so nothing is copied, padded or repeated for float32. With a
// head_dim of a multiple of 16, up to four query heads of the group share one pass over the
// keys and one over the values (grouped_heads.h; 16-lane vectors with AVX-512, 8 with AVX2).
// Otherwise, per query head: scores four keys at a time with the query in registers, a
// vectorised softmax, then the weighted sum of values 64 dimensions at a time in registers.
// Either way the rows are asked for ahead (a sequence's blocks are scattered, too short a run
// for the hardware prefetcher), and the multiply-adds are explicit, as the module is built
// without contracted ones (cpu_kernels.py).
//
// The cache holds float32, or int8 with a float32 scale per token per kv head. An int8 head
// row is dequantized once into a per-thread buffer, and every query head of its group reads it
// there: widening int8 inside each head's dot product would redo it per query head.
#include "grouped_heads.h"
#include "kernels.h"
#include "decode_split.h"
#include "product.h"
#include "softmax.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace {

using kvpilot::hsum;
using kvpilot::softmax_ops::exp_less_max;
using kvpilot::softmax_ops::softmax;

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kFar = 32;  // rows ahead requested into L2 (as grouped_heads.h, measured there)

// s[t] = scale * q . rows[t] for n rows; q stays in registers, four rows at a time.
// `ahead`, when given, is the value rows: they and the keys are requested into L2 a few rows
// before use (the first head of a group reads them from memory, the rest from L2).
template <int64_t HD>
void scores(const float* q, const float* const* rows, int64_t n, int64_t hd, float scale,
            float* s, const float* const* ahead) {
  const int64_t chunks = (HD > 0 ? HD : hd) / 8;
  __m256 qv[(HD > 0 ? HD : kMaxHeadDim) / 8];
  for (int64_t c = 0; c < chunks; ++c) qv[c] = _mm256_loadu_ps(q + 8 * c);
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    for (int64_t j = t + kFar; ahead && j < std::min(n, t + kFar + 4); ++j) {
      kvpilot::prefetch_l2(rows[j], 4 * hd);
      kvpilot::prefetch_l2(ahead[j], 4 * hd);
    }
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < chunks; ++c) {
      a0 = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(rows[t] + 8 * c), a0);
      a1 = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(rows[t + 1] + 8 * c), a1);
      a2 = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(rows[t + 2] + 8 * c), a2);
      a3 = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(rows[t + 3] + 8 * c), a3);
    }
    _mm_storeu_ps(s + t, _mm_mul_ps(kvpilot::totals4(a0, a1, a2, a3), _mm_set1_ps(scale)));
  }
  for (; t < n; ++t) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c)
      a = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(rows[t] + 8 * c), a);
    s[t] = hsum(a) * scale;
  }
}

// out = sum_t p[t] rows[t], 64 dimensions at a time so the sums stay in registers.
template <int64_t HD>
void weighted_sum(const float* p, const float* const* rows, int64_t n, int64_t hd, float* out) {
  const int64_t dims = HD > 0 ? HD : hd;
  for (int64_t d0 = 0; d0 < dims; d0 += 64) {
    const int64_t chunks = std::min<int64_t>(64, dims - d0) / 8;
    __m256 acc[8];
    for (int64_t c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      const __m256 w = _mm256_set1_ps(p[t]);
      const float* v = rows[t] + d0;
      for (int64_t c = 0; c < chunks; ++c)
        acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * c), acc[c]);
    }
    for (int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(out + d0 + 8 * c, acc[c]);
  }
}

// Where one sequence's visible keys (or values) of one kv head are, as float rows: the cache
// rows themselves, or int8 rows times their scales written once into `buf` (every query head
// of the group then reads the float row).
template <typename T>
void gather_rows(const T* cache, const float* scales, const int64_t* table, int64_t first,
                 int64_t len, int64_t bs, int64_t kvh, int64_t kv, int64_t hd,
                 std::vector<const float*>& rows, std::vector<float>& buf) {
  rows.resize(len - first);
  if constexpr (!std::is_same_v<T, float>) buf.resize((len - first) * hd);
  for (int64_t block = first / bs; block * bs < len; ++block) {  // one table lookup per block
    const int64_t start = block * bs, base = table[block] * bs - start;
    for (int64_t pos = std::max(first, start); pos < std::min(len, start + bs); ++pos) {
      const int64_t slot = base + pos, at = (slot * kvh + kv) * hd;
      if constexpr (std::is_same_v<T, float>) {
        rows[pos - first] = cache + at;
      } else {
        float* row = buf.data() + (pos - first) * hd;
        const float s = scales[slot * kvh + kv];
        for (int64_t i = 0; i < hd; ++i) row[i] = s * static_cast<float>(cache[at + i]);
        rows[pos - first] = row;
      }
    }
  }
}

// A task's share of one kv head's group of query heads: the whole of the visible keys, giving
// the attention itself, or one part of them (see Split), giving each head's output before
// normalising and its scores' {max, sum of e^(score - max)} in `stats`.
struct Part {
  float* out;    // [heads, hd]
  float* stats;  // [heads, 2], or null when the part is the whole
};

// probs[0, n) are scores: made into the weights the values are summed with.
inline void weigh(float* probs, int64_t n, float* stats) {
  if (stats == nullptr) return softmax(probs, n);
  const auto [top, total] = exp_less_max(probs, n);
  stats[0] = top;
  stats[1] = total;
}

#if defined(KVPILOT_GROUPED_HEADS)
template <int G, int64_t HD>
void grouped_pass(const float* q, const float* const* keys, const float* const* values,
                  int64_t n, int64_t hd, float scale, float* probs, Part part) {
  kvpilot::grouped::scores<G, HD>(q, keys, values, n, hd, scale, probs);
  for (int h = 0; h < G; ++h) weigh(probs + h * n, n, part.stats ? part.stats + 2 * h : nullptr);
  kvpilot::grouped::weighted_sum<G, HD>(probs, values, n, hd, part.out);
}

// `heads` (1 to 4) consecutive query heads of one kv head's group; probs holds heads x n.
template <int64_t HD>
void grouped_heads(int64_t heads, const float* q, const float* const* keys,
                   const float* const* values, int64_t n, int64_t hd, float scale, float* probs,
                   Part part) {
  switch (heads) {
    case 1: grouped_pass<1, HD>(q, keys, values, n, hd, scale, probs, part); break;
    case 2: grouped_pass<2, HD>(q, keys, values, n, hd, scale, probs, part); break;
    case 3: grouped_pass<3, HD>(q, keys, values, n, hd, scale, probs, part); break;
    default: grouped_pass<4, HD>(q, keys, values, n, hd, scale, probs, part); break;
  }
}
#endif

// One OpenMP task per sequence, kv head and part: a single sequence (batch 1) still uses every
// core, and a task reads its kv head's keys and values for all the query heads that share it.
// HD is the head dimension when known at compile time (the loops then unroll fully), or 0 to
// read it at run time; either way a multiple of 8. ksp/vsp are the scales, null for float32.
template <int64_t HD, typename T>
void decode_rows(const float* qp, const T* kp, const T* vp, const float* ksp, const float* vsp,
                 const int64_t* bt, const int64_t* lens, float* op, int64_t D, int64_t H,
                 int64_t hd, int64_t bs, int64_t kvh, int64_t max_blocks, float scale,
                 int64_t window, kvpilot::Split& split) {
  const int64_t group = H / kvh, parts = split.parts;  // query heads per kv head, consecutive
#pragma omp parallel for schedule(dynamic)
  for (int64_t task = 0; task < D * kvh * parts; ++task) {
    thread_local std::vector<const float*> keys, values;
    thread_local std::vector<float> key_buf, value_buf, probs;
    const int64_t d = task / (kvh * parts), kv = task / parts % kvh, p = task % parts;
    const int64_t len = lens[d], visible = window > 0 ? std::min(len, window) : len;
    const int64_t span = (visible + parts - 1) / parts;
    const int64_t first = len - visible + p * span, end = std::min(len, first + span);
    const int64_t n = end - first, at = task * group;  // `at`: this part's first head in split
    float* stats = parts > 1 ? split.stats.data() + 2 * at : nullptr;
    if (n <= 0) {  // no keys: a part weighs nothing in the merge, a whole row reads zeros
      if (stats) std::fill(stats, stats + 2 * group, 0.0f);
      else std::fill(op + (d * H + kv * group) * hd, op + (d * H + (kv + 1) * group) * hd, 0.0f);
      continue;
    }
    auto out = [&](int64_t head) {
      return Part{parts > 1 ? split.out.data() + (at + head) * hd
                            : op + (d * H + kv * group + head) * hd,
                  stats ? stats + 2 * head : nullptr};
    };
    const int64_t* table = bt + d * max_blocks;
    gather_rows(kp, ksp, table, first, end, bs, kvh, kv, hd, keys, key_buf);
    gather_rows(vp, vsp, table, first, end, bs, kvh, kv, hd, values, value_buf);
    const float* q = qp + (d * H + kv * group) * hd;
#if defined(KVPILOT_GROUPED_HEADS)
    if (hd % 16 == 0) {
      probs.resize(kvpilot::grouped::kMaxGroup * n);
      for (int64_t head = 0; head < group; head += kvpilot::grouped::kMaxGroup) {
        const int64_t heads = std::min<int64_t>(kvpilot::grouped::kMaxGroup, group - head);
        grouped_heads<HD>(heads, q + head * hd, keys.data(), values.data(), n, hd, scale,
                      probs.data(), out(head));
      }
      continue;
    }
#endif
    probs.resize(n);
    for (int64_t head = 0; head < group; ++head) {
      scores<HD>(q + head * hd, keys.data(), n, hd, scale, probs.data(),
                 head == 0 ? values.data() : nullptr);
      weigh(probs.data(), n, out(head).stats);
      weighted_sum<HD>(probs.data(), values.data(), n, hd, out(head).out);
    }
  }
  if (parts > 1) split.merge(op, D, H, kvh, hd);
}

}  // namespace

template <typename T>
at::Tensor decode(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, const float* k_scale,
                  const float* v_scale, at::Tensor block_tables, at::Tensor context_lens,
                  double scale, int64_t window) {
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous());
  TORCH_CHECK(q.scalar_type() == at::kFloat);
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = at::empty_like(q);
  const int64_t hd = q.size(2);
  TORCH_CHECK(hd % 8 == 0 && hd <= kMaxHeadDim, "head_dim: a multiple of 8, at most 256");
  const int64_t D = q.size(0), kvh = k_cache.size(2);
  const int64_t* lp = lens.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t d = 0; d < D; ++d)
    longest = std::max(longest, window > 0 ? std::min(lp[d], window) : lp[d]);
  kvpilot::Split split(D, q.size(1), kvh, hd, longest);
  auto rows = hd == 64 ? decode_rows<64, T> : hd == 128 ? decode_rows<128, T> : decode_rows<0, T>;
  rows(q.data_ptr<float>(), k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), k_scale, v_scale,
       tables.data_ptr<int64_t>(), lp, out.data_ptr<float>(), D, q.size(1), hd, k_cache.size(1),
       kvh, tables.size(1), static_cast<float>(scale), window, split);
  return out;
}

at::Tensor paged_decode(
    at::Tensor q,             // [D, heads, head_dim] float32
    at::Tensor k_cache,       // [num_blocks, block_size, kv_heads, head_dim] float32
    at::Tensor v_cache,
    at::Tensor block_tables,  // [D, max_blocks] int64
    at::Tensor context_lens,  // [D] int64
    double scale,
    int64_t window) {         // sliding window, or <= 0 for full attention
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat);
  return decode<float>(q, k_cache, v_cache, nullptr, nullptr, block_tables, context_lens, scale,
                       window);
}

at::Tensor paged_decode_int8(
    at::Tensor q,             // [D, heads, head_dim] float32
    at::Tensor k_cache,       // [num_blocks, block_size, kv_heads, head_dim] int8
    at::Tensor v_cache,
    at::Tensor k_scale,       // [num_blocks, block_size, kv_heads] float32
    at::Tensor v_scale,
    at::Tensor block_tables,  // [D, max_blocks] int64
    at::Tensor context_lens,  // [D] int64
    double scale,
    int64_t window) {
  TORCH_CHECK(k_cache.scalar_type() == at::kChar && v_cache.scalar_type() == at::kChar);
  TORCH_CHECK(k_scale.is_contiguous() && v_scale.is_contiguous());
  TORCH_CHECK(k_scale.scalar_type() == at::kFloat && v_scale.scalar_type() == at::kFloat);
  return decode<int8_t>(q, k_cache, v_cache, k_scale.data_ptr<float>(),
                        v_scale.data_ptr<float>(), block_tables, context_lens, scale, window);
}
