// Decode attention straight from the paged KV cache, for CPUs.
//
// One query token per sequence; each sequence is one OpenMP task. It reads its keys and values
// once, block by block through the block table, whole token rows at a time (all kv heads are
// contiguous), and serves every query head from the kv head it shares (grouped-query
// attention), so nothing is gathered, padded or repeated.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <vector>

torch::Tensor paged_decode(
    torch::Tensor q,             // [D, heads, head_dim] float32
    torch::Tensor k_cache,       // [num_blocks, block_size, kv_heads, head_dim] float32
    torch::Tensor v_cache,
    torch::Tensor block_tables,  // [D, max_blocks] int64
    torch::Tensor context_lens,  // [D] int64
    double scale,
    int64_t window) {            // sliding window, or <= 0 for full attention
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous());
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k_cache.scalar_type() == torch::kFloat32);
  const int64_t D = q.size(0), H = q.size(1), hd = q.size(2);
  const int64_t bs = k_cache.size(1), kvh = k_cache.size(2), group = H / kvh;
  const int64_t max_blocks = block_tables.size(1);
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* bt = block_tables.contiguous().data_ptr<int64_t>();
  const int64_t* lens = context_lens.contiguous().data_ptr<int64_t>();
  float* op = out.data_ptr<float>();

#pragma omp parallel for schedule(dynamic)
  for (int64_t d = 0; d < D; ++d) {
    const int64_t len = lens[d];
    const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
    const int64_t* table = bt + d * max_blocks;
    const float* qd = qp + d * H * hd;
    const int64_t row = kvh * hd;  // one token's keys (or values), all kv heads, contiguous
    std::vector<float> scores(H * len);
    std::vector<float> acc(H * hd, 0.0f);
    // Pass 1: scaled q.k for every visible position and query head, block by block.
    for (int64_t pos = first; pos < len;) {
      const int64_t offset = pos % bs, count = std::min(bs - offset, len - pos);
      const float* k = kp + (table[pos / bs] * bs + offset) * row;
      for (int64_t t = 0; t < count; ++t, k += row) {
        for (int64_t head = 0; head < H; ++head) {
          const float* qh = qd + head * hd;
          const float* kh = k + (head / group) * hd;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < hd; ++i) dot += qh[i] * kh[i];
          scores[head * len + pos + t] = dot * static_cast<float>(scale);
        }
      }
      pos += count;
    }
    // Softmax over the visible positions of each query head.
    for (int64_t head = 0; head < H; ++head) {
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
      const float* v = vp + (table[pos / bs] * bs + offset) * row;
      for (int64_t t = 0; t < count; ++t, v += row) {
        for (int64_t head = 0; head < H; ++head) {
          const float p = scores[head * len + pos + t];
          const float* vh = v + (head / group) * hd;
          float* a = acc.data() + head * hd;
#pragma omp simd
          for (int64_t i = 0; i < hd; ++i) a[i] += p * vh[i];
        }
      }
      pos += count;
    }
    std::copy(acc.begin(), acc.end(), op + d * H * hd);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "Decode attention over a paged KV cache (CPU, float32)");
}
