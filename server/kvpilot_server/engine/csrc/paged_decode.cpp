// Decode attention straight from the paged KV cache, for CPUs.
//
// One query token per sequence; each sequence and kv head is one OpenMP task. It reads that kv
// head's keys and values once, block by block through the block table, and serves every query
// head that shares it (grouped-query attention), so nothing is gathered, padded or repeated.
//
// The cache holds float32, or int8 with a float32 scale per token per kv head. An int8 head
// row is dequantized on the fly into a small buffer, once, and every query head of its group
// reads it there: widening int8 inside each head's dot product would redo it per query head.
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

// One token's keys or values for one kv head, as float: the cache row itself, or the int8 row
// times its scale, written into `buf`.
template <int64_t HD, typename T>
inline const float* head_row(const T* cache, const float* scales, int64_t slot, int64_t head,
                             int64_t kvh, int64_t hd, float* buf) {
  const int64_t n = HD > 0 ? HD : hd;
  if constexpr (std::is_same_v<T, float>) {
    return cache + (slot * kvh + head) * n;
  } else {
    const int8_t* src = cache + (slot * kvh + head) * n;
    const float s = scales[slot * kvh + head];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) buf[i] = s * static_cast<float>(src[i]);
    return buf;
  }
}

// HD is the head dimension when known at compile time (the inner loops then unroll and
// vectorize fully), or 0 to read it at run time. ksp/vsp are the scales, null for float32.
// One OpenMP task per sequence and kv head: a single sequence (batch 1) still uses every core,
// and a task reads its kv head's keys and values once for all the query heads that share it.
template <int64_t HD, typename T>
void decode_rows(const float* qp, const T* kp, const T* vp, const float* ksp, const float* vsp,
                 const int64_t* bt, const int64_t* lens, float* op, int64_t D, int64_t H,
                 int64_t hd_runtime, int64_t bs, int64_t kvh, int64_t max_blocks, float scale,
                 int64_t window) {
  const int64_t hd = HD > 0 ? HD : hd_runtime;
  const int64_t group = H / kvh;  // query heads per kv head, consecutive
#pragma omp parallel for schedule(dynamic)
  for (int64_t task = 0; task < D * kvh; ++task) {
    const int64_t d = task / kvh, kv = task % kvh;
    const int64_t len = lens[d];
    const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
    const int64_t* table = bt + d * max_blocks;
    const float* qd = qp + (d * H + kv * group) * hd;  // this kv head's query heads
    std::vector<float> scores(group * len);
    std::vector<float> acc(group * hd, 0.0f);
    std::vector<float> buf(std::is_same_v<T, float> ? 0 : hd);
    // Pass 1: scaled q.k for every visible position and query head, block by block.
    for (int64_t pos = first; pos < len;) {
      const int64_t offset = pos % bs, count = std::min(bs - offset, len - pos);
      const int64_t slot = table[pos / bs] * bs + offset;
      for (int64_t t = 0; t < count; ++t) {
        const float* k = head_row<HD>(kp, ksp, slot + t, kv, kvh, hd, buf.data());
        for (int64_t head = 0; head < group; ++head) {
          const float* qh = qd + head * hd;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < hd; ++i) dot += qh[i] * k[i];
          scores[head * len + pos + t] = dot * scale;
        }
      }
      pos += count;
    }
    // Softmax over the visible positions of each query head.
    for (int64_t head = 0; head < group; ++head) {
      float* s = scores.data() + head * len;
      const float top = *std::max_element(s + first, s + len);
      float sum = 0.0f;
      for (int64_t t = first; t < len; ++t) {
        s[t] = std::exp(s[t] - top);
        sum += s[t];
      }
      const float inv = 1.0f / sum;
      for (int64_t t = first; t < len; ++t) s[t] *= inv;
    }
    // Pass 2: probability-weighted sum of the values.
    for (int64_t pos = first; pos < len;) {
      const int64_t offset = pos % bs, count = std::min(bs - offset, len - pos);
      const int64_t slot = table[pos / bs] * bs + offset;
      for (int64_t t = 0; t < count; ++t) {
        const float* v = head_row<HD>(vp, vsp, slot + t, kv, kvh, hd, buf.data());
        for (int64_t head = 0; head < group; ++head) {
          const float p = scores[head * len + pos + t];
          float* a = acc.data() + head * hd;
#pragma omp simd
          for (int64_t i = 0; i < hd; ++i) a[i] += p * v[i];
        }
      }
      pos += count;
    }
    std::copy(acc.begin(), acc.end(), op + (d * H + kv * group) * hd);
  }
}

template <typename T>
torch::Tensor decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                     const float* k_scale, const float* v_scale, torch::Tensor block_tables,
                     torch::Tensor context_lens, double scale, int64_t window) {
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous());
  TORCH_CHECK(q.scalar_type() == torch::kFloat32);
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = torch::empty_like(q);
  const int64_t hd = q.size(2);
  auto rows = hd == 64 ? decode_rows<64, T> : hd == 128 ? decode_rows<128, T> : decode_rows<0, T>;
  rows(q.data_ptr<float>(), k_cache.data_ptr<T>(), v_cache.data_ptr<T>(), k_scale, v_scale,
       tables.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), out.data_ptr<float>(), q.size(0),
       q.size(1), hd, k_cache.size(1), k_cache.size(2), tables.size(1), static_cast<float>(scale),
       window);
  return out;
}

