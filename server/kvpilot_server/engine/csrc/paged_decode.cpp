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

// HD is the head dimension when known at compile time (the inner loops then unroll and
// vectorize fully), or 0 to read it at run time.
template <int64_t HD>
void decode_rows(const float* qp, const float* kp, const float* vp, const int64_t* bt,
                 const int64_t* lens, float* op, int64_t D, int64_t H, int64_t hd_runtime,
                 int64_t bs, int64_t kvh, int64_t max_blocks, float scale, int64_t window) {
  const int64_t hd = HD > 0 ? HD : hd_runtime;
  const int64_t group = H / kvh;
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
          scores[head * len + pos + t] = dot * scale;
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
}

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
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = torch::empty_like(q);
  const int64_t hd = q.size(2);
  auto run = hd == 64 ? decode_rows<64> : hd == 128 ? decode_rows<128> : decode_rows<0>;
  run(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
      tables.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), out.data_ptr<float>(), q.size(0),
      q.size(1), hd, k_cache.size(1), k_cache.size(2), tables.size(1),
      static_cast<float>(scale), window);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "Decode attention over a paged KV cache (CPU, float32)");
}