torch::Tensor paged_decode(
    torch::Tensor q,             // [D, heads, head_dim] float32
    torch::Tensor k_cache,       // [num_blocks, block_size, kv_heads, head_dim] float32
    torch::Tensor v_cache,
    torch::Tensor block_tables,  // [D, max_blocks] int64
    torch::Tensor context_lens,  // [D] int64
    double scale,
    int64_t window) {            // sliding window, or <= 0 for full attention
  TORCH_CHECK(k_cache.scalar_type() == torch::kFloat32 && v_cache.scalar_type() == torch::kFloat32);
  return decode<float>(q, k_cache, v_cache, nullptr, nullptr, block_tables, context_lens, scale,
                       window);
}

torch::Tensor paged_decode_int8(
    torch::Tensor q,             // [D, heads, head_dim] float32
    torch::Tensor k_cache,       // [num_blocks, block_size, kv_heads, head_dim] int8
    torch::Tensor v_cache,
    torch::Tensor k_scale,       // [num_blocks, block_size, kv_heads] float32
    torch::Tensor v_scale,
    torch::Tensor block_tables,  // [D, max_blocks] int64
    torch::Tensor context_lens,  // [D] int64
    double scale,
    int64_t window) {
  TORCH_CHECK(k_cache.scalar_type() == torch::kInt8 && v_cache.scalar_type() == torch::kInt8);
  TORCH_CHECK(k_scale.is_contiguous() && v_scale.is_contiguous());
  TORCH_CHECK(k_scale.scalar_type() == torch::kFloat32 && v_scale.scalar_type() == torch::kFloat32);
  return decode<int8_t>(q, k_cache, v_cache, k_scale.data_ptr<float>(),
                        v_scale.data_ptr<float>(), block_tables, context_lens, scale, window);
}

// Quantize new keys or values [N, kv_heads, head_dim] per token per kv head into their cache
// slots, bit for bit as kv_cache.quantize does: one call instead of about ten PyTorch ops.
// Any strides: decode-sized projections come out transposed (see linear.py).
void write_int8(torch::Tensor x, torch::Tensor cache, torch::Tensor scales, torch::Tensor slots) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && cache.scalar_type() == torch::kInt8);
  TORCH_CHECK(cache.is_contiguous() && scales.is_contiguous());
  const int64_t n = x.size(0), kvh = x.size(1), hd = x.size(2), step = x.stride(2);
  const auto slot = slots.contiguous();
  const int64_t* sp = slot.data_ptr<int64_t>();
  const float* xp = x.data_ptr<float>();
  int8_t* cp = cache.data_ptr<int8_t>();
  float* scp = scales.data_ptr<float>();
#pragma omp parallel for if (n > 64)
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < kvh; ++h) {
      const float* src = xp + t * x.stride(0) + h * x.stride(1);
      float top = 0.0f;
      for (int64_t i = 0; i < hd; ++i) top = std::max(top, std::abs(src[i * step]));
      const float s = std::max(top / 127.0f, 1e-8f);
      int8_t* dst = cp + (sp[t] * kvh + h) * hd;
      for (int64_t i = 0; i < hd; ++i)
        dst[i] = static_cast<int8_t>(std::nearbyint(src[i * step] / s));
      scp[sp[t] * kvh + h] = s;
    }
  }
}

// New float32 keys and values [N, kv_heads, head_dim] (any strides) into their cache slots,
// both in one call: two index_copy_ calls and their views cost several times the copy.
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache,
           torch::Tensor slots) {
  TORCH_CHECK(k.scalar_type() == torch::kFloat32 && v.scalar_type() == torch::kFloat32);
  TORCH_CHECK(k_cache.scalar_type() == torch::kFloat32 && k_cache.is_contiguous() &&
              v_cache.scalar_type() == torch::kFloat32 && v_cache.is_contiguous());
  const int64_t n = k.size(0), kvh = k.size(1), hd = k.size(2);
  TORCH_CHECK(v.sizes() == k.sizes() && k_cache.size(2) == kvh && k_cache.size(3) == hd);
  const auto slot = slots.contiguous();
  const int64_t* sp = slot.data_ptr<int64_t>();
  const int64_t capacity = k_cache.size(0) * k_cache.size(1);
  for (int64_t t = 0; t < n; ++t) TORCH_CHECK(sp[t] >= 0 && sp[t] < capacity, "slot out of range");
  for (auto [x, cache] : {std::pair{k, k_cache}, std::pair{v, v_cache}}) {
    const float* xp = x.data_ptr<float>();
    float* cp = cache.data_ptr<float>();
    const int64_t step = x.stride(2);
#pragma omp parallel for if (n > 64)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < kvh; ++h) {
        const float* src = xp + t * x.stride(0) + h * x.stride(1);
        float* dst = cp + (sp[t] * kvh + h) * hd;
        for (int64_t i = 0; i < hd; ++i) dst[i] = src[i * step];
      }
  }
}
